"""One layer's parameters as ONE contiguous byte buffer, and back into tensors on the device.

A `LayerLayout` says where each parameter of a decoder block sits in the layer's buffer and how it
is encoded:
  raw        the parameter's own bytes (fp16/bf16/fp32); unpacked as a zero-copy view
  gguf       the GGUF tensor's blocks exactly as in the model file (Q4_K, Q6_K, F32 …); unpacked
             by `ondevice.quant.gguf_blocks` then cast to the parameter's dtype — bit-identical to
             a model loaded by gguf's numpy dequantizer and cast the same way
  groupwise  int8/int4 codes + scales (`ondevice.quant.groupwise`); lossy
GGUF layouts mirror the file: a run of tensors that are (nearly) adjacent in the file is one run in
the buffer, so the disk tier reads a layer with one `pread` per run (`file_ranges`). A model split
into parts (`…-00001-of-00003.gguf`) is read the same way: each range names the part it is in.

Parameters are re-pointed by replacing the block's `nn.Parameter` objects (`point_params`); while a
layer is not loaded its parameters are meta tensors of the right shape and dtype (`free_params`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
from torch import nn

from ondevice.files.gguf_reader import SplitReader
from ondevice.quant import gguf_blocks, groupwise
from ondevice.quant.groupwise import GroupSpec

ALIGN = 256  # byte alignment of each tensor (raw/groupwise) or run (gguf) in a layer buffer
MAX_GAP = 64 * 2**10  # GGUF tensors closer than this in the file are read as one run


@dataclass(frozen=True)
class PackedTensor:
    name: str  # parameter name inside the block, e.g. "mlp.up_proj.weight"
    offset: int  # byte offset in the layer buffer
    nbytes: int
    shape: tuple[int, ...]
    dtype: torch.dtype  # the parameter's dtype on the device
    encoding: str  # "raw" | "gguf" | "groupwise"
    qtype: int = 0  # gguf: a GGMLQuantizationType
    spec: GroupSpec | None = None  # groupwise
    unpermute_heads: int = 0  # gguf: undo llama.cpp's Q/K row permutation over this many heads (Llama)


@dataclass(frozen=True)
class FileRange:
    file_offset: int
    nbytes: int
    buffer_offset: int
    part: int = 0  # which file of a split model (gguf_split.part_paths order)


@dataclass(frozen=True)
class LayerLayout:
    tensors: tuple[PackedTensor, ...]
    nbytes: int  # the layer buffer's size (what moves over the bus)
    file_ranges: tuple[FileRange, ...] = ()  # where the buffer's bytes are in the model file, if anywhere

    @property
    def zero_copy(self) -> bool:
        """Whether every parameter is a view of the buffer (nothing decoded into new memory)."""
        return all(t.encoding == "raw" for t in self.tensors)

    @property
    def decoded_bytes(self) -> int:
        """Bytes the parameters occupy on the device once unpacked."""
        total = 0
        for t in self.tensors:
            numel = 1
            for dim in t.shape:
                numel *= dim
            total += numel * t.dtype.itemsize
        return total


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def layout_from_params(block: nn.Module, spec: GroupSpec | None = None) -> LayerLayout:
    """Raw bytes of each parameter (or group-wise codes when `spec` is given and the shape fits)."""
    tensors, offset = [], 0
    for name, p in block.named_parameters():
        shape = tuple(p.shape)
        if spec is not None and p.dim() >= 2 and spec.fits(shape):
            entry = PackedTensor(name, offset, spec.packed_bytes(p.numel()), shape, p.dtype, "groupwise", spec=spec)
        else:
            entry = PackedTensor(name, offset, p.numel() * p.element_size(), shape, p.dtype, "raw")
        tensors.append(entry)
        offset = _align(offset + entry.nbytes)
    return LayerLayout(tuple(tensors), offset)


def pack_params(block: nn.Module, layout: LayerLayout, out: torch.Tensor) -> None:
    """Write the block's parameters into `out` (1-D uint8, ≥ layout.nbytes) as `layout` says."""
    params = dict(block.named_parameters())
    for t in layout.tensors:
        p = params[t.name].detach()
        if t.encoding == "groupwise":
            data = groupwise.quantize(p, t.spec)
        else:
            data = p.contiguous().reshape(-1).view(torch.uint8)
        out[t.offset : t.offset + t.nbytes].copy_(data)


@dataclass(frozen=True)
class GGUFTensorInfo:
    file_offset: int  # absolute byte offset of the tensor's data in the file
    nbytes: int
    qtype: int
    shape: tuple[int, ...]  # numpy order (GGUF dims reversed), as gguf's dequantize returns it
    part: int = 0  # which file of a split model holds it


def gguf_tensor_index(path_or_reader) -> dict[str, GGUFTensorInfo]:
    """Every tensor of a GGUF model (all parts if split): where its bytes are and how they are encoded.
    Takes a path or a gguf_reader.SplitReader already open (parsing a header takes seconds)."""
    reader = path_or_reader if isinstance(path_or_reader, SplitReader) else SplitReader(path_or_reader)
    part_of = {path: i for i, path in enumerate(reader.parts)}
    return {
        t.name: GGUFTensorInfo(
            int(t.data_offset), int(t.n_bytes), int(t.tensor_type), tuple(int(d) for d in reversed(t.shape)), part_of[t.path]
        )
        for t in reader.tensors
    }


def layout_from_gguf(
    block: nn.Module,
    names: Mapping[str, str],
    index: Mapping[str, GGUFTensorInfo],
    unpermute: Mapping[str, int] | None = None,
) -> LayerLayout:
    """Layout of a block whose parameter `p` is the GGUF tensor `names[p]`, as stored in the file.

    unpermute[p] = n_heads for Llama's Q/K weights, whose rows llama.cpp's converter interleaved.
    """
    unpermute = unpermute or {}
    params = dict(block.named_parameters())
    missing = sorted(set(params) - set(names))
    if missing:
        raise ValueError(f"no GGUF tensor named for parameters {missing}")
    absent = sorted(names[p] for p in params if names[p] not in index)
    if absent:
        raise ValueError(f"the GGUF file has no tensors {absent}")
    order = sorted(params, key=lambda p: (index[names[p]].part, index[names[p]].file_offset))
    tensors, ranges, end = [], [], 0
    run_file_start = run_buffer_start = run_file_end = run_part = None
    for name in order:
        info = index[names[name]]
        if tuple(params[name].shape) != info.shape:
            raise ValueError(f"{name} has shape {tuple(params[name].shape)} but {names[name]} is {info.shape}")
        if run_file_end is None or info.part != run_part or not 0 <= info.file_offset - run_file_end <= MAX_GAP:
            if run_file_end is not None:
                ranges.append(FileRange(run_file_start, run_file_end - run_file_start, run_buffer_start, run_part))
            run_file_start, run_buffer_start, run_part = info.file_offset, _align(end), info.part
        offset = run_buffer_start + info.file_offset - run_file_start
        heads = unpermute.get(name, 0)
        tensors.append(
            PackedTensor(name, offset, info.nbytes, info.shape, params[name].dtype, "gguf", info.qtype, None, heads)
        )
        run_file_end = info.file_offset + info.nbytes
        end = offset + info.nbytes
    if run_file_end is not None:
        ranges.append(FileRange(run_file_start, run_file_end - run_file_start, run_buffer_start, run_part))
    return LayerLayout(tuple(tensors), _align(end), tuple(ranges))


def unpack(buffer: torch.Tensor, layout: LayerLayout) -> dict[str, torch.Tensor]:
    """A layer buffer (1-D uint8, on the device) → {parameter name: tensor on the same device}."""
    out = {}
    for t in layout.tensors:
        raw = buffer[t.offset : t.offset + t.nbytes]
        if t.encoding == "raw":
            out[t.name] = raw.view(t.dtype).reshape(t.shape)
        elif t.encoding == "gguf":
            w = gguf_blocks.dequantize(raw, t.qtype, t.shape, t.dtype)  # rounded once: a row permutation commutes with it
            out[t.name] = _unpermute_rows(w, t.unpermute_heads) if t.unpermute_heads else w
        else:
            out[t.name] = groupwise.dequantize(raw, t.spec, t.shape).to(t.dtype)
    return out


def _unpermute_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K permutation: within each head, rows (0, h/2, 1, h/2+1, …) → (0, 1, …)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _owner(block: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, leaf = name.rpartition(".")
    return (block.get_submodule(path) if path else block), leaf


def point_params(block: nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Make the block compute with these tensors (views are kept as views: nothing is copied)."""
    for name, tensor in tensors.items():
        owner, leaf = _owner(block, name)
        owner._parameters[leaf] = nn.Parameter(tensor, requires_grad=False)


def free_params(block: nn.Module, layout: LayerLayout) -> None:
    """Point the block's parameters at meta tensors: nothing loaded, shapes and dtypes kept."""
    point_params(block, {t.name: torch.empty(t.shape, dtype=t.dtype, device="meta") for t in layout.tensors})


def move_buffers(block: nn.Module, device: torch.device) -> None:
    """Move the block's buffers (not its parameters) to the device: they stay resident."""
    for module in block.modules():
        for name, buf in module._buffers.items():
            if buf is not None:
                module._buffers[name] = buf.to(device)


def check_unpacks_to_params(block: nn.Module, layout: LayerLayout, buffer: torch.Tensor) -> None:
    """Raise ValueError unless unpacking `buffer` gives exactly the block's current (non-meta)
    parameters — the proof that a streamed layer computes with the weights the resident one has."""
    params = dict(block.named_parameters())
    for t in layout.tensors:
        if t.encoding == "groupwise" or params[t.name].is_meta:
            continue
        got = unpack(buffer[t.offset : t.offset + t.nbytes], _alone(t))[t.name]
        if not torch.equal(got.cpu(), params[t.name].detach().cpu()):
            raise ValueError(f"parameter {t.name} differs from its packed bytes ({t.encoding})")


def _alone(t: PackedTensor) -> LayerLayout:
    entry = PackedTensor(t.name, 0, t.nbytes, t.shape, t.dtype, t.encoding, t.qtype, t.spec, t.unpermute_heads)
    return LayerLayout((entry,), t.nbytes)
