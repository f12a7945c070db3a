"""One engine, many clients: requests wait in a FIFO and run one at a time in a worker thread.

The engine (llama.cpp / torch passes, seconds long) never runs on the event loop. A `Job` carries one
request's generation; the worker posts its events (`Delta` text pieces, then `Finished` or `Failed`)
back to the job's asyncio queue. A job still waiting is removed when its client goes away; a running
one is flagged and the engine stops before its next target pass.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from ondevice.decode.protocols import DraftSpec
from ondevice.serve.errors import ApiError
from ondevice.decode.verify import Sampling

log = logging.getLogger("ondevice.serve")


@dataclass
class Delta:
    text: str  # the next piece of the answer


@dataclass
class Finished:
    completion: Any  # generation.Completion


@dataclass
class Failed:
    error: ApiError


@dataclass(eq=False)
class Job:
    prompt_ids: list[int]
    max_tokens: int
    sampling: Sampling
    spec: DraftSpec | None
    stops: list[str]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False  # the client went away: stop before the next target pass
    tokens: int = 0  # generated so far
    submitted: float = field(default_factory=time.perf_counter)

    def post(self, event: Delta | Finished | Failed) -> None:
        """From the worker thread to the request's coroutine."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop has closed: nobody is listening any more
            pass


class GenerationQueue:
    def __init__(self, run_job: Callable[[Job], str], max_waiting: int = 64):
        """run_job(job) runs in the worker thread and returns the answer's finish reason."""
        self._run_job = run_job
        self.max_waiting = max_waiting
        self._waiting: deque[Job] = deque()
        self._running: Job | None = None
        self._closed = False
        self._cond = threading.Condition()
        self.counts = {"finished": 0, "failed": 0, "cancelled": 0, "tokens": 0}  # answers by outcome; tokens generated
        self._thread = threading.Thread(target=self._work, name="ondevice-generation", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._closed:
                raise ApiError(503, "the server is shutting down.")
            if len(self._waiting) >= self.max_waiting:
                raise ApiError(429, f"{len(self._waiting)} requests are already waiting; try again later.")
            self._waiting.append(job)
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        """The client went away: drop the job if it waits, else stop it at the next target pass."""
        with self._cond:
            if job in self._waiting:
                self._waiting.remove(job)
                self.counts["cancelled"] += 1
                return
        job.cancelled = True

    def snapshot(self) -> dict:
        with self._cond:
            return {"waiting": len(self._waiting), "running": int(self._running is not None), **self.counts}

    def stop_accepting(self, cancel_running: bool = False) -> None:
        """Shutdown begins: refuse new jobs, fail the waiting ones (503); the running one finishes
        unless `cancel_running`."""
        with self._cond:
            self._closed = True
            for job in self._waiting:
                job.post(Failed(ApiError(503, "the server is shutting down.")))
            self.counts["cancelled"] += len(self._waiting)
            self._waiting.clear()
            if cancel_running and self._running is not None:
                self._running.cancelled = True
            self._cond.notify_all()

    def cancel_running(self) -> None:
        """Stop the running answer at its next target pass. Takes no lock: safe in a signal handler."""
        job = self._running
        if job is not None:
            job.cancelled = True

    def close(self, timeout: float | None = None) -> None:
        """Cancel everything and wait for the worker to leave the engine."""
        self.stop_accepting(cancel_running=True)
        self._thread.join(timeout)

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if not self._waiting:
                    return
                job = self._running = self._waiting.popleft()
            outcome = "failed"
            try:
                outcome = "cancelled" if self._run_job(job) == "cancelled" else "finished"
            except ApiError as err:
                job.post(Failed(err))
            except Exception as err:  # the worker must survive anything one request does
                log.exception("generation failed")
                job.post(Failed(ApiError(500, f"generation failed: {type(err).__name__}: {err}")))
            finally:
                with self._cond:
                    self._running = None
                    self.counts[outcome] += 1
                    self.counts["tokens"] += job.tokens
