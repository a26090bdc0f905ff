#!/usr/bin/env bash
# scripts/check_nccl_versions.sh — compile epfuse's NCCL headers against several NCCL releases
#
#   scripts/check_nccl_versions.sh [VERSION...]
#
# VERSION: "toolkit" (the NCCL next to nvcc, or under NCCL_ROOT), "latest" (the newest
# nvidia-nccl-cu13 wheel on PyPI), or an exact wheel version such as 2.30.7. Default:
# "toolkit latest".
#
# For each NCCL it compiles, without running anything (no GPU needed):
#   - include/epfuse/host_nccl.h as C11 and as C++17 (-Werror);
#   - include/epfuse/core/nccl.cuh + host_nccl.h in a CUDA translation unit whose kernel and host
#     function use every function of core/nccl.cuh, to an object for sm_90;
#   - examples/02_nccl_ranks/main.cu to an object, then links it against that release's libnccl.
# The translation unit checks NCCL_VERSION_CODE, so a stray nccl.h (the toolkit's) cannot stand in
# for the release under test. Wheels are unpacked (headers and libnccl only) into
# $EPF_NCCL_CACHE (default: build/nccl-versions in the repository).
#
# Exit: 0 when every NCCL that could be obtained compiled; 1 when one failed to compile. A wheel
# that cannot be obtained because PyPI is unreachable is reported as "SKIPPED: no network" and
# does not fail the run.
#
# Environment: NVCC (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc), CC / CXX (default
# cc / c++), NCCL_ROOT, EPF_NCCL_CACHE, EPF_NCCL_PACKAGE (default nvidia-nccl-cu13),
# EPF_NCCL_ARCH (default sm_90), PYTHON (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

pkg=${EPF_NCCL_PACKAGE:-nvidia-nccl-cu13}
arch=${EPF_NCCL_ARCH:-sm_90}
cache=${EPF_NCCL_CACHE:-$repo/build/nccl-versions}
python=${PYTHON:-python3}
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
cc=${CC:-cc}
cxx=${CXX:-c++}
cuda_home=$(cd "$(dirname "$nvcc")/.." && pwd)
cuda_inc="$cuda_home/include"

if [ ! -x "$nvcc" ]; then
  echo "check_nccl_versions: no nvcc (set NVCC)" >&2
  exit 1
fi
mkdir -p "$cache" || exit 1
work=$(mktemp -d "${TMPDIR:-/tmp}/epf-nccl-check.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT

compiled=()
failed=()
skipped=()
cur_inc=""

# nccl_version_code <include dir>: NCCL_VERSION_CODE from its nccl.h
nccl_version_code() {
  sed -n 's/^#define NCCL_VERSION_CODE \([0-9][0-9]*\).*/\1/p' "$1/nccl.h" | head -n 1
}
nccl_version_string() {
  local inc=$1
  printf '%s.%s.%s' \
    "$(sed -n 's/^#define NCCL_MAJOR \([0-9]*\).*/\1/p' "$inc/nccl.h")" \
    "$(sed -n 's/^#define NCCL_MINOR \([0-9]*\).*/\1/p' "$inc/nccl.h")" \
    "$(sed -n 's/^#define NCCL_PATCH \([0-9]*\).*/\1/p' "$inc/nccl.h")"
}

# The CUDA translation unit: every function of core/nccl.cuh, device and host.
cat >"$work/nccl_check.cu" <<'EOF'
#include "epfuse/core/nccl.cuh"
#include "epfuse/host_nccl.h"
#if NCCL_VERSION_CODE != EPF_EXPECT_NCCL_VERSION_CODE
#error "this nccl.h is not the release under test (include order)"
#endif
__global__ void epf_nccl_check_kernel(ncclDevComm_t dev, ncclWindow_t win, epf_team_t* out) {
  epf_team_t t = epf_team_from_devcomm(&dev, win);
  epf_team_t u = epf_team_from_window(win, dev.lsaRank, dev.lsaSize);
  epf_lsa_barrier_sync_block(&dev, blockIdx.x);
  if (threadIdx.x == 0) out[blockIdx.x] = t.stride == u.stride ? t : u;
}
int epf_nccl_check_host(ncclComm_t comm, ncclDevComm_t* dev, ncclWindow_t win, epf_team_t* team) {
  epf_status_t st = epf_nccl_devcomm_create(comm, 1, 10.0, dev);
  if (st == EPF_OK) st = epf_nccl_team_query(dev, win, 0, team);
  if (st == EPF_OK) st = epf_nccl_devcomm_destroy(comm, dev);
  return (int)st;
}
EOF
printf '#include "epfuse/host_nccl.h"\nint epf_nccl_check_anchor(void);\nint epf_nccl_check_anchor(void) { return 0; }\n' \
  >"$work/host_nccl_check.c"
cp "$work/host_nccl_check.c" "$work/host_nccl_check.cpp"

# step <what> <log> <command...>: run one compile. With warnings as errors first; when only that
# fails, again without -Werror (NCCL's own headers are not always -Wextra clean): "ok, with
# warnings" and the warnings are shown, but it is not a failure. Sets step_ok.
step() {
  local what=$1 log=$2 relaxed=() a
  shift 2
  step_ok=1
  if "$@" >"$log" 2>&1; then
    echo "  $what: ok"; return
  fi
  for a in "$@"; do
    case "$a" in -Werror|-Werror=all-warnings) ;; *) relaxed+=("$a") ;; esac
  done
  if "${relaxed[@]}" >"$log.relaxed" 2>&1; then
    # diagnostics with a location: file:line:col: (gcc) or file(line): (nvcc's front end)
    local diags ours
    diags=$(grep -E '^[^ ]+(:[0-9]+:[0-9]+|\([0-9]+\)): (warning|error)' "$log")
    ours=$(printf '%s\n' "$diags" | grep -v -F "$cur_inc/" | grep -v '^$')
    if [ -n "$diags" ] && [ -z "$ours" ]; then
      echo "  $what: ok ($(printf '%s\n' "$diags" | wc -l) warnings, all inside NCCL's own headers)"
    else
      echo "  $what: ok, with warnings:"; sed 's/^/    /' "$log" | head -n 40
    fi
    return
  fi
  echo "  $what: FAILED"; sed 's/^/    /' "$log.relaxed" | head -n 80
  step_ok=0
}

# check <label> <include dir> <library file>: compile everything against that NCCL
check() {
  local label=$1 inc=$2 lib=$3 code ver d ok=1 nccl_inc
  code=$(nccl_version_code "$inc")
  ver=$(nccl_version_string "$inc")
  if [ -z "$code" ] || [ ! -f "$inc/nccl_device.h" ]; then
    echo "NCCL $label: $inc has no nccl.h with the device API (nccl_device.h)"
    failed+=("$label")
    return
  fi
  d="$work/$label"
  mkdir -p "$d"
  # A wheel's include directory goes first (-I, not -isystem: nvcc's own include directory, which
  # may hold the toolkit's nccl.h, comes before every -isystem directory). The toolkit's is nvcc's
  # own: -isystem, as the project's build has it (its device headers are not -Wextra clean).
  if [ "$inc" = "$cuda_inc" ]; then nccl_inc=(-isystem "$inc"); else nccl_inc=(-I "$inc"); fi
  cur_inc=$inc
  echo "NCCL $label ($ver, $inc):"
  local common=("${nccl_inc[@]}" -I "$repo/include")
  # Some wheels (2.28.7) ship nccl_device.h's GIN GDAKI transport without the DOCA GPUNetIO
  # headers it includes; epfuse uses no GIN, so that transport is switched off (NCCL's own macro).
  if [ -f "$inc/nccl_device/gin/gdaki/gin_gdaki.h" ] &&
     grep -q 'doca_gpunetio/doca_gpunetio_device.h' "$inc/nccl_device/gin/gdaki/gin_gdaki.h" &&
     [ ! -f "$inc/nccl_device/gin/gdaki/doca_gpunetio/doca_gpunetio_device.h" ]; then
    common+=(-DNCCL_GIN_GDAKI_ENABLE=0)
    echo "  note: this NCCL lacks the DOCA GPUNetIO headers nccl_device.h includes: -DNCCL_GIN_GDAKI_ENABLE=0"
  fi
  local cuflags=(-std=c++17 -arch="$arch" -Werror=all-warnings -Xcompiler=-Wall,-Wextra)
  step "host_nccl.h (C11)" "$d/c.log" "$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror "${common[@]}" \
    -isystem "$cuda_inc" -fsyntax-only "$work/host_nccl_check.c"
  [ $step_ok = 1 ] || ok=0
  step "host_nccl.h (C++17)" "$d/cxx.log" "$cxx" -std=c++17 -Wall -Wextra -Wpedantic -Werror \
    "${common[@]}" -isystem "$cuda_inc" -fsyntax-only "$work/host_nccl_check.cpp"
  [ $step_ok = 1 ] || ok=0
  step "core/nccl.cuh + host_nccl.h (CUDA, $arch, every function used)" "$d/cu.log" "$nvcc" "${cuflags[@]}" \
    "${common[@]}" -DEPF_EXPECT_NCCL_VERSION_CODE="$code" -c "$work/nccl_check.cu" -o "$d/nccl_check.o"
  [ $step_ok = 1 ] || ok=0
  step "examples/02_nccl_ranks (compile only, not run)" "$d/ex02.log" "$nvcc" "${cuflags[@]}" \
    "${common[@]}" -I "$repo/examples/common" -c "$repo/examples/02_nccl_ranks/main.cu" -o "$d/ex02.o"
  if [ $step_ok = 1 ] && [ -n "$lib" ] && [ -f "$lib" ]; then
    step "examples/02_nccl_ranks linked against $lib" "$d/link.log" "$nvcc" -arch="$arch" "$d/ex02.o" \
      -o "$d/ex02" -L "$(dirname "$lib")" -l:"$(basename "$lib")" -lpthread
  fi
  [ $step_ok = 1 ] || ok=0
  if [ $ok = 1 ]; then compiled+=("$ver"); else failed+=("$ver"); fi
}

# toolkit: the NCCL that nvcc's include directory (or NCCL_ROOT) holds
check_toolkit() {
  local root inc lib
  for root in ${NCCL_ROOT:-} "$cuda_home" /usr/local /usr; do
    if [ -f "$root/include/nccl.h" ]; then inc="$root/include"; break; fi
  done
  if [ -z "${inc:-}" ]; then
    echo "NCCL toolkit: no nccl.h next to nvcc, under NCCL_ROOT, /usr/local or /usr: SKIPPED"
    skipped+=("toolkit")
    return
  fi
  for lib in "$root/lib64/libnccl.so" "$root/lib/libnccl.so" "$root/lib/x86_64-linux-gnu/libnccl.so" \
             "$root/lib64/libnccl.so.2" "$root/lib/libnccl.so.2"; do
    [ -f "$lib" ] && break
    lib=""
  done
  check toolkit "$inc" "$lib"
}

pypi_versions="" # newest first
pypi_state=""    # "", "ok" or the reason it is unreachable
pypi_list() {
  [ -n "$pypi_state" ] && return
  local out
  if ! command -v "$python" >/dev/null 2>&1 || ! "$python" -m pip --version >/dev/null 2>&1; then
    pypi_state="no pip"; return
  fi
  out=$(timeout 120 "$python" -m pip index versions "$pkg" --disable-pip-version-check 2>&1)
  pypi_versions=$(printf '%s\n' "$out" | sed -n 's/^Available versions: //p' | tr -d ',')
  if [ -n "$pypi_versions" ]; then
    pypi_state=ok
  else # pip reports an unreachable index as "no matching distribution" (from versions: none)
    pypi_state="no $pkg versions listed; pip: $(printf '%s\n' "$out" | tail -n 1)"
  fi
}

skip_reason() {
  if [ "$pypi_state" = "no pip" ]; then echo "SKIPPED: no pip ($python -m pip)"
  else echo "SKIPPED: no network (PyPI unreachable: $pypi_state)"; fi
}

# wheel <version>: download (once), unpack nvidia/nccl, check
check_wheel() {
  local v=$1 dir whl
  if [ "$v" = latest ]; then
    pypi_list
    if [ "$pypi_state" != ok ]; then
      echo "NCCL latest: $(skip_reason)"
      skipped+=("latest"); return
    fi
    v=${pypi_versions%% *}
    echo "NCCL latest on PyPI ($pkg): $v (available: $pypi_versions)"
  fi
  dir="$cache/$v"
  if [ ! -f "$dir/nvidia/nccl/include/nccl.h" ]; then
    pypi_list
    if [ "$pypi_state" != ok ]; then
      echo "NCCL $v: $(skip_reason)"
      skipped+=("$v"); return
    fi
    case " $pypi_versions " in
      *" $v "*) ;;
      *) echo "NCCL $v: not a $pkg version on PyPI (available: $pypi_versions): FAILED"
         failed+=("$v"); return ;;
    esac
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
    if ! timeout 900 "$python" -m pip download --no-deps --disable-pip-version-check \
         "$pkg==$v" -d "$dir.tmp" >"$work/pip.log" 2>&1; then
      echo "NCCL $v: SKIPPED: no network (pip download failed: $(tail -n 1 "$work/pip.log"))"
      skipped+=("$v"); rm -rf "$dir.tmp"; return
    fi
    whl=$(ls "$dir.tmp"/*.whl 2>/dev/null | head -n 1)
    if [ -z "$whl" ] || ! "$python" - "$whl" "$dir.tmp" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("nvidia/nccl/")])
EOF
    then
      echo "NCCL $v: the wheel could not be unpacked: FAILED"; failed+=("$v"); return
    fi
    rm -f "$whl"
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
  fi
  check "$v" "$dir/nvidia/nccl/include" "$(ls "$dir"/nvidia/nccl/lib/libnccl.so* 2>/dev/null | head -n 1)"
}

[ $# -gt 0 ] || set -- toolkit latest
for v in "$@"; do
  case "$v" in
    toolkit) check_toolkit ;;
    *) check_wheel "$v" ;;
  esac
done

echo "NCCL versions compiled: ${compiled[*]:-none}"
[ ${#skipped[@]} -eq 0 ] || echo "NCCL versions skipped: ${skipped[*]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "NCCL versions FAILED: ${failed[*]}"
  exit 1
fi
exit 0
