#!/usr/bin/env python3
"""zoo_summary.py — the model-zoo summary tables of the performance log (docs/dev/perf-log/zoo.md), from
bench_zoo's CSV (docs/performance.md's tables come from scripts/gen_perf_tables.py).

Usage: python3 scripts/zoo_summary.py [docs/perf-zoo.csv]
Prints markdown: (1) targets met, out of reach (bench_zoo's bound) and missed per stage family, (2) one row per model at 8 virtual ranks with the
headline stages (fraction of the copy ceiling; LL: microseconds at T = 1 and the fraction at
T = 128), (3) the application rows (bench_zoo --apps: CSV column app), each with both fractions,
so the page's tables are regenerated, not typed.
Fractions: min_frac (minimal bytes / time / copy ceiling, issue #31) where the CSV has that column,
else frac_ceiling (the bytes the implementation moves; CSVs before issue #31).
"""
import collections
import csv
import sys


def headline(r):
    """the row's headline fraction as a string ('' when not measured)"""
    return r["min_frac"] if "min_frac" in r else r["frac_ceiling"]


def family(r):
    st, mode = r["stage"], r["mode"]
    if mode == "ll":
        if st == "dispatch":
            return f"LL T={r['tokens']} dispatch ({'quantized' if r['payload'] != 'bf16' else 'bf16'})"
        return f"LL T={r['tokens']} combine (all variants)"
    if st == "dispatch" and r["payload"] != "bf16":
        return f"HT {mode} dispatch (quantizing)"
    return f"HT {mode} {st}"


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "docs/perf-zoo.csv"
    with open(path) as f:  # '#' lines: provenance notes, not rows
        every = list(csv.DictReader(line for line in f if not line.startswith("#")))
    rows = [r for r in every if not r.get("app")]  # the model zoo; the application rows last
    apps = [r for r in every if r.get("app")]
    fam = collections.OrderedDict()
    for r in rows:
        if r["meets"] not in ("yes", "no", "out-of-reach"):
            continue
        f = fam.setdefault(family(r), [0, 0, [], "", 0, []])
        f[0] += r["meets"] == "yes"
        f[1] += 1
        if r["meets"] == "out-of-reach":
            f[4] += 1
            f[5].append(float(r["bound_frac"]))
        f[2].append(float(headline(r) or 0) if not r["target"].startswith("<=") else float(r["us"]))
        f[3] = r["target"]
    met = sum(v[0] for v in fam.values())
    tot = sum(v[1] for v in fam.values())
    oor = sum(v[4] for v in fam.values())
    print(f"Targets met: **{met} of {tot}** rows with a target; **{oor}** more out of reach (their bound, "
          f"the run's latency floor plus their bytes at the copy ceiling, is below the target); "
          f"**{tot - met - oor}** missed ({len(rows)} rows in all).\n")
    print("| stage family | target | met | out of reach (bound) | missed | range |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for k, (m, n, vals, tgt, no, bounds) in fam.items():
        if tgt.startswith("<="):
            rng = f"{min(vals):.1f}–{max(vals):.1f} µs"
        else:
            rng = f"{100 * min(vals):.0f}–{100 * max(vals):.0f} %"
        bnd = f"{no} ({100 * min(bounds):.0f}–{100 * max(bounds):.0f} %)" if no else "0"
        print(f"| {k} | {tgt} | {m} / {n} | {bnd} | {n - m - no} | {rng} |")
    print()
    by = {r["case"]: r for r in rows}
    models = []
    for r in rows:
        if r["model"] not in models:
            models.append(r["model"])
    cols = [("HT em dispatch bf16", "ht-em", "bf16", "dispatch"),
            ("HT em dispatch mxfp8", "ht-em", "mxfp8", "dispatch"),
            ("HT em combine pull", "ht-em", "bf16", "combine-pull"),
            ("HT em combine via buffer", "ht-em", "bf16", "combine-eo"),
            ("HT em combine mxfp8", "ht-em", "bf16", "combine-mxfp8"),
            ("HT rm dispatch+expand", "ht-rm", "bf16", "dispatch+expand"),
            ("HT rm combine", "ht-rm", "bf16", "combine-eo")]
    print("8 virtual ranks, HT at 4096 tokens per rank (fraction of the copy ceiling); LL BF16 dispatch / "
          "push combine at T = 1 (µs) and T = 128 (fraction of issued bytes):\n")
    print("| model | " + " | ".join(c[0] for c in cols) + " | LL T=1 µs | LL T=128 |")
    print("| --- |" + " ---: |" * (len(cols) + 2))
    for mdl in models:
        cells = []
        for _, mode, pay, st in cols:
            ks = [k for k in by if k.startswith(f"{mdl}/R8/{mode}/") and k.endswith(f"/{pay}/{st}")]
            cells.append(f"{100 * float(headline(by[ks[0]]) or 0):.0f} %" if ks else "—")
        d1 = by.get(f"{mdl}/R8/ll/T1/bf16/dispatch")
        c1 = by.get(f"{mdl}/R8/ll/T1/bf16/combine-push")
        d128 = by.get(f"{mdl}/R8/ll/T128/bf16/dispatch")
        c128 = by.get(f"{mdl}/R8/ll/T128/bf16/combine-push")
        ll1 = f"{float(d1['us']):.1f} / {float(c1['us']):.1f}" if d1 and c1 else "—"
        ll128 = (f"{100 * float(headline(d128) or 0):.0f} / {100 * float(headline(c128) or 0):.0f} %"
                 if d128 and c128 else "—")
        print(f"| {mdl} | " + " | ".join(cells) + f" | {ll1} | {ll128} |")
    if apps:
        print("\nApplication rows (bench_zoo --apps; the app's configuration, beside its twins): µs, % of the copy "
              "ceiling by minimal bytes and by the bytes moved (HT) / issued (LL):\n")
        print("| app | case | µs | minimal | moved / issued | target | meets |")
        print("| --- | --- | ---: | ---: | ---: | --- | --- |")
        for r in apps:
            us = f"{float(r['us']):.1f}" if r["us"] else "—"
            mf = f"{100 * float(r['min_frac']):.0f} %" if r["min_frac"] else "—"
            hf = f"{100 * float(r['frac_ceiling']):.0f} %" if r["frac_ceiling"] else "—"
            print(f"| {r['app']} | {r['case'][len(r['app']) + 1:]} | {us} | {mf} | {hf} | {r['target']} | {r['meets']} |")


if __name__ == "__main__":
    main()
