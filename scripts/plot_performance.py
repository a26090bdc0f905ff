#!/usr/bin/env python3
"""plot_performance.py — the plots of the performance log (docs/dev/perf-log/), from docs/perf-data.csv.

Writes docs/img/perf_quant.png, perf_ht.png and perf_ll.png: fraction of the measured copy ceiling
per implementation (bars), with the µs printed on each bar; and docs/img/perf_route.png: the route
update's time per version (docs/perf-route.csv) against the targets. Re-run after adding measurements:
    python3 scripts/plot_performance.py
Needs matplotlib (pip install matplotlib); uses the Agg backend (no display).
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    rows = []
    with open(os.path.join(ROOT, "docs", "perf-data.csv")) as f:
        for r in csv.DictReader(line for line in f if not line.startswith("#")):
            rows.append(r)
    titles = {
        "quant": "Quantization of [32768, 7168] BF16 on one H200",
        "ht": "HT dispatch / combine, 8 virtual ranks, T=4096, H=7168, top-8 of 256 (one H200)",
        "ll": "LL dispatch / combine, 8 virtual ranks, T=128, H=7168, top-8 of 256 (one H200, copy convention)",
    }
    os.makedirs(os.path.join(ROOT, "docs", "img"), exist_ok=True)
    for group, title in titles.items():
        sel = [r for r in rows if r["group"] == group]
        labels = [f"{r['label']}\n{r['implementation']}" for r in sel]
        frac = [100.0 * float(r["fraction"]) for r in sel]
        colors = ["#2b7bba" if r["implementation"].startswith("epfuse") else "#bbbbbb" for r in sel]
        fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(sel)), 4), dpi=100)
        bars = ax.bar(range(len(sel)), frac, color=colors)
        for b, r in zip(bars, sel):
            ax.text(b.get_x() + b.get_width() / 2, b.get_height() + 1, f"{float(r['us']):.0f} µs",
                    ha="center", va="bottom", fontsize=8)
        ax.axhline(100, color="black", lw=0.8, ls="--")
        ax.set_xticks(range(len(sel)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("% of measured copy ceiling")
        ax.set_ylim(0, 115)
        ax.set_title(title, fontsize=9)
        fig.tight_layout()
        out = os.path.join(ROOT, "docs", "img", f"perf_{group}.png")
        fig.savefig(out)
        plt.close(fig)
        print("wrote", os.path.relpath(out, ROOT))
    plot_route()
    return 0


def plot_route():
    """Route update per version (graph µs per update) with the issue's targets as dashed lines."""
    with open(os.path.join(ROOT, "docs", "perf-route.csv")) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    series = [("T4096_1rank", "T = 4096, 1 rank (target 10 µs)", "#2b7bba", 10.0),
              ("T128_1rank", "T = 128, 1 rank (target 5 µs)", "#d9822b", 5.0),
              ("T4096_8ranks", "T = 4096, 8 virtual ranks", "#888888", None)]
    fig, ax = plt.subplots(figsize=(8, 4), dpi=100)
    x = range(len(rows))
    for key, label, color, target in series:
        # a version measured without a case leaves its cell empty: a gap in that line
        ax.plot(x, [float(r[key]) if r[key].strip() else float("nan") for r in rows], marker="o", color=color,
                label=label)
        if target is not None:
            ax.axhline(target, color=color, lw=0.8, ls="--")
    ax.set_xticks(list(x))
    ax.set_xticklabels([r["version"].replace(" ", "\n") for r in rows], fontsize=7)
    ax.set_ylabel("µs per update (CUDA graph)")
    ax.set_ylim(0, 40)
    ax.set_title("Route update, E = 256, top-8, one H200 (bench_route)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = os.path.join(ROOT, "docs", "img", "perf_route.png")
    fig.savefig(out)
    plt.close(fig)
    print("wrote", os.path.relpath(out, ROOT))


if __name__ == "__main__":
    sys.exit(main())
