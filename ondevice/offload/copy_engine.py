"""Asynchronous host → device copies for the layer streamer: a CUDA side stream, or — when the
"device" is the CPU — a worker thread, so the same prefetch schedule runs (and is tested) anywhere.

Ordering is by markers, like CUDA events:
  ticket = engine.copy(dst, src, after=marker)  # starts once `after` is reached, runs beside compute
  wait   = engine.wait(ticket)                  # compute will not go on until the copy is done
  marker = engine.mark()                        # "everything compute has issued so far"
A copy into a ring slot goes `after` the marker taken when the slot's previous layer finished, so a
slot is never overwritten while a layer still computes with it.
"""

from __future__ import annotations

import queue
import threading
import time

import torch


class DoneMarker:
    """A marker that is already reached (CPU compute is synchronous)."""

    def done(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


# --- CUDA ----------------------------------------------------------------------------------------


class CudaTicket:
    def __init__(self, start: torch.cuda.Event, end: torch.cuda.Event):
        self.start, self.end = start, end

    def done(self) -> bool:
        return self.end.query()

    def synchronize(self, timeout_s: float | None = None) -> None:
        self.end.synchronize()

    def seconds(self) -> float:
        return self.start.elapsed_time(self.end) / 1e3


class CudaMarker:
    def __init__(self, event: torch.cuda.Event):
        self.event = event

    def done(self) -> bool:
        return self.event.query()

    def synchronize(self) -> None:
        self.event.synchronize()


class CudaWait:
    """Compute stalled from `ready` (it reached the layer) until the copy's end, if that came later."""

    def __init__(self, ready: torch.cuda.Event, copied: torch.cuda.Event):
        self.ready, self.copied = ready, copied

    def done(self) -> bool:
        return self.ready.query() and self.copied.query()

    def seconds(self) -> float:
        return max(0.0, self.ready.elapsed_time(self.copied) / 1e3)


class CudaCopyEngine:
    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, after: CudaMarker | DoneMarker | None) -> CudaTicket:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.stream):
            if isinstance(after, CudaMarker):
                self.stream.wait_event(after.event)
            start.record(self.stream)
            dst.copy_(src, non_blocking=True)
            end.record(self.stream)
        return CudaTicket(start, end)

    def wait(self, ticket: CudaTicket) -> CudaWait:
        compute = torch.cuda.current_stream(self.device)
        ready = torch.cuda.Event(enable_timing=True)
        ready.record(compute)
        compute.wait_event(ticket.end)
        return CudaWait(ready, ticket.end)

    def mark(self) -> CudaMarker:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return CudaMarker(event)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def close(self) -> None:
        self.synchronize()


# --- CPU -----------------------------------------------------------------------------------------


class ThreadTicket:
    def __init__(self) -> None:
        self.event = threading.Event()
        self.error: BaseException | None = None
        self.copy_seconds = 0.0

    def done(self) -> bool:
        return self.event.is_set()

    def synchronize(self, timeout_s: float | None = None) -> None:
        if not self.event.wait(timeout_s):
            raise TimeoutError(f"a weight copy did not finish within {timeout_s:.0f} s")
        if self.error is not None:
            raise RuntimeError(f"a weight copy failed: {self.error}") from self.error

    def seconds(self) -> float:
        return self.copy_seconds


class ThreadWait:
    def __init__(self, seconds: float):
        self._seconds = seconds

    def done(self) -> bool:
        return True

    def seconds(self) -> float:
        return self._seconds


class ThreadCopyEngine:
    """Copies run in order on one worker thread (torch releases the GIL while copying)."""

    def __init__(self, timeout_s: float = 120.0):
        self.timeout_s = timeout_s
        self.jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="ondevice-copy", daemon=True)
        self.thread.start()

    def copy(self, dst: torch.Tensor, src: torch.Tensor, after=None) -> ThreadTicket:
        ticket = ThreadTicket()
        self.jobs.put((dst, src, after, ticket))
        return ticket

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            dst, src, after, ticket = job
            try:
                if after is not None:
                    after.synchronize()
                start = time.perf_counter()
                if dst is not None:
                    dst.copy_(src)
                ticket.copy_seconds = time.perf_counter() - start
            except BaseException as err:  # handed to whoever waits on the ticket
                ticket.error = err
            ticket.event.set()

    def wait(self, ticket: ThreadTicket) -> ThreadWait:
        start = time.perf_counter()
        ticket.synchronize(self.timeout_s)
        return ThreadWait(time.perf_counter() - start)

    def mark(self) -> DoneMarker:
        return DoneMarker()

    def synchronize(self) -> None:
        self.copy(None, None).synchronize(self.timeout_s)  # an empty job: done once all before it are

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join(timeout=self.timeout_s)


def copy_engine_for(device: torch.device, timeout_s: float = 120.0):
    return CudaCopyEngine(device) if device.type == "cuda" else ThreadCopyEngine(timeout_s)
