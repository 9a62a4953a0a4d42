#!/usr/bin/python3
"""PyTorch's side of the data-parallel benchmark (bench/bench_ddp.cpp).

Trains the same model as bench_ddp (a GPT preset written out below, with
strata's architecture, or the 512-2048-512 MLP) with
torch.nn.parallel.DistributedDataParallel over Gloo, AdamW, the same fixed
random batches, per-rank batch, warm-up and timed steps, and prints one JSON
line on rank 0 with "impl": "pytorch" (the same keys as bench_ddp).

Needs Debian's python3-torch (torch 1.13, run with /usr/bin/python3). It
starts --devices ranks itself (torch.multiprocessing.spawn) on a free
loopback port.

Same data and weights as bench_ddp: python3-torch and LibTorch are the same
libtorch_cpu, so the batches drawn from a generator seeded with --seed, and
a model built right after torch.manual_seed(--seed) with its layers created
in the same order as strata's, are the same on both sides.

Step times: each rank times forward + backward (with DDP's all-reduce) +
optimizer step + zero_grad of each timed step; the per-step times are
reduced with MAX across ranks at the end.

Usage: /usr/bin/python3 bench/ddp_peer.py --model gpt --size small --batch 16 --steps 30
"""
import argparse
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
from torch.nn.parallel import DistributedDataParallel

import tables

# The presets of strata::models::GPTConfig::preset: (n_layer, n_head, n_embd, block_size).
PRESETS = {
    "tiny": (2, 2, 64, 64),
    "small": (4, 4, 128, 128),
    "medium": (6, 6, 384, 256),
    "large": (12, 12, 768, 256),
}
VOCAB = 256


class CausalSelfAttention(nn.Module):
    def __init__(self, n_head, n_embd):
        super().__init__()
        self.n_head, self.n_embd = n_head, n_embd
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.n_head
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, hd).transpose(1, 2)
        k = k.view(B, T, self.n_head, hd).transpose(1, 2)
        v = v.view(B, T, self.n_head, hd).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
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
    def __init__(self, n_head, n_embd):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(n_head, n_embd)
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

    def __init__(self, size):
        super().__init__()
        n_layer, n_head, n_embd, block_size = PRESETS[size]
        self.block_size = block_size
        self.wte = nn.Embedding(VOCAB, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList([Block(n_head, n_embd) for _ in range(n_layer)])
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
        x = self.wte(idx) + self.wpe(torch.arange(T, dtype=torch.long))
        for b in self.blocks:
            x = b(x)
        return F.linear(self.ln_f(x), self.wte.weight)

    def loss(self, idx, targets):
        logits = self(idx)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


class MLP(nn.Module):
    """strata::models::MLP(512, 2048, 512, 1): Linear, ReLU, Linear."""

    def __init__(self, d_in=512, hidden=2048, d_out=512):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(d_in, hidden), nn.Linear(hidden, d_out)])

    def forward(self, x):
        return self.layers[1](torch.relu(self.layers[0](x)))


def label(args):
    return f"gpt-{args.size}" if args.model == "gpt" else "mlp-512-2048-512"


def worker(rank, args, port):
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.devices)
    world = args.devices

    gen = torch.Generator().manual_seed(args.seed)
    if args.model == "gpt":
        seq_len = PRESETS[args.size][3]
        pool = torch.randint(0, VOCAB, (args.pool, world * args.batch, seq_len + 1), generator=gen, dtype=torch.long)
        mine = [p.narrow(0, rank * args.batch, args.batch) for p in pool]
        inputs = [m[:, :seq_len].contiguous() for m in mine]
        targets = [m[:, 1:].contiguous() for m in mine]
        torch.manual_seed(args.seed)
        model = GPT(args.size)
    else:
        seq_len = 0
        x = torch.randn(args.pool, world * args.batch, 512, generator=gen)
        y = torch.randn(args.pool, world * args.batch, 512, generator=gen)
        inputs = [x[i].narrow(0, rank * args.batch, args.batch).contiguous() for i in range(args.pool)]
        targets = [y[i].narrow(0, rank * args.batch, args.batch).contiguous() for i in range(args.pool)]
        torch.manual_seed(args.seed)
        model = MLP()
    ddp = DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=args.lr, weight_decay=0.01)

    def loss_of(i):
        x, y = inputs[i % args.pool], targets[i % args.pool]
        if args.model == "gpt":
            logits = ddp(x)
            return F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        return F.mse_loss(ddp(x), y)

    step_ms, fwd_ms, bwd_ms, opt_ms = [], [], [], []
    last_loss = 0.0
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            dist.barrier()
        start = time.perf_counter()
        loss = loss_of(i)
        t_fwd = time.perf_counter()
        loss.backward()
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
    rss = [None] * world
    dist.all_gather_object(rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
    loss_t = torch.tensor(last_loss, dtype=torch.float64)
    dist.all_reduce(loss_t)
    if rank == 0:
        step_s = statistics.median(step_ms) / 1e3
        out = {
            "impl": args.impl_label,
            "model": label(args),
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
        out["peak_rss_mb_per_rank"] = rss
        out["loss_after_k"] = loss_t.item() / world
        out["k"] = args.warmup + args.steps
        if args.phases:
            out["phases_ms_median"] = {
                "forward": statistics.median(fwd_ms),
                "backward_and_allreduce": statistics.median(bwd_ms),
                "optimizer": statistics.median(opt_ms),
            }
        print(json.dumps(out), flush=True)
    # Note [Leave without destructors]: under Python 3.11, tearing down DDP
    # (destroy_process_group, or the Reducer dropping the last reference to
    # the Gloo process group) can deadlock in torch 1.13:
    # ~ProcessGroupGloo joins a worker thread that waits for the GIL, which
    # the joining thread holds; the left-over rank then spins forever. The
    # run is over, so meet once more and leave without running destructors.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
    p.add_argument("--bucket-cap-mb", type=int, default=25)
    p.add_argument("--impl-label", default="pytorch", help='the "impl" field of the result')
    p.add_argument("--phases", action="store_true", help="also report forward / backward / optimizer medians")
    p.add_argument("--table", metavar="FILE", help="print the table of the JSON lines in FILE and exit")
    args = p.parse_args()
    if args.table:
        tables.speed_table(tables.load(args.table))
        return
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    mp.spawn(worker, args=(args, free_port()), nprocs=args.devices, join=True)


if __name__ == "__main__":
    main()
