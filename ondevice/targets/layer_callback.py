"""llama.cpp's eval callback that reports each decoder layer as it finishes (a streaming target's clock).

llama.cpp names each decoder layer's output `l_out-{i}` and the LM head's `result_output`; an eval
callback that asks for those nodes splits the graph there and is called again once each has
computed. `layer_callback(on_layer)` turns that into on_layer(i) per layer and on_layer(OUTPUT_LAYER)
after the head: the page-cache and direct-read windows (targets/page_cache.py, targets/direct_window.py)
steer their reads by it.
"""

from __future__ import annotations

import ctypes
import functools

import llama_cpp

from ondevice.files.gguf_header import OUTPUT_LAYER
from ondevice.machine.llama_repack import ggml_library


@functools.cache
def _ggml_get_name():
    """ggml's tensor-name getter (libggml-base, shipped beside llama-cpp-python's libllama)."""
    lib = ctypes.CDLL(str(ggml_library("libggml-base.so")))
    lib.ggml_get_name.restype = ctypes.c_char_p
    lib.ggml_get_name.argtypes = [ctypes.c_void_p]
    return lib.ggml_get_name


def layer_callback(on_layer):
    """A llama.cpp eval callback that calls on_layer(i) as each decoder layer i finishes computing
    and on_layer(OUTPUT_LAYER) after the LM head (llama.cpp names them `l_out-{i}` and
    `result_output`; asking for those nodes splits the graph there). Keep the returned object alive
    as long as the context uses it."""
    get_name = _ggml_get_name()

    @llama_cpp.ggml_backend_sched_eval_callback
    def callback(tensor, ask, user_data):
        name = get_name(tensor) or b""
        if name.startswith(b"l_out-"):
            layer = int(name[6:])
        elif name == b"result_output":
            layer = OUTPUT_LAYER
        else:
            return not ask  # not observed: the graph runs on (a later call would mean "go on")
        if not ask:
            on_layer(layer)
        return True

    return callback
