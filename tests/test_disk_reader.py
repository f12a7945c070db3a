"""offload/disk.py: the disk tier's reads. The reference is the file itself, read with open()."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from ondevice.errors import OndeviceError
from ondevice.offload.disk import DiskReader, read_ranges
from ondevice.offload.layout import FileRange, LayerLayout

SIZE = 1 << 16


@pytest.fixture()
def data_file(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, SIZE, dtype=np.uint8).tobytes())
    return path


def layer(ranges: list[tuple[int, int]]) -> LayerLayout:
    """A layer whose buffer holds the given (file offset, length) ranges back to back."""
    out, at = [], 0
    for offset, n in ranges:
        out.append(FileRange(offset, n, at))
        at += n
    return LayerLayout((), at, tuple(out))


def expected_bytes(path, ranges) -> bytes:
    data = path.read_bytes()
    return b"".join(data[offset : offset + n] for offset, n in ranges)


def test_read_ranges_puts_each_range_at_its_buffer_offset(data_file):
    ranges = [(4096, 100), (17, 3000), (SIZE - 50, 50)]
    out = torch.zeros(3150, dtype=torch.uint8)
    fd = os.open(data_file, os.O_RDONLY)
    try:
        assert read_ranges(fd, layer(ranges).file_ranges, out) == 3150
    finally:
        os.close(fd)
    assert out.numpy().tobytes() == expected_bytes(data_file, ranges)


def test_read_ranges_past_the_end_is_a_short_read(data_file):
    fd = os.open(data_file, os.O_RDONLY)
    try:
        with pytest.raises(EOFError):
            read_ranges(fd, layer([(SIZE - 10, 20)]).file_ranges, torch.zeros(20, dtype=torch.uint8))
    finally:
        os.close(fd)


LAYERS = {0: [(0, 5000)], 1: [(9000, 1000), (100, 700)], 2: [(30000, 8000)], 3: [(SIZE - 4000, 4000)]}


def test_reader_delivers_every_layer_in_order_through_a_bounded_set_of_buffers(data_file):
    reader = DiskReader(str(data_file), {i: layer(r) for i, r in LAYERS.items()}, n_buffers=2, timeout_s=10)
    try:
        order = [0, 1, 2, 3, 0, 2]
        tickets = [reader.submit(i) for i in order[:2]]  # as many reads as buffers ahead
        for n, index in enumerate(order):
            got = reader.wait(tickets[n])
            assert got.numpy().tobytes() == expected_bytes(data_file, LAYERS[index])
            assert tickets[n].buffer == n % 2
            reader.release(tickets[n])
            if n + 2 < len(order):
                tickets.append(reader.submit(order[n + 2]))
        assert reader.stats.bytes_read == sum(sum(length for _, length in LAYERS[i]) for i in order)
        assert reader.n_buffers == 2 and all(len(b) == 8000 for b in reader.buffers)  # the largest layer's size
    finally:
        reader.close()


def test_a_buffer_is_not_refilled_before_it_is_released(data_file):
    reader = DiskReader(str(data_file), {i: layer(r) for i, r in LAYERS.items()}, n_buffers=1, timeout_s=10)
    try:
        first = reader.submit(0)
        held = bytes(reader.wait(first).numpy().tobytes())
        second = reader.submit(1)
        assert not second.event.wait(0.3)  # buffer 0 is still held
        assert reader.buffers[0][: len(held)].numpy().tobytes() == held
        reader.release(first)
        assert reader.wait(second).numpy().tobytes() == expected_bytes(data_file, LAYERS[1])
    finally:
        reader.close()


def test_a_shrunk_file_is_a_one_line_error(data_file):
    reader = DiskReader(str(data_file), {i: layer(r) for i, r in LAYERS.items()}, n_buffers=2, timeout_s=10)
    try:
        os.truncate(data_file, 1000)
        with pytest.raises(OndeviceError) as err:
            reader.wait(reader.submit(2))
        assert "\n" not in str(err.value) and str(data_file) in str(err.value)
    finally:
        reader.close()
