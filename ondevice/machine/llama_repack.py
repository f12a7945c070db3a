"""Whether llama.cpp's repacked weight layouts run on this machine: a fact measured once per build.

llama.cpp copies weights it holds in RAM into faster CPU layouts (its extra buffer types: the
AVX2/AVX-512 interleaved blocks, and on CPUs with AMX the tile layout of its AMX kernels). Built by
GCC 12, the AMX kernels die at their first tile instruction: GCC 12's `_tile_loadconfig` tells the
compiler that it reads only the first 8 bytes of the 64-byte tile configuration, so the stores of the
tile shapes are dropped as dead and an empty configuration is loaded (llama.cpp's own fix, open:
ggml-org/llama.cpp#26954, keeps the configuration in read-only data). The README's install builds
llama.cpp with `-fno-tree-dse -fno-dse`, which keeps those stores; a wheel built without them (pip's
cache of an earlier install) still crashes. So on a CPU with AMX a child process loads a model with
the repacked layouts and decodes a batch of 8 tokens: it exits cleanly where they run and dies of an
illegal instruction or a segfault where they do not. The verdict is saved in the home per build of
the library and set of weight types (`runs_here`).

It is asked only where the user turns the AMX kernels on (ONDEVICE_AMX=1: `repack_runs`); off by
default because no answer in RAM got faster with them while the repacked copies cost memory
(docs/measurements). Without them a load asks for the CPU_REPACK layouts weight by weight, leaving the
AMX buffer type out (machine/repack_layouts.py). llama.cpp loads a thread's tile configuration once and trusts it from then on,
so a context whose model uses them decodes on a thread of its own (llama_backend.LlamaContext): torch's
bfloat16 matmuls release the calling thread's configuration, and the next AMX pass there would die.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterable

import llama_cpp

from ondevice.files.gguf_header import read_header
from ondevice.machine.ram import anon_rss, ram_budget
from ondevice.paths import read_state, state_file, write_json

LIB_DIR = Path(llama_cpp.__file__).parent / "lib"  # llama-cpp-python's shared libraries (libggml-*.so, libllama.so)


def ggml_library(name: str) -> Path:
    """The path of one of ggml's libraries beside libllama by its soname (name.0) where it ships so:
    opened by another name, the dynamic loader gives a second copy, whose state (its buffer types)
    llama.cpp does not share."""
    versioned = LIB_DIR / f"{name}.0"
    return versioned if versioned.exists() else LIB_DIR / name
SAVED = "llama-repack.json"  # in the home's machine/ folder
PROBE_SECONDS = 300  # a child that takes longer (a very large model on a slow disk) tells nothing
PROBE_MARGIN = 512 << 20  # the child's interpreter, llama.cpp and its buffers, and room to spare
CRASHES = (-signal.SIGILL, -signal.SIGSEGV, -signal.SIGBUS)

CHILD = textwrap.dedent("""
    import sys
    import llama_cpp as L
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.use_extra_bufts, mp.n_gpu_layers = True, 0
    model = L.llama_model_load_from_file(sys.argv[1].encode(), mp)
    if not model:
        sys.exit(3)
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 64, 64, 64
    cp.n_threads = cp.n_threads_batch = 2
    ctx = L.llama_init_from_model(model, cp)
    batch = L.llama_batch_init(8, 0, 1)
    batch.n_tokens = 8
    for i in range(8):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = 100 + i, i, 1, i == 7
        batch.seq_id[i][0] = 0
    sys.exit(0 if L.llama_decode(ctx, batch) == 0 else 4)
""")


def library_identity(library: str | Path) -> list:
    """The shared library's path, size and modification time: a new build (or install) is a new identity."""
    info = os.stat(library)
    return [str(library), info.st_size, info.st_mtime_ns]


def repacked_batch_runs(model: str | Path) -> bool | None:
    """True if a child process loads `model` with llama.cpp's repacked layouts and decodes 8 tokens;
    False if it dies of what broken kernels raise (an illegal instruction, a segfault, a bus error);
    None if it fails otherwise (killed for memory under a limit, no model, no answer within
    PROBE_SECONDS): that says nothing of the build."""
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}  # a crash ends the child at once, without a debugger's trace
    try:
        result = subprocess.run([sys.executable, "-c", CHILD, str(model)], env=env, capture_output=True, timeout=PROBE_SECONDS)
    except subprocess.TimeoutExpired:
        return None
    if result.returncode == 0:
        return True
    return False if result.returncode in CRASHES else None


def fits_twice(model: str | Path) -> bool:
    """Whether `model` held twice (a repacked copy and the file's pages) fits in the memory this process
    may still use. Where it does not, a probe's child could get this process OOM-killed instead, and
    llama.cpp's own repacking load is killed (under a 0.9 GB limit, the 1.1 GB default target)."""
    try:
        size = Path(model).stat().st_size
    except OSError:  # no model to probe with
        return False
    return ram_budget().bytes - (anon_rss() or 0) >= 2 * size + PROBE_MARGIN


_verdicts: dict[str, bool] = {}  # this process's: per build of the library and set of weight types


def runs_here(model: str | Path, library: str | Path, types: Iterable[str]) -> bool:
    """The verdict for this build of `library` (llama.cpp's CPU backend) and a model of these weight
    `types`: saved in the home, else measured now with `model` (a few seconds, once) and saved. A
    crash with any types condemns the build (the tile configuration is every AMX kernel's); a probe
    that says nothing (`repacked_batch_runs` None), or none run for want of memory, leaves the weights
    unrepacked and saves nothing."""
    identity = library_identity(library) if Path(library).exists() else [str(library)]
    key = ",".join(sorted(set(types)))
    memo = json.dumps([identity, key])
    if memo not in _verdicts:
        saved = state_file("machine", SAVED)
        verdicts = read_state(saved, lambda d: {str(k): bool(v) for k, v in d["runs"].items()} if d["library"] == identity else {},
                              "llama.cpp repack verdict") or {}
        if False in verdicts.values():
            _verdicts[memo] = False
        elif key in verdicts:
            _verdicts[memo] = verdicts[key]
        else:
            verdict = repacked_batch_runs(model) if fits_twice(model) else None
            _verdicts[memo] = bool(verdict)  # no verdict: the file's layout for this process, and asked again next time
            if verdict is not None:
                verdicts[key] = verdict
                write_json(saved, {"library": identity, "runs": verdicts})
    return _verdicts[memo]


@functools.cache
def cpu_has_amx() -> bool:
    """True if this CPU reports AMX (Linux /proc/cpuinfo flags) or llama.cpp was built with AMX."""
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="replace")
        if any(f in flags.split() for f in ("amx_tile", "amx_int8", "amx_bf16")):
            return True
    except OSError:
        pass
    return b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info()


def repack_runs(model: str | Path) -> bool:
    """True if llama.cpp's repacked layouts are used here: always on a CPU without AMX; with AMX, only with
    ONDEVICE_AMX=1 and where this build runs them with `model` (this module says why)."""
    if not cpu_has_amx():
        return True
    if os.environ.get("ONDEVICE_AMX", "") in ("", "0"):
        return False
    types = {t.type_name for t in read_header(model).tensors.values()}
    return runs_here(model, LIB_DIR / "libggml-cpu.so", types)
