"""PyTorch's own Gloo collectives, timed the way bench_collectives times strata's.

Run with the venv's Python ($STRATA_PYTHON: torch 2.13.0 CPU, the
libtorch_cpu strata links; bench/run_collectives.sh finds it):

    collectives_peer.py [-n 2]            # CSV lines: torch,op,bytes,seconds_per_iter[,torch op]
    collectives_peer.py --table A.csv ...  # the comparison table of the CSV files

Same sizes (1 KB .. 64 MB, powers of 4), iteration rule, warm-up and
slowest-rank timing as bench/bench_collectives.cpp; one thread per rank.
The row "reduce_scatter" uses dist.reduce_scatter_tensor where the Gloo
process group has it (torch 2.x); where it has not (torch 1.13) it is
measured as all_reduce of the input followed by taking this rank's slice,
and the table says so in its last column.
"""
import argparse
import os
import sys
import time

MIN_BYTES = 1 << 10
MAX_BYTES = 64 << 20


def iterations(nbytes):
    return max(4, min(1000, (256 << 20) // nbytes))


def sizes():
    b = MIN_BYTES
    while b <= MAX_BYTES:
        yield b
        b *= 4


def worker(rank, world, port, queue):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    # Does this torch's Gloo have reduce_scatter? (1.13's had not.)
    try:
        dist.reduce_scatter_tensor(torch.ones(1), torch.ones(world))
        rs_op = "reduce_scatter_tensor"
    except (RuntimeError, AttributeError, NotImplementedError):
        rs_op = "all_reduce+slice"
    results = []
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        for nbytes in sizes():
            elems = nbytes // 4
            full = torch.ones(elems)
            piece = torch.ones(elems // world)
            outs = list(full.chunk(world))  # all_gather writes into views of `full`

            def run():
                if op == "all_reduce":
                    dist.all_reduce(full)
                elif op == "all_gather":
                    dist.all_gather(outs, piece)
                elif rs_op == "reduce_scatter_tensor":
                    dist.reduce_scatter_tensor(piece, full)
                else:  # no reduce_scatter in 1.13's Gloo: all_reduce, keep this rank's slice
                    dist.all_reduce(full)
                    piece.copy_(full.narrow(0, rank * (elems // world), elems // world))

            run()
            run()
            iters = iterations(nbytes)
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                run()
            seconds = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            results.append((op, nbytes, seconds.item(), rs_op if op == "reduce_scatter" else op))
    dist.destroy_process_group()
    if rank == 0:
        queue.put(results)


def measure(world):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = queue.get()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            sys.exit(f"collectives_peer: a worker exited with code {p.exitcode}")
    for op, nbytes, seconds, torch_op in results:
        print(f"torch,{op},{nbytes},{seconds:.9f},{torch_op}", flush=True)


def bus_bandwidth(op, nbytes, seconds, world):
    factor = 2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world
    return factor * nbytes / seconds / 1e9


def human(nbytes):
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


IMPLS = ("strata-shm", "strata-gloo", "torch")


def table(paths, world):
    """Bus bandwidth of every implementation found, each strata one's ratio to
    torch, and the time per call (microseconds) up to 64 KB, where latency
    rather than bandwidth decides."""
    rows, torch_ops, seen = {}, {}, []
    for path in paths:
        with open(path) as f:
            for line in f:
                parts = line.strip().split(",")
                if len(parts) not in (4, 5):
                    continue
                impl, op, nbytes, seconds = parts[0], parts[1], int(parts[2]), float(parts[3])
                impl = "strata-gloo" if impl == "strata" else impl  # CSVs from before the shm backend
                rows.setdefault((op, nbytes), {})[impl] = seconds
                if impl not in seen:
                    seen.append(impl)
                if impl == "torch":
                    # Older CSVs (torch 1.13) have no 5th field: all_reduce+slice.
                    torch_ops[op] = parts[4] if len(parts) == 5 else (
                        "all_reduce+slice" if op == "reduce_scatter" else op)
    impls = [i for i in IMPLS if i in seen] + [i for i in seen if i not in IMPLS]
    ours = [i for i in impls if i != "torch"]
    short = {i: i.replace("strata-", "") for i in impls}
    head = f"{'op':<15}{'size':>7}"
    head += "".join(f"  {short[i] + ' GB/s':>10}" for i in impls)
    head += "".join(f"  {short[i] + '/torch':>11}" for i in ours)
    head += "".join(f"  {short[i] + ' us':>9}" for i in impls)
    print(head + "  torch op")
    order = ("all_reduce", "all_gather", "reduce_scatter")
    for (op, nbytes), by in sorted(rows.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1])):
        bw = {i: bus_bandwidth(op, nbytes, by[i], world) if by.get(i) else None for i in impls}
        line = f"{op:<15}{human(nbytes):>7}"
        line += "".join(f"  {bw[i]:>10.3f}" if bw[i] else f"  {'n/a':>10}" for i in impls)
        for i in ours:
            line += f"  {bw[i] / bw['torch']:>11.2f}" if bw[i] and bw.get("torch") else f"  {'n/a':>11}"
        for i in impls:
            small = nbytes <= (64 << 10) and by.get(i)
            line += f"  {by[i] * 1e6:>9.1f}" if small else f"  {'':>9}"
        print(line + "  " + torch_ops.get(op, op))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--table", nargs="+", metavar="CSV", help="print the comparison table of these CSV files")
    args = parser.parse_args()
    if args.table:
        table(args.table, args.n)
    else:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        measure(args.n)


if __name__ == "__main__":
    main()
