#!/usr/bin/env python3
"""gen_perf_tables.py — the tables of docs/performance.md, generated from the CSVs in docs/.

Each table lives in docs/performance.md between two marker lines
    <!-- perf-table:begin NAME -->
    <!-- perf-table:end NAME -->
and is made from one CSV, whose '#' header line (date, machine, commit) is quoted under the table:
    ht      docs/perf-zoo.csv    HT rows at 8 virtual ranks per model, then targets per stage family
    ll      docs/perf-zoo.csv    LL rows at 8 virtual ranks per model, then targets per stage family
The zoo tables show each row's headline fraction: min_frac (minimal bytes / time / copy ceiling,
issue #31) where the CSV has that column, else frac_ceiling (the bytes the implementation moves:
CSVs before issue #31); the source line under the table says which. Application rows (CSV column
app, bench_zoo --apps) are not part of the model-zoo tables or their stage families.
    route   docs/perf-route.csv  the newest measured value of each case
    quant   docs/perf-data.csv   the 'quant' rows
    apps    docs/perf-apps.csv   the application rows (bench_zoo --apps), each beside the benchmarked
                                 path of the same shape it should match (its twin) and the ratio
Usage:
    python3 scripts/gen_perf_tables.py [--root DIR]           rewrite the regions in place
    python3 scripts/gen_perf_tables.py --check [--root DIR]   exit 1 if a region differs from what the
                                                              CSVs give (CTest: test_perf_tables)
After a new measurement: update the CSV and its '#' header line, run without --check, commit both.
"""
import argparse
import csv
import difflib
import pathlib
import re
import sys

PAGE = "docs/performance.md"
BEGIN = re.compile(r"^<!-- perf-table:begin (\w+) -->$")
END = "<!-- perf-table:end {} -->"
MODELS = ["deepseek-v3", "kimi-k2", "qwen3-235b", "qwen3-30b", "gpt-oss-120b", "llama4-maverick", "mixtral-8x22b"]


def read_csv(path):
    """(the '#' header lines without '# ', the rows)"""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    notes = [l[1:].strip() for l in lines if l.startswith("#")]
    rows = list(csv.DictReader(l for l in lines if l and not l.startswith("#")))
    return notes, rows


def source(rel, notes, extra=""):
    text = " ".join(notes).rstrip()
    if text and not text.endswith("."):
        text += "."
    return f"Source: `{rel}` — {text}" + (f" {extra}" if extra else "")


def pct(x):
    return f"{100.0 * float(x):.0f} %"


def zoo_by_case(rows):
    return {r["case"]: r for r in rows}


def frac_key(rows):
    """the headline fraction's column: min_frac when the CSV has it, else frac_ceiling"""
    return "min_frac" if rows and "min_frac" in rows[0] else "frac_ceiling"


def headline(r):
    """a row's headline fraction (a string; empty when not measured)"""
    return r["min_frac"] if "min_frac" in r else r["frac_ceiling"]


def frac_note(rows):
    if frac_key(rows) == "min_frac":
        return "Fractions: minimal bytes (min_frac)."
    return "Fractions: bytes this implementation moves (frac_ceiling; this CSV predates min_frac)."


def zoo_rows(rows):
    """the model-zoo rows (not the application rows of bench_zoo --apps)"""
    return [r for r in rows if not r.get("app")]


def ceilings(rows, mode_prefix):
    vals = sorted({float(r["ceiling_gbs"]) for r in rows if r["mode"].startswith(mode_prefix) and r["ceiling_gbs"]})
    if not vals:
        return "not recorded"
    lo, hi = vals[0], vals[-1]
    return f"{lo:.0f} GB/s" if lo == hi else f"{lo:.0f}–{hi:.0f} GB/s"


def family_table(rows, fams):
    """rows with a target, grouped by fams(row) -> label (None: not counted); met / out of reach / missed"""
    agg = {}
    for r in rows:
        if r["meets"] not in ("yes", "no", "out-of-reach"):
            continue
        key = fams(r)
        if key is None:
            continue
        a = agg.setdefault(key, {"target": r["target"], "n": 0, "met": 0, "oor": 0, "vals": []})
        a["n"] += 1
        a["met"] += r["meets"] == "yes"
        a["oor"] += r["meets"] == "out-of-reach"
        a["vals"].append(float(r["us"]) if r["target"].startswith("<=") else float(headline(r)))
    out = ["| stage family (4, 8, 16 ranks; every model) | target | met | out of reach | missed | range |",
           "| --- | --- | ---: | ---: | ---: | --- |"]
    for key, a in agg.items():
        v = a["vals"]
        rng = f"{min(v):.1f}–{max(v):.1f} µs" if a["target"].startswith("<=") else f"{100 * min(v):.0f}–{100 * max(v):.0f} %"
        tgt = a["target"].replace(">=", "≥ ").replace("<=", "≤ ").replace("us", " µs").replace("%", " %")
        out.append(f"| {key} | {tgt} | {a['met']} / {a['n']} | {a['oor']} | {a['n'] - a['met'] - a['oor']} | {rng} |")
    return out


def ht_family(r):
    mode = "expert-major" if r["mode"] == "ht-em" else "rank-major"
    st, pay = r["stage"], r["payload"]
    if st == "dispatch":
        return f"{mode} dispatch, " + ("BF16" if pay == "bf16" else "quantizing (MXFP8, FP8-128)")
    if st == "dispatch+expand":
        return f"{mode} dispatch + expand (every payload)"
    return {"combine-pull": f"{mode} combine, pull in place",
            "combine-eo": f"{mode} combine, BF16 through an expert-output buffer",
            "combine-mxfp8": f"{mode} combine, MXFP8"}.get(st)


def ll_family(r):
    t = f"T = {r['tokens']}"
    if r["stage"] == "dispatch":
        return f"{t} dispatch, " + ("BF16" if r["payload"] == "bf16" else "quantizing (MXFP8, FP8-128)")
    return f"{t} combine (push, pull, MXFP8, behind a quantized dispatch)"


def table_ht(root):
    rel = "docs/perf-zoo.csv"
    notes, rows = read_csv(root / rel)
    ht = [r for r in zoo_rows(rows) if r["mode"].startswith("ht")]
    by = zoo_by_case(ht)
    cols = [("dispatch BF16", "ht-em", "bf16", "dispatch"),
            ("dispatch MXFP8", "ht-em", "mxfp8", "dispatch"),
            ("dispatch FP8-128", "ht-em", "fp8", "dispatch"),
            ("combine pull", "ht-em", "bf16", "combine-pull"),
            ("combine via buffer", "ht-em", "bf16", "combine-eo"),
            ("combine MXFP8", "ht-em", "bf16", "combine-mxfp8"),
            ("RM dispatch + expand", "ht-rm", "bf16", "dispatch+expand"),
            ("RM combine", "ht-rm", "bf16", "combine-eo")]
    out = ["| model (H, top-k of E) | " + " | ".join(c[0] for c in cols) + " |",
           "| --- |" + " ---: |" * len(cols)]
    for m in MODELS:
        cells, shape = [], ""
        for _, mode, pay, st in cols:
            ks = [k for k in by if k.startswith(f"{m}/R8/{mode}/") and k.endswith(f"/{pay}/{st}")]
            r = by[ks[0]] if ks else None
            if r and not shape:
                shape = f" ({r['hidden']}, {r['topk']} of {r['experts']})"
            cells.append(pct(headline(r)) if r and headline(r) else "—")
        out.append(f"| {m}{shape} | " + " | ".join(cells) + " |")
    out += ["", *family_table(ht, ht_family), "",
            source(rel, notes, f"Copy ceiling of the HT rows: {ceilings(ht, 'ht')}. {frac_note(ht)}")]
    return out


def table_ll(root):
    rel = "docs/perf-zoo.csv"
    notes, rows = read_csv(root / rel)
    ll = [r for r in zoo_rows(rows) if r["mode"] == "ll"]
    by = zoo_by_case(ll)

    def us(m, t, pay, st):
        r = by.get(f"{m}/R8/ll/T{t}/{pay}/{st}")
        return f"{float(r['us']):.1f}" if r and r["us"] else "—"

    def frac(m, t, pay, st):
        r = by.get(f"{m}/R8/ll/T{t}/{pay}/{st}")
        if not r or not headline(r):
            return "—"
        b = f" ({100 * float(r['bound_frac']):.0f})" if r["bound_frac"] else ""
        return f"{float(r['us']):.1f} µs, {pct(headline(r))}{b}"

    out = ["| model | T = 1 BF16 µs: dispatch / pull / push | T = 128 dispatch BF16 | T = 128 combine pull | T = 128 combine push | "
           "T = 128 dispatch MXFP8 |",
           "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for m in MODELS:
        t1 = " / ".join(us(m, 1, "bf16", s) for s in ("dispatch", "combine-pull", "combine-push"))
        out.append(f"| {m} | {t1} | {frac(m, 128, 'bf16', 'dispatch')} | {frac(m, 128, 'bf16', 'combine-pull')} | "
                   f"{frac(m, 128, 'bf16', 'combine-push')} | {frac(m, 128, 'mxfp8', 'dispatch')} |")
    out += ["", *family_table(ll, ll_family), "",
            source(rel, notes, f"Copy ceiling of the LL rows: {ceilings(ll, 'll')}. {frac_note(ll)}")]
    return out


def table_route(root):
    rel = "docs/perf-route.csv"
    notes, rows = read_csv(root / rel)
    cases = [("T4096_1rank", "1 rank, T = 4096", "≤ 10 µs"),
             ("T128_1rank", "1 rank, T = 128", "≤ 5 µs"),
             ("T4096_8ranks", "8 virtual ranks, T = 4096 per rank", "—")]
    out = ["| full update (counts, slots, count exchange, offsets), E = 256, top-8 | µs per update in a CUDA graph "
           "| target | version (commit) |",
           "| --- | ---: | --- | --- |"]
    for key, label, tgt in cases:
        r = next((r for r in reversed(rows) if r[key].strip()), None)
        if r is None:
            out.append(f"| {label} | — | {tgt} | — |")
            continue
        v = float(r[key])
        met = ""
        if tgt.startswith("≤"):
            met = " (met)" if v <= float(tgt.split()[1]) else " (**missed**)"
        out.append(f"| {label} | {v:.2f} | {tgt}{met} | {r['version']} ({r['commit']}) |")
    out += ["", source(rel, notes)]
    return out


def table_quant(root):
    rel = "docs/perf-data.csv"
    notes, rows = read_csv(root / rel)
    q = [r for r in rows if r["group"] == "quant"]
    impls = []
    for r in q:
        if r["implementation"] not in impls:
            impls.append(r["implementation"])
    labels = []
    for r in q:
        if r["label"] not in labels:
            labels.append(r["label"])
    out = ["| format | " + " | ".join(impls) + " |",
           "| --- |" + " ---: |" * len(impls)]
    for lab in labels:
        cells = []
        for im in impls:
            r = next((r for r in q if r["label"] == lab and r["implementation"] == im), None)
            cells.append(f"{float(r['us']):.1f} µs, {pct(r['fraction'])}" if r else "—")
        out.append(f"| {lab} | " + " | ".join(cells) + " |")
    out += ["", source(rel, notes)]
    return out



def app_twin(case, by_case):
    """the benchmarked path of the same shape an application row should match: a GEMM-ready scale
    layout's dispatch -> the COMPACT one; a combine through a buffer (or LL fixed y) -> the in-place
    pull of the same tag (or, HT, the window combine); a backward stage -> its forward twin (the
    in-place dispatch-backward: the in-place pull combine; push: the combine through the buffer)"""
    parts = case.split("/")
    tag, stage = parts[-2], parts[-1]
    base = "/".join(parts[:-2])
    cands = []
    if stage == "dispatch" and tag.endswith(("-segmn", "-swz")):
        cands.append(f"{base}/{tag.rsplit('-', 1)[0]}-compact/dispatch")
    if stage in ("combine-eo", "combine-fixed"):
        cands += [f"{base}/{tag}/combine-window", f"{base}/{tag}/combine-pull", f"{base}/bf16/combine-pull"]
    if stage == "dispatch-backward":
        cands += [f"{base}/{tag}/combine-eo"]
    if stage == "dispatch-backward-inplace":  # dx rows over the receive rows: the in-place pull combine
        cands += [f"{base}/{tag}/combine-pull", f"{base}/{tag}/combine-eo"]
    if stage == "combine-backward":
        cands += [f"{base}/{tag}/dispatch"]
    if stage == "combine-backward+expand":
        cands += [f"{base}/{tag}/dispatch+expand"]
    for c in cands:
        if c in by_case and c != case:
            return by_case[c]
    return None


def table_apps(root):
    rel = "docs/perf-apps.csv"
    notes, rows = read_csv(root / rel)
    rows = [r for r in rows if r.get("app")]
    by_case = zoo_by_case(rows)
    out = ["| example | row | µs | % (min bytes) | benchmarked twin | twin µs | ratio |",
           "| --- | --- | ---: | ---: | --- | ---: | ---: |"]
    for r in rows:
        t = app_twin(r["case"], by_case)
        # a push twin of a pull row, a rank-major twin of an expert-major one: in the CSV
        if (t is None or "-push/" in r["case"] or "/ht-rm/" in r["case"] or "-compact/combine-eo" in r["case"]
                or (r["app"] == "python-ll" and r["tokens"] != "128")):
            continue
        name = "/".join([r["case"].split("/")[-4]] + r["case"].split("/")[-2:])
        tname = "/".join(t["case"].split("/")[-2:])
        ratio = float(r["us"]) / float(t["us"]) if float(t["us"]) > 0 else float("nan")
        out.append(f"| {r['app']} | {name} (T {r['tokens']}) | {float(r['us']):.0f} | {pct(r['min_frac'])} | {tname} | "
                   f"{float(t['us']):.0f} | {ratio:.2f}× |")
    out += ["", source(rel, notes)]
    return out

TABLES = {"ht": table_ht, "ll": table_ll, "route": table_route, "quant": table_quant, "apps": table_apps}


def render(text, root):
    """the page with every region regenerated; raises ValueError on a malformed page"""
    lines = text.split("\n")
    out, seen, i = [], [], 0
    while i < len(lines):
        m = BEGIN.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        name = m.group(1)
        if name not in TABLES:
            raise ValueError(f"{PAGE}:{i + 1}: unknown table '{name}' (known: {', '.join(TABLES)})")
        if name in seen:
            raise ValueError(f"{PAGE}:{i + 1}: table '{name}' appears twice")
        seen.append(name)
        end = END.format(name)
        j = i + 1
        while j < len(lines) and lines[j] != end:
            if BEGIN.match(lines[j]):
                raise ValueError(f"{PAGE}:{j + 1}: region '{name}' is not closed before the next one")
            j += 1
        if j == len(lines):
            raise ValueError(f"{PAGE}:{i + 1}: no '{end}' line")
        out += [lines[i], *TABLES[name](root), lines[j]]
        i = j + 1
    missing = [n for n in TABLES if n not in seen]
    if missing:
        raise ValueError(f"{PAGE}: no region for table(s) {', '.join(missing)}")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parent.parent))
    ap.add_argument("--check", action="store_true", help="exit 1 if the page's tables differ from the CSVs")
    a = ap.parse_args()
    root = pathlib.Path(a.root)
    page = root / PAGE
    text = page.read_text(encoding="utf-8")
    try:
        new = render(text, root)
    except (ValueError, OSError, KeyError) as e:
        print(f"gen_perf_tables: {e}")
        return 1
    if a.check:
        if new != text:
            diff = difflib.unified_diff(text.split("\n"), new.split("\n"), PAGE, PAGE + " (from the CSVs)", lineterm="", n=0)
            print("\n".join(list(diff)[:40]))
            print(f"gen_perf_tables: {PAGE} differs from the CSVs; run python3 scripts/gen_perf_tables.py")
            return 1
        print(f"gen_perf_tables: {PAGE}: {len(TABLES)} tables match the CSVs")
        return 0
    if new != text:
        page.write_text(new, encoding="utf-8")
        print(f"gen_perf_tables: rewrote the tables of {PAGE}")
    else:
        print(f"gen_perf_tables: {PAGE} already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
