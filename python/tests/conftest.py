import os
import random

import pytest


@pytest.fixture
def seed():
    """A fresh seed per test, printed (rerun with EPFUSE_TEST_SEED=<n>)."""
    s = int(os.environ.get("EPFUSE_TEST_SEED", random.SystemRandom().randrange(1 << 31)))
    print(f"seed {s}")
    return s
