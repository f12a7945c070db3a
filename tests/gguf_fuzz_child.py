"""The child process of the GGUF fuzz test (test_untrusted_gguf.py): opens each mutant as ondevice does.

    python gguf_fuzz_child.py BASE.gguf SEED N START [KIND]

KIND is `header` (gguf_mutants.py: the format broken; the default) or `model`
(gguf_model_mutants.py: well-formed files whose metadata llama.cpp asserts on). For mutant i (from START on) it prints `start i`, then one JSON line: {"i", "label", "outcome"} where
outcome is "refused: <the one-line error>", "loaded" (the file passed every check and llama.cpp loaded
it and decoded a token) or "bug: <traceback>" (anything but an OndeviceError, or an error of more than
one line). At the end: {"done": true, "maxrss_kb": peak resident memory}. A crash or a hang shows as a
`start i` with nothing after it; the parent restarts the child past it.
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from gguf_model_mutants import TEXT, model_mutants  # noqa: E402
from gguf_mutants import mutants  # noqa: E402
from ondevice.errors import OndeviceError  # noqa: E402
from ondevice.files.gguf_reader import SplitReader  # noqa: E402
from ondevice.files.gguf_check import check_gguf_file  # noqa: E402
from ondevice.llama_backend import LlamaContext, LlamaModel  # noqa: E402
from ondevice.loading.footprint import ModelSize  # noqa: E402
from ondevice.prompt.tokenizer import Tokenizer  # noqa: E402


def open_like_ondevice(path: Path) -> str:
    """What loading a model does to the file, each reader in turn."""
    check_gguf_file(path)
    ModelSize.from_gguf(path)  # the memory plan reads the header first
    SplitReader(path)  # gguf-py: the torch and ONNX backends, VocabTrim
    tokenizer = Tokenizer(path)
    ids = tokenizer.encode(TEXT)  # every byte that a prompt can hold goes through the tokenizer's byte fallback
    tokenizer.decode(ids + list(range(tokenizer.n_vocab)))
    model = LlamaModel(path)
    context = LlamaContext(model, n_ctx=64, n_seq_max=1, n_batch=8, threads=1)
    context.decode([1], [0], [0], [True])
    return "loaded"


def outcome(path: Path) -> str:
    try:
        return open_like_ondevice(path)
    except OndeviceError as err:
        text = str(err)
        return f"refused: {text}" if "\n" not in text.strip() else f"bug: an error of several lines: {text!r}"
    except BaseException:  # noqa: BLE001 - every other exception is what the test looks for
        return "bug: " + traceback.format_exc(limit=4)


def main(base: str, seed: str, n: str, start: str, kind: str = "header") -> None:
    data = Path(base).read_bytes()
    make = {"header": mutants, "model": model_mutants}[kind]
    with tempfile.TemporaryDirectory() as folder:
        for i, (label, blob) in enumerate(make(data, int(seed), int(n))):
            if i < int(start):
                continue
            path = Path(folder) / f"mutant-{i}.gguf"  # a new name each: nothing cached applies to it
            path.write_bytes(blob)
            print(f"start {i}", flush=True)
            print(json.dumps({"i": i, "label": label, "outcome": outcome(path)}), flush=True)
            path.unlink()
    print(json.dumps({"done": True, "maxrss_kb": peak_rss_kb()}), flush=True)


def peak_rss_kb() -> int:
    """This process's peak resident memory since it started. Not ru_maxrss: Linux carries the forking
    parent's peak over exec into it (a pytest process of 1 GB made every child report 1 GB)."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


if __name__ == "__main__":
    main(*sys.argv[1:])
