"""Prints the one table of scripts/gpu-check.sh from the JSON lines of
bench/bench_gpu.cpp (strata) and bench/gpu_peer.py (PyTorch, Lightning
Fabric): per model, every implementation and strategy with tokens/s, its
ratio to plain PyTorch on the same device, the median step, peak device
memory and the loss after K steps (the same data and initial weights on
every row, so the losses agree to rounding when every row trains the same
thing).

Usage: python3 bench/gpu_table.py RESULTS.jsonl [MORE.jsonl ...] [--out TABLE.md]
"""
import argparse
import json
import sys

ORDER = {("strata", "single_device"): 0, ("strata", "ddp"): 1, ("strata", "fsdp"): 2,
         ("pytorch", "single_device"): 3, ("pytorch", "ddp"): 4, ("pytorch", "fsdp2"): 5,
         ("fabric", "ddp"): 6, ("fabric", "fsdp"): 7}


def load(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            for number, line in enumerate(f, 1):
                line = line.strip()
                if not line.startswith("{"):
                    continue  # logs between the result lines
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    sys.exit(f"{path}:{number}: not a JSON result line ({e})")
    return rows


def table(rows):
    models = sorted({r.get("model", "?") for r in rows}, key=lambda m: (len(m), m))
    devices = sorted({r.get("device", "?") for r in rows})
    precisions = sorted({r.get("precision", "?") for r in rows if "precision" in r})
    memory = "peak MB: the caching allocator's peak of allocated bytes" if any(
        d.startswith("cuda") for d in devices) else "peak MB: the process's peak RSS (CPU run)"
    out = [f"device: {', '.join(devices)}; precision: {', '.join(precisions) or '?'}; world size 1; {memory}",
           "",
           "| model | impl | strategy | tokens/s | vs pytorch plain | step ms | peak MB | loss after K |",
           "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for model in models:
        mine = [r for r in rows if r.get("model") == model]
        mine.sort(key=lambda r: ORDER.get((r.get("impl"), r.get("strategy")), 99))
        base = next((r["tokens_per_s"] for r in mine
                     if r.get("impl") == "pytorch" and r.get("strategy") == "single_device" and "tokens_per_s" in r),
                    None)
        for r in mine:
            if "error" in r:
                out.append(f"| {model} | {r.get('impl')} | {r.get('strategy')} | failed: {r['error']} | | | | |")
                continue
            ratio = f"{r['tokens_per_s'] / base:.2f}x" if base else "-"
            out.append(f"| {model} | {r['impl']} | {r['strategy']} | {r['tokens_per_s']:,.0f} | {ratio} | "
                       f"{r['step_ms_median']:.1f} | {r['peak_mem_mb']:,.0f} | "
                       f"{r['loss_after_k']:.4f} (K={r['k']}) |")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", nargs="+")
    p.add_argument("--out", help="also write the table to this file")
    args = p.parse_args()
    rows = load(args.results)
    if not rows:
        sys.exit("no result lines in " + ", ".join(args.results))
    text = table(rows)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
