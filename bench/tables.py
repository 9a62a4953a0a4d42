"""Tables of the training benchmarks' results: the JSON lines printed by
bench_ddp (strata, DDP or FSDP) and bench/ddp_peer.py (PyTorch DDP and
FSDP2, Lightning Fabric).

  speed FILE [--against IMPL ...] [--train-peak] [--matmul FILE ...] [--markdown]
      per model and impl, the median over repeats of each run's median step
      time, throughput, peak RSS, loss after K, and the step time's ratio to
      each --against impl (default: pytorch); --train-peak adds the peak RSS
      over the start during training (rows that report it); --matmul adds
      each row's model FLOP/s and its fraction of the machine's matmul rate
      (MFU), from the JSON lines of bench/matmul_rate.{cc,py} (one FILE per
      measurement round); lines with an "error" are listed below the table;
  matrix FILE [--matmul FILE ...] [--markdown]
      bench/run_matrix.sh's table: per model, strategy and precision, each
      impl's median step, its ratio to the PyTorch row and to the Fabric
      row of the same model, strategy and precision, throughput, MFU (of
      the fp32 matmul rate, every row alike), loss after K and the training
      peak over the start;
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

# strata::models::GPTConfig::preset: (n_layer, n_head, n_embd, block_size).
GPT_PRESETS = {
    "tiny": (2, 2, 64, 64),
    "small": (4, 4, 128, 128),
    "medium": (6, 6, 384, 256),
    "large": (12, 12, 768, 256),
}
GPT_VOCAB = 256


def flops_per_item(model):
    """Training FLOPs per token (GPT) or per sample (MLP) of a result's
    "model" label: Note [Model FLOPs]."""
    if model.startswith("gpt-"):
        size, _, ctx = model[4:].partition("-T")
        n_layer, _, d, block = GPT_PRESETS[size]
        t = int(ctx) if ctx else block
        matmul_params = n_layer * 12 * d * d + GPT_VOCAB * d
        return 6 * matmul_params + 12 * n_layer * t * d
    if model == "mlp-512-2048-512":
        return 6 * (512 * 2048 + 2048 * 512)
    return None


# Note [Model FLOPs]
# A training step costs 6 FLOPs per matmul weight per token (2 forward, 4
# backward: PaLM's / Chinchilla's 6N) plus the attention's two T x T
# matmuls, 12 * n_layer * T * d per token (forward 4 T d per layer: Q K^T
# and att V, backward twice that; strata and the peers compute the full
# T x T, masked, so no causal halving). The weights counted (N) are those of
# a matmul: per layer 12 d^2 (c_attn 3 d^2, c_proj d^2, c_fc 4 d^2, c_proj
# 4 d^2) plus the tied head's vocab x d; embedding look-ups, biases,
# LayerNorms, GELU, softmax and AdamW are not counted. GPT small (L 4, d
# 128, T 128, vocab 256): N = 819,200 of 842,496 parameters, 6 N = 4.92 M
# plus attention 0.79 M = 5.70 MFLOP per token. MLP 512-2048-512: 6 x 2.1 M
# = 12.6 MFLOP per sample. The machine's rate (the MFU's denominator) is
# the sum, over one process per rank each on --threads threads started at
# the same moment, of the median rate of an fp32 1024 x 1024 x 1024 matmul
# (bench/matmul_rate.cc, LibTorch from C++; bench/matmul_rate.py, the same
# libtorch_cpu from Python), averaged over the rounds measured (run_peers.sh:
# before each repeat and after the last).


def matmul_rates(paths):
    """{impl: [machine rate of each round, GFLOP/s]} of bench/matmul_rate's
    JSON lines, one file per round (its lines: concurrent processes)."""
    rates = {}
    for path in paths:
        per_impl = {}
        for r in load(path):
            if r.get("kind") == "matmul":
                # fp32 rows keep the plain impl name (the MFU's denominator).
                key = r["impl"] + ("" if r.get("dtype", "fp32") == "fp32" else f" {r['dtype']}")
                per_impl.setdefault(key, []).append(r["gflops_median"])
        for impl, xs in per_impl.items():
            rates.setdefault(impl, []).append(sum(xs))
    return rates


def machine_rate(rates):
    """The MFU's denominator: the C++ measurement's mean over rounds (the
    Python one where C++ is missing), GFLOP/s, and which it is."""
    for impl in ("libtorch (C++)", "torch (Python)"):
        if rates.get(impl):
            return statistics.fmean(rates[impl]), impl
    return None, None


def load(path):
    """The JSON lines of `path` (other lines are skipped), in order."""
    with open(path) as f:
        return [json.loads(line) for line in (raw.strip() for raw in f) if line.startswith("{")]


def print_rows(header, rows, markdown=False):
    """Prints `rows` (lists of str) under `header`, columns padded (as a
    Markdown table with markdown)."""
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join(" --- " for _ in header) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
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


def speed_table(runs, against=("pytorch",), train_peak=False, matmul_gflops=None, markdown=False):
    """Prints per model and impl the median over repeats of each run's median
    step, with one "x IMPL" column per impl of `against` (the step time over
    that impl's, same model). train_peak adds the training peak over the
    starting RSS (the largest rank; rows that report memory); matmul_gflops
    (the machine's rate, GFLOP/s) adds model GFLOP/s and MFU (Note [Model
    FLOPs]). Lines with an "error" are listed after the table."""
    errors = [r for r in runs if "error" in r]
    runs = [r for r in runs if "error" not in r and "step_ms_median" in r]
    by_key = {}
    for r in runs:
        by_key.setdefault((r["model"], r["impl"]), []).append(r)
    header = ["model", "impl", "step ms (median)", "spread"] + [f"x {impl}" for impl in against]
    header += ["throughput", "peak RSS MB per rank"]
    if train_peak:
        header.append("train peak over start MB")
    header.append("loss after K")
    if matmul_gflops:
        header += ["model GFLOP/s", "MFU"]
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
                items_per_s = statistics.median(r["tokens_per_s"] for r in rs)
                tput = f"{items_per_s:,.0f} tok/s"
            else:
                items_per_s = statistics.median(r["samples_per_s"] for r in rs)
                tput = f"{items_per_s:,.0f} samples/s"
            spread = f"{min(medians):.1f}-{max(medians):.1f}" if len(medians) > 1 else "-"
            rss = ", ".join(f"{x:.0f}" for x in best["peak_rss_mb_per_rank"])
            row = [model, impl, f"{step[impl]:.1f}", spread] + [""] * len(against) + [tput, rss]
            if train_peak:
                row.append(f"{statistics.median(over_start(r, 'train_peak') for r in rs):.0f}"
                           if "memory" in best else "-")
            row.append(f"{best['loss_after_k']:.4f} (K={best['k']})")
            if matmul_gflops:
                per_item = flops_per_item(model)
                if per_item:
                    gflops = per_item * items_per_s / 1e9
                    row += [f"{gflops:.1f}", f"{gflops / matmul_gflops:.1%}"]
                else:
                    row += ["-", "-"]
            rows.append(row)
        # Each row's step time over each baseline's, same model.
        for row in rows[first:]:
            for j, base in enumerate(against):
                if base in step:
                    row[4 + j] = f"{step[row[1]] / step[base]:.2f}"
    print_rows(header, rows, markdown)
    seen = set()
    for e in errors:
        text = f"{e['impl']} ({e['model']}, {e['world']} ranks): {e['error']}"
        if "error_past_check" in e:
            text += f"\n    past that check: {e['error_past_check']}"
        if text not in seen:
            print(text)
            seen.add(text)


def matrix_table(runs, matmul_gflops=None, markdown=False):
    """Prints bench/run_matrix.sh's table: one row per (model, strategy,
    precision, impl), the median over repeats of each run's median step,
    with its ratio to the fastest "pytorch ..." row, the fastest "fabric ..."
    row and the fastest peer row of any kind (the peers at their best:
    fused AdamW and SDPA rows where run_matrix.sh ran them) of the same
    model, strategy and precision. Lines with an "error" follow."""
    errors = [r for r in runs if "error" in r]
    groups = {}
    for r in runs:
        if "error" in r or "step_ms_median" not in r:
            continue
        key = (r["model"], r["strategy"], r.get("precision", "32-true"))
        groups.setdefault(key, {}).setdefault(r["impl"], []).append(r)
    header = ["model", "strategy", "precision", "impl", "step ms", "x pytorch", "x fabric", "x fastest peer",
              "throughput", "MFU", "loss after K", "train peak over start MB"]
    rows = []
    for (model, strategy, precision), impls in groups.items():
        step = {impl: statistics.median(r["step_ms_median"] for r in rs) for impl, rs in impls.items()}
        base = {kind: min((i for i in step if i.startswith(kind)), key=step.get, default=None)
                for kind in ("pytorch", "fabric")}
        base["peer"] = min((i for i in step if not i.startswith("strata")), key=step.get, default=None)
        kinds = ("strata", "pytorch", "fabric")
        ordered = sorted(impls, key=lambda i: next((k for k, kind in enumerate(kinds) if i.startswith(kind)), 3))
        for impl in ordered:
            rs = impls[impl]
            best = min(rs, key=lambda r: abs(r["step_ms_median"] - step[impl]))
            per_s_key = "tokens_per_s" if "tokens_per_s" in best else "samples_per_s"
            items_per_s = statistics.median(r[per_s_key] for r in rs)
            tput = f"{items_per_s:,.0f} {'tok' if per_s_key == 'tokens_per_s' else 'samples'}/s"
            ratios = [f"{step[impl] / step[base[k]]:.2f}" if base[k] else "-" for k in ("pytorch", "fabric", "peer")]
            per_item = flops_per_item(model)
            mfu = f"{per_item * items_per_s / 1e9 / matmul_gflops:.1%}" if per_item and matmul_gflops else "-"
            peak = f"{statistics.median(over_start(r, 'train_peak') for r in rs):.0f}" if "memory" in best else "-"
            rows.append([model, strategy, precision, impl, f"{step[impl]:.1f}", *ratios, tput, mfu,
                         f"{best['loss_after_k']:.4f} (K={best['k']})", peak])
    print_rows(header, rows, markdown)
    seen = set()
    for e in errors:
        text = f"{e['impl']} ({e['model']}, {e.get('strategy', '?')}, {e.get('precision', '32-true')}): {e['error']}"
        if text not in seen:
            print(text)
            seen.add(text)


def memory_table(runs):
    """Prints per world size and strategy/init the memory figures of each run
    (the first run of a kind, if repeated), with ratios to plain DDP's."""
    kinds = {}
    for r in runs:
        if "memory" not in r or "error" in r:
            continue
        init = r["init"] + ("" if r.get("impl", "strata") == "strata" else ", " + r["impl"])
        kinds.setdefault((r["model"], r["world"], r["strategy"], init), r)
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
    p.add_argument("kind", choices=["speed", "matrix", "memory"])
    p.add_argument("file", help="JSON lines of bench_ddp / ddp_peer.py")
    p.add_argument("--against", nargs="+", default=["pytorch"], help="impls to give step-time ratios to")
    p.add_argument("--train-peak", action="store_true", help="speed: add the training peak over the start")
    p.add_argument("--matmul", nargs="+", metavar="FILE", default=[],
                   help="speed: bench/matmul_rate JSON lines, one file per round; adds model GFLOP/s and MFU")
    p.add_argument("--markdown", action="store_true", help="speed: print a Markdown table")
    args = p.parse_args()
    runs = load(args.file)
    if args.kind in ("speed", "matrix"):
        rate = None
        if args.matmul:
            rates = matmul_rates(args.matmul)
            rate, source = machine_rate(rates)
            for impl, xs in rates.items():
                print(f"matmul rate, {impl}: " + ", ".join(f"{x:.1f}" for x in xs) + " GFLOP/s (per round, summed over the ranks' processes)")
            if rate:
                print(f"machine rate used for MFU: {rate:.1f} GFLOP/s ({source}, mean over rounds)")
            print()
        if args.kind == "speed":
            speed_table(runs, args.against, args.train_peak, rate, args.markdown)
        else:
            matrix_table(runs, rate, args.markdown)
    else:
        memory_table(runs)


if __name__ == "__main__":
    main()
