"""Where a streamed target pass's time went: waiting for the disk, or computing.

llama.cpp reports each layer as it finishes (page_cache.LayerWindow's eval callback), and the window
looks (mincore) whether the next layer's pages were all in memory when its turn came. A layer found
in memory (kept, or read ahead in time) took the time computing costs; one that was not took longer
by the time it waited for its pages. So computing is priced per byte from the layers found in memory
in the same pass (same tree, same context: the median of their seconds per byte), and a layer that
was not in memory counts its stretch beyond that price as waiting for the disk:

    compute_i = price × bytes_i,   wait_i = max(0, stretch_i − compute_i)   (not in memory)
    wait = Σ wait_i,   compute = pass − wait

A stretch runs from the end of the layer before (the pass's start for the first) to the layer's end;
what follows the last layer (copying the logits out) is computing. So the two add up to the pass. The
price includes what streaming costs the CPU while it computes (docs/measurements/code-notes.md,
"Direct reads"), so the wait is the time streaming adds.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class LayerStretch:
    end: float  # when llama.cpp reported the layer done
    nbytes: int  # the layer's weights
    in_memory: bool  # all its pages were in memory when its turn came


@dataclass(frozen=True)
class PassSplit:
    seconds: float  # the whole pass, start to finish
    wait_seconds: float  # of which waiting for pages from the disk
    layers: int  # layers reported during the pass

    @property
    def compute_seconds(self) -> float:
        return self.seconds - self.wait_seconds


def split_pass(start: float, layers: Sequence[LayerStretch], finish: float) -> PassSplit | None:
    """The split of one pass; None when no layer was found in memory (no price to compare with)."""
    stretches, begin = [], start
    for layer in layers:
        stretches.append(max(0.0, layer.end - begin))
        begin = max(begin, layer.end)
    prices = [s / layer.nbytes for s, layer in zip(stretches, layers) if layer.in_memory and layer.nbytes > 0]
    if not prices:
        return None
    price = statistics.median(prices)
    wait = sum(max(0.0, s - price * layer.nbytes) for s, layer in zip(stretches, layers) if not layer.in_memory)
    return PassSplit(max(0.0, finish - start), min(wait, max(0.0, finish - start)), len(layers))
