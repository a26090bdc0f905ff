#!/usr/bin/env bash
# device_extra.sh — after scripts/gpu_suite.sh build: compute-sanitizer memcheck of test_route and a
# one-GPU smoke run of the multi-GPU tests and benchmark (EPF_MG_GPUS=1: a 1-rank NCCL team), all
# into one log ($OUT/extra.log; the device tool brings back at most 8 files).
set -u -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OUT=${OUT:-$root/gpu-out}
B=${BUILD_DIR:-build-gpu}
log="$OUT/extra.log"
: >"$log"
NCCL_ROOT=${NCCL_ROOT:-$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)}
export LD_LIBRARY_PATH="$root/.deps/cmocka/usr/lib/x86_64-linux-gnu:${NCCL_ROOT:+$NCCL_ROOT/lib:}${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{
  echo "== compute-sanitizer memcheck test_route"
  compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 "$B/tests/gpu/test_route" 2>&1 |
    grep -E "ERROR SUMMARY|PASSED|FAILED|Invalid"
  for t in tests/multigpu/test_mg_signal tests/multigpu/test_mg_ht tests/multigpu/test_mg_ll tests/bench/bench_mg; do
    echo "== EPF_MG_GPUS=1 $t"
    EPF_MG_GPUS=1 timeout 150 "$B/$t" 2>&1 | tail -40
    echo "exit ${PIPESTATUS[0]}"
  done
} >>"$log" 2>&1
grep -E "^== |exit |ERROR SUMMARY|PASSED|FAILED|tests passed" "$log"
