"""A synthetic torch target streamed from pinned RAM to a GPU, built in memory: no file is written.

    target = offloaded_target(PRESETS["llama-3.3-70b"], "cuda", gpu_memory="24GB")
    target.placement.describe()   # '80 layers: 4 on GPU, 76 streamed from RAM, 0 from disk; 40 GB moved per pass'

`ondevice bench --synthetic` writes a GGUF and loads it as a real model is loaded; at 32B-70B that
is 20-43 GB written and read back, minutes before the first pass. Here the same model is put
together where it runs, by the loader's own pieces: the tensors a file of the shape would hold
(`quant_mix.preset_tensors`) at the offsets a file would give them (`virtual_index`), the layouts
and placement `target.offloaded` makes of a file (`meta_layouts`, `place_layers`), and a
`LayerStreamer` over pinned host buffers of GGUF blocks — the bytes the writer would write
(`writer.tensor_chunks`), dequantized on the device after each transfer as a real file's are.

By default each distinct layer (the Q4_K_M mix gives some layers Q6_K attn_v / ffn_down) is
generated once and copied to every layer like it: the bytes moved and the work done per pass are
the model's, the values repeat across layers. `exact=True` generates every layer from its own
seed, as the writer does, so the target computes what a written file of the shape loaded by
`load_offloaded_target` computes (tests/test_gpu_check.py compares their logits).
"""

from __future__ import annotations

import numpy as np
import torch

from ondevice.errors import OndeviceError
from ondevice.offload.encoded import EncodedLayers
from ondevice.offload.layout import GGUFTensorInfo, LayerLayout, move_buffers, unpack
from ondevice.offload.streamer import LayerStreamer, StreamedLayer
from ondevice.targets.offloaded import LAYER_NAMES, assign_resident, meta_layouts, place_layers
from ondevice.decode.protocols import MAX_BUDGET
from ondevice.files.architecture import ModelArgs, llama3_rope_factors
from ondevice.quant import gguf_blocks
from ondevice.synthetic.quant_mix import TensorSpec, preset_tensors
from ondevice.synthetic.shapes import LLAMA3_ROPE, ModelShape
from ondevice.synthetic.writer import tensor_chunks
from ondevice.targets import weights
from ondevice.targets.torch_model import rope_inv_freq
from ondevice.targets.torch_target import TorchTarget, default_dtype

ALIGNMENT = 32  # GGUF's default tensor alignment: where the writer puts each tensor


def virtual_index(tensors: list[TensorSpec]) -> dict[str, GGUFTensorInfo]:
    """Where each tensor would sit in a GGUF of these tensors, relative to the data section (as the
    writer lays them out: in order, each at the next multiple of ALIGNMENT)."""
    index, offset = {}, 0
    for t in tensors:
        index[t.name] = GGUFTensorInfo(offset, t.nbytes, int(t.qtype), t.shape)
        offset += -(-t.nbytes // ALIGNMENT) * ALIGNMENT
    return index


def model_args(shape: ModelShape) -> ModelArgs:
    """The torch model's hyper-parameters for a shape: what `architecture.gguf_model_args` reads from the
    header of a file of that shape (which stores them as float32)."""
    factors = None
    if shape.rope_factor is not None:
        factors = llama3_rope_factors(shape.head_dim, shape.rope_theta, {**LLAMA3_ROPE, "factor": shape.rope_factor})
        factors = tuple(float(f) for f in np.asarray(factors, dtype=np.float32))
    return ModelArgs(
        arch=shape.arch, vocab_size=shape.vocab, dim=shape.dim, n_layers=shape.n_layers, n_heads=shape.n_heads,
        n_kv_heads=shape.n_kv_heads, head_dim=shape.head_dim, intermediate_size=shape.ffn, norm_eps=float(np.float32(shape.norm_eps)),
        rope_theta=float(np.float32(shape.rope_theta)), rope_freq_factors=factors, qkv_bias=shape.arch == "qwen2",
        qk_norm=shape.arch == "qwen3", tie_embeddings=shape.tied,
    )


def offloaded_target(
    shape: ModelShape, device=None, gpu_memory: str | None = None, ram_memory: str | None = None, *, n_ctx: int = 4096,
    max_tree: int = MAX_BUDGET, seed: int = 0, dtype=None, head_dtype=torch.float32, exact: bool = False,
    keep_encoded: bool | None = None,
) -> TorchTarget:
    """A TorchTarget of random weights in the shape's quant mix, placed within the budgets as
    `load_offloaded_target` places a file (device: default cuda when available). Streamed layers
    live in (pinned) RAM: with no file behind them there is no disk tier, so a RAM budget too small
    for them is refused in one line."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = dtype or default_dtype(device)
    tensors = preset_tensors(shape)
    args, _ = weights.untie_for_head_dtype(model_args(shape), dtype, head_dtype)
    model, layouts = meta_layouts(args, dtype, head_dtype, virtual_index(tensors))
    _, placement = place_layers(model, layouts, device, dtype, n_ctx, gpu_memory, ram_memory, max_tree, keep_encoded)
    if placement.from_disk:
        raise OndeviceError(
            f"the synthetic {shape.name} needs RAM for all {len(placement.streamed)} streamed layers (it has no file to read "
            "the others from); free RAM or raise --ram-memory."
        )
    layers = LayerBytes(shape, tensors, layouts, seed, exact)
    loaded = resident_tensors(shape, args, tensors, device, dtype, head_dtype, seed)
    for i in placement.on_device:
        on_device = unpack(torch.from_numpy(layers.host_bytes(i)).to(device), layouts[i])
        loaded |= {f"layers.{i}.{name}": w for name, w in on_device.items()}
    assign_resident(model, loaded, placement)
    model.inv_freq = rope_inv_freq(args).to(device)
    if placement.encoded_on_device:  # kept as GGUF blocks, decoded for each pass (offload/encoded.py)
        kept = {i: torch.from_numpy(layers.host_bytes(i)).to(device) for i in placement.encoded_on_device}
        EncodedLayers(model.layers, kept, layouts)
    target = TorchTarget(model, n_ctx)
    target.placement = placement
    if placement.streamed:
        pin = device.type == "cuda"
        streamed = [StreamedLayer(i, layouts[i], pinned_copy(layers.host_bytes(i), pin)) for i in placement.streamed]
        for i in placement.streamed:
            move_buffers(model.layers[i], device)
        target.streamer = LayerStreamer(model.layers, streamed, device, placement.ring_slots)
    return target


def pinned_copy(data: np.ndarray, pin: bool) -> torch.Tensor:
    host = torch.empty(len(data), dtype=torch.uint8, pin_memory=pin)
    host.copy_(torch.from_numpy(data))
    return host


class LayerBytes:
    """Each layer's host buffer as the file's bytes would fill it: one generated per distinct
    layout and reused for the layers like it, or (exact) each layer's own."""

    def __init__(self, shape: ModelShape, tensors: list[TensorSpec], layouts: dict[int, LayerLayout], seed: int, exact: bool):
        self.shape, self.layouts, self.seed, self.exact = shape, layouts, seed, exact
        self.position = {t.name: k for k, t in enumerate(tensors)}  # the writer seeds each tensor by its place in the file
        self.spec = {t.name: t for t in tensors}
        self.generated: dict[tuple, np.ndarray] = {}  # layout → its bytes

    def host_bytes(self, i: int) -> np.ndarray:
        layout = self.layouts[i]
        if self.exact:  # each layer's own bytes, made when asked for and not kept (the caller copies them)
            return self._generate(i, layout)
        key = tuple((t.name, t.offset, t.nbytes, t.qtype) for t in layout.tensors)
        if key not in self.generated:
            self.generated[key] = self._generate(i, layout)
        return self.generated[key]

    def _generate(self, i: int, layout: LayerLayout) -> np.ndarray:
        out = np.zeros(layout.nbytes, dtype=np.uint8)
        names = LAYER_NAMES(i)
        for t in layout.tensors:
            name = names[t.name]
            data = np.concatenate([np.asarray(c).reshape(-1).view(np.uint8) for c in tensor_chunks(self.shape, self.spec[name], self.seed, self.position[name])])
            out[t.offset : t.offset + t.nbytes] = data
        return out


def resident_tensors(shape: ModelShape, args: ModelArgs, tensors: list[TensorSpec], device, dtype, head_dtype, seed: int) -> dict[str, torch.Tensor]:
    """Embeddings, final norm and LM head on the device, decoded from the bytes the writer would
    write (a tied head gets its own copy when its dtype differs, as the loader gives it)."""
    spec = {t.name: (k, t) for k, t in enumerate(tensors)}

    def decoded(name: str, as_dtype) -> torch.Tensor:
        """Decoded a run of rows at a time (the writer's chunks): a 128k-row head decoded whole
        would need several GB of fp32 scratch on the device."""
        k, t = spec[name]
        out = torch.empty(t.shape, dtype=as_dtype, device=device)
        row = 0
        for chunk in tensor_chunks(shape, t, seed, k):
            raw = torch.from_numpy(np.asarray(chunk).reshape(-1).view(np.uint8)).to(device)
            rows = raw.numel() * t.shape[0] // t.nbytes if len(t.shape) == 2 else t.shape[0]
            part = gguf_blocks.dequantize(raw, int(t.qtype), (rows, *t.shape[1:]) if len(t.shape) == 2 else t.shape)
            out[row : row + rows] = part
            row += rows
        return out

    out = {"tok_embeddings.weight": decoded("token_embd.weight", dtype), "norm.weight": decoded("output_norm.weight", dtype)}
    if not args.tie_embeddings:
        out["output.weight"] = decoded("token_embd.weight" if shape.tied else "output.weight", head_dtype or dtype)
    return out
