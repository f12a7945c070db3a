"""Shared fixtures. `real_pair`: the default model pair's files, downloaded on first use (~1.6 GB)."""

from __future__ import annotations

import os

import pytest

# Tests touch no network and write nothing outside temporary folders. Two dependencies would, unless
# told not to before they are imported: the Hugging Face client asks the real hub for its user-agent
# registry on its first request, even when a test points it at a local stand-in (it reads HF_ENDPOINT
# once, at import); ONNX Runtime (1.29+) keeps a telemetry database under ~/.cache/Microsoft and
# uploads a process event.
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["ORT_DISABLE_TELEMETRY"] = "1"



@pytest.fixture(scope="session")
def real_pair():
    """Verified paths of the default pair in the default cache (mark tests using it `real`).

    Imported here, not at the top: the GPU machine has no llama.cpp, and its CUDA tests
    (`ondevice.eval.gpu_check`) must still collect.
    """
    from ondevice.catalog.hub import ensure_pair
    from ondevice.catalog.pairs import load_pair

    return ensure_pair(load_pair(None))


def pytest_collection_modifyitems(config, items):
    """A test that takes the real pair is a `real` test, marked or not: `-m "not real"` never downloads."""
    for item in items:
        if "real_pair" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.real)
