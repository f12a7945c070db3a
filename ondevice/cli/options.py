"""CLI options, declared once as Annotated aliases, named as the code names them.

Two groups of options are shared by several commands, each declared once and handed to the command
as one object: `@load_options` gives a command the flags of `LoadOptions` (which pair, which
backends, how much memory, how many threads), checked before anything is downloaded — so generate,
chat, bench, serve and profile accept the same flags, and a bad value (`--target-backend foo`,
`--gpu-memory banana`) fails in one line; `@decoding_options` gives chat and generate the flags of
`Decoding` (how long an answer, how to sample, how to draft).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import typing
from typing import Annotated, Optional

import typer

from ondevice.cli.decoding import Decoding
from ondevice.loading.options import LoadOptions

MaxTokens = Annotated[int, typer.Option("--max-tokens", "-n", min=1, help="Most tokens to generate.")]
Temperature = Annotated[float, typer.Option("--temperature", "-t", help="0 = greedy (exactly the target's argmax); > 0 samples exactly from the target.")]
TopP = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass, in (0, 1].")]
TopK = Annotated[int, typer.Option("--top-k", help="Sample among the k most likely tokens (0 = all).")]
Seed = Annotated[int, typer.Option("--seed", help="Random seed for sampling.")]
Tree = Annotated[str, typer.Option("--tree", help="Draft tree builder: chain, best-first, multi-seq, hybrid (best-first grown from the free trees), lookup (prompt lookup), suffix (this session's text), recycle (the target's past candidates) — the last three need no model — or auto (planner).")]
Budget = Annotated[Optional[int], typer.Option("--budget", help="Drafted tokens per target pass (default: chosen by the builder/planner).")]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]
Think = Annotated[
    Optional[bool],
    typer.Option("--think/--no-think", help="Models that think before answering (Qwen3): on or off (default: the model's chat template's default, on)."),
]

# --- the load options: one group, one declaration ---------------------------------------------
Model = Annotated[
    Optional[str],
    typer.Option("--model", "-m", help="Model pair from the catalog (see `ondevice models`). Default: $ONDEVICE_MODEL or the catalog default."),
]
TargetModel = Annotated[
    Optional[str],
    typer.Option("--target", help="Your own target instead of the pair's: a GGUF file (first part if split) or hf:owner/repo:Q4_K_M / hf:owner/repo/file.gguf."),
]
DrafterModel = Annotated[
    Optional[str],
    typer.Option("--drafter", help="Your own drafter (GGUF file or hf: reference). Default: the pair's, or for --target one with the same tokenizer, found automatically."),
]
Draft = Annotated[bool, typer.Option("--draft/--no-draft", help="Draft with the drafter model, or (--no-draft) run the target alone: same code path, no drafter.")]
TargetBackend = Annotated[str, typer.Option("--target-backend", help="llama (llama.cpp), onnx (ONNX Runtime, CPU: 4/8-bit MatMulNBits, fast on batched passes), torch (our PyTorch model; GPU offload), or auto: the fastest this machine measured (`ondevice profile`), else llama on a CPU, torch on a GPU.")]
DrafterBackend = Annotated[str, typer.Option("--drafter-backend", help="llama (llama.cpp) or onnx (ONNX Runtime) for the drafter, or auto: the fastest this machine measured (`ondevice profile`; when the target streams from disk both are measured on first use), else llama.")]
VocabTrim = Annotated[bool, typer.Option("--vocab-trim/--no-vocab-trim", help="Draft with the trimmed-vocabulary drafter when one is built.")]
Threads = Annotated[Optional[int], typer.Option("--threads", help="CPU threads (default: physical cores this process may use).")]
Ctx = Annotated[
    Optional[int],
    typer.Option("--ctx", help="Context window in tokens (default 4096; when the target streams from disk, generate and bench "
                 "size it to the prompt and --max-tokens, and chat uses 2048, or 1536 or 1024 where that keeps the LM head in RAM: "
                 "its KV cache is RAM the target's layers can use)."),
]
GpuMemory = Annotated[Optional[str], typer.Option("--gpu-memory", help="GPU memory budget for the target, e.g. 6GiB (default: free minus a margin).")]
RamMemory = Annotated[Optional[str], typer.Option("--ram-memory", help="RAM budget for the target, e.g. 8GiB; what does not fit streams from disk (with a GPU: the pinned RAM for layers streamed to it).")]
Overlap = Annotated[
    Optional[bool],
    typer.Option("--overlap/--no-overlap", help="Draft the next tree while the target verifies (default: when the target is on a GPU)."),
]
KeepDrafter = Annotated[
    Optional[bool],
    typer.Option("--keep-drafter/--drop-drafter", help="A target streaming from disk: load the drafter model anyway, or leave it out and give its RAM to the target's layers (free drafts stay on). Default: whichever measured faster here."),
]
RepackedStream = Annotated[
    bool,
    typer.Option("--stream-repacked/--stream-file", help="A target streaming from disk: stream a copy of it in llama.cpp's repacked "
                 "layouts (written once beside the model, as large as it), so its layers compute as in RAM; --stream-file streams the file as it is."),
]

Rpc = Annotated[
    Optional[str],
    typer.Option("--rpc", help="Split the target across this machine and `ondevice worker`s, e.g. 127.0.0.1:50052,10.0.0.3:50052: "
                 "layers placed by the memory each offers; the drafter stays on this CPU. Trusted networks or SSH tunnels only."),
]

LOAD_FLAGS = {  # LoadOptions field -> its flag (`device` has none: the torch target's device, for the Python API)
    "model": Model, "target": TargetModel, "drafter": DrafterModel, "target_backend": TargetBackend, "drafter_backend": DrafterBackend,
    "draft": Draft, "vocab_trim": VocabTrim, "threads": Threads, "ctx": Ctx, "gpu_memory": GpuMemory, "ram_memory": RamMemory,
    "overlap": Overlap, "keep_drafter": KeepDrafter, "rpc": Rpc, "repacked_stream": RepackedStream,
}
DECODING_FLAGS = {  # Decoding field -> its flag
    "max_tokens": MaxTokens, "temperature": Temperature, "top_p": TopP, "top_k": TopK, "seed": Seed, "tree": Tree, "budget": Budget,
    "think": Think,
}


def default_model(model: str | None) -> str | None:
    return model or os.environ.get("ONDEVICE_MODEL") or None


def checked_load_options(**values) -> LoadOptions:
    """The load flags' values → a checked LoadOptions (OndeviceError if bad); --model defaults to $ONDEVICE_MODEL."""
    return LoadOptions(**{**values, "model": default_model(values["model"])}).checked()


def load_options(command):
    """Give a Typer command the load options: its `load: LoadOptions` parameter becomes the flags
    of LOAD_FLAGS on the command line, checked before the command body runs."""
    return option_group(command, "load", LoadOptions, LOAD_FLAGS, checked_load_options)


def decoding_options(**defaults):
    """Give a Typer command the decoding options: its `decoding: Decoding` parameter becomes the
    flags of DECODING_FLAGS, with these defaults where the command's differ (chat: max_tokens=1024)."""
    return lambda command: option_group(command, "decoding", Decoding, DECODING_FLAGS, Decoding, defaults)


def option_group(command, name: str, group, flags: dict, make, defaults: dict | None = None):
    """`command` with its parameter `name` replaced by the flags of the dataclass `group`'s fields
    (defaults: the fields', unless `defaults` says otherwise); make(**values) builds what it gets."""
    hints = typing.get_type_hints(command, include_extras=True)
    own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in inspect.signature(command).parameters.values() if p.name != name]
    defaults = {f.name: f.default for f in dataclasses.fields(group)} | (defaults or {})
    shared = [inspect.Parameter(field, inspect.Parameter.KEYWORD_ONLY, default=defaults[field], annotation=kind) for field, kind in flags.items()]

    def run(**kwargs):
        return command(**{name: make(**{field: kwargs.pop(field) for field in flags})}, **kwargs)

    run.__signature__ = inspect.Signature(own + shared)
    run.__annotations__ = {p.name: p.annotation for p in own + shared}
    run.__name__, run.__qualname__, run.__doc__, run.__module__ = command.__name__, command.__qualname__, command.__doc__, command.__module__
    return run
