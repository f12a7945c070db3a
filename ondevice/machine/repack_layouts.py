"""llama.cpp's repacked CPU weight layouts (its CPU_REPACK buffer type): which weights it repacks here,
and how a load asks for them without the AMX buffer type.

In RAM llama.cpp copies the weights of its matrix products into interleaved layouts its CPU kernels
compute faster with (on x86 with AVX2 or AVX-512: Q4_0, Q4_K and IQ4_NL in blocks of 8 rows). Its
extra buffer types are offered all together (`use_extra_bufts`), and on a CPU with AMX the AMX one
comes first and takes the weights its tile kernels compute; those stay off unless asked for
(machine/llama_repack.py). There the CPU_REPACK layouts are asked for weight by weight instead
(`tensor_buft_overrides`): `repack_overrides` names every block weight `repacks_here` says CPU_REPACK
takes, so a type it does not hold (Q6_K, Q5_0) is never put there.

`repacks_here` asks ggml itself: a tensor of each type and shape initialized in a CPU_REPACK buffer
gets kernels of its layout (its `extra`) or none. The tensor struct's fields are read at offsets
checked against ggml's own functions when the library is first used (`_layout`); a build whose
struct differs has no CPU_REPACK here for ondevice (the file's layout is used).
"""

from __future__ import annotations

import contextlib
import ctypes as C
import functools
import re
from pathlib import Path

import llama_cpp

from ondevice.files.gguf_header import read_header
from ondevice.machine import llama_repack

P = C.c_void_p
BLOCK_WEIGHT = re.compile(r"blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight")
OFF_BUFFER, OFF_SRC0, OFF_DATA, OFF_NAME, OFF_EXTRA = 8, 152, 248, 256, 320  # ggml_tensor, checked in _layout
GGML_TYPE_F32, GGML_TYPE_Q4_K = 0, 12


class InitParams(C.Structure):
    _fields_ = [("mem_size", C.c_size_t), ("mem_buffer", P), ("no_alloc", C.c_bool)]


@functools.cache
def ggml_libs():
    """libggml-base and libggml-cpu with the signatures used here: the instances libllama loaded (a
    second copy would have buffer types of its own, which llama.cpp's scheduler does not know)."""
    base = C.CDLL(str(llama_repack.ggml_library("libggml-base.so")))
    cpu = C.CDLL(str(llama_repack.ggml_library("libggml-cpu.so")))
    sig = {
        "ggml_init": (P, [InitParams]), "ggml_free": (None, [P]),
        "ggml_new_tensor_2d": (P, [P, C.c_int, C.c_int64, C.c_int64]), "ggml_mul_mat": (P, [P, P, P]),
        "ggml_set_name": (P, [P, C.c_char_p]), "ggml_get_name": (P, [P]), "ggml_nbytes": (C.c_size_t, [P]),
        "ggml_backend_reg_get_proc_address": (P, [P, C.c_char_p]), "ggml_backend_reg_dev_get": (P, [P, C.c_size_t]),
        "ggml_backend_buft_name": (C.c_char_p, [P]), "ggml_backend_buft_alloc_buffer": (P, [P, C.c_size_t]),
        "ggml_backend_buffer_get_base": (P, [P]), "ggml_backend_buffer_free": (None, [P]),
        "ggml_backend_tensor_alloc": (C.c_int, [P, P, P]), "ggml_backend_tensor_set": (None, [P, P, C.c_size_t, C.c_size_t]),
        "ggml_backend_buffer_init_tensor": (C.c_int, [P, P]), "ggml_backend_buffer_set_usage": (None, [P, C.c_int]),
    }  # fmt: skip
    for name, (restype, argtypes) in sig.items():
        fn = getattr(base, name)
        fn.restype, fn.argtypes = restype, argtypes
    cpu.ggml_backend_cpu_reg.restype = P
    return base, cpu


def pointer_at(address: int) -> int | None:
    return P.from_address(address).value


@functools.cache
def repack_buffer_type() -> int | None:
    """llama.cpp's CPU_REPACK buffer type on this machine, or None (no such kernels, or a ggml whose
    tensor struct is not the one this module writes)."""
    try:
        base, cpu = ggml_libs()
    except (OSError, AttributeError):  # ggml's libraries not where llama-cpp-python ships them on Linux
        return None
    reg = cpu.ggml_backend_cpu_reg()
    proc = base.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
    if not proc:
        return None
    extra = C.CFUNCTYPE(C.POINTER(P), P)(proc)(base.ggml_backend_reg_dev_get(reg, 0))
    found, i = None, 0
    while extra[i]:
        if base.ggml_backend_buft_name(extra[i]) == b"CPU_REPACK":
            found = extra[i]
        i += 1
    return found if found and _layout(found) else None


def _layout(buft: int) -> bool:
    """Whether ggml's tensor struct has its fields where this module reads and writes them: a tensor
    named, used in a product and allocated in a CPU_REPACK buffer, read back field by field."""
    base, _ = ggml_libs()
    ctx = base.ggml_init(InitParams(1 << 20, None, True))
    try:
        weight = base.ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_K, 256, 8)  # a type every x86 repacking takes, 8 rows
        product = base.ggml_mul_mat(ctx, weight, base.ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 256, 1))
        base.ggml_set_name(weight, b"probe")
        buffer = base.ggml_backend_buft_alloc_buffer(buft, base.ggml_nbytes(weight))
        try:
            base.ggml_backend_tensor_alloc(buffer, weight, base.ggml_backend_buffer_get_base(buffer))
            return (
                base.ggml_get_name(weight) == weight + OFF_NAME and pointer_at(product + OFF_SRC0) == weight
                and pointer_at(weight + OFF_BUFFER) == buffer and pointer_at(weight + OFF_DATA) == base.ggml_backend_buffer_get_base(buffer)
                and bool(pointer_at(weight + OFF_EXTRA))
            )  # fmt: skip
        finally:
            base.ggml_backend_buffer_free(buffer)
    finally:
        base.ggml_free(ctx)


def repacked_names(path: str | Path, tensors: dict | None = None) -> list[str]:
    """The block weights of a GGUF file llama.cpp would repack on this machine (empty: none, or no
    CPU_REPACK here). tensors: its header's, where read already."""
    tensors = read_header(path).tensors if tensors is None else tensors
    weights = {name: (t.qtype, tuple(t.shape)) for name, t in tensors.items() if BLOCK_WEIGHT.fullmatch(name) and len(t.shape) == 2}
    return [name for name, fast in zip(weights, repacks_here(list(weights.values()))) if fast]


def repacks_here(weights: list[tuple[int, tuple[int, int]]]) -> list[bool]:
    """For each (ggml type, (columns, rows)) of a weight, whether llama.cpp would repack it on this
    machine (all False where there is no CPU_REPACK here)."""
    buft = repack_buffer_type()
    if buft is None or not weights:
        return [False] * len(weights)
    base, _ = ggml_libs()
    found = []
    ctx = base.ggml_init(InitParams(1 << 20, None, True))
    buffer = base.ggml_backend_buft_alloc_buffer(buft, 64)  # init_tensor only decides the layout
    try:
        for qtype, shape in weights:
            tensor = base.ggml_new_tensor_2d(ctx, qtype, *shape)
            base.ggml_backend_buffer_init_tensor(buffer, tensor)
            found.append(bool(pointer_at(tensor + OFF_EXTRA)))
    finally:
        base.ggml_backend_buffer_free(buffer)
        base.ggml_free(ctx)
    return found


def layouts_repacked() -> bool:
    """Whether loads that may repack (`llama_backend.load_model`) compute with llama.cpp's CPU_REPACK
    layouts here: wherever ggml has them, through its extra buffer types or weight by weight."""
    return repack_buffer_type() is not None


class TensorOverride(C.Structure):
    """llama.cpp's llama_model_tensor_buft_override: a tensor-name pattern and the buffer type for it."""

    _fields_ = [("pattern", C.c_char_p), ("buft", P)]


def repack_overrides(path: str | Path):
    """The block weights of `path` llama.cpp's CPU_REPACK buffer type takes here, as a
    NULL-terminated array of tensor buffer overrides, or None where there are none. For a load that
    leaves the extra buffer types off (`use_extra_bufts`: on a CPU with AMX, where the AMX one would
    come first): the interleaved layouts without the tile kernels. One pattern per kind of weight,
    naming its layers (llama.cpp compiles every pattern for every tensor it loads)."""
    layers: dict[str, list[str]] = {}
    for name in repacked_names(path):
        _, layer, kind, _ = name.split(".")
        layers.setdefault(kind, []).append(layer)
    if not layers:
        return None
    buft = repack_buffer_type()
    patterns = [f"^blk\\.({'|'.join(found)})\\.{kind}\\.weight$".encode() for kind, found in layers.items()]
    return (TensorOverride * (len(patterns) + 1))(*[TensorOverride(p, buft) for p in patterns], TensorOverride(None, None))


@contextlib.contextmanager
def weight_layout_guard(model: str | Path | None = None):
    """For llama-cpp-python's own `Llama()`, which builds its model parameters itself: the weight layout
    ondevice's loads use here. On a CPU with AMX whose AMX kernels are not used with `model`
    (`repack_runs`), the extra buffer types stay off and `model`'s weights go to CPU_REPACK one by one
    (`repack_overrides`; no model: the weights as the file stores them, mapped). `Llama()` decodes on
    its caller's thread: give a model that uses the AMX kernels only where no other AMX code (torch's
    bfloat16 work) runs on that thread."""
    if not llama_repack.cpu_has_amx() or (model is not None and llama_repack.repack_runs(model)):
        yield
        return
    overrides = repack_overrides(model) if model is not None else None
    bindings = llama_cpp.llama_cpp  # the module whose global Llama.__init__ looks the function up in
    original = bindings.llama_model_default_params

    def guarded():
        params = original()
        params.use_extra_bufts = False
        if overrides is not None:
            params.tensor_buft_overrides = C.cast(overrides, C.c_void_p)
        return params

    bindings.llama_model_default_params = guarded
    try:
        yield
    finally:
        bindings.llama_model_default_params = original
