import importlib.util
import os
import random
import sys

import pytest

# the package from the source tree when none is installed (with EPFUSE_LIBRARY naming a built
# libepfuse.so): `EPFUSE_LIBRARY=build/src/libepfuse.so.0 python3 -m pytest python/tests`
if importlib.util.find_spec("epfuse") is None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))


@pytest.fixture
def seed():
    """A fresh seed per test, printed (rerun with EPFUSE_TEST_SEED=<n>)."""
    s = int(os.environ.get("EPFUSE_TEST_SEED", random.SystemRandom().randrange(1 << 31)))
    print(f"seed {s}")
    return s


def usable_gpus() -> int:
    """epfuse.device_count(), or 0 where the CUDA driver cannot serve this runtime (a driver too
    old raises EpfError there: the tests that need a GPU skip instead of failing to collect)."""
    import epfuse
    try:
        return epfuse.device_count()
    except epfuse.EpfError:
        return 0
