"""What a model takes in RAM, from sizes alone: its file's parts (`ModelSize`, from a GGUF header or
an architecture preset) and each llama.cpp context's buffers (`context_buffers`, against the sizes
llama.cpp reports: tests/test_memory_plan.py). The memory plan (loading/memory.py) adds them up."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ondevice.errors import OndeviceError
from ondevice.files.gguf_check import check_model_file

F32, F16 = 4, 2
CELL_PAD = 256  # llama.cpp rounds a context's KV cells up to a multiple of this


def tensor_bytes(nbytes: dict[str, int]) -> dict[str, object]:
    """ModelSize's layer_bytes, head_bytes and embd_bytes from each tensor's bytes, by GGUF name."""
    layers: dict[int, int] = {}
    for name, size in nbytes.items():
        parts = name.split(".")
        if parts[0] == "blk" and len(parts) > 2 and parts[1].isdigit():
            layers[int(parts[1])] = layers.get(int(parts[1]), 0) + size
    tied = "output.weight" not in nbytes  # the LM head is the input embedding table
    return {
        "layer_bytes": tuple(layers[i] for i in sorted(layers)),
        "head_bytes": nbytes["token_embd.weight"] if tied else nbytes["output.weight"],
        "embd_bytes": 0 if tied else nbytes["token_embd.weight"],
    }


@dataclass(frozen=True)
class ModelSize:
    """What a model's memory depends on: its file, and the shapes that size its KV cache and logits.
    From a GGUF header (`from_gguf`, any architecture llama.cpp runs) or an architecture preset
    (`ondevice.synthetic.quant_mix.preset_size`, for a model not downloaded)."""

    file_bytes: int  # the weights as stored (all parts of a split model)
    n_layers: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    layer_bytes: tuple[int, ...] = ()  # each decoder block's bytes in the file (empty: unknown; then a
    #                                    streamed pass is planned to read the whole file)
    head_bytes: int = 0  # the LM head's (output.weight, or token_embd when tied): read by every pass
    embd_bytes: int = 0  # a separate input embedding table: read a row per token, not per pass

    @classmethod
    def from_gguf(cls, path: str | Path) -> "ModelSize":
        header = check_model_file(path)  # a header llama.cpp would abort on, or our arithmetic fail on, is refused here
        if not header.tensors:
            raise OndeviceError(f"{path} holds no weights (a vocabulary-only GGUF); give the model's own file.")
        if "token_embd.weight" not in header.tensors:
            raise OndeviceError(f"{path} has no input embedding table (token_embd.weight): it is not a language model ondevice can run.")
        n_head = int(header.arch_value("attention.head_count", 1))
        n_embd = int(header.arch_value("embedding_length", 0))
        return cls(
            file_bytes=sum({t.path: t.path.stat().st_size for t in header.tensors.values()}.values()),
            n_layers=int(header.arch_value("block_count", len(header.layer_ranges()))), n_embd=n_embd, n_head=n_head,
            n_head_kv=int(header.arch_value("attention.head_count_kv", n_head)),
            head_dim=int(header.arch_value("attention.key_length", n_embd // max(n_head, 1))),
            n_vocab=header.n_vocab, **tensor_bytes({name: t.nbytes for name, t in header.tensors.items()}),
        )

    @property
    def working_bytes(self) -> int:
        """What of the file a pass reads: all of it but a separate input embedding table."""
        return self.file_bytes - self.embd_bytes

    @property
    def streamed_window(self) -> int:
        """Page cache a streamed pass needs at the least: two decoder layers in flight, or the LM
        head (read whole at the end of a pass) and the layer before it."""
        per_layer = max(self.layer_bytes) if self.layer_bytes else self.file_bytes // max(self.n_layers, 1)
        return max(2 * per_layer, self.head_bytes + per_layer)


@dataclass(frozen=True)
class ContextBuffers:
    """What one llama.cpp context allocates besides the weights (all of it touched, so resident)."""

    kv: int  # KV cache: cells × layers × kv heads × head dim × (K + V) × bytes per value
    output: int  # logits rows kept for the caller: max(sequences, outputs) × n_vocab × 4
    compute: int  # the graph's scratch, reused across the graph: the larger of one ubatch's
    #               logits and its attention scores (heads × cells per token)

    @property
    def total(self) -> int:
        return self.kv + self.output + self.compute


def context_buffers(
    shape: ModelSize, cells: int, n_ubatch: int, n_outputs: int, n_seq: int = 1, kv_bytes: int = F32
) -> ContextBuffers:
    """llama.cpp's buffers for a context of `cells` KV cells that returns at most `n_outputs` logits
    rows per call (against the sizes llama.cpp reports: tests/test_memory_plan.py). llama.cpp rounds
    the cells up to a multiple of 256; it reserves max(sequences, outputs) output rows (the first
    n_seq at once, the rest when a call first asks for them)."""
    cells = -(-cells // CELL_PAD) * CELL_PAD
    kv = cells * shape.n_layers * shape.n_head_kv * shape.head_dim * 2 * kv_bytes
    output = max(n_seq, n_outputs) * shape.n_vocab * F32
    logits = min(n_ubatch, n_outputs) * shape.n_vocab * F32 + n_ubatch * 3 * shape.n_embd * F32
    attention = n_ubatch * (shape.n_head * cells + 7 * shape.n_embd) * F32
    return ContextBuffers(kv, output, max(logits, attention))
