#!/usr/bin/env python3
"""plot_zoo.py — the model-zoo figure of docs/performance.md (and the log's zoo.md), from bench_zoo's CSV (issue #17).

One heat map per virtual-rank count: a column per model, a row per case (mode / tokens / payload /
stage); each cell shows the row's % of the copy ceiling measured in the same run (LL T=1: its µs),
coloured by how close it is to its target (green: met; red: far below; grey: no target), and
framed in red when the target is missed; a missed cell whose bound (bench_zoo: the run's latency
floor plus the row's bytes at the copy ceiling) is below the target too is framed in grey and its
text ends in '*' (out of reach). Cells the run refused or failed say so. The fraction is min_frac
(minimal bytes, issue #31) where the CSV has it, else frac_ceiling (bytes moved; older CSVs); the
application rows (CSV column app, bench_zoo --apps) are not drawn (they share the cases' labels).

Usage:
  build/tests/bench/bench_zoo --csv docs/perf-zoo.csv [--torch zoo_torch.csv]
  python3 scripts/plot_zoo.py [--csv docs/perf-zoo.csv] [--out docs/img/perf_zoo.png]
Needs matplotlib (Agg backend); without it the script says so and exits 0 (the CSV is the data).
"""
import argparse
import csv
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_ORDER = ["deepseek-v3", "kimi-k2", "qwen3-235b", "qwen3-30b", "gpt-oss-120b", "llama4-maverick",
               "mixtral-8x22b"]


def read_rows(path):
    """the model-zoo rows (application rows left out)"""
    with open(path) as f:
        return [r for r in csv.DictReader(line for line in f if not line.startswith("#")) if not r.get("app")]


def headline(r):
    """the row's headline fraction as a string ('' when not measured)"""
    return r["min_frac"] if "min_frac" in r else r["frac_ceiling"]


def num(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


def case_label(r):
    """the row's case without model and ranks (HT rows share one label whatever T ran)"""
    t = f" T{r['tokens']}" if r["mode"] == "ll" else ""
    return f"{r['mode']}{t} {r['payload']} {r['stage']}"


def cell(r):
    """(score for the colour or None, text, frame colour or None)"""
    meets = r["meets"]
    if meets.startswith("REFUSED") or meets.startswith("ERROR"):
        return None, meets.split(":")[0].lower(), None
    us, frac, tgt = num(r["us"]), num(headline(r)), r["target"]
    if us is None:
        return None, "", None
    if tgt.startswith("<=") and tgt.endswith("us"):  # LL T=1: time bound
        bound = float(tgt[2:-2])
        return bound / us, f"{us:.1f}µs", "#b00000" if meets == "no" else None
    text = f"{100 * frac:.0f}" if frac is not None else ""
    if tgt.startswith(">=") and tgt.endswith("%") and frac is not None:
        if meets == "out-of-reach":
            return frac / (float(tgt[2:-1]) / 100.0), text + "*", "#666666"
        return frac / (float(tgt[2:-1]) / 100.0), text, "#b00000" if meets == "no" else None
    return None, text, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=os.path.join(ROOT, "docs", "perf-zoo.csv"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "img", "perf_zoo.png"))
    a = ap.parse_args()
    if not os.path.exists(a.csv):
        print(f"plot_zoo: no {a.csv}: run bench_zoo --csv {a.csv} first")
        return 1
    rows = read_rows(a.csv)
    measured = [r for r in rows if num(r["us"]) is not None or r["meets"].startswith(("REFUSED", "ERROR"))]
    with_target = [r for r in measured if r["meets"] in ("yes", "no", "out-of-reach")]
    print(f"plot_zoo: {len(rows)} rows, {len(measured)} measured, targets met "
          f"{sum(r['meets'] == 'yes' for r in with_target)} of {len(with_target)}, out of reach "
          f"{sum(r['meets'] == 'out-of-reach' for r in with_target)}")
    try:
        import matplotlib
    except ImportError:
        print("plot_zoo: matplotlib not available (pip install matplotlib); no plot written")
        return 0
    if not measured:
        print("plot_zoo: no measured rows (a --list CSV?); no plot written")
        return 0
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np  # a matplotlib dependency
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.patches import Rectangle

    ranks = sorted({int(r["ranks"]) for r in measured})
    models = [m for m in MODEL_ORDER if any(r["model"] == m for r in measured)]
    models += sorted({r["model"] for r in measured} - set(models))
    labels = []
    for r in measured:  # first-seen order: the order bench_zoo ran them in
        if case_label(r) not in labels:
            labels.append(case_label(r))
    index = {(int(r["ranks"]), r["model"], case_label(r)): r for r in measured}
    cmap = plt.get_cmap("RdYlGn").copy()
    cmap.set_bad("#dddddd")
    norm = TwoSlopeNorm(vmin=0.4, vcenter=1.0, vmax=1.3)
    fig, axes = plt.subplots(1, len(ranks), figsize=(1.0 + 0.75 * len(models) * len(ranks) + 2.6,
                                                      1.5 + 0.22 * len(labels)), squeeze=False, dpi=100)
    for ax, R in zip(axes[0], ranks):
        grid = [[float("nan")] * len(models) for _ in labels]
        for yi, lab in enumerate(labels):
            for xi, m in enumerate(models):
                r = index.get((R, m, lab))
                if r is None:
                    continue
                score, text, frame = cell(r)
                if score is not None:
                    grid[yi][xi] = min(max(score, 0.4), 1.3)
                ax.text(xi, yi, text, ha="center", va="center", fontsize=6,
                        color="black" if score is not None else "#555555")
                if frame:
                    ax.add_patch(Rectangle((xi - 0.5, yi - 0.5), 1, 1, fill=False, ec=frame, lw=1.2))
        ax.imshow(np.ma.masked_invalid(np.array(grid)), cmap=cmap, norm=norm, aspect="auto")
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels(models, rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels if R == ranks[0] else [""] * len(labels), fontsize=6)
        ax.set_title(f"{R} virtual ranks", fontsize=9)
    ceiling = next((num(r["ceiling_gbs"]) for r in measured if num(r["ceiling_gbs"])), None)
    basis = " by minimal bytes" if measured and "min_frac" in measured[0] else ""
    fig.suptitle(f"bench_zoo: % of the copy ceiling{basis}" + (f" ({ceiling:.0f} GB/s, same run)" if ceiling else "") +
                 "; LL T1: µs. Colour: against the row's target (grey: none); red frame: target missed;\n"
                 "grey frame and *: missed and out of reach (the run's latency floor + the row's bytes at the ceiling)",
                 fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    fig.savefig(a.out)
    plt.close(fig)
    print("plot_zoo: wrote", os.path.relpath(a.out, ROOT) if a.out.startswith(ROOT) else a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
