#!/usr/bin/python3
"""Tables of the data-parallel benchmarks' results: the JSON lines printed by
bench_ddp (strata, DDP or FSDP) and bench/ddp_peer.py (PyTorch's DDP).

  speed FILE [--against IMPL ...] [--train-peak]
      per model and impl, the median over repeats of each run's median step
      time, throughput, peak RSS, loss after K, and the step time's ratio to
      each --against impl (default: pytorch);
  memory FILE
      per world size and strategy, the training state per rank (parameters,
      gradients, AdamW moments), the peak RSS over the worker's starting RSS
      during training and during set-up, each with its ratio to DDP's at the
      same world size (see Note [Memory figures] in bench_ddp.cpp).

Imports no torch; ddp_peer.py --table uses speed_table.
"""
import argparse
import json
import statistics


def load(path):
    """The JSON lines of `path` (other lines are skipped), in order."""
    with open(path) as f:
        return [json.loads(line) for line in (raw.strip() for raw in f) if line.startswith("{")]


def print_rows(header, rows):
    """Prints `rows` (lists of str) under `header`, columns padded."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = " | ".join("{:<%d}" % w for w in widths)
    print(fmt.format(*header))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(fmt.format(*row))


def over_start(run, key):
    """The largest over ranks of memory[key] minus that rank's starting RSS, MB."""
    mem = run["memory"]
    return max(p - b for p, b in zip(mem[key], mem["baseline"]))


def speed_table(runs, against=("pytorch",), train_peak=False):
    """Prints per model and impl the median over repeats of each run's median
    step, with one "x IMPL" column per impl of `against` (the step time over
    that impl's, same model). train_peak adds the training peak over the
    starting RSS (strata's rows only)."""
    by_key = {}
    for r in runs:
        by_key.setdefault((r["model"], r["impl"]), []).append(r)
    header = ["model", "impl", "step ms (median)", "spread", "throughput", "peak RSS MB per rank"]
    if train_peak:
        header.append("train peak over start MB")
    header += ["loss after K"] + [f"x {impl}" for impl in against]
    rows = []
    models = list(dict.fromkeys(m for m, _ in by_key))
    impls = list(dict.fromkeys(i for _, i in by_key))
    for model in models:
        step, first = {}, len(rows)
        for impl in impls:
            rs = by_key.get((model, impl))
            if not rs:
                continue
            medians = [r["step_ms_median"] for r in rs]
            step[impl] = statistics.median(medians)
            best = min(rs, key=lambda r: abs(r["step_ms_median"] - step[impl]))
            if "tokens_per_s" in best:
                tput = f"{statistics.median(r['tokens_per_s'] for r in rs):,.0f} tok/s"
            else:
                tput = f"{statistics.median(r['samples_per_s'] for r in rs):,.0f} samples/s"
            spread = f"{min(medians):.1f}-{max(medians):.1f}" if len(medians) > 1 else "-"
            rss = ", ".join(f"{x:.0f}" for x in best["peak_rss_mb_per_rank"])
            row = [model, impl, f"{step[impl]:.1f}", spread, tput, rss]
            if train_peak:
                row.append(f"{statistics.median(over_start(r, 'train_peak') for r in rs):.0f}"
                           if "memory" in best else "-")
            rows.append(row + [f"{best['loss_after_k']:.4f} (K={best['k']})"] + [""] * len(against))
        # Each row's step time over each baseline's, same model.
        for row in rows[first:]:
            for j, base in enumerate(against):
                if base in step:
                    row[len(row) - len(against) + j] = f"{step[row[1]] / step[base]:.2f}"
    print_rows(header, rows)


def memory_table(runs):
    """Prints per world size and strategy/init the memory figures of each run
    (the first run of a kind, if repeated), with ratios to plain DDP's."""
    kinds = {}
    for r in runs:
        kinds.setdefault((r["model"], r["world"], r["strategy"], r["init"]), r)
    header = ["model", "world", "strategy", "init", "state MB/rank", "x ddp", "ddp/N + unit MB",
              "train peak over start MB", "x ddp", "set-up peak over start MB", "x ddp", "peak RSS MB (max rank)",
              "step ms"]
    rows = []
    for (model, world, strategy, init), r in kinds.items():
        ddp = kinds.get((model, world, "ddp", "plain"))
        state = max(r["memory"]["state"])
        train = over_start(r, "train_peak")
        setup = over_start(r, "setup_peak")
        row = [model, str(world), strategy, init, f"{state:.0f}", "", "", f"{train:.0f}", "", f"{setup:.0f}", "",
               f"{max(r['peak_rss_mb_per_rank']):.0f}", f"{r['step_ms_median']:.0f}"]
        if ddp:
            row[5] = f"{state / max(ddp['memory']['state']):.3f}"
            row[8] = f"{train / over_start(ddp, 'train_peak'):.3f}"
            row[10] = f"{setup / over_start(ddp, 'setup_peak'):.3f}"
            if "largest_unit_mb" in r:
                row[6] = f"{max(ddp['memory']['state']) / world + r['largest_unit_mb']:.0f}"
        rows.append(row)
    print_rows(header, rows)
    if any(not r["memory"]["hwm_reset"] for r in kinds.values()):
        print("note: /proc/self/clear_refs refused a VmHWM reset; train peaks include set-up")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("kind", choices=["speed", "memory"])
    p.add_argument("file", help="JSON lines of bench_ddp / ddp_peer.py")
    p.add_argument("--against", nargs="+", default=["pytorch"], help="impls to give step-time ratios to")
    p.add_argument("--train-peak", action="store_true", help="speed: add the training peak over the start")
    args = p.parse_args()
    runs = load(args.file)
    if args.kind == "speed":
        speed_table(runs, args.against, args.train_peak)
    else:
        memory_table(runs)


if __name__ == "__main__":
    main()
