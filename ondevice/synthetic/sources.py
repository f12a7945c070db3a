"""What `--synthetic NAME` means: a preset shape, a catalog pair, or a GGUF file to make a twin of.

    resolve("qwen3-32b")             # [target]: the preset in llama.cpp's Q4_K_M mix
    resolve("qwen2.5-coder-1.5b")    # [target, drafter] of the catalog pair; from its files if downloaded
    resolve("path/to/model.gguf")    # [target]: the file's own shape and per-tensor types

A twin made from a file copies its exact tensor list (names, shapes, GGUF types), so it is the
same model to every backend except for the values of the weights.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from gguf.constants import GGMLQuantizationType

from ondevice.catalog import hub
from ondevice.catalog.pairs import list_pairs
from ondevice.errors import OndeviceError
from ondevice.files.gguf_header import read_header
from ondevice.synthetic.blocks import SUPPORTED
from ondevice.synthetic.quant_mix import TensorSpec, preset_tensors
from ondevice.synthetic.shapes import PRESETS, ModelShape, find_shape, shape_of_gguf


@dataclass(frozen=True)
class SyntheticModel:
    shape: ModelShape
    tensors: tuple[TensorSpec, ...]
    role: str  # "target" or "drafter": which curve to measure
    real_file: Path | None = None  # the real GGUF it is a twin of, when there is one here


def tensors_of_gguf(path: str | Path) -> tuple[TensorSpec, ...]:
    """A GGUF's tensors in file order: name, shape (numpy order), type. Only the header is read."""
    header = read_header(path)
    tensors = tuple(TensorSpec(t.name, tuple(reversed(t.shape)), GGMLQuantizationType(t.qtype)) for t in header.tensors.values())
    unsupported = sorted({t.qtype.name for t in tensors if t.qtype not in SUPPORTED})
    if unsupported:
        raise OndeviceError(f"{path} holds {', '.join(unsupported)} tensors, which synthetic twins cannot write yet.")
    return tensors


def from_preset(shape: ModelShape, role: str | None = None) -> SyntheticModel:
    return SyntheticModel(shape, tuple(preset_tensors(shape)), role or shape.role)


def from_file(path: str | Path, name: str | None = None, role: str = "target") -> SyntheticModel:
    path = Path(path).expanduser()
    shape, tensors = shape_of_gguf(path), tensors_of_gguf(path)
    preset = matching_preset(shape)
    if name is None and preset is not None and tensors == tuple(preset_tensors(PRESETS[preset])):
        name = preset  # the same model to every backend: measured under the preset's name (what forecasts look up)
    return SyntheticModel(dataclasses.replace(shape, name=name or shape.name), tensors, role, path)


def matching_preset(shape: ModelShape) -> str | None:
    """The preset with the same dimensions, if any (names a downloaded file's shape like the catalog does)."""
    keys = ("arch", "n_layers", "dim", "ffn", "n_heads", "n_kv_heads", "head_dim", "vocab", "tied")
    for preset in PRESETS.values():
        if all(getattr(preset, k) == getattr(shape, k) for k in keys):
            return preset.name
    return None


def resolve(name: str) -> list[SyntheticModel]:
    """The synthetic model(s) NAME stands for; a one-line OndeviceError if it is none of the three.
    A catalog pair named like a preset (qwen2.5-7b) is the pair: its target and its drafter."""
    if name.endswith(".gguf") or Path(name).expanduser().is_file():
        return [from_file(name)]
    pair = next((p for p in list_pairs() if p.name == name), None)
    if pair is not None:
        return [pair_model(pair.target, "target"), pair_model(pair.drafter, "drafter")]
    return [from_preset(find_shape(name))]


def pair_model(model_file, role: str) -> SyntheticModel:
    """A catalog model: a twin of its file when downloaded, else its `shape` preset."""
    if hub.is_downloaded(model_file):
        return from_file(hub.local_path(model_file), model_file.shape, role)
    if model_file.shape is None:
        raise OndeviceError(f"{model_file.label} is not downloaded and its catalog entry names no `shape`: no synthetic model for it.")
    return from_preset(find_shape(model_file.shape), role)
