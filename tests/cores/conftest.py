"""Fixtures of the core tests; the factories and cached jitted runners live in tests/cores/common.py."""
import zlib

import numpy as np
import pytest


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A numpy Generator seeded from the test's node id: reproducible, different per test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
