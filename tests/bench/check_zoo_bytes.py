#!/usr/bin/env python3
"""check_zoo_bytes.py — bench_zoo's minimal-bytes formulas (issue #31 §1) against values worked out
by hand, on the host (CTest bench_zoo_min_bytes, label unit: no GPU).

    python3 tests/bench/check_zoo_bytes.py build/tests/bench/bench_zoo

Runs `bench_zoo --list --quick --csv FILE` and checks:
  1. rows whose minimum does not depend on the routing (K distinct experts per token, all routed,
     so routed = R * T * K) equal the numbers below, each derived in its comment from the shape:
     H hidden, 2H a BF16 row; FP8-128 and MXFP8 rows are H bytes + H/128 * 4 or H/32 scale bytes;
  2. a rank-major expand's minimum is its dispatch's copies read once plus every routed copy
     written: expand = (dispatch - R*T*2H) + routed * row (BF16: no scales);
  3. every row: 0 < min_bytes <= hbm_bytes (no implementation moves less than the minimum; the
     HT "moved" / LL "issued" count is one implementation's), min_frac empty (nothing measured),
     and the app column is the row name's first field exactly for application rows.
Exit 0 when all hold, 1 otherwise (each failure printed).
"""
import csv
import os
import subprocess
import sys
import tempfile

# DeepSeek-V3 (H 7168, top-8), 8 ranks, T 512: tokens R*T = 4096, routed 32768
DS_X = 4096 * 14336                       # 58,720,256: every token read once (2H = 14336)
DS_FP8_COPY = 7168 + 7168 // 128 * 4      # 7,392: E4M3 row + 56 FP32 scales
DS_MX_COPY = 7168 + 7168 // 32            # 7,392: E4M3 row + 224 E8M0 scales
DS_COMBINE = 32768 * 14336 + DS_X         # 528,482,304: the K rows of every token read, one written
# qwen3-30b (H 2048, top-8), 4 ranks, T 512 / LL T 128
# h2048-e64-k4 (examples/03, examples/python/moe_layer.py): 8 ranks, T 512: 4096 tokens, 16384 routed

EXPECT = {
    # dispatch: R*T*2H + routed * (row + scales)
    "ex05/deepseek-v3/R8/ht-em/T512/fp8-segmn/dispatch": DS_X + 32768 * DS_FP8_COPY,       # 300,941,312
    "ex05/deepseek-v3/R8/ht-em/T512/fp8-compact/dispatch": DS_X + 32768 * DS_FP8_COPY,     # same bytes, other layout
    "ex05-mxfp8/deepseek-v3/R8/ht-em/T512/mxfp8-swz/dispatch": DS_X + 32768 * DS_MX_COPY,  # 300,941,312
    "ex05/deepseek-v3/R8/ht-em/T512/bf16/dispatch": DS_X + 32768 * 14336,                  # 528,482,304
    # combine: routed * crow + R*T*2H, whatever the variant (in place, buffer, window)
    "ex05/deepseek-v3/R8/ht-em/T512/fp8-segmn/combine-eo": DS_COMBINE,
    "ex05/deepseek-v3/R8/ht-em/T512/fp8-segmn/combine-window": DS_COMBINE,
    "ex05/deepseek-v3/R8/ht-em/T512/bf16/combine-pull": DS_COMBINE,
    "ex06/deepseek-v3/R8/ht-rm/T512/bf16-push/combine-eo": DS_COMBINE,
    # backward of combine = a BF16 dispatch of dy; RANK_MAJOR with its expand: the expert-major rows
    "ex06/deepseek-v3/R8/ht-em/T512/bf16-pull/combine-backward": DS_X + 32768 * 14336,
    "ex06/deepseek-v3/R8/ht-rm/T512/bf16-pull/combine-backward+expand": DS_X + 32768 * 14336,
    "ex06/deepseek-v3/R8/ht-rm/T512/bf16-pull/dispatch+expand": DS_X + 32768 * 14336,
    # backward of dispatch = a combine + the router-weight gradient: routed FP32 read, R*T*K FP32 written
    "ex06/deepseek-v3/R8/ht-em/T512/bf16-pull/dispatch-backward": DS_COMBINE + 32768 * 4 + 4096 * 8 * 4,  # 528,744,448
    # ... wherever its dx rows are: in place over the receive rows (ex06 --dx-out window) the same
    # minimum as through the buffer, and that of the in-place pull combine (its forward twin) + the gradient
    "ex06/deepseek-v3/R8/ht-em/T512/bf16-pull/dispatch-backward-inplace": DS_COMBINE + 32768 * 4 + 4096 * 8 * 4,
    "ex06/deepseek-v3/R8/ht-em/T512/bf16-pull/combine-pull": DS_COMBINE,
    # examples/python/moe_layer.py, examples/03: H 2048 (2H 4096)
    "python-moe_layer/h2048-e64-k4/R8/ht-em/T512/bf16/combine-eo": 16384 * 4096 + 4096 * 4096,  # 83,886,080
    "ex03/h2048-e64-k4/R8/ht-em/T512/mxfp8/dispatch": 4096 * 4096 + 16384 * (2048 + 64),        # 51,380,224
    # the Python package's LL path, DeepSeek-V3, 8 ranks: T 1 (8 tokens, 64 copies), T 128 (1024, 8192)
    "python-ll/deepseek-v3/R8/ll/T1/bf16/dispatch": 8 * 14336 + 64 * 14336,                 # 1,032,192
    "python-ll/deepseek-v3/R8/ll/T128/bf16/combine-fixed": 8192 * 14336 + 1024 * 14336,     # 132,120,576
    # model-zoo rows: qwen3-30b, 4 ranks (H 2048): HT T 512 (2048 tokens, 16384 copies), LL T 128 (512, 4096)
    "qwen3-30b/R4/ht-em/T512/bf16/dispatch": 2048 * 4096 + 16384 * 4096,                    # 75,497,472
    "qwen3-30b/R4/ht-em/T512/mxfp8/combine-mxfp8": 16384 * (2048 + 64) + 2048 * 4096,       # the MXFP8 combine row: 2112
    "qwen3-30b/R4/ll/T128/mxfp8/dispatch": 512 * 4096 + 4096 * (2048 + 64),                 # 10,747,904
}


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "zoo.csv")
        p = subprocess.run([sys.argv[1], "--list", "--quick", "--csv", path], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
        if p.returncode != 0:
            print(f"bench_zoo --list --quick exited {p.returncode}:\n{p.stderr}")
            return 1
        with open(path) as f:
            rows = {r["case"]: r for r in csv.DictReader(f)}
    bad = 0
    for case, want in EXPECT.items():
        r = rows.get(case)
        if r is None:
            print(f"FAIL {case}: not listed")
            bad += 1
        elif int(r["min_bytes"]) != want:
            print(f"FAIL {case}: min_bytes {r['min_bytes']}, by hand {want}")
            bad += 1
    for pre in ("ex06/deepseek-v3/R8/ht-rm/T512/bf16-pull/", "qwen3-30b/R4/ht-rm/T512/bf16/"):
        disp, exp = rows.get(pre + "dispatch"), rows.get(pre + "expand")
        x = 4096 * 14336 if pre.startswith("ex06") else 2048 * 4096
        row, routed = (14336, 32768) if pre.startswith("ex06") else (4096, 16384)
        if disp is None or exp is None or int(exp["min_bytes"]) != int(disp["min_bytes"]) - x + routed * row:
            print(f"FAIL {pre}expand: not (dispatch - R*T*2H) + routed * row")
            bad += 1
    apps = {"ex05", "ex05-mxfp8", "ex06", "ex03", "python-moe_layer", "python-ll"}
    for case, r in rows.items():
        mb, hb = float(r["min_bytes"]), float(r["hbm_bytes"])
        first = case.split("/")[0]
        if not 0 < mb <= hb:
            print(f"FAIL {case}: min_bytes {mb:.0f} not in (0, hbm_bytes {hb:.0f}]")
            bad += 1
        if r["min_frac"] != "":
            print(f"FAIL {case}: min_frac '{r['min_frac']}' in a listing")
            bad += 1
        if r["app"] != (first if first in apps else ""):
            print(f"FAIL {case}: app '{r['app']}'")
            bad += 1
    n_app = sum(1 for r in rows.values() if r["app"])
    print(f"check_zoo_bytes: {len(rows)} rows ({n_app} application rows), {len(EXPECT)} minimums by hand, "
          f"{'all hold' if not bad else f'{bad} failures'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
