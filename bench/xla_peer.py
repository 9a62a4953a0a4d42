"""torch_xla's side of the xla benchmark (bench/bench_xla.cpp): the same GPT,
weights, batches and step as bench_xla's xla side, trained on one XLA
device of torch_xla's CPU PJRT client, and printed as one JSON line.

  torch-xla     plain torch_xla: the model moved to torch_xla.device(),
                torch.optim.AdamW, torch.nn.utils.clip_grad_norm_,
                torch_xla.sync() ending the step (its lazy tensor core)
  fabric-xla    Lightning Fabric with SingleDeviceXLAStrategy: fabric.setup,
                fabric.backward, fabric.clip_gradients, optimizer.step (see
                Note [Fabric's XLA accelerator on a CPU client])
  torch-xla-ddp data-parallel on --devices devices of the CPU client, as
                bench_ddp --strategy xla runs strata's (see
                Note [torch_xla's devices as threads]); with torch_xla 2.9
                it aborts in its first all-reduce (docs/benchmarks.md)

The step is bench_xla's (Note [What an xla step is] there): zero_grad,
forward and loss, backward, clipping to norm 1.0, AdamW (lr --lr, weight
decay 0.1), the end of the step, then the loss read on the host. One
difference is the peer's best: Python's clip_grad_norm_ returns the norm as
a tensor, so torch_xla runs one program a step where LibTorch's C++ (whose
clip_grad_norm_ returns a double, read on the host) runs two.

Same data and weights as bench_xla: the batches from a CPU generator seeded
with --seed (randint over the vocabulary, pool x batch x (T + 1)), the model
built on the CPU right after torch.manual_seed(--seed) in strata's layer
order (bench/ddp_peer.py's GPT), then moved. torch 2.9's CPU generator and
initialisers draw what LibTorch 2.13's do; the first loss agreeing with
bench_xla's checks it.

Runs under torch_xla's own venv (bench/run_torch_xla.sh makes it); prints
{"impl", "step_ms_median", "losses", "compiles", "fallbacks", ...}.
Usage: python bench/xla_peer.py --peer torch-xla --model-size tiny --steps 30
"""
import argparse
import json
import os
import statistics
import sys
import time

# Before torch_xla is imported: its CPU client.
os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.debug.metrics as met  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_peer import GPT, PRESETS, VOCAB  # noqa: E402


def batches(args):
    """bench_xla's pool: x = tokens [0, T), y = tokens [1, T]."""
    seq_len = PRESETS[args.model_size][3]
    gen = torch.Generator().manual_seed(args.seed)
    pool = torch.randint(0, VOCAB, (args.pool, args.batch, seq_len + 1), generator=gen, dtype=torch.long)
    return [(p[:, :seq_len].contiguous(), p[:, 1:].contiguous()) for p in pool]


def build_model(args):
    torch.manual_seed(args.seed)
    return GPT(args.model_size, sdpa=args.attention == "sdpa")


def loss_of(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))


def metric_total_ms(name):
    data = met.metric_data(name)
    return data[1] / 1e6 if data else 0.0  # (count, total ns, samples)


def metric_count(name):
    data = met.metric_data(name)
    return data[0] if data else 0


def plain(args, device):
    """torch_xla as its own docs train: model.to(device), sync per step."""
    model = build_model(args).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1,
                                  foreach=args.foreach)

    def step(x, y):
        optimizer.zero_grad()
        loss = loss_of(model, x.to(device), y.to(device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        torch_xla.sync()
        return loss.item()

    return step


# Note [Fabric's XLA accelerator on a CPU client]
# Lightning's XLAAccelerator counts TPU chips (torch_xla._internal.tpu asks
# the TPU's metadata server), so on torch_xla's CPU client it cannot count
# the devices and Fabric refuses them. The subclass below says the client's
# one device is there (availability, count, parsing of `devices`), and
# nothing else changes: SingleDeviceXLAStrategy, its precision plugin and the training
# calls are Lightning's.
def fabric(args, device):
    from lightning.fabric import Fabric
    from lightning.fabric.accelerators import XLAAccelerator
    from lightning.fabric.strategies import SingleDeviceXLAStrategy

    class CPUClientXLAAccelerator(XLAAccelerator):
        @staticmethod
        def is_available():
            return True

        @staticmethod
        def auto_device_count():
            return 1

        @staticmethod
        def parse_devices(devices):
            return devices

        @staticmethod
        def get_parallel_devices(devices):
            return [torch.device("xla", 0)]

    strategy = SingleDeviceXLAStrategy(device=device, accelerator=CPUClientXLAAccelerator())
    f = Fabric(strategy=strategy, devices=1)
    # The model first, then its optimizer (Lightning's order for XLA: moving
    # a module to an XLA device makes new parameters, and an optimizer made
    # before would keep updating the CPU ones).
    model = f.setup_module(build_model(args))
    optimizer = f.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1,
                                                     foreach=args.foreach))

    def step(x, y):
        optimizer.zero_grad()
        loss = loss_of(model, f.to_device(x), f.to_device(y))
        f.backward(loss)
        f.clip_gradients(model, optimizer, max_norm=args.clip)
        optimizer.step()
        torch_xla.sync()
        return loss.item()

    return step


# Note [torch_xla's devices as threads]
# On its CPU client torch_xla runs xmp.spawn's replicas as threads of one
# process, one per device (CPU_NUM_DEVICES of them), as strata's xla
# strategy runs its ranks; TPUs get a process per chip instead. The step is
# bench_ddp's (--strategy xla): forward and loss, backward,
# xm.optimizer_step (the gradients' all-reduce, mean, then AdamW with
# weight decay 0.01), zero_grad, the end of the step, the loss read; no
# clipping. Rank r trains on rows [r * batch, (r + 1) * batch) of each
# batch of the pool (bench/ddp_peer.py's make_data), and "loss_after_k" is
# the mean over ranks of the last step's loss, as bench_ddp prints it. Each
# replica writes its times to a file in a temporary folder; the parent joins
# them.
def ddp_replica(index, args):
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr
    from ddp_peer import make_data

    device = torch_xla.device()
    rank, world = xr.global_ordinal(), xr.world_size()
    args.model, args.size = "gpt", args.model_size
    inputs, targets, _ = make_data(args, rank, world)
    model = build_model(args).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, foreach=args.foreach)
    step_ms, loss = [], 0.0
    for i in range(args.warmup + args.steps):
        start = time.perf_counter()
        out = loss_of(model, inputs[i % args.pool].to(device), targets[i % args.pool].to(device))
        out.backward()
        xm.optimizer_step(optimizer)
        optimizer.zero_grad()
        torch_xla.sync()
        loss = out.item()
        if i >= args.warmup:
            step_ms.append((time.perf_counter() - start) * 1e3)
    with open(os.path.join(args.out_dir, f"rank-{rank}.json"), "w") as f:
        json.dump({"step_ms": step_ms, "loss": loss, "world": world}, f)


def run_ddp(args):
    import tempfile

    import torch_xla.distributed.xla_multiprocessing as xmp

    os.environ["CPU_NUM_DEVICES"] = str(args.devices)
    load_before = " ".join(open("/proc/loadavg").read().split()[:3])
    with tempfile.TemporaryDirectory() as folder:
        args.out_dir = folder
        xmp.spawn(ddp_replica, args=(args,))
        ranks = [json.load(open(os.path.join(folder, f"rank-{r}.json"))) for r in range(args.devices)]
    slowest = [max(step) for step in zip(*(r["step_ms"] for r in ranks))]
    print(json.dumps({
        "impl": "torch_xla ddp" + (" foreach" if args.foreach else ""),
        "torch_xla": torch_xla.__version__,
        "strategy": "xla",
        "model": "gpt-" + args.model_size,
        "world": args.devices,
        "batch": args.batch,
        "steps": args.steps,
        "warmup": args.warmup,
        "step_ms_median": statistics.median(slowest),
        "loss_after_k": statistics.fmean(r["loss"] for r in ranks),
        "k": args.warmup + args.steps,
        "load_before": load_before,
        "load_after": " ".join(open("/proc/loadavg").read().split()[:3]),
    }), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer", choices=["torch-xla", "fabric-xla", "torch-xla-ddp"], default="torch-xla")
    parser.add_argument("--model-size", choices=sorted(PRESETS), default="small")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=30, help="steps; the median skips the first two")
    parser.add_argument("--pool", type=int, help="distinct batches, cycled (default: 4; torch-xla-ddp: 8)")
    parser.add_argument("--devices", type=int, default=2, help="torch-xla-ddp: devices (replicas)")
    parser.add_argument("--warmup", type=int, default=3, help="torch-xla-ddp: untimed steps before --steps")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--attention", choices=["explicit", "sdpa"], default="explicit")
    parser.add_argument("--foreach", action="store_true",
                        help="torch.optim.AdamW(foreach=True): one _foreach_ op per update term")
    args = parser.parse_args()
    if args.pool is None:
        args.pool = 8 if args.peer == "torch-xla-ddp" else 4
    if args.steps < 3 or args.batch < 1 or args.pool < 1 or args.clip <= 0 or args.devices < 1 or args.warmup < 0:
        parser.error(f"--steps must be >= 3, --batch, --pool and --devices >= 1, --clip > 0, --warmup >= 0 "
                     f"(got {args.steps}, {args.batch}, {args.pool}, {args.devices}, {args.clip}, {args.warmup})")
    if args.peer == "torch-xla-ddp":
        return run_ddp(args)

    load_before = " ".join(open("/proc/loadavg").read().split()[:3])
    device = torch_xla.device()
    data = batches(args)
    step = (plain if args.peer == "torch-xla" else fabric)(args, device)
    torch_xla.sync()  # the weights' upload is not step 0's
    met.clear_all()

    step_ms, losses, execute_ms = [], [], []
    for i in range(args.steps):
        x, y = data[i % args.pool]
        execute_before = metric_total_ms("ExecuteTime")
        start = time.perf_counter()
        losses.append(step(x, y))
        step_ms.append((time.perf_counter() - start) * 1e3)
        execute_ms.append(metric_total_ms("ExecuteTime") - execute_before)
        if i == 1:
            compiles_by_step_1 = metric_count("CompileTime")

    timed = step_ms[2:]
    out = {
        "impl": {"torch-xla": "torch_xla", "fabric-xla": "fabric SingleDeviceXLAStrategy"}[args.peer]
                + (" foreach" if args.foreach else ""),
        "torch_xla": torch_xla.__version__,
        "torch": torch.__version__,
        "model": "gpt-" + args.model_size,
        "batch": args.batch,
        "steps": args.steps,
        "threads": torch.get_num_threads(),
        "step_ms_median": statistics.median(timed),
        "step_ms": step_ms,
        "execute_ms_median": statistics.median(execute_ms[2:]),
        "first_steps_ms": step_ms[:2],
        "compiles_by_step_1": compiles_by_step_1,
        "compiles_after_step_1": metric_count("CompileTime") - compiles_by_step_1,
        "fallbacks": sorted(met.executed_fallback_ops()),
        "losses": losses,
        "load_before": load_before,
        "load_after": " ".join(open("/proc/loadavg").read().split()[:3]),
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
