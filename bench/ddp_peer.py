"""The Python peers of the training benchmarks (bench/bench_ddp.cpp).

Trains the same model as bench_ddp (a GPT preset written out below, with
strata's architecture, or the 512-2048-512 MLP) with AdamW on the same
fixed random batches, per-rank batch, warm-up and timed steps, through one
of these peers (--peer), and prints one JSON line on rank 0 with the keys
of bench_ddp's:

  pytorch-ddp             torch.nn.parallel.DistributedDataParallel (Gloo)
  pytorch-fsdp2           torch.distributed.fsdp.fully_shard (FSDP2) on each
                          GPT Block, then on the root (Gloo, CPU)
  fabric-ddp              Lightning Fabric, strategy="ddp"
  fabric-fsdp             Lightning Fabric, strategy="fsdp" (FSDPStrategy,
                          which is FSDP1): refused on CPU; prints an
                          {"error": ...} line quoting what it said
  fabric-model-parallel   Lightning Fabric's ModelParallelStrategy, whose
                          parallelize_fn applies fully_shard as
                          pytorch-fsdp2 does: Fabric's FSDP2

Runs under the project's venv (torch 2.13.0 CPU, lightning; $STRATA_PYTHON,
bench/python.sh). The PyTorch peers start --devices ranks themselves
(torch.multiprocessing.spawn) on a free loopback port; the Fabric peers let
Fabric launch them (its subprocess launcher re-runs this script).

Same data and weights as bench_ddp: torch and strata use the same
libtorch_cpu (the venv's), with the same CPU generator. The batches come
from a generator seeded with --seed, and the model is built in full right
after torch.manual_seed(--seed), with its layers created in the same order
as strata's, before any peer wraps or shards it, so every row starts from
the same weights and sees the same batches; "loss after K" agreeing checks
it. nn.Linear and LibTorch's C++ torch::nn::Linear both call the same
at::linear, so forward and backward run the same kernels.

Step times: each rank times forward + backward (with the gradient
all-reduce or reduce-scatter) + optimizer step + zero_grad of each timed
step; the per-step times are reduced with MAX across ranks at the end.
Memory: the figures of Note [Memory figures] in bench_ddp.cpp, measured the
same way (VmRSS at the worker's start, once torch.distributed, DDP's and
FSDP2's Python modules, and for Fabric lightning, are loaded; VmHWM after
set-up; VmHWM reset then read at the end; the local bytes of parameters,
gradients and AdamW's moments: FSDP2's local shards).

Usage: $STRATA_PYTHON bench/ddp_peer.py --peer pytorch-fsdp2 --model gpt --size small --batch 16 --steps 30
"""
import argparse
import contextlib
import importlib
import json
import math
import os
import resource
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import tables

# The presets of strata::models::GPTConfig::preset: (n_layer, n_head, n_embd, block_size).
PRESETS = tables.GPT_PRESETS
VOCAB = tables.GPT_VOCAB

PEERS = {
    # --peer: (default "impl" label, "strategy" field)
    "pytorch-ddp": ("pytorch ddp", "ddp"),
    "pytorch-fsdp2": ("pytorch fsdp2", "fsdp"),
    "fabric-ddp": ("fabric ddp", "ddp"),
    "fabric-fsdp": ("fabric fsdp", "fsdp"),
    "fabric-model-parallel": ("fabric model-parallel", "fsdp"),
}


class CausalSelfAttention(nn.Module):
    def __init__(self, n_head, n_embd, sdpa=False):
        super().__init__()
        self.n_head, self.n_embd, self.sdpa = n_head, n_embd, sdpa
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.n_head
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, hd).transpose(1, 2)
        k = k.view(B, T, self.n_head, hd).transpose(1, 2)
        v = v.view(B, T, self.n_head, hd).transpose(1, 2)
        if self.sdpa:  # strata's --attention sdpa: the same function through the fused kernel
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(B, T, C)
            return self.c_proj(y)
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(future, float("-inf")).softmax(-1)
        y = torch.matmul(att, v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLPBlock(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_head, n_embd, sdpa=False):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(n_head, n_embd, sdpa)
        self.ln2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = MLPBlock(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def _init_linear(layer, std):
    nn.init.normal_(layer.weight, 0.0, std)
    nn.init.zeros_(layer.bias)


def _init_norm(norm):
    nn.init.ones_(norm.weight)
    nn.init.zeros_(norm.bias)


class GPT(nn.Module):
    """strata::models::GPT without dropout: embeddings, pre-norm blocks, final
    LayerNorm, head tied to the token embedding, GPT-2 initialisation."""

    def __init__(self, size, sdpa=False):
        super().__init__()
        n_layer, n_head, n_embd, block_size = PRESETS[size]
        self.block_size = block_size
        self.wte = nn.Embedding(VOCAB, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList([Block(n_head, n_embd, sdpa) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)
        # GPT-2 initialisation, in strata's order (GPTImpl::reset_parameters).
        std, proj_std = 0.02, 0.02 / math.sqrt(2.0 * n_layer)
        with torch.no_grad():
            nn.init.normal_(self.wte.weight, 0.0, std)
            nn.init.normal_(self.wpe.weight, 0.0, std)
            for b in self.blocks:
                _init_norm(b.ln1)
                _init_linear(b.attn.c_attn, std)
                _init_linear(b.attn.c_proj, proj_std)
                _init_norm(b.ln2)
                _init_linear(b.mlp.c_fc, std)
                _init_linear(b.mlp.c_proj, proj_std)
            _init_norm(self.ln_f)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, dtype=torch.long, device=idx.device))
        for b in self.blocks:
            x = b(x)
        return F.linear(self.ln_f(x), self.wte.weight)


class MLP(nn.Module):
    """strata::models::MLP(512, 2048, 512, 1): Linear, ReLU, Linear."""

    def __init__(self, d_in=512, hidden=2048, d_out=512):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(d_in, hidden), nn.Linear(hidden, d_out)])

    def forward(self, x):
        return self.layers[1](torch.relu(self.layers[0](x)))


def label(args):
    return f"gpt-{args.size}" if args.model == "gpt" else "mlp-512-2048-512"


# --- memory (Note [Memory figures] in bench_ddp.cpp) -----------------------

def proc_status_mb(key):
    """A "VmRSS" / "VmHWM" line of /proc/self/status, in MB (-1 if absent)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    return -1.0


def reset_peak_rss():
    """Sets VmHWM (and ru_maxrss) back to the current RSS; False where refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def local_bytes(t):
    """Bytes this rank holds of `t` (a DTensor's local shard)."""
    if t is None:
        return 0
    if hasattr(t, "to_local"):
        t = t.to_local()
    return t.numel() * t.element_size()


def training_state_bytes(model, optimizer):
    """Parameters, their gradients and AdamW's moments held by this rank."""
    total = sum(local_bytes(p) + local_bytes(p.grad) for p in model.parameters())
    for state in getattr(optimizer, "optimizer", optimizer).state.values():
        total += sum(local_bytes(state.get(k)) for k in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"))
    return total


# --- one rank's run, common to every peer ----------------------------------

def make_data(args, rank, world):
    """This rank's batches: Note [Same data and initial weights as the peer]
    in bench_ddp.cpp."""
    gen = torch.Generator().manual_seed(args.seed)
    if args.model == "gpt":
        seq_len = PRESETS[args.size][3]
        pool = torch.randint(0, VOCAB, (args.pool, world * args.batch, seq_len + 1), generator=gen, dtype=torch.long)
        mine = [p.narrow(0, rank * args.batch, args.batch) for p in pool]
        return [m[:, :seq_len].contiguous() for m in mine], [m[:, 1:].contiguous() for m in mine], seq_len
    x = torch.randn(args.pool, world * args.batch, 512, generator=gen)
    y = torch.randn(args.pool, world * args.batch, 512, generator=gen)
    inputs = [x[i].narrow(0, rank * args.batch, args.batch).contiguous() for i in range(args.pool)]
    targets = [y[i].narrow(0, rank * args.batch, args.batch).contiguous() for i in range(args.pool)]
    return inputs, targets, 0


def build_model(args):
    """The model in full, built right after manual_seed(--seed) as strata does."""
    torch.manual_seed(args.seed)
    return GPT(args.size, sdpa=args.attention == "sdpa") if args.model == "gpt" else MLP()


def shard_fsdp2(model, mesh=None):
    """FSDP2 as strata's FSDP units: each GPT Block, then the root (embeddings,
    final norm, tied head; the MLP: the root only)."""
    from torch.distributed.fsdp import fully_shard

    for block in getattr(model, "blocks", []):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def torch_autocast(args):
    """The forward context of --precision for the PyTorch peers: bf16-mixed
    runs forward and loss under CPU autocast to bf16 (fp32 weights and
    optimizer), as strata's bf16-mixed and Fabric's do."""
    if args.precision == "bf16-mixed":
        return lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext


def run_rank(args, rank, world, wrap, make_optimizer, backward, autocast=contextlib.nullcontext):
    """Trains and, on rank 0, prints the JSON line. wrap(model) -> the model
    to call; make_optimizer(params) -> the optimizer; backward(loss);
    autocast() -> the context forward and loss run in (--precision)."""
    torch.set_num_threads(args.threads)
    # Load what the peers would load lazily during set-up (DDP's constructor
    # imports torch._dynamo, FSDP2 is torch.distributed.fsdp: about 75 MB of
    # Python modules) before the baseline, on every row alike, as strata's
    # baseline has LibTorch and Gloo loaded; Fabric's rows have lightning too.
    for name in ("torch._dynamo", "torch.distributed.fsdp"):
        importlib.import_module(name)

    baseline_mb = proc_status_mb("VmRSS")
    inputs, targets, seq_len = make_data(args, rank, world)
    model = build_model(args)
    params = sum(p.numel() for p in model.parameters())
    model = wrap(model)
    setup_peak_mb = proc_status_mb("VmHWM")
    setup_maxrss_mb = peak_rss_mb()  # the reset below also resets ru_maxrss
    hwm_reset = reset_peak_rss()
    optimizer = make_optimizer(model.parameters())

    def loss_of(i):
        x, y = inputs[i % args.pool], targets[i % args.pool]
        with autocast():
            if args.model == "gpt":
                logits = model(x)
                return F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
            return F.mse_loss(model(x), y)

    step_ms, fwd_ms, bwd_ms, opt_ms = [], [], [], []
    last_loss = 0.0
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            dist.barrier()
        start = time.perf_counter()
        loss = loss_of(i)
        t_fwd = time.perf_counter()
        backward(loss)
        t_bwd = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad()
        t_all = time.perf_counter()
        last_loss = loss.item()
        if i >= args.warmup:
            step_ms.append((t_all - start) * 1e3)
            fwd_ms.append((t_fwd - start) * 1e3)
            bwd_ms.append((t_bwd - t_fwd) * 1e3)
            opt_ms.append((t_all - t_bwd) * 1e3)

    times = torch.tensor(step_ms, dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    step_ms = times.tolist()
    maxrss_mb = max(setup_maxrss_mb, peak_rss_mb())
    state_mb = training_state_bytes(model, optimizer) / (1024.0 * 1024.0)
    mine = [maxrss_mb, baseline_mb, setup_peak_mb, proc_status_mb("VmHWM"), state_mb]
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    per_rank = [list(col) for col in zip(*gathered)]
    loss_t = torch.tensor(last_loss, dtype=torch.float64)
    dist.all_reduce(loss_t)
    if rank == 0:
        step_s = statistics.median(step_ms) / 1e3
        out = {
            "impl": args.impl_label,
            "peer": args.peer,
            "strategy": PEERS[args.peer][1],
            "init": "plain",
            "precision": args.precision,
            "optimizer": "adamw-fused" if args.fused else "adamw",
            "attention": args.attention,
            "compiled": args.compile,
            "model": label(args),
            "params": params,
            "world": world,
            "threads": args.threads,
            "batch": args.batch,
            "steps": args.steps,
            "step_ms_median": statistics.median(step_ms),
            "step_ms_mean": statistics.fmean(step_ms),
        }
        if args.model == "gpt":
            out["tokens_per_s"] = world * args.batch * seq_len / step_s
        else:
            out["samples_per_s"] = world * args.batch / step_s
        out["peak_rss_mb_per_rank"] = per_rank[0]
        out["loss_after_k"] = loss_t.item() / world
        out["k"] = args.warmup + args.steps
        out["memory"] = {"baseline": per_rank[1], "setup_peak": per_rank[2], "train_peak": per_rank[3],
                         "state": per_rank[4], "hwm_reset": hwm_reset}
        if args.phases:
            out["phases_ms_median"] = {
                "forward": statistics.median(fwd_ms),
                "backward_and_allreduce": statistics.median(bwd_ms),
                "optimizer": statistics.median(opt_ms),
            }
        print(json.dumps(out), flush=True)
    leave()


def leave():
    """Note [Leave without destructors]: under Python 3.11, tearing down DDP
    (destroy_process_group, or the Reducer dropping the last reference to
    the Gloo process group) deadlocked in torch 1.13: ~ProcessGroupGloo
    joined a worker thread that waited for the GIL, which the joining
    thread held, and the left-over rank spun forever. Kept under torch 2.13
    (and for Fabric's processes) as the cheap safe way out: the run is over,
    so meet once more and leave without running destructors."""
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def adamw(args):
    """AdamW as the peer's user would write it: the per-parameter loop (the
    CPU default), or fused=True (one kernel per dtype and device; a CPU
    kernel since torch 2.4) with --fused."""
    return lambda params: torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01, fused=args.fused or None)


# --- the peers -------------------------------------------------------------

def pytorch_worker(rank, args, port):
    """pytorch-ddp and pytorch-fsdp2: one rank of torch.multiprocessing.spawn."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.devices)
    if args.peer == "pytorch-ddp":
        from torch.nn.parallel import DistributedDataParallel

        wrap = lambda m: DistributedDataParallel(m, bucket_cap_mb=args.bucket_cap_mb)  # noqa: E731
    else:
        wrap = shard_fsdp2
    if args.compile:
        wrap = compiled(args, wrap)
    run_rank(args, rank, args.devices, wrap, adamw(args), lambda loss: loss.backward(), torch_autocast(args))


def compiled(args, wrap):
    """--compile: the peer with torch.compile (inductor), as its docs advise.
    DDP: the DDP-wrapped model compiled whole (dynamo's DDPOptimizer splits
    the graph at the buckets, so the all-reduces still overlap backward).
    FSDP2: each GPT Block compiled before it is sharded (FSDP2's hooks stay
    outside the compiled blocks, as torchtitan does), the MLP whole. The
    compiles happen in the warm-up steps."""
    if args.peer == "pytorch-ddp":
        return lambda m: torch.compile(wrap(m))

    def compile_blocks_then_shard(m):
        blocks = getattr(m, "blocks", [])
        for block in blocks:
            block.compile()
        if not blocks:
            m.compile()
        return wrap(m)

    return compile_blocks_then_shard


def error_line(args, **errors):
    return json.dumps({"impl": args.impl_label, "peer": args.peer, "strategy": PEERS[args.peer][1],
                       "precision": args.precision, "model": label(args), "world": args.devices, "threads": args.threads, "batch": args.batch,
                       **errors})


def first_line(e):
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"


def run_fabric(args):
    """fabric-ddp, fabric-fsdp, fabric-model-parallel: Fabric launches the
    ranks (this process is rank 0; the others re-run this script)."""
    import lightning as L

    if args.peer == "fabric-ddp":
        strategy = "ddp"
    elif args.peer == "fabric-model-parallel":
        from lightning.fabric.strategies import ModelParallelStrategy

        strategy = ModelParallelStrategy(parallelize_fn=lambda m, mesh: shard_fsdp2(m, mesh["data_parallel"]),
                                         data_parallel_size=args.devices, tensor_parallel_size=1)
    else:
        # Fabric(strategy="fsdp") on CPU: quote the refusal. Then, to see
        # whether only Fabric's check stands in the way, pass an instance of
        # a subclass of FSDPStrategy (the check tests `type(...) is
        # FSDPStrategy`), each GPT Block a unit, and quote what fails next.
        from lightning.fabric.strategies import FSDPStrategy

        try:
            L.Fabric(accelerator="cpu", devices=args.devices, strategy="fsdp")
            refused = None
        except Exception as e:  # noqa: BLE001 - quoted, not handled
            refused = first_line(e)

        class CPUFSDPStrategy(FSDPStrategy):
            pass

        strategy = CPUFSDPStrategy(auto_wrap_policy={Block}, state_dict_type="sharded")
    try:
        fabric = L.Fabric(accelerator="cpu", devices=args.devices, num_nodes=1, strategy=strategy,
                          precision=args.precision)
    except Exception as e:  # noqa: BLE001
        print(error_line(args, error=first_line(e)), flush=True)
        return

    def worker(fabric):
        def wrap(model):
            return fabric.setup_module(model)

        def make_optimizer(params):
            return fabric.setup_optimizers(adamw(args)(params))

        if args.peer != "fabric-fsdp":
            run_rank(args, fabric.global_rank, fabric.world_size, wrap, make_optimizer, fabric.backward,
                     fabric.autocast)
            return
        try:
            run_rank(args, fabric.global_rank, fabric.world_size, wrap, make_optimizer, fabric.backward,
                     fabric.autocast)
        except Exception as e:  # noqa: BLE001
            if fabric.global_rank == 0:
                print(error_line(args, error=refused or "(Fabric accepted strategy='fsdp' on CPU)",
                                 error_past_check=first_line(e)), flush=True)
            sys.stdout.flush()
            os._exit(0)

    fabric.launch(worker)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="peers (--peer):\n" + "\n".join(__doc__.split("\n")[7:19]))
    p.add_argument("--peer", choices=sorted(PEERS), default="pytorch-ddp")
    p.add_argument("--model", choices=["gpt", "mlp"], default="gpt")
    p.add_argument("--size", choices=sorted(PRESETS), default="small")
    p.add_argument("--devices", type=int, default=2, help="ranks")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    p.add_argument("--batch", type=int, default=16, help="batch per rank")
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before")
    p.add_argument("--pool", type=int, default=8, help="distinct random batches, cycled")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--fused", action="store_true", help="AdamW(fused=True): the peer at its best")
    p.add_argument("--compile", action="store_true",
                   help="pytorch-ddp and pytorch-fsdp2 under torch.compile (inductor); compiled in the warm-up steps")
    p.add_argument("--attention", choices=["explicit", "sdpa"], default="explicit",
                   help="sdpa: F.scaled_dot_product_attention(is_causal=True), as strata's --attention sdpa")
    p.add_argument("--bucket-cap-mb", type=int, default=25, help="pytorch-ddp")
    p.add_argument("--precision", choices=["32-true", "bf16-mixed"], default="32-true",
                   help="bf16-mixed: fp32 weights, forward and loss under bf16 autocast")
    p.add_argument("--impl-label", help='the "impl" field of the result (default: from --peer, e.g. "pytorch ddp")')
    p.add_argument("--phases", action="store_true", help="also report forward / backward / optimizer medians")
    p.add_argument("--table", metavar="FILE", help="print the table of the JSON lines in FILE and exit")
    args = p.parse_args()
    if args.table:
        tables.speed_table(tables.load(args.table))
        return
    if args.compile and args.peer.startswith("fabric-"):
        p.error("--compile is for the PyTorch peers (pytorch-ddp, pytorch-fsdp2)")
    if args.impl_label is None:
        args.impl_label = PEERS[args.peer][0] + (" + compile" if args.compile else "")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    if args.peer.startswith("fabric-"):
        run_fabric(args)
    else:
        mp.spawn(pytorch_worker, args=(args, free_port()), nprocs=args.devices, join=True)


if __name__ == "__main__":
    main()
