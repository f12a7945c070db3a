"""`python -m ondevice.eval.llamacpp_split`: llama-cpp-python's `Llama` over the same RPC split, no
drafts — what a llama.cpp user gets from `--rpc` (one token per pass), for measurements.

    python -m ondevice.eval.llamacpp_split --rpc 127.0.0.1:50052,127.0.0.1:50053 --layers 2,13,13 \
        --prompts heldout2-chat --limit 3 --max-tokens 32

The workers are registered with ggml as llama.cpp's `--rpc` does (common/arg.cpp: add_rpc_devices:
ggml_backend_rpc_add_server, then ggml_backend_register), so `Llama()` picks them as its devices;
--layers (this machine, then each worker: `ondevice generate --rpc … --json` prints them under
placement.rpc) becomes n_gpu_layers and tensor_split, the LM head on the last worker. One JSON line:
tok/s of each answer after its first token, and its token ids.
"""

from __future__ import annotations

import argparse
import ctypes
import json

from ondevice.bench.llamacpp_rows import load_llama, run_row
from ondevice.catalog.choose import choose
from ondevice.bench import prompt_sets
from ondevice.prompt.tokenizer import Tokenizer
from ondevice.rpc import library
from ondevice.rpc.faults import install_abort_handler


def register_workers(endpoints) -> None:
    """Make the workers ggml devices every later load sees (llama.cpp's --rpc)."""
    rpc, _, _ = library._libs()
    ggml = ctypes.CDLL(str(library.lib_path("libggml")))
    ggml.ggml_backend_register.argtypes, ggml.ggml_backend_register.restype = [ctypes.c_void_p], None
    install_abort_handler(endpoints)
    for e in endpoints:
        library.hello(e)
        ggml.ggml_backend_register(rpc.ggml_backend_rpc_add_server(e.encode()))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m ondevice.eval.llamacpp_split", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rpc", required=True, help="the workers, host:port comma-separated, in the split's order")
    ap.add_argument("--layers", required=True, help="decoder layers on this machine, then on each worker, comma-separated")
    ap.add_argument("--pair", default=None, help="catalog pair (default: the default pair)")
    ap.add_argument("--prompts", choices=tuple(prompt_sets.SETS), default="chat")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    endpoints = library.parse_workers(args.rpc)
    layers = [int(n) for n in args.layers.split(",")]
    if len(layers) != len(endpoints) + 1:
        ap.error("--layers needs one count for this machine and one per worker")
    files = choose(args.pair, None, None, draft=False)
    tok = Tokenizer(files.target)
    prompts = prompt_sets.encoded(args.prompts, args.limit, tok)
    register_workers(endpoints)
    shares = layers[1:]
    shares[-1] += 1  # the LM head: one more "layer" after the last, on the last worker
    llm = load_llama(files.target, args.ctx, args.threads, n_gpu_layers=sum(shares), tensor_split=[float(n) for n in shares])
    result, outputs = run_row("llama-cpp-python over RPC, target alone", llm, prompts, args.max_tokens, tok.is_end)
    print(json.dumps({"config": result.config, "tokens_per_second": result.tokens_per_second, "token_ids": outputs,
                      "layers": layers, "rpc": list(endpoints)}))


if __name__ == "__main__":
    main()
