"""The machine's fp32 matmul rate, measured with torch (Python) through the
same libtorch_cpu as strata: the twin of bench/matmul_rate.cc (same flags,
same JSON line with "impl": "torch (Python)"). See that file.

Usage: $STRATA_PYTHON bench/matmul_rate.py [--n 1024] [--reps 30] [--threads 1] [--start-at EPOCH_SECONDS]
"""
import argparse
import json
import sys
import statistics
import time

import torch


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--start-at", type=float, default=0.0, help="wall-clock time (epoch seconds) to start timing at")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    n = args.n
    a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    for _ in range(5):
        torch.mm(a, b, out=c)
    if args.start_at > 0:
        time.sleep(max(0.0, args.start_at - time.time()))
    secs = []
    for _ in range(args.reps):
        t = time.perf_counter()
        torch.mm(a, b, out=c)
        secs.append(time.perf_counter() - t)
    flop = 2.0 * n ** 3
    line = json.dumps({"kind": "matmul", "impl": "torch (Python)", "n": n, "threads": args.threads, "reps": args.reps,
                       "gflops_median": round(flop / statistics.median(secs) / 1e9, 2),
                       "gflops_best": round(flop / min(secs) / 1e9, 2)})
    # One write per line: the ranks' processes append to one file at once
    # (print() writes the newline apart when Python runs unbuffered).
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
