#!/usr/bin/env bash
# run_pytest.sh <source dir> <work dir> — `pip install "./python[test]"` into a fresh virtual environment
# under <work dir>, then `pytest python/tests`. The environment sees the system's packages
# (PyTorch, CuPy where installed), so the GPU tests run where a GPU is. Exit 77 (CTest: Not Run)
# only when the Python build tools cannot be installed (no network and none installed).
set -euo pipefail
src=$1
work=$2
py=${PYTHON:-python3}
venv="$work/venv"
rm -rf "$venv"
"$py" -m venv --system-site-packages "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
# The README's commands: `pip install "./python[test]"` (the package and what its tests need), then
# `pytest python/tests`. --no-build-isolation: build with the tools installed here (and the system
# cmake) rather than a second download in an isolated environment, so that it also works on a GPU
# machine without network whose environment has them.
python -c "import scikit_build_core" 2>/dev/null || pip install -q "scikit-build-core>=0.10" || {
  echo "test_python: cannot install scikit-build-core (no network?): not run"
  exit 77
}
pip install -q --no-build-isolation "$src/python[test]" \
  --config-settings=build-dir="$work/build" --config-settings=cmake.define.EPF_CAPI_CUDA_ARCHITECTURES="${EPF_CAPI_CUDA_ARCHITECTURES:-90}" || {
  if ! python -c "import pytest" 2>/dev/null && ! pip download -q --no-deps -d "$work/probe" pytest >/dev/null 2>&1; then
    echo "test_python: the [test] extra cannot be installed (no network?): not run"
    exit 77
  fi
  exit 1
}
cd "$work"
python -c "import epfuse, sys; print('epfuse', epfuse.version(), epfuse.get_library())"
python -m pytest -q -rs "$src/python/tests"
