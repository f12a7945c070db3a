"""What a load is asked for: `LoadOptions` (the CLI's flags and the Python API's keywords, checked
before anything is downloaded) and `Answers` (what it will answer, when known)."""

from __future__ import annotations

from dataclasses import dataclass

from ondevice.catalog.stores import resolve as stores
from ondevice.errors import OndeviceError
from ondevice.sizes import parse_size

DEFAULT_CTX = 4096  # tokens of context unless --ctx, or a streaming target answering known prompts (`sized_context`)
STREAMING_CHAT_CTX = 2048  # `ondevice chat`'s longest context where the target streams (unless --ctx): answers of
# its default 1024 tokens and as much history, older turns dropped past it; 4096's KV cache takes RAM the target's
# kept layers would have (docs/measurements/code-notes.md, "Streaming chat's context"); shorter where that keeps
# the LM head in RAM (loading/choices.head_keeping_context)
TARGET_BACKENDS = ("auto", "torch", "llama", "onnx")
DRAFTER_BACKENDS = ("auto", "llama", "onnx")
CPU_BACKENDS = ("llama", "onnx")  # what the profile compares on a CPU (`ondevice profile`), and auto picks among



@dataclass
class LoadOptions:
    model: str | None = None  # a catalog pair's name; None: the catalog default
    target: str | None = None  # a GGUF file or hf:owner/repo[:QUANT | /file.gguf] instead of the pair's target
    drafter: str | None = None  # the same for the drafter; default: the pair's, or one found automatically
    target_backend: str = "auto"
    drafter_backend: str = "auto"
    draft: bool = True
    vocab_trim: bool = True
    threads: int | None = None
    ctx: int | None = None  # context window in tokens; None: DEFAULT_CTX, or when a llama.cpp target streams, sized to the answers (`Answers`)
    device: str | None = None  # torch target: "cpu" / "cuda"; default: cuda if available
    gpu_memory: str | None = None
    ram_memory: str | None = None
    overlap: bool | None = None  # draft while the target verifies; None: when the target is on a GPU
    keep_drafter: bool | None = None  # None: where the target streams, load the drafter only where it pays
    # for the layers its RAM would keep (loading/drafter_room.py); True: always (a --tree that needs it, --drafter)
    streaming_ctx: int | None = None  # the context of a streaming target when neither --ctx nor the answers say
    # (chat: STREAMING_CHAT_CTX; None: DEFAULT_CTX): every KV cell not allocated keeps target layers cached
    free_tree_nodes: int | None = None  # the largest tree of the free drafters asked for (a --tree lookup/suffix/
    # recycle --budget): a load without the drafter model sizes a streaming target's buffers for it; None: FREE_TREE_NODES
    rpc: str | None = None  # "host:port,…": the target's layers split across this machine and these workers (ondevice/rpc)
    repacked_stream: bool = True  # a streaming llama.cpp target: stream its copy in llama.cpp's repacked layouts
    # (targets/repacked_copy.py, written once beside the model) where this CPU has them

    def checked(self) -> "LoadOptions":
        """These options, or an OndeviceError naming the bad one: checked before anything is downloaded.
        The flags' values and combinations first, then what a flag names: a model, RPC workers, a size."""
        if self.target_backend not in TARGET_BACKENDS:
            raise OndeviceError(f"unknown target backend {self.target_backend!r}; choose one of {', '.join(TARGET_BACKENDS)}.")
        if self.drafter_backend not in DRAFTER_BACKENDS:
            raise OndeviceError(f"unknown drafter backend {self.drafter_backend!r}; choose one of {', '.join(DRAFTER_BACKENDS)}.")
        if self.threads is not None and self.threads < 1:
            raise OndeviceError(f"--threads must be at least 1 (got {self.threads}).")
        if self.ctx is not None and self.ctx < 16:
            raise OndeviceError(f"--ctx must be at least 16 tokens (got {self.ctx}).")
        if self.drafter is not None and not self.draft:
            raise OndeviceError("--drafter and --no-draft contradict each other; drop one.")
        if self.rpc is not None and self.target_backend not in ("auto", "llama"):
            raise OndeviceError(f"--rpc splits a llama.cpp target; --target-backend {self.target_backend} cannot be split (drop one).")
        for flag, ref in (("--target", self.target), ("--drafter", self.drafter)):
            if ref is not None:
                stores.check(ref, flag)
        if self.rpc is not None:
            from ondevice.rpc import library  # lazy: ggml's RPC library only with --rpc

            library.parse_workers(self.rpc)
            library.require_rpc()  # the installed llama.cpp has RPC
        for flag, size in (("--gpu-memory", self.gpu_memory), ("--ram-memory", self.ram_memory)):
            if size is not None and parse_size(size) <= 0:
                raise OndeviceError(f"{flag} must be more than 0 bytes (got {size!r}).")
        return self

    @property
    def context(self) -> int:
        """The context window in tokens: --ctx, else DEFAULT_CTX (plan_load may size it)."""
        return self.ctx or DEFAULT_CTX


@dataclass(frozen=True)
class Answers:
    """What a load will answer, when known (generate, bench): a streaming target's context is sized
    to them (`sized_context`), so its KV cache takes what they use."""

    prompts: tuple  # strings or conversations
    max_tokens: int  # at most this many tokens each
