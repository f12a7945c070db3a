"""`ondevice worker`: llama.cpp's RPC server on this machine's CPU, advertising the memory it may use.

A client (`--rpc host:port`) places the target's layers on the workers by the free memory each
reports. llama.cpp's CPU device reports the machine's whole RAM as free, which a worker in a
cgroup or beside other programs does not have; so the worker answers the memory question itself:
`--mem` (less what it has allocated since it started), else its cgroup's room, else the RAM the
kernel says is available. It does so by pointing the CPU device's `get_memory` entry
(ggml-backend-impl.h: struct ggml_backend_device_i, the third function pointer) at a Python
function; the device is a process-wide static, and only this process serves it.

The protocol has no authentication and no encryption: anyone who reaches the port can read and
write the worker's memory buffers and run graphs on it. It binds 127.0.0.1 unless --host says
otherwise; reach a worker on another machine through an SSH tunnel or on a trusted network only.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading

import psutil

from ondevice.machine.facts import default_threads
from ondevice.machine.ram import anon_rss, own_cgroup_memory
from ondevice.rpc import library
from ondevice.sizes import format_bytes

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 50052  # llama.cpp's rpc-server default
GET_MEMORY_SLOT = 2  # struct ggml_backend_device_i: get_name, get_description, get_memory, ...
_GetMemory = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t))

OPEN_NETWORK_WARNING = """
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
WARNING: Host ('{host}') is != '127.0.0.1'
         Never expose the RPC server to an open network!
         This is an experimental feature and is not secure!
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
"""  # llama.cpp's rpc-server prints this, word for word


class MemoryReport:
    """What the worker says it has: (free, total) bytes, asked by each client as it places layers."""

    def __init__(self, limit: int | None = None):
        self.limit = limit
        self.start = anon_rss() or psutil.Process().memory_info().rss

    def free_total(self) -> tuple[int, int]:
        if self.limit is not None:
            used = max(0, (anon_rss() or 0) - self.start)
            return max(0, self.limit - used), self.limit
        cgroup = own_cgroup_memory()
        available = int(psutil.virtual_memory().available)
        if cgroup is not None and cgroup.available < available:
            return cgroup.available, cgroup.limit
        return available, int(psutil.virtual_memory().total)

    def source(self) -> str:
        if self.limit is not None:
            return f"--mem {format_bytes(self.limit)}"
        cgroup = own_cgroup_memory()
        return f"cgroup limit {format_bytes(cgroup.limit)}" if cgroup is not None and cgroup.available < psutil.virtual_memory().available else "available RAM"


def report_memory_through(device: int, report: MemoryReport):
    """Point the CPU device's get_memory at `report` (the returned callback must stay alive)."""

    @_GetMemory
    def get_memory(dev, free, total):
        f, t = report.free_total()
        free[0], total[0] = f, t

    iface = (ctypes.c_void_p * (GET_MEMORY_SLOT + 1)).from_address(device)
    iface[GET_MEMORY_SLOT] = ctypes.cast(get_memory, ctypes.c_void_p).value
    return get_memory


def serve(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, mem: int | None = None, threads: int | None = None,
          cache_dir: str | None = None, out=sys.stderr) -> None:
    """Run the worker until interrupted (Ctrl-C) or killed."""
    library.require_rpc()
    if host != DEFAULT_HOST:
        out.write(OPEN_NETWORK_WARNING.format(host=host))
    out.write("ondevice worker: llama.cpp's RPC protocol has no authentication and no encryption; "
              "serve only a trusted network, or keep 127.0.0.1 and reach it through an SSH tunnel.\n")
    report = MemoryReport(mem)
    device = library.cpu_device()
    keep = report_memory_through(device, report)
    free, _ = report.free_total()
    out.write(f"ondevice worker: offering {format_bytes(free)} ({report.source()}) at {host}:{port}, pid {os.getpid()}\n")
    out.flush()
    endpoint = f"{host}:{port}"
    server = threading.Thread(target=library.start_server, args=(endpoint, threads or default_threads(), [device], cache_dir),
                              daemon=True, name="rpc-server")
    server.start()  # in a thread: llama.cpp's accept loop never returns, and Ctrl-C must still stop the worker
    try:
        while server.is_alive():
            server.join(0.5)
    except KeyboardInterrupt:
        out.write("ondevice worker: stopped\n")
        out.flush()
        os._exit(130)  # the server thread is blocked in accept() inside llama.cpp
    del keep
    out.write(f"ondevice worker: llama.cpp's RPC server at {endpoint} stopped (port in use, or not an address of this machine)\n")
    out.flush()
    sys.exit(1)
