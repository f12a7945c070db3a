"""Shared fixtures. `real_pair`: the default model pair's files, downloaded on first use (~1.6 GB)."""

from __future__ import annotations

import pytest

from ondevice.catalog import load_pair
from ondevice.hub import PairFiles, ensure_pair


@pytest.fixture(scope="session")
def real_pair() -> PairFiles:
    """Verified paths of the default pair in the default cache (mark tests using it `real`)."""
    return ensure_pair(load_pair(None))
