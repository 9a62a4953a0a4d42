"""PyTorch and Lightning Fabric beside bench/bench_gpu.cpp, on one device.

Trains the same GPT (bench/ddp_peer.py's, strata's architecture and
initialisation, built on the CPU right after torch.manual_seed(--seed) and
then moved) with AdamW on the same fixed random batches as bench_gpu, at
world size 1, through each peer of --peers in turn, and prints one JSON
line per run with bench_gpu's keys:

  pytorch-single   the plain module on the device
  pytorch-ddp      torch.nn.parallel.DistributedDataParallel (NCCL on a
                   GPU, Gloo on the CPU)
  pytorch-fsdp2    torch.distributed.fsdp.fully_shard on each Block, then
                   on the root
  fabric-ddp       Lightning Fabric, strategy="ddp"
  fabric-fsdp      Lightning Fabric, FSDPStrategy with each Block a unit
                   (Fabric refuses FSDP on the CPU: an {"error": ...} line)

Timing and memory as Note [GPU step times and memory] in bench_gpu.cpp:
the device synchronised around each step, the median step gives tokens/s,
peak memory is torch.cuda.max_memory_allocated (reset when the run
starts; the process's peak RSS on the CPU).

Usage: python3 bench/gpu_peer.py --device cuda --sizes medium,large --peers pytorch-single,pytorch-ddp
"""
import argparse
import gc
import json
import os
import resource
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_peer  # noqa: E402  (the GPT, its presets)

PEERS = {
    # --peer: ("impl", "strategy")
    "pytorch-single": ("pytorch", "single_device"),
    "pytorch-ddp": ("pytorch", "ddp"),
    "pytorch-fsdp2": ("pytorch", "fsdp2"),
    "fabric-ddp": ("fabric", "ddp"),
    "fabric-fsdp": ("fabric", "fsdp"),
}


class DeviceGPT(ddp_peer.GPT):
    """ddp_peer.GPT with its position indices on the input's device."""

    def forward(self, idx):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, dtype=torch.long, device=idx.device))
        for b in self.blocks:
            x = b(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_mb(device):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / (1024.0 * 1024.0)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def ensure_process_group(device):
    """A one-rank group for DDP and FSDP2 (NCCL on a GPU, Gloo on the CPU)."""
    if dist.is_initialized():
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, rank=0, world_size=1, **kwargs)


def shard_fsdp2(model, device):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (1,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def make_batches(args, size):
    seq_len = ddp_peer.PRESETS[size][3]
    gen = torch.Generator().manual_seed(args.seed)
    pool = torch.randint(0, ddp_peer.VOCAB, (args.pool, args.batch, seq_len + 1), generator=gen, dtype=torch.long)
    return [p[:, :seq_len].contiguous() for p in pool], [p[:, 1:].contiguous() for p in pool], seq_len


def train(args, peer, size, device, wrap, make_optimizer, backward, autocast):
    """One run; returns bench_gpu's JSON fields."""
    synchronize(device)
    reset_peak(device)
    inputs, targets, seq_len = make_batches(args, size)
    inputs = [x.to(device) for x in inputs]
    targets = [y.to(device) for y in targets]
    torch.manual_seed(args.seed)
    model = DeviceGPT(size)
    params = sum(p.numel() for p in model.parameters())
    model = wrap(model)
    optimizer = make_optimizer(model.parameters())
    step_ms, last_loss = [], 0.0
    for i in range(args.warmup + args.steps):
        synchronize(device)
        start = time.perf_counter()
        with autocast():
            logits = model(inputs[i % args.pool])
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets[i % args.pool].reshape(-1))
        backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        synchronize(device)
        ms = (time.perf_counter() - start) * 1e3
        last_loss = loss.item()
        if i >= args.warmup:
            step_ms.append(ms)
    step = statistics.median(step_ms)
    impl, strategy = PEERS[peer]
    line = {"impl": impl, "strategy": strategy, "model": f"gpt-{size}", "params": params, "device": str(device),
            "precision": args.precision, "batch": args.batch, "seq_len": seq_len, "steps": args.steps,
            "step_ms_median": step, "tokens_per_s": args.batch * seq_len / (step / 1e3),
            "peak_mem_mb": peak_mb(device), "loss_after_k": last_loss, "k": args.warmup + args.steps}
    del model, optimizer
    return line


def pytorch_run(args, peer, size, device):
    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16-mixed")

    def wrap(model):
        model = model.to(device)
        if peer == "pytorch-ddp":
            ensure_process_group(device)
            from torch.nn.parallel import DistributedDataParallel

            return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        if peer == "pytorch-fsdp2":
            ensure_process_group(device)
            return shard_fsdp2(model, device)
        return model

    def make_optimizer(params):
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)

    return train(args, peer, size, device, wrap, make_optimizer, lambda loss: loss.backward(), autocast)


def fabric_run(args, peer, size, device, fabrics):
    import lightning as L

    if peer not in fabrics:
        if peer == "fabric-fsdp":
            from lightning.fabric.strategies import FSDPStrategy

            strategy = FSDPStrategy(auto_wrap_policy={ddp_peer.Block}, state_dict_type="sharded")
        else:
            strategy = "ddp"
        fabric = L.Fabric(accelerator=device.type, devices=1, strategy=strategy, precision=args.precision)
        fabric.launch()
        fabrics[peer] = fabric
    fabric = fabrics[peer]

    def autocast():
        return fabric.autocast()

    return train(args, peer, size, fabric.device, fabric.setup_module,
                 lambda params: fabric.setup_optimizers(torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)),
                 fabric.backward, autocast)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n")[7:18]))
    p.add_argument("--device", default="cuda", help="cuda (cuda:0), or cpu for a dry run")
    p.add_argument("--sizes", default="medium,large", help="GPT presets, comma-separated")
    p.add_argument("--peers", default=",".join(PEERS), help="comma-separated, of: " + ", ".join(PEERS))
    p.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"])
    p.add_argument("--batch", type=int, default=32, help="sequences per step")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before")
    p.add_argument("--pool", type=int, default=4, help="distinct random batches, cycled")
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    sizes = [s for s in args.sizes.split(",") if s]
    peers = [s for s in args.peers.split(",") if s]
    for name in sizes:
        if name not in ddp_peer.PRESETS:
            p.error(f"unknown size '{name}'; choose from {', '.join(ddp_peer.PRESETS)}")
    for name in peers:
        if name not in PEERS:
            p.error(f"unknown peer '{name}'; choose from {', '.join(PEERS)}")
    fabrics = {}
    for size in sizes:
        for peer in peers:
            try:
                if peer.startswith("fabric-"):
                    line = fabric_run(args, peer, size, device, fabrics)
                else:
                    line = pytorch_run(args, peer, size, device)
            except Exception as e:  # noqa: BLE001 - reported in the table, the other rows still run
                impl, strategy = PEERS[peer]
                first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                line = {"impl": impl, "strategy": strategy, "model": f"gpt-{size}", "device": str(device),
                        "error": f"{type(e).__name__}: {first}"[:300]}
            print(json.dumps(line), flush=True)
    sys.stdout.flush()
    # Note [Leave without destructors] in bench/ddp_peer.py: the process
    # group's teardown is not worth the risk of a hang at exit.
    os._exit(0)


if __name__ == "__main__":
    main()
