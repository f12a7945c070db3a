"""llama.cpp's RPC backend through ctypes: is it built in, connect to a worker, start a server.

llama-cpp-python builds it when installed with `CMAKE_ARGS=-DGGML_RPC=ON` (libggml-rpc.so beside
libllama); its Python bindings do not wrap it, so this file does, from ggml-rpc.h and ggml-backend.h
of the pinned llama.cpp:

    ggml_backend_reg_t ggml_backend_rpc_add_server(const char * endpoint);   // a worker's devices
    void ggml_backend_rpc_start_server(const char * endpoint, const char * cache_dir,
                                       size_t n_threads, size_t n_devices, ggml_backend_dev_t * devices);

llama.cpp's RPC client aborts the process when a worker cannot be reached, so `hello` asks each
worker first, in Python, with a timeout (the same handshake: command 14, 24 capability bytes).
"""

from __future__ import annotations

import ctypes
import functools
import socket
import struct
from pathlib import Path

import llama_cpp

from ondevice.errors import OndeviceError
from ondevice.machine.llama_repack import LIB_DIR
RPC_LIB = LIB_DIR / "libggml-rpc.so"  # built with -DGGML_RPC=ON
RPC_PROTO_MAJOR = 7  # ggml-rpc.h of the pinned llama.cpp: a worker must speak the same major version
CMD_HELLO = 14
CONN_CAPS = 24  # transport.h: RPC_CONN_CAPS_SIZE; all zero asks for plain TCP
INSTALL_HINT = "reinstall with RPC: CMAKE_ARGS=-DGGML_RPC=ON pip install --force-reinstall --no-cache-dir llama-cpp-python==" + llama_cpp.__version__
CPU_DEVICE_TYPE = 0  # GGML_BACKEND_DEVICE_TYPE_CPU


def rpc_available() -> bool:
    """Whether the installed llama-cpp-python was built with llama.cpp's RPC backend."""
    return RPC_LIB.is_file() and bool(llama_cpp.llama_supports_rpc())


def require_rpc() -> None:
    if not rpc_available():
        raise OndeviceError(f"this llama-cpp-python ({llama_cpp.__version__}) was built without llama.cpp's RPC backend; {INSTALL_HINT}")


def lib_path(name: str) -> Path:
    """The file of ggml library `name` that llama.cpp itself uses in this process. A wheel cannot hold
    symbolic links, so libggml.so, libggml.so.0 and libggml.so.0.25.3 are three copies, and opening
    another than libllama's (NEEDED: libggml.so.0) would load a second ggml with its own state: its
    own device registry, RPC connections and abort callback."""
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            path = line.split()[-1] if line.split() else ""
            if path.startswith(str(LIB_DIR / name) + ".so"):
                return Path(path)
    except OSError:
        pass
    soname = LIB_DIR / f"{name}.so.0"
    return soname if soname.is_file() else LIB_DIR / f"{name}.so"


@functools.cache
def _libs():
    """(libggml-rpc, libggml-base, libggml) with the signatures used here."""
    require_rpc()
    rpc = ctypes.CDLL(str(lib_path("libggml-rpc")))
    base = ctypes.CDLL(str(lib_path("libggml-base")))
    ggml = ctypes.CDLL(str(lib_path("libggml")))
    p, size_t = ctypes.c_void_p, ctypes.c_size_t
    rpc.ggml_backend_rpc_add_server.restype, rpc.ggml_backend_rpc_add_server.argtypes = p, [ctypes.c_char_p]
    rpc.ggml_backend_rpc_start_server.restype = None
    rpc.ggml_backend_rpc_start_server.argtypes = [ctypes.c_char_p, ctypes.c_char_p, size_t, size_t, ctypes.POINTER(p)]
    base.ggml_backend_reg_dev_count.restype, base.ggml_backend_reg_dev_count.argtypes = size_t, [p]
    base.ggml_backend_reg_dev_get.restype, base.ggml_backend_reg_dev_get.argtypes = p, [p, size_t]
    base.ggml_backend_dev_name.restype, base.ggml_backend_dev_name.argtypes = ctypes.c_char_p, [p]
    base.ggml_backend_dev_memory.restype = None
    base.ggml_backend_dev_memory.argtypes = [p, ctypes.POINTER(size_t), ctypes.POINTER(size_t)]
    ggml.ggml_backend_dev_by_type.restype, ggml.ggml_backend_dev_by_type.argtypes = p, [ctypes.c_int]
    return rpc, base, ggml


def parse_endpoint(text: str) -> tuple[str, int]:
    """'host:port' → (host, port), or an OndeviceError naming the fix."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise OndeviceError(f"{text!r} is not a worker address; give host:port, e.g. 127.0.0.1:50052.")
    return host, int(port)


def parse_workers(text: str) -> tuple[str, ...]:
    """'h1:p1,h2:p2' → the endpoints, each checked (parse_endpoint), no repeats."""
    endpoints = tuple(e.strip() for e in text.split(",") if e.strip())
    if not endpoints:
        raise OndeviceError("--rpc needs at least one worker, e.g. --rpc 127.0.0.1:50052.")
    for e in endpoints:
        parse_endpoint(e)
    if len(set(endpoints)) != len(endpoints):
        raise OndeviceError(f"--rpc names a worker twice ({text}); give each once.")
    return endpoints


def hello(endpoint: str, timeout: float = 5.0) -> tuple[int, int, int]:
    """The worker's protocol version (major, minor, patch), asked as llama.cpp's client asks, or an
    OndeviceError: llama.cpp itself would abort the process on a worker it cannot reach."""
    host, port = parse_endpoint(endpoint)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(struct.pack("<BQ", CMD_HELLO, CONN_CAPS) + bytes(CONN_CAPS))
            head = _recv(sock, 8)
            (size,) = struct.unpack("<Q", head)
            body = _recv(sock, size)
    except socket.timeout:
        raise OndeviceError(f"worker {endpoint} did not answer within {timeout:.0f} s (busy with another client, or not an ondevice worker).") from None
    except OSError as err:
        raise OndeviceError(f"cannot reach worker {endpoint} ({err.strerror or err}); start it with `ondevice worker` there.") from None
    major, minor, patch = body[0], body[1], body[2]
    if major != RPC_PROTO_MAJOR:
        raise OndeviceError(f"worker {endpoint} speaks RPC protocol {major}.{minor}.{patch}, this client {RPC_PROTO_MAJOR}.x; install the same llama-cpp-python on both.")
    return major, minor, patch


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the worker closed the connection")
        data += chunk
    return data


@functools.cache
def worker_devices(endpoint: str) -> tuple[int, ...]:
    """The ggml devices (pointers) of one worker, connected once per process: its first `hello`
    checks it answers, then llama.cpp's client connects for good."""
    hello(endpoint)
    rpc, base, _ = _libs()
    reg = rpc.ggml_backend_rpc_add_server(endpoint.encode())
    if not reg:
        raise OndeviceError(f"llama.cpp could not add worker {endpoint}.")
    return tuple(base.ggml_backend_reg_dev_get(reg, i) for i in range(base.ggml_backend_reg_dev_count(reg)))


def device_memory(device: int) -> tuple[int, int]:
    """(free, total) bytes a device reports (a worker: what `ondevice worker` advertises)."""
    _, base, _ = _libs()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    base.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


def device_name(device: int) -> str:
    return _libs()[1].ggml_backend_dev_name(device).decode(errors="replace")


def cpu_device() -> int:
    return _libs()[2].ggml_backend_dev_by_type(CPU_DEVICE_TYPE)


def start_server(endpoint: str, threads: int, devices: list[int], cache_dir: str | None = None) -> None:
    """Serve `devices` at `endpoint` until the process ends (llama.cpp's loop: one client at a time)."""
    rpc, _, _ = _libs()
    arr = (ctypes.c_void_p * len(devices))(*devices)
    rpc.ggml_backend_rpc_start_server(endpoint.encode(), cache_dir.encode() if cache_dir else None, threads, len(devices), arr)
