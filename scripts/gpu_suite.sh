#!/usr/bin/env bash
# gpu_suite.sh — build and run the GPU suite and the benchmarks on a GPU machine that has no
# network (the lent H200). Everything it needs travels with the tree:
#   .deps/cmocka   Debian's libcmocka0 + libcmocka-dev unpacked (scripts/fetch_deps.sh makes it)
#   NCCL           from the machine's Python environment (site-packages/nvidia/nccl), or NCCL_ROOT
# Usage: scripts/gpu_suite.sh [memwatch] [build] [test] [wheel] [bench] [torch] [sanitize] [repro] [shapes]
#                             [shapes_sanitize]   (default: build test bench torch)
#   memwatch         sample the card's used memory every 200 ms while the stages run; the peak goes
#                    to $OUT/gpu.txt (does the suite fit this card?)
#   wheel            the wheel a user installs (WHEEL, default .whl/epfuse-*.whl: built elsewhere by
#                    scripts/build_wheel.sh) into a fresh virtual environment that sees the machine's
#                    packages (PyTorch, nvidia-nccl), no network: pytest python/tests and
#                    examples/python/moe_layer.py ($OUT/wheel.log)
#   repro            the issue reproducers in REPRO_CMDS (one command per line, run with a timeout)
#   shapes           test_shapes, SHAPES_RUNS runs (default 1) of SHAPES_SECONDS each (default 60),
#                    a fresh seed per run ($OUT/shapes.log)
#   shapes_sanitize  compute-sanitizer memcheck of test_shapes --sanitize ($OUT/shapes-sanitize.log)
# Logs go to $OUT (or ./gpu-out): configure.log build.log ctest-gpu.log bench.log torch.log.
# BENCHES="bench_ht bench_ll" / TORCH_SCRIPTS="check_quant_torch.py" / TESTS=regex select a subset;
# TARGETS="test_route bench_route" builds only those targets.
set -u -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OUT=${OUT:-$root/gpu-out}
mkdir -p "$OUT"
stages=${*:-build test bench torch}
has() { case " $stages " in *" $1 "*) return 0 ;; esac; return 1; }

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
CMOCKA_ROOT=${CMOCKA_ROOT:-$root/.deps/cmocka/usr}
if [ -z "${NCCL_ROOT:-}" ]; then
  NCCL_ROOT=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
fi
export LD_LIBRARY_PATH="$CMOCKA_ROOT/lib/x86_64-linux-gnu:${NCCL_ROOT:+$NCCL_ROOT/lib:}${LD_LIBRARY_PATH:-}"
B=${BUILD_DIR:-build-gpu}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
if has memwatch; then
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$OUT/mem.samples" 2>/dev/null &
  memwatch_pid=$!
  memwatch_report() {
    kill "$memwatch_pid" 2>/dev/null
    wait "$memwatch_pid" 2>/dev/null
    echo "peak device memory used: $(sort -n "$OUT/mem.samples" | tail -n 1) MiB of $(nvidia-smi --query-gpu=memory.total --format=csv,noheader)" |
      tee -a "$OUT/gpu.txt"
    rm -f "$OUT/mem.samples"
  }
  trap memwatch_report EXIT
fi

if has build; then
  gen=""; command -v ninja >/dev/null 2>&1 && gen="-G Ninja"
  cmake -S . -B "$B" $gen -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DEPF_BUILD_BENCHMARKS=ON \
        -DCMOCKA_ROOT="$CMOCKA_ROOT" ${NCCL_ROOT:+-DNCCL_ROOT="$NCCL_ROOT"} >"$OUT/configure.log" 2>&1 \
    || { tail -30 "$OUT/configure.log"; exit 1; }
  grep -E "NCCL|cmocka" "$OUT/configure.log" | head -5
  cmake --build "$B" -j "$(nproc)" ${TARGETS:+--target $TARGETS} >"$OUT/build.log" 2>&1 || { grep -E "error|Error" "$OUT/build.log" | head -40; exit 1; }
  echo "build: ok"
fi
if has test; then
  # full output of every test in the log; the summary and failures on the terminal
  ctest --test-dir "$B" -L gpu ${TESTS:+-R "$TESTS"} -V --timeout 900 >"$OUT/ctest-gpu.log" 2>&1
  grep -E "Test +#|tests passed|FAILED|Failed|Timeout|Not Run|\[  FAILED|ERROR|error:" "$OUT/ctest-gpu.log" | tail -60
fi
if has wheel; then
  (
    set -e
    whl=${WHEEL:-$(ls "$root"/.whl/epfuse-*.whl | head -n 1)}
    venv=$(mktemp -d)/venv
    python3 -m venv --system-site-packages "$venv"
    # where python3 is itself a venv (the image's PyTorch environment), --system-site-packages
    # reaches only the base interpreter's: show the new venv python3's site-packages by a .pth
    python3 -c "import site; print('\n'.join(site.getsitepackages()))" \
      >"$("$venv/bin/python" -c "import site; print(site.getsitepackages()[0])")/_machine_site.pth"
    # no network here: the wheel's requirements must already be met by the machine's packages
    "$venv/bin/python" -m pip install --no-index -q "$whl"
    cd "$(dirname "$venv")"
    "$venv/bin/python" -c "import epfuse; epfuse.show_versions()" 2>&1 || "$venv/bin/python" -c "import epfuse; print(epfuse.get_library())"
    "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$root/python/tests"
    "$venv/bin/python" "$root/examples/python/moe_layer.py"
  ) >"$OUT/wheel.log" 2>&1
  echo "wheel: exit $?" | tee -a "$OUT/wheel.log"
  grep -E "passed|failed|error|Error|moe_layer|exit" "$OUT/wheel.log" | tail -15
fi
if has sanitize; then
  for t in ${SANITIZE_TESTS:-}; do
    for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
      # API errors are not reported: NCCL probes features with calls that fail by design (e.g.
      # cuMemCreate without fabric handles); every CUDA call of ours is checked by the tests.
      compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 "$B/tests/gpu/$t" \
        >"$OUT/sanitize-$t-$tool.log" 2>&1
      echo "sanitize $t $tool: exit $?" | tee -a "$OUT/sanitize.log"
      grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$OUT/sanitize-$t-$tool.log" | tee -a "$OUT/sanitize.log"
    done
  done
fi
if has repro; then
  : >"$OUT/repro.log"
  while IFS= read -r cmd; do
    [ -n "$cmd" ] || continue
    echo "== $cmd" | tee -a "$OUT/repro.log"
    # shellcheck disable=SC2086
    timeout "${REPRO_TIMEOUT:-120}" $B/$cmd >>"$OUT/repro.log" 2>&1
    echo "exit $?" | tee -a "$OUT/repro.log"
    grep -E "verify|bit-exact|FAILED|Error|error" "$OUT/repro.log" | tail -2
  done <<<"${REPRO_CMDS:-}"
fi
if has shapes; then
  : >"$OUT/shapes.log"
  for i in $(seq 1 "${SHAPES_RUNS:-1}"); do
    echo "== test_shapes run $i (${SHAPES_SECONDS:-60} s)" | tee -a "$OUT/shapes.log"
    timeout $(( ${SHAPES_SECONDS:-60} + 120 )) "$B/tests/gpu/test_shapes" --seconds "${SHAPES_SECONDS:-60}" >>"$OUT/shapes.log" 2>&1
    echo "exit $?" | tee -a "$OUT/shapes.log"
  done
  grep -E "^seed|seed:|configurations|FAIL|repro|exit" "$OUT/shapes.log" | tail -40
fi
if has shapes_sanitize; then
  compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 "$B/tests/gpu/test_shapes" --sanitize \
    --seconds "${SHAPES_SANITIZE_SECONDS:-90}" >"$OUT/shapes-sanitize.log" 2>&1
  echo "shapes sanitize: exit $?" | tee -a "$OUT/shapes-sanitize.log"
  grep -E "ERROR SUMMARY|configurations|FAIL|Invalid|exit" "$OUT/shapes-sanitize.log" | tail -20
fi
if has bench; then
  : >"$OUT/bench.log"
  for b in "$B"/tests/bench/bench_*; do
    [ -x "$b" ] || continue
    case " ${BENCHES:-$(basename "$b")} " in *" $(basename "$b") "*) ;; *) continue ;; esac
    args_file="tests/bench/$(basename "$b").args" # one argument set per line; none: defaults only
    if [ -f "$args_file" ]; then
      while IFS= read -r args; do
        case "$args" in "#"*|"") continue ;; esac
        echo "== $(basename "$b") $args" | tee -a "$OUT/bench.log"
        # shellcheck disable=SC2086
        "$b" $args 2>&1 | tee -a "$OUT/bench.log"
      done <"$args_file"
    else
      echo "== $(basename "$b")" | tee -a "$OUT/bench.log"
      "$b" 2>&1 | tee -a "$OUT/bench.log"
    fi
  done
fi
if has torch; then
  : >"$OUT/torch.log"
  for s in scripts/check_*_torch.py scripts/bench_*_torch.py; do
    [ -f "$s" ] || continue
    case " ${TORCH_SCRIPTS:-$(basename "$s")} " in *" $(basename "$s") "*) ;; *) continue ;; esac
    echo "== $s" | tee -a "$OUT/torch.log"
    python3 "$s" --build "$B" 2>&1 | tee -a "$OUT/torch.log"
  done
fi
