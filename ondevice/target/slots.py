"""What the targets that keep their own KV cache (torch, ONNX) share about its slots.

Slots 0..n_cached hold committed tokens; a verified tree's nodes sit after them until `commit(path)`
keeps one root-first path of them.
"""

from __future__ import annotations

import numpy as np

from ondevice.errors import OndeviceError


def is_root_path(parents: np.ndarray, path: np.ndarray) -> bool:
    """Whether `path` is a root-first path (path[0] == 0) of the tree with these parents."""
    if len(path) == 0 or path[0] != 0 or len(parents) == 0 or np.any(path >= len(parents)):
        return False
    return bool(np.all(parents[path[1:]] == path[:-1]))


def check_room(n_cached: int, n_new: int, n_ctx: int) -> None:
    if n_cached + n_new > n_ctx:
        raise OndeviceError(f"{n_cached + n_new} tokens do not fit the context of {n_ctx}: shorten the prompt or start with a larger n_ctx.")
