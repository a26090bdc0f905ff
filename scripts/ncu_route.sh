#!/usr/bin/env bash
# ncu_route.sh — Nsight Compute profile of one route update (bench_route --profile R T) on the
# GPU machine: the details page (duration, warp-state stalls, instruction statistics) and the
# SASS source page with the warp-state samples per instruction (bench code is built -lineinfo).
# Usage: OUT=dir scripts/ncu_route.sh build-dir "R T" ["R T" ...]; writes $OUT/ncu.tgz.
set -u -o pipefail
B=$1; shift
OUT=${OUT:-gpu-out}
tmp=$(mktemp -d)
for cfg in "$@"; do
  set -- $cfg
  tag="r$1-t$2"
  ncu --clock-control none --cache-control none --kernel-name epf__route_update_kernel --launch-skip 20 \
      --launch-count 1 --set full --import-source yes --warp-sampling-interval 0 -f -o "$tmp/$tag" \
      "$B/tests/bench/bench_route" --profile "$1" "$2" >"$tmp/$tag-run.log" 2>&1
  echo "ncu $tag: exit $?"
  ncu --import "$tmp/$tag.ncu-rep" --page details >"$tmp/$tag-details.txt" 2>&1
  ncu --import "$tmp/$tag.ncu-rep" --page source --csv --print-source sass >"$tmp/$tag-sass.csv" 2>&1 ||
    ncu --import "$tmp/$tag.ncu-rep" --page source --csv >"$tmp/$tag-sass.csv" 2>&1
  grep -E "Duration|Elapsed Cycles|SM Frequency|Registers|Warp Cycles Per Issued|Issued Ipc" "$tmp/$tag-details.txt" | head -12
done
tar -C "$tmp" -czf "$OUT/ncu.tgz" --exclude='*.ncu-rep' .
ls -la "$OUT/ncu.tgz"
