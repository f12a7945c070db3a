"""The reference every speculative answer is held to: the target alone, greedy, one token per pass.

VocabTrim's calibration answers with it; the exactness tests and `python -m ondevice.eval.numerics`
compare against it.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ondevice.decode.protocols import Target
from ondevice.decode.tree import DraftTree


def greedy_reference(
    target: Target, prompt: Sequence[int], max_new: int, is_end: Callable[[int], bool] | None = None
) -> list[int]:
    """The target alone, greedy, one token per pass: max_new tokens, or fewer ending with the first
    end token when `is_end` is given. The cache ends holding prompt + output[:-1]."""
    target.truncate(0)
    target.prefill(prompt[:-1])
    root, out = prompt[-1], []
    while len(out) < max_new and not (out and is_end is not None and is_end(root)):
        logits = target.forward_tree(DraftTree.root_only(root))[0]  # the prediction after `root`
        target.commit([0])
        root = int(np.argmax(logits))
        out.append(root)
    return out
