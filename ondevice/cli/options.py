"""CLI options, declared once as Annotated aliases and shared by generate, chat and bench."""

from __future__ import annotations

import os
from typing import Annotated, Optional

import typer

Model = Annotated[
    Optional[str],
    typer.Option("--model", "-m", help="Model pair from the catalog (see `ondevice models`). Default: $ONDEVICE_MODEL or the catalog default."),
]
MaxTokens = Annotated[int, typer.Option("--max-tokens", "-n", min=1, help="Most tokens to generate.")]
Temperature = Annotated[float, typer.Option("--temperature", "-t", help="0 = greedy (exactly the target's argmax); > 0 samples exactly from the target.")]
TopP = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass, in (0, 1].")]
TopK = Annotated[int, typer.Option("--top-k", help="Sample among the k most likely tokens (0 = all).")]
Seed = Annotated[int, typer.Option("--seed", help="Random seed for sampling.")]
NoDraft = Annotated[bool, typer.Option("--no-draft", help="Target alone: same code path, no drafter.")]
Tree = Annotated[str, typer.Option("--tree", help="Draft tree builder: chain, best-first, multi-seq, lookup (prompt lookup: no model), or auto (planner).")]
Budget = Annotated[Optional[int], typer.Option("--budget", help="Drafted tokens per target pass (default: chosen by the builder/planner).")]
TargetBackend = Annotated[str, typer.Option("--target-backend", help="torch (our PyTorch target; GPU offload) or llama (llama.cpp GGUF target), or auto.")]
VocabTrim = Annotated[bool, typer.Option("--vocab-trim/--no-vocab-trim", help="Draft with the trimmed-vocabulary drafter when one is built.")]
GpuMemory = Annotated[Optional[str], typer.Option("--gpu-memory", help="GPU memory budget for the target, e.g. 6GiB (default: free minus a margin).")]
RamMemory = Annotated[Optional[str], typer.Option("--ram-memory", help="Pinned RAM budget for streamed layers, e.g. 8GiB; the rest streams from disk.")]
Overlap = Annotated[
    Optional[bool],
    typer.Option("--overlap/--no-overlap", help="Draft the next tree while the target verifies (default: when the target is on a GPU)."),
]
Threads = Annotated[Optional[int], typer.Option("--threads", help="CPU threads (default: physical cores).")]
Ctx = Annotated[int, typer.Option("--ctx", help="Context window in tokens.")]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Print timings after each answer.")]


def default_model(model: str | None) -> str | None:
    return model or os.environ.get("ONDEVICE_MODEL") or None
