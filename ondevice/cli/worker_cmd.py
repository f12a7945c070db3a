"""`ondevice worker`: lend this machine's memory and CPU to a target split across machines (ondevice/rpc)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ondevice.errors import OndeviceError
from ondevice.rpc.worker import DEFAULT_HOST, DEFAULT_PORT, serve
from ondevice.sizes import parse_size


def worker(
    host: str = typer.Option(DEFAULT_HOST, "--host", help="Address to listen on. Only 127.0.0.1 (the default) is safe: the protocol has no authentication; reach it through an SSH tunnel."),
    port: int = typer.Option(DEFAULT_PORT, "--port", min=1, max=65535, help="TCP port."),
    mem: Optional[str] = typer.Option(None, "--mem", help="Memory to offer clients, e.g. 6GiB (default: this process's cgroup room, or the available RAM)."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="CPU threads for the layers it computes (default: the physical cores)."),
    cache: Optional[Path] = typer.Option(None, "--cache", help="Keep the weights clients send in this folder (llama.cpp's RPC cache): a later load sends hashes instead of tensors over 10 MB."),
) -> None:
    """Serve this machine's CPU and memory to `ondevice ... --rpc HOST:PORT` (llama.cpp's RPC server).

    The client places some of the target's layers here, by the memory this worker offers, and runs them
    here on every pass. Run it on a trusted network only, or keep the default 127.0.0.1 and tunnel:
    `ssh -L 50052:127.0.0.1:50052 HOST` on the client, then `--rpc 127.0.0.1:50052`.
    """
    limit = parse_size(mem) if mem is not None else None
    if limit is not None and limit <= 0:
        raise OndeviceError(f"--mem must be more than 0 bytes (got {mem!r}).")
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
    serve(host, port, limit, threads, str(cache) if cache is not None else None)
