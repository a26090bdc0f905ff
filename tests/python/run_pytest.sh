#!/usr/bin/env bash
# run_pytest.sh <source dir> <work dir> — `pip install ./python` into a fresh virtual environment
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
need=()
python -c "import scikit_build_core" 2>/dev/null || need+=("scikit-build-core>=0.10")
python -c "import pytest" 2>/dev/null || need+=(pytest)
if [ ${#need[@]} -gt 0 ] && ! pip install -q "${need[@]}"; then
  echo "test_python: cannot install ${need[*]} (no network?): not run"
  exit 77
fi
# --no-build-isolation: build with the tools above (and the system cmake), no second download
pip install -q --no-build-isolation "$src/python" \
  --config-settings=build-dir="$work/build" --config-settings=cmake.define.EPF_CAPI_CUDA_ARCHITECTURES="${EPF_CAPI_CUDA_ARCHITECTURES:-90}"
cd "$work"
python -c "import epfuse, sys; print('epfuse', epfuse.version(), epfuse.get_library())"
python -m pytest -q -rs "$src/python/tests"
