"""Checkpoint files -> (ModelArgs, state_dict) for `torch_model.Transformer`.

Two sources, same result:
- a GGUF file (llama.cpp's format), every tensor dequantized with the `gguf` package. Where the
  GGUF keeps q/k rows in RoPE-pair order (`ModelArgs.gguf_permuted_rows`: Llama), we undo that to
  get back the Hugging Face "rotate-half" layout the torch model rotates.
- a Hugging Face checkpoint folder: config.json + *.safetensors.

What the architecture is, and the tensors' names, come from `files/architecture.py`.

Tensors are converted to the requested dtype one at a time, so the peak memory is the model in that
dtype plus one fp32 tensor. `iter_gguf_weights` yields them one by one for callers that place them
elsewhere (pinned memory, disk). The LM head may get its own dtype (`head_dtype`): a bf16 body with
an fp32 head keeps logits free of bf16 rounding, which otherwise creates exact ties and doubles
the batch noise (see torch_target.default_dtype). A tied head then gets its own copy.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from gguf.quants import dequantize
from safetensors import safe_open

from ondevice.errors import OndeviceError
from ondevice.files.gguf_reader import SplitReader
from ondevice.files.architecture import GGUF_NAMES, HF_NAMES, ModelArgs, gguf_model_args, hf_model_args, rename

# --- GGUF ------------------------------------------------------------------------------------------


def open_gguf(path: str | Path) -> SplitReader:
    """A reader of the model (every part of a split one), or a one-line OndeviceError (missing, not a GGUF)."""
    return SplitReader(path)


def _unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's convert permutation (rows of each head interleaved as pairs) of a Q/K tensor."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _dequantize(tensor) -> np.ndarray:
    try:
        w = dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as err:
        raise OndeviceError(
            f"Tensor {tensor.name} is stored as {tensor.tensor_type.name}, which the gguf package cannot dequantize: use a K-quant or Q8_0 file."
        ) from err
    return w.reshape(tuple(int(d) for d in reversed(tensor.shape)))  # GGUF lists dims innermost first


def untie_for_head_dtype(args: ModelArgs, dtype, head_dtype) -> tuple[ModelArgs, bool]:
    """(args, copy_head): a head in another dtype than the embeddings cannot share their matrix."""
    if args.tie_embeddings and head_dtype not in (None, dtype):
        return dataclasses.replace(args, tie_embeddings=False), True
    return args, False


def _converted(name: str, w: torch.Tensor, dtype, head_dtype, copy_head: bool):
    """Yield (name, w in its dtype), plus the head's own copy of a tied embedding matrix."""
    yield name, w.to((head_dtype or dtype) if name == "output.weight" else dtype)
    if copy_head and name == "tok_embeddings.weight":
        yield "output.weight", w.to(head_dtype or dtype)


def iter_gguf_weights(
    reader, args: ModelArgs, dtype=torch.float32, head_dtype=torch.float32, keep: Callable[[str], bool] | None = None
):
    """Yield (our name, tensor) for every tensor of the model, dequantized one at a time.

    `args` as returned by `load_gguf` (after `untie_for_head_dtype`): if it says untied while the
    file has no output.weight, the embedding matrix is yielded a second time as the head.
    keep(our name) False: the tensor is skipped, never dequantized (e.g. layers that will stream).
    """
    copy_head = not args.tie_embeddings and not any(t.name == "output.weight" for t in reader.tensors)
    permuted = args.gguf_permuted_rows()
    for tensor in reader.tensors:
        name = rename(tensor.name, GGUF_NAMES)
        if name is None or (keep is not None and not keep(name)):
            continue  # e.g. rope_freqs.weight, already read into args
        w = _dequantize(tensor)
        if (heads := permuted.get(name.split(".", 2)[-1] if name.startswith("layers.") else "")) is not None:
            w = _unpermute_qk(w, heads)
        yield from _converted(name, torch.from_numpy(np.require(w, np.float32, ["C", "W"])), dtype, head_dtype, copy_head)


def load_gguf(path: str | Path, dtype=torch.float32, head_dtype=torch.float32) -> tuple[ModelArgs, dict[str, torch.Tensor]]:
    """A GGUF file -> (ModelArgs, state_dict); head_dtype None: the LM head in dtype like the rest."""
    reader = open_gguf(path)
    args, _ = untie_for_head_dtype(gguf_model_args(reader), dtype, head_dtype)
    return args, dict(iter_gguf_weights(reader, args, dtype, head_dtype))


# --- Hugging Face safetensors ------------------------------------------------------------------------


def load_hf(folder: str | Path, dtype=torch.float32, head_dtype=torch.float32) -> tuple[ModelArgs, dict[str, torch.Tensor]]:
    """A Hugging Face checkpoint folder (config.json + *.safetensors) -> (ModelArgs, state_dict)."""
    folder = Path(folder).expanduser()
    files = sorted(folder.glob("*.safetensors"))
    if not (folder / "config.json").is_file() or not files:
        raise OndeviceError(f"{folder} is not a Hugging Face checkpoint (needs config.json and *.safetensors).")
    args, copy_head = untie_for_head_dtype(hf_model_args(json.loads((folder / "config.json").read_text())), dtype, head_dtype)
    state_dict = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            for key in f.keys():
                name = rename(key, HF_NAMES)
                if name is None or (name == "output.weight" and (args.tie_embeddings or copy_head)):
                    continue  # a checkpoint may store a tied head too
                state_dict.update(_converted(name, f.get_tensor(key), dtype, head_dtype, copy_head))
    return args, state_dict
