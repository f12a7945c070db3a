"""llama.cpp alone, with none of ondevice's checks: load a GGUF, tokenize, decode one token.

    python llama_alone_child.py MODEL.gguf

Prints "refused" (llama.cpp returned an error) or "loaded"; a file llama.cpp aborts on kills this
process (SIGABRT). What test_untrusted_gguf.py compares ondevice's refusals with: that each case
it names is one llama.cpp itself does not survive.
"""

from __future__ import annotations

import sys

import llama_cpp

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from gguf_model_mutants import TEXT  # noqa: E402


@llama_cpp.llama_log_callback
def _quiet(level, text, user_data):
    pass


def main(path: str) -> str:
    llama_cpp.llama_log_set(_quiet, None)
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = False  # ondevice's AMX crash guard (llama_backend.py), so only the file can abort it
    model = llama_cpp.llama_model_load_from_file(path.encode(), params)
    if not model:
        return "refused"
    vocab = llama_cpp.llama_model_get_vocab(model)
    data = TEXT.encode()
    ids = (llama_cpp.llama_token * (len(data) + 16))()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), ids, len(ids), False, True)
    context_params = llama_cpp.llama_context_default_params()
    context_params.n_ctx, context_params.n_batch, context_params.n_threads = 64, 8, 1
    context = llama_cpp.llama_init_from_model(model, context_params)
    if not context or n <= 0:
        return "refused"
    if llama_cpp.llama_decode(context, llama_cpp.llama_batch_get_one(ids, 1)) != 0:
        return "refused"
    return "loaded"


if __name__ == "__main__":
    print(main(sys.argv[1]), flush=True)
