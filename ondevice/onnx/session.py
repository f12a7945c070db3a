"""ONNX Runtime sessions, set up in one place: threads, spinning, graph optimizations — and the check
that every MatMulNBits node runs a fast integer kernel.

Threads: `machine.facts.default_threads()` (physical cores this process may use) unless told; the
threads inherit the process's CPU affinity (taskset, cgroups), so ORT pins nothing itself. Intra-op
threads do not spin while idle: the drafter (llama.cpp or ORT) and the target take turns on the same
cores, and a spinning pool would steal the other's time between calls.

Fast kernels: ONNX Runtime runs MatMulNBits on its packed integer kernels only for some
(bits, block size, accuracy level) on a given CPU and only without float zero points; otherwise it
dequantizes the whole matrix to float32 on every call (README, "ONNX Runtime on the CPU", says how
much slower). ORT does not say which path it took, so `check_fast_kernels` times it: each distinct configuration
in a graph, on a 1024×1024 matrix (2048² to confirm a slow one), against a float32 MatMul of the
same size. The fallback writes the whole float32 matrix and then runs that very MatMul over it: at
least twice its memory traffic; a packed kernel reads 4–8× fewer bytes. So the line is drawn at 2×,
far from both (README, "ONNX Runtime on the CPU", has what each measured and the command).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from ondevice.errors import OndeviceError
from ondevice.machine.facts import default_threads

FALLBACK_RATIO = 2.0  # slower than this × a float MatMul: the dequantize-everything fallback


def session_options(threads: int | None = None) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or default_threads()
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only
    return options


def open_session(path: str | Path, threads: int | None = None) -> ort.InferenceSession:
    try:
        return ort.InferenceSession(str(path), session_options(threads), providers=["CPUExecutionProvider"])
    except Exception as err:  # a damaged or stale cache file
        raise OndeviceError(f"ONNX Runtime cannot load {path} ({str(err).splitlines()[0]}); delete {Path(path).parent} to rebuild it.") from err


# --- the fast-kernel check ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NBitsConfig:
    bits: int
    block: int
    accuracy_level: int
    zero_point_type: int | None = None  # TensorProto data type of a zero-point input, None if absent


def nbits_configs(model_path: str | Path) -> set[NBitsConfig]:
    """The distinct MatMulNBits configurations of a saved model (its weights are not loaded)."""
    model = onnx.load(str(model_path), load_external_data=False)
    types = {init.name: init.data_type for init in model.graph.initializer}
    configs = set()
    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        zero = node.input[3] if len(node.input) > 3 and node.input[3] else None
        configs.add(NBitsConfig(attrs["bits"], attrs["block_size"], attrs.get("accuracy_level", 0), types.get(zero) if zero else None))
    return configs


def _one_node(config: NBitsConfig | None, k: int, n: int) -> bytes:
    """A model of one MatMulNBits with this config (or, for None, one float32 MatMul) of k → n."""
    rng = np.random.default_rng(0)
    inits, x = [], helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])
    if config is None:
        inits.append(numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32), "w"))
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
    else:
        blocks = k // config.block
        inits.append(numpy_helper.from_array(rng.integers(0, 256, (n, blocks, config.block * config.bits // 8), dtype=np.uint8), "b"))
        inits.append(numpy_helper.from_array(rng.random((n, blocks), dtype=np.float32), "s"))
        inputs = ["x", "b", "s"]
        if config.zero_point_type is not None:
            zero_dtype = helper.tensor_dtype_to_np_dtype(config.zero_point_type)
            shape = (n, blocks) if config.zero_point_type != TensorProto.UINT8 or config.bits == 8 else (n, (blocks + 1) // 2)
            inits.append(numpy_helper.from_array(np.zeros(shape, dtype=zero_dtype), "z"))
            inputs.append("z")
        node = helper.make_node("MatMulNBits", inputs, ["y"], domain="com.microsoft", K=k, N=n, bits=config.bits,
                                block_size=config.block, accuracy_level=config.accuracy_level)  # fmt: skip
    graph = helper.make_graph([node], "probe", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]).SerializeToString()


def kernel_ratio(config: NBitsConfig, size: int = 2048, repeats: int = 5, threads: int | None = None) -> float:
    """Time of one MatMulNBits call with this config over a float32 MatMul's, same size, one token:
    best of `repeats` each, interleaved (other processes only ever add time)."""
    sessions = [ort.InferenceSession(_one_node(c, size, size), session_options(threads), providers=["CPUExecutionProvider"])
                for c in (config, None)]  # fmt: skip
    x = np.random.default_rng(1).standard_normal((1, size), dtype=np.float32)
    best = [float("inf"), float("inf")]
    for _ in range(repeats):
        for i, session in enumerate(sessions):
            t0 = time.perf_counter()
            session.run(None, {"x": x})
            best[i] = min(best[i], time.perf_counter() - t0)
    return best[0] / best[1]


def kernel_ratios(model_paths: list[str | Path], threads: int | None = None) -> dict[NBitsConfig, float]:
    """{config: kernel_ratio} for every MatMulNBits configuration in these models: on a 1024² matrix
    and a slow one again on 2048² before it is called a fallback."""
    configs = set().union(*(nbits_configs(path) for path in model_paths))
    ratios = {config: kernel_ratio(config, size=1024, threads=threads) for config in configs}
    return {c: r if r <= FALLBACK_RATIO else kernel_ratio(c, size=2048, repeats=7, threads=threads) for c, r in ratios.items()}


def fallback_error(ratios: dict[NBitsConfig, float]) -> str | None:
    """The one-line error for configurations on the fallback path, None if every one is fast."""
    slow = {c: r for c, r in ratios.items() if r > FALLBACK_RATIO}
    if not slow:
        return None
    desc = ", ".join(f"{c.bits}-bit block {c.block} accuracy {c.accuracy_level} ({r:.2f}× a float MatMul)" for c, r in slow.items())
    return f"MatMulNBits falls back to dequantizing every weight on this CPU for {desc}: use the llama backends."


def check_fast_kernels(model_paths: list[str | Path], threads: int | None = None) -> dict[NBitsConfig, float]:
    """kernel_ratios, or an OndeviceError if any configuration would run the dequantize-everything fallback."""
    ratios = kernel_ratios(model_paths, threads)
    if error := fallback_error(ratios):
        raise OndeviceError(error)
    return ratios
