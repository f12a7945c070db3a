"""Our GGUF reader (files/gguf_reader.py, on the fast header reader) against gguf-py's own reader, the
reference: the same tensors in the same order, types, shapes, offsets and bytes, and the same scalar
metadata, on every architecture the tests write and on a split set."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from ondevice.errors import OndeviceError
from ondevice.files.gguf_reader import open_model
from tiny_models import write_tiny_gguf


def same_as_gguf_py(path, reference_parts) -> None:
    ours = open_model(path)
    theirs = [t for part in reference_parts for t in gguf.GGUFReader(part).tensors]
    assert [t.name for t in ours.tensors] == [t.name for t in theirs]
    for a, b in zip(ours.tensors, theirs):
        assert (a.tensor_type, tuple(a.shape), a.n_bytes, a.data_offset) == (b.tensor_type, tuple(int(d) for d in b.shape), b.n_bytes, b.data_offset)
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape and np.array_equal(a.data, b.data)
    for key, field in gguf.GGUFReader(reference_parts[0]).fields.items():
        value = field.contents()
        if key.startswith("GGUF.") or isinstance(value, list):
            continue
        assert ours.fields[key].contents() == value, key


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
def test_tensors_and_metadata_equal_gguf_pys(tmp_path, arch):
    path = write_tiny_gguf(tmp_path / f"{arch}.gguf", arch=arch)
    same_as_gguf_py(path, [path])


def test_a_split_set_reads_as_one_model(tmp_path):
    first = write_tiny_gguf(tmp_path / "tiny.gguf", arch="qwen2", split_max_tensors=10)
    parts = sorted(tmp_path.glob("*-of-*.gguf"))
    assert len(parts) > 1 and first == parts[0]
    same_as_gguf_py(first, parts)
    assert {t.path for t in open_model(first).tensors} == set(parts)


def test_an_array_field_is_not_read(tmp_path):
    reader = open_model(write_tiny_gguf(tmp_path / "t.gguf", arch="qwen2"))
    with pytest.raises(OndeviceError, match="array"):
        reader.fields["tokenizer.ggml.tokens"].contents()
