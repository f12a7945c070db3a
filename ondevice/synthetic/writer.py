"""Write a synthetic GGUF: a model shape's tensors in llama.cpp's Q4_K_M mix, random and valid.

    path = write_synthetic_gguf(find_shape("qwen2.5-7b"), folder / "qwen2.5-7b.gguf", seed=0)

The header (architecture, hyper-parameters, a synthetic vocabulary) is written by gguf's
GGUFWriter; the tensor data is streamed after it in chunks of ~64 MB, so a 47 GB model needs
64 MB of memory. The same (shape, seed) always gives the same bytes. The file appears under its
name only once complete (written as `<name>.part`, then renamed); free disk space is checked first.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np
from gguf import GGUFWriter
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from ondevice.synthetic.blocks import generator, random_blocks
from ondevice.catalog.models_folder import check_free_space
from ondevice.synthetic.quant_mix import QUANTS, TensorSpec, file_bytes, preset_tensors
from ondevice.synthetic.shapes import LLAMA3_ROPE, ModelShape
from ondevice.synthetic.vocab import synthetic_vocab
from ondevice.files.architecture import llama3_rope_factors

CHUNK_BYTES = 64 << 20
HEADER_ROOM = 64 << 20  # the header (vocabulary); check_free_space adds its own margin
HEAD_GAIN = 4.0  # LM head rows: logits of std ~4, like a trained model's


def write_synthetic_gguf(
    shape: ModelShape, path: str | Path, seed: int = 0, tensors: Sequence[TensorSpec] | None = None, show: bool = True
) -> Path:
    """Write `shape` with random weights to `path`; returns path. `tensors`: names, shapes and types
    to write (default: llama.cpp's mix for the shape's quant). A progress bar if `show`."""
    path = Path(path)
    preset = tensors is None
    tensors = preset_tensors(shape) if preset else list(tensors)
    path.parent.mkdir(parents=True, exist_ok=True)
    check_free_space(path.parent, file_bytes(tensors) + HEADER_ROOM)
    part = path.with_name(path.name + ".part")
    writer = GGUFWriter(str(part), shape.arch)
    _write_header(writer, shape, seed)
    if preset:
        writer.add_file_type(QUANTS[shape.quant])
    for t in tensors:
        writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.qtype)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        out = writer.fout[0]
        with _progress(show) as progress:
            task = progress.add_task(f"writing synthetic {shape.name}", total=file_bytes(tensors))
            for index, t in enumerate(tensors):
                writer.write_padding(out, out.tell())  # each tensor starts at the GGUF alignment
                for chunk in tensor_chunks(shape, t, seed, index):
                    out.write(memoryview(chunk))
                    progress.advance(task, chunk.nbytes)
        writer.close()
        os.replace(part, path)
    except BaseException:
        writer.close()
        part.unlink(missing_ok=True)
        raise
    return path


def tensor_chunks(shape: ModelShape, t: TensorSpec, seed: int, index: int):
    """The tensor's bytes, a run of whole rows at a time; chunk k comes from generator(seed, index, k)."""
    if t.name == "rope_freqs.weight":
        rope = {**LLAMA3_ROPE, "factor": shape.rope_factor}
        yield np.asarray(llama3_rope_factors(shape.head_dim, shape.rope_theta, rope), dtype=np.float32).view(np.uint8)
        return
    rng = generator(seed, index, 0)
    if len(t.shape) == 1:  # norms ~1, biases ~0.1
        values = rng.standard_normal(t.shape[0], dtype=np.float32) * np.float32(0.1)
        yield (values + np.float32(1.0) if t.name.endswith("norm.weight") else values).view(np.uint8)
        return
    rows, columns = t.shape
    std = (HEAD_GAIN if t.name == "output.weight" or (shape.tied and t.name == "token_embd.weight") else 1.0) / np.sqrt(columns)
    row_bytes = t.nbytes // rows
    step = max(1, CHUNK_BYTES // row_bytes)
    for k, start in enumerate(range(0, rows, step)):
        n_rows = min(step, rows - start)
        yield random_blocks(t.qtype, n_rows * columns, generator(seed, index, k), float(std))


def _write_header(writer: GGUFWriter, shape: ModelShape, seed: int) -> None:
    writer.add_name(f"synthetic {shape.name} (random weights, seed {seed})")
    writer.add_string("ondevice.synthetic.shape", shape.name)
    writer.add_uint32("ondevice.synthetic.seed", seed)
    writer.add_quantization_version(2)
    writer.add_context_length(32768 if shape.arch != "llama" else 131072)
    writer.add_embedding_length(shape.dim)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_block_count(shape.n_layers)
    writer.add_head_count(shape.n_heads)
    writer.add_head_count_kv(shape.n_kv_heads)
    if shape.head_dim * shape.n_heads != shape.dim or shape.arch == "qwen3":
        writer.add_key_length(shape.head_dim)
        writer.add_value_length(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.norm_eps)
    if shape.arch == "llama":
        writer.add_rope_dimension_count(shape.head_dim)
        writer.add_vocab_size(shape.vocab)
    tokens, types, merges = synthetic_vocab(shape.vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe" if shape.arch == "llama" else "qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(shape.vocab - 1)
    writer.add_eos_token_id(shape.vocab - 1)
    writer.add_add_bos_token(False)


def _progress(show: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
        console=Console(stderr=True), disable=not show, transient=True,
    )
