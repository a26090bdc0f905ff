#!/usr/bin/env python3
"""gen_layout_diagrams.py — the PNG diagrams of docs/layouts.md (matplotlib; pip install matplotlib).

  docs/img/layout_expert_major.png   the EXPERT_MAJOR receive region of one rank
  docs/img/layout_rank_major.png     the RANK_MAJOR receive region + its expert-major expand view
  docs/img/layout_ll_rank_major.png  the low-latency RANK_MAJOR rows [2][R][T] + the packed expert-major view
  docs/img/window_plan.png           one rank's window slice: the plan's regions, in order

The pictures show a small team (R = 4 ranks, 2 local experts each, top-2) so every row is visible;
the rules are the ones in docs/route.md and docs/high-throughput.md. Rerun after changing them:
    python3 scripts/gen_layout_diagrams.py            (every picture)
    python3 scripts/gen_layout_diagrams.py ll_rank_major   (only the named ones)
"""
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parent.parent / "docs" / "img"
SRC_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759"]
PAD = "#d9d9d9"


def box(ax, x, y, w, h, color, text="", fs=7, tc="white"):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor="black", linewidth=0.6))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fs, color=tc)


def save(fig, name):
    OUT.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT / name, dpi=110, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote docs/img/{name} ({(OUT / name).stat().st_size // 1024} KiB)")


def expert_major():
    # rank d = 1 of R = 4, local experts 0 and 1; rows per (source, (token, k)); alignment 4
    segs = [  # (local expert, [(source, token, k), ...])
        (0, [(0, 0, 0), (0, 3, 1), (1, 1, 0), (2, 0, 1), (2, 2, 0), (3, 4, 0)]),
        (1, [(0, 1, 1), (1, 1, 1), (1, 2, 0), (3, 0, 0), (3, 2, 1)]),
    ]
    fig, ax = plt.subplots(figsize=(9, 3.2))
    x = 0
    for le, rows in segs:
        start = x
        for s, t, k in rows:
            box(ax, x, 0, 1, 1, SRC_COLORS[s], f"s{s}\nt{t},k{k}")
            x += 1
        while x % 4:
            box(ax, x, 0, 1, 1, PAD, "pad", tc="black")
            x += 1
        ax.annotate("", xy=(start, 1.35), xytext=(x, 1.35), arrowprops=dict(arrowstyle="<->", lw=0.8))
        ax.text((start + x) / 2, 1.5, f"local expert {le}: RECV_SEGMENT[{le}]",
                ha="center", fontsize=8)
    ax.text(0, -0.45, "row 0", fontsize=7)
    ax.text(x - 1, -0.45, f"row {x - 1}", fontsize=7)
    for s in range(4):
        box(ax, 0.5 + 4 * s, -1.3, 0.5, 0.5, SRC_COLORS[s])
        ax.text(1.1 + 4 * s, -1.05, f"from source rank {s}", fontsize=7, va="center")
    ax.set_xlim(-0.5, x + 0.5)
    ax.set_ylim(-1.6, 1.9)
    ax.axis("off")
    ax.set_title("EXPERT_MAJOR receive region of rank 1: one row per (token, k) copy;\n"
                 "by local expert, then source rank, then the source's (token, k) order;\n"
                 "segments begin at multiples of expert_alignment (4 here); metadata epf_recv_meta_em_t, pad rows src_token = -1", fontsize=9)
    save(fig, "layout_expert_major.png")


def rank_major():
    # rank d = 1: rows by source, then token; each row lists its local experts in k order
    rows = [(0, 0, "e0"), (0, 1, "e1"), (0, 3, "e0"), (1, 1, "e0,e1"), (1, 2, "e1"), (2, 0, "e0"), (2, 2, "e0"),
            (3, 0, "e1"), (3, 2, "e1"), (3, 4, "e0")]
    fig, ax = plt.subplots(figsize=(9, 4.2))
    for i, (s, t, ex) in enumerate(rows):
        box(ax, i, 2.2, 1, 1, SRC_COLORS[s], f"s{s} t{t}\n{ex}")
    ax.text(-0.4, 3.45, "RECV_TOKENS (rank-major): one row per (token, destination rank), by source then token; "
            "RECV_RM_OFFSET[s] = first row of source s", fontsize=8)
    # expand view
    view = [(0, [0, 2, 3, 5, 6, 9]), (1, [1, 3, 4, 7, 8])]
    x = 0
    for le, idx in view:
        start = x
        for i in idx:
            s, t, _ = rows[i]
            box(ax, x, 0, 1, 1, SRC_COLORS[s], f"s{s} t{t}")
            ax.plot([i + 0.5, x + 0.5], [2.2, 1.0], color="gray", lw=0.4)
            x += 1
        ax.text((start + x) / 2, -0.35, f"expert {le}", ha="center", fontsize=8)
        x += 0.3
    ax.text(-0.4, -0.8, "epf_ht_expand -> expert-major view (em_view): the same segments an EXPERT_MAJOR receive "
            "would have, so one grouped GEMM serves both", fontsize=8)
    ax.set_xlim(-0.5, 12)
    ax.set_ylim(-1.1, 3.8)
    ax.axis("off")
    ax.set_title("RANK_MAJOR receive region of rank 1 and its expert-major expand view "
                 "(fewer copies cross the link: one per destination rank)", fontsize=9)
    save(fig, "layout_rank_major.png")


def ll_rank_major():
    # rank d = 1 of R = 4, T = 5, one parity: [R source][T] rows, rows [0, rows_s) valid, each listing
    # its local experts in k order; the expand writes the packed expert-major view [EL][R * T]
    T = 5
    rows = {0: [(0, "e0"), (1, "e1"), (3, "e0")], 1: [(1, "e0,e1"), (2, "e1")], 2: [(0, "e0"), (2, "e0")],
            3: [(0, "e1"), (2, "e1"), (4, "e0")]}
    fig, ax = plt.subplots(figsize=(10, 4.4))
    pos = {}
    for s in range(4):
        for j in range(T):
            x = s * (T + 0.3) + j
            if j < len(rows[s]):
                t, ex = rows[s][j]
                box(ax, x, 2.2, 1, 1, SRC_COLORS[s], f"s{s} t{t}\n{ex}", fs=6)
                pos[(s, j)] = x
            else:
                box(ax, x, 2.2, 1, 1, PAD, "", tc="black")
        ax.text(s * (T + 0.3) + T / 2, 3.35, f"source {s}: rows [0, {len(rows[s])}) of T = {T}", ha="center", fontsize=7)
    ax.text(-0.4, 3.75, "RECV_TOKENS of one parity (rank-major LL): [R source][T] fixed rows, one per (token, rank); "
            "signal word (epoch | rows) per (parity, source)", fontsize=8)
    # the packed view: expert le's copies from source 0, then 1, ... (epf_ll_packed_row)
    view = [(0, [(0, 0), (0, 2), (1, 0), (2, 0), (2, 1), (3, 2)]), (1, [(0, 1), (1, 0), (1, 1), (3, 0), (3, 1)])]
    x = 0
    for le, idx in view:
        start = x
        for s, j in idx:
            t, _ = rows[s][j]
            box(ax, x, 0, 1, 1, SRC_COLORS[s], f"s{s} t{t}", fs=6)
            ax.plot([pos[(s, j)] + 0.5, x + 0.5], [2.2, 1.0], color="gray", lw=0.4)
            x += 1
        ax.text((start + x) / 2, -0.35, f"expert {le}: {len(idx)} rows (expert_counts)", ha="center",
                fontsize=7)
        x += 1.5
    ax.text(-0.4, -0.85, "receive half (packed outputs) or epf_ll_expand -> the packed expert-major view of an "
            "expert-major LL receive: one grouped GEMM for both layouts", fontsize=8)
    ax.set_xlim(-0.5, 4 * (T + 0.3) + 0.5)
    ax.set_ylim(-1.2, 4.1)
    ax.axis("off")
    ax.set_title("Low-latency RANK_MAJOR receive rows of rank 1 (one parity) and the expanded expert-major view",
                 fontsize=9)
    save(fig, "layout_ll_rank_major.png")


def window_plan():
    regions = [
        ("HEADER", "config hash + handshake epochs (fixed size)", 1.0, "#bab0ac"),
        ("SIG_COUNT [R]", "count exchange arrival per source", 0.5, "#9c755f"),
        ("SIG_DISPATCH [R]", "HT dispatch arrival per source", 0.5, "#9c755f"),
        ("SIG_COMBINE [R]", "combine arrival per peer", 0.5, "#9c755f"),
        ("SIG_BARRIER [R]", "team barrier per peer", 0.5, "#9c755f"),
        ("SIG_LL_*", "LL: SIG_LL_DISPATCH / SIG_LL_COMBINE, [2 parity][...] signal words", 0.5, "#9c755f"),
        ("COUNTS", "[2 parity][source][E + R] published counts", 0.8, "#edc948"),
        ("RECV_TOKENS", "HT: recv_capacity rows of row_bytes; LL: [2][EL][R][T] rows", 3.0, "#4e79a7"),
        ("RECV_SCALES", "the rows' scales (compact or swizzled 128x4); empty for BF16", 0.8, "#76b7b2"),
        ("RECV_META", "per-row metadata (source token, rank, k/expert, weight)", 0.8, "#59a14f"),
        ("COMBINE", "combine landing rows (push / LL); else empty", 1.2, "#f28e2b"),
        ("EXPERT_OUT", "HT pull combine: expert outputs when dispatch rows are quantized", 1.6, "#e15759"),
    ]
    fig, ax = plt.subplots(figsize=(8, 6.4))
    y = 0.0
    for name, what, h, color in regions:
        y -= h
        box(ax, 0, y, 3, h, color, name, fs=8)
        ax.text(3.2, y + h / 2, what, va="center", fontsize=8)
    ax.text(-0.1, 0.05, "offset 0", fontsize=7, ha="right")
    ax.text(-0.1, y, "plan.total_bytes", fontsize=7, ha="right", va="bottom")
    ax.set_xlim(-1.2, 10)
    ax.set_ylim(y - 0.3, 0.6)
    ax.axis("off")
    ax.set_title("One rank's window slice (epf_plan_compute): every region starts at a multiple of EPF_ALIGN (256 B);\n"
                 "virtual ranks: R slices back to back in one allocation; NCCL: one slice per rank's symmetric window",
                 fontsize=9)
    save(fig, "window_plan.png")


if __name__ == "__main__":
    ALL = {"expert_major": expert_major, "rank_major": rank_major, "ll_rank_major": ll_rank_major,
           "window_plan": window_plan}
    for name in sys.argv[1:] or list(ALL):
        ALL[name]()
