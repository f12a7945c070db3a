"""targets/pass_split.py: a streamed pass's time split into disk wait and compute, against hand sums."""

from __future__ import annotations

import pytest

from ondevice.targets.pass_split import LayerStretch, split_pass


def test_a_layer_not_in_memory_waits_for_its_stretch_beyond_the_price_of_computing():
    # layers of 100 bytes; in memory: stretches 1.0 and 2.0 s → price 0.015 s/byte (median of 0.01, 0.02);
    # not in memory: 4.0 s (1.5 computing, 2.5 waiting) and 1.0 s (less than the price: no wait);
    # then 0.5 s copying logits: computing
    layers = [LayerStretch(1.0, 100, True), LayerStretch(3.0, 100, True), LayerStretch(7.0, 100, False), LayerStretch(8.0, 100, False)]
    split = split_pass(0.0, layers, 8.5)
    assert split.seconds == 8.5 and split.layers == 4
    assert split.wait_seconds == pytest.approx(2.5)
    assert split.compute_seconds == pytest.approx(6.0)


def test_computing_is_priced_per_byte():
    # a 50-byte layer in memory at 0.5 s prices a 200-byte layer at 2 s: of its 3 s, 1 s is waiting
    split = split_pass(10.0, [LayerStretch(10.5, 50, True), LayerStretch(13.5, 200, False)], 13.5)
    assert split.wait_seconds == pytest.approx(1.0)


def test_no_layer_in_memory_gives_no_price_and_no_split():
    assert split_pass(0.0, [LayerStretch(1.0, 100, False)], 1.0) is None
    assert split_pass(0.0, [], 1.0) is None
