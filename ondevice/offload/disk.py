"""The disk tier: layers read from the model file on every pass, by a prefetch thread.

A layer's bytes are the byte ranges of its GGUF tensors (`LayerLayout.file_ranges`, found from the
tensor data offsets gguf.GGUFReader reports). The reader thread takes read requests in order, reads
each into the next of a few host staging buffers (pinned when the device is CUDA) with `preadv`,
then drops those pages from the page cache (`posix_fadvise(DONTNEED)`): every pass really reads the
disk, and the page cache does not hold a second copy of what the staging buffers just got.

A staging buffer is reused only after the streamer releases it with the copy that read it
(`release(ticket, after=copy)`), so a read never overwrites bytes still on their way to the device.

Failures reach the foreground as one-line `OndeviceError`s: the file vanished, was replaced or
shrank (short read), a read takes longer than `timeout_s`, or the thread died. No wait is unbounded.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch

from ondevice.errors import OndeviceError
from ondevice.files.gguf_split import part_paths
from ondevice.offload.layout import FileRange, LayerLayout

POLL_S = 0.05  # how often waits look at the reader thread's health


def open_parts(path: str) -> list[int]:
    """Read-only file descriptors of every part of the model at `path` (one unless it is split)."""
    fds = []
    try:
        for part in part_paths(path):
            fds.append(os.open(part, os.O_RDONLY))
    except OSError:
        close_all(fds)
        raise
    return fds


def close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        os.close(fd)


def read_ranges(fds: int | Sequence[int], ranges: Sequence[FileRange], out: torch.Tensor, drop_cache: bool = True) -> int:
    """Read each file range into `out` (1-D uint8 CPU tensor) at its buffer offset; returns bytes read.
    fds: the model file's descriptor, or one per part of a split model (`open_parts`), indexed by range.part.

    Raises EOFError on a short read (the file is shorter than the ranges say).
    """
    fds = [fds] if isinstance(fds, int) else fds
    array = out.numpy()
    total = 0
    for r in ranges:
        fd = fds[r.part]
        view = memoryview(array[r.buffer_offset : r.buffer_offset + r.nbytes])
        done = 0
        while done < r.nbytes:
            n = os.preadv(fd, [view[done:]], r.file_offset + done)
            if n == 0:
                raise EOFError(f"file ends before byte {r.file_offset + r.nbytes}")
            done += n
        if drop_cache:
            os.posix_fadvise(fd, r.file_offset, r.nbytes, os.POSIX_FADV_DONTNEED)
        total += done
    return total


@dataclass
class ReadTicket:
    layer: int
    buffer: int  # which staging buffer
    nbytes: int
    event: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


@dataclass
class DiskStats:
    bytes_read: int = 0
    read_seconds: float = 0.0

    @property
    def bandwidth(self) -> float:
        """Bytes per second while reading."""
        return self.bytes_read / self.read_seconds if self.read_seconds else 0.0


class DiskReader:
    def __init__(
        self,
        path: str,
        layouts: Mapping[int, LayerLayout],
        n_buffers: int = 2,
        pin_memory: bool = False,
        timeout_s: float = 120.0,
    ):
        if any(not layout.file_ranges for layout in layouts.values()):
            raise ValueError("disk-tier layers need file ranges (a GGUF layout)")
        self.path, self.layouts, self.timeout_s = str(path), dict(layouts), timeout_s
        size = max(layout.nbytes for layout in self.layouts.values())
        self.buffers = [torch.empty(size, dtype=torch.uint8, pin_memory=pin_memory) for _ in range(n_buffers)]
        self.parts = [str(p) for p in part_paths(self.path)]
        self.fds = open_parts(self.path)
        self.identity = [_identity(os.fstat(fd)) for fd in self.fds]
        self.free = [queue.Queue() for _ in range(n_buffers)]  # release markers per staging buffer
        for q in self.free:
            q.put(None)
        self.requests: queue.Queue[ReadTicket | None] = queue.Queue()
        self.stats = DiskStats()
        self.n_submitted = 0
        self.error: str | None = None
        self.closed = False
        self.thread = threading.Thread(target=self._run, name="ondevice-disk", daemon=True)
        self.thread.start()

    @property
    def n_buffers(self) -> int:
        return len(self.buffers)

    # --- foreground ---------------------------------------------------------------------------
    def submit(self, layer: int) -> ReadTicket:
        """Queue a read of `layer`; requests are served in order, each into the next staging buffer."""
        ticket = ReadTicket(layer, self.n_submitted % self.n_buffers, self.layouts[layer].nbytes)
        self.n_submitted += 1
        self.requests.put(ticket)
        return ticket

    def wait(self, ticket: ReadTicket) -> torch.Tensor:
        """The staging buffer holding the layer, once read. One-line OndeviceError on any failure."""
        deadline = time.monotonic() + self.timeout_s
        while not ticket.event.wait(POLL_S):
            if self.error is not None or not self.thread.is_alive():
                raise OndeviceError(self.error or f"The reader of {self.path} stopped unexpectedly; restart ondevice.")
            if time.monotonic() > deadline:
                raise OndeviceError(
                    f"Reading layer {ticket.layer} from {self.path} took over {self.timeout_s:.0f} s; "
                    "the disk may be failing or busy: check it, or keep more layers in RAM."
                )
        if ticket.error is not None:
            raise OndeviceError(ticket.error)
        return self.buffers[ticket.buffer][: ticket.nbytes]

    def release(self, ticket: ReadTicket, after=None) -> None:
        """The staging buffer may be refilled once `after` (a copy ticket or marker) is done."""
        self.free[ticket.buffer].put(after)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.requests.put(None)
            self.thread.join(timeout=self.timeout_s)
            close_all(self.fds)

    # --- reader thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while (ticket := self._next_request()) is not None:
            try:
                self._wait_buffer_free(ticket.buffer)
                self._check_file()
                start = time.perf_counter()
                nbytes = read_ranges(self.fds, self.layouts[ticket.layer].file_ranges, self.buffers[ticket.buffer])
                self.stats.read_seconds += time.perf_counter() - start
                self.stats.bytes_read += nbytes
            except BaseException as err:  # reported by the foreground, then this thread ends
                self.error = ticket.error = self._describe(err, ticket.layer)
                ticket.event.set()
                return
            ticket.event.set()

    def _next_request(self) -> ReadTicket | None:
        while not self.closed:
            try:
                return self.requests.get(timeout=POLL_S)
            except queue.Empty:
                continue
        return None

    def _wait_buffer_free(self, buffer: int) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                after = self.free[buffer].get(timeout=POLL_S)
                break
            except queue.Empty:
                if self.closed or time.monotonic() > deadline:
                    raise TimeoutError("staging buffer never released") from None
        if after is not None:
            after.synchronize()

    def _check_file(self) -> None:
        """The path must still name the file we opened, with no fewer bytes than we need."""
        for fd, part, identity in zip(self.fds, self.parts, self.identity):
            if os.fstat(fd).st_nlink == 0 or _identity(os.stat(part)) != identity:
                raise FileNotFoundError("removed or replaced")

    def _describe(self, err: BaseException, layer: int) -> str:
        what = {FileNotFoundError: "vanished or was replaced", EOFError: "shrank"}.get(type(err))
        if what:
            return (
                f"The model file {self.path} {what} while layer {layer} was being read from it; "
                "download it again and restart."
            )
        return (
            f"Reading layer {layer} from {self.path} failed ({type(err).__name__}: {err}); check the disk and restart."
        )


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino
