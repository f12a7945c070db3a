"""CLI options, declared once as Annotated aliases.

The options that say how to load a pipeline (which pair, which backends, how much memory, how many
threads) are one group: `@load_options` adds them to a command, checks them, and hands the command
one `LoadOptions` — so generate, chat, bench and serve accept the same flags, and a bad value
(`--target-backend foo`, `--gpu-memory banana`) fails in one line before anything is downloaded.
"""

from __future__ import annotations

import inspect
import os
import typing
from typing import Annotated, Optional

import typer

from ondevice.loading import LoadOptions

Model = Annotated[
    Optional[str],
    typer.Option("--model", "-m", help="Model pair from the catalog (see `ondevice models`). Default: $ONDEVICE_MODEL or the catalog default."),
]
MaxTokens = Annotated[int, typer.Option("--max-tokens", "-n", min=1, help="Most tokens to generate.")]
Temperature = Annotated[float, typer.Option("--temperature", "-t", help="0 = greedy (exactly the target's argmax); > 0 samples exactly from the target.")]
TopP = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass, in (0, 1].")]
TopK = Annotated[int, typer.Option("--top-k", help="Sample among the k most likely tokens (0 = all).")]
Seed = Annotated[int, typer.Option("--seed", help="Random seed for sampling.")]
Tree = Annotated[str, typer.Option("--tree", help="Draft tree builder: chain, best-first, multi-seq, hybrid (best-first grown from the free trees), lookup (prompt lookup), suffix (this session's text), recycle (the target's past candidates) — the last three need no model — or auto (planner).")]
Budget = Annotated[Optional[int], typer.Option("--budget", help="Drafted tokens per target pass (default: chosen by the builder/planner).")]
Threads = Annotated[Optional[int], typer.Option("--threads", help="CPU threads (default: physical cores this process may use).")]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]
Think = Annotated[
    Optional[bool],
    typer.Option("--think/--no-think", help="Models that think before answering (Qwen3): on or off (default: the model's chat template's default, on)."),
]

# --- the load options: one group, one declaration ---------------------------------------------
TargetModel = Annotated[
    Optional[str],
    typer.Option("--target", help="Your own target instead of the pair's: a GGUF file (first part if split) or hf:owner/repo:Q4_K_M / hf:owner/repo/file.gguf."),
]
DrafterModel = Annotated[
    Optional[str],
    typer.Option("--drafter", help="Your own drafter (GGUF file or hf: reference). Default: the pair's, or for --target one with the same tokenizer, found automatically."),
]
NoDraft = Annotated[bool, typer.Option("--no-draft", help="Target alone: same code path, no drafter.")]
TargetBackend = Annotated[str, typer.Option("--target-backend", help="llama (llama.cpp), onnx (ONNX Runtime, CPU: 4/8-bit MatMulNBits, fast on batched passes), torch (our PyTorch model; GPU offload), or auto: the fastest this machine measured (`ondevice profile`), else llama on a CPU, torch on a GPU.")]
DrafterBackend = Annotated[str, typer.Option("--drafter-backend", help="llama (llama.cpp) or onnx (ONNX Runtime) for the drafter, or auto: the fastest this machine measured (`ondevice profile`; when the target streams from disk both are measured on first use), else llama.")]
VocabTrim = Annotated[bool, typer.Option("--vocab-trim/--no-vocab-trim", help="Draft with the trimmed-vocabulary drafter when one is built.")]
GpuMemory = Annotated[Optional[str], typer.Option("--gpu-memory", help="GPU memory budget for the target, e.g. 6GiB (default: free minus a margin).")]
RamMemory = Annotated[Optional[str], typer.Option("--ram-memory", help="RAM budget for the target, e.g. 8GiB; what does not fit streams from disk (with a GPU: the pinned RAM for layers streamed to it).")]
Overlap = Annotated[
    Optional[bool],
    typer.Option("--overlap/--no-overlap", help="Draft the next tree while the target verifies (default: when the target is on a GPU)."),
]
Ctx = Annotated[
    Optional[int],
    typer.Option("--ctx", help="Context window in tokens (default 4096; when the target streams from disk, generate and bench "
                 "size it to the prompt and --max-tokens: its KV cache is RAM the target's layers can use)."),
]

_KW = inspect.Parameter.KEYWORD_ONLY
LOAD_PARAMETERS = [  # name, annotation, default
    ("model", Model, None),
    ("target", TargetModel, None),
    ("drafter", DrafterModel, None),
    ("target_backend", TargetBackend, "auto"),
    ("drafter_backend", DrafterBackend, "auto"),
    ("no_draft", NoDraft, False),
    ("vocab_trim", VocabTrim, True),
    ("threads", Threads, None),
    ("ctx", Ctx, None),
    ("gpu_memory", GpuMemory, None),
    ("ram_memory", RamMemory, None),
    ("overlap", Overlap, None),
]


def default_model(model: str | None) -> str | None:
    return model or os.environ.get("ONDEVICE_MODEL") or None


def load_options_from(values: dict) -> LoadOptions:
    """The CLI's spelling of the load options → a checked LoadOptions (OndeviceError if bad)."""
    return LoadOptions(
        pair=default_model(values["model"]), target=values["target"], drafter=values["drafter"], target_backend=values["target_backend"],
        drafter_backend=values["drafter_backend"], draft=not values["no_draft"],
        vocab_trim=values["vocab_trim"], threads=values["threads"], n_ctx=values["ctx"],
        gpu_memory=values["gpu_memory"], ram_memory=values["ram_memory"], overlap=values["overlap"],
    ).checked()


def load_options(command):
    """Give a Typer command the load options: its `load: LoadOptions` parameter becomes the flags
    of LOAD_PARAMETERS on the command line, checked before the command body runs."""
    hints = typing.get_type_hints(command, include_extras=True)
    own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in inspect.signature(command).parameters.values() if p.name != "load"]
    shared = [inspect.Parameter(name, _KW, default=default, annotation=kind) for name, kind, default in LOAD_PARAMETERS]

    def run(**kwargs):
        load = load_options_from({name: kwargs.pop(name) for name, _, _ in LOAD_PARAMETERS})
        return command(load=load, **kwargs)

    run.__signature__ = inspect.Signature(own + shared)
    run.__annotations__ = {p.name: p.annotation for p in own + shared}
    run.__name__, run.__qualname__, run.__doc__, run.__module__ = command.__name__, command.__qualname__, command.__doc__, command.__module__
    return run
