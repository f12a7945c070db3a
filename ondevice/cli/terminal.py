"""Keyboard input for `ondevice chat`, with Ctrl-C that always lands.

`input()` has a race: a SIGINT that arrives after the prompt is printed but before the read blocks
(or that the kernel hands to another thread, e.g. one of llama.cpp's) leaves the read blocked and the
KeyboardInterrupt pending forever. `LineReader` waits for input in short `select` steps instead:
Python runs signal handlers between them, so Ctrl-C at the prompt always raises KeyboardInterrupt.
`ctrl_c_stops_the_answer` turns the first Ctrl-C during an answer into a flag the engine checks.
"""

from __future__ import annotations

import io
import os
import select
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Callable

WAIT_STEP_S = 0.2  # how long a Ctrl-C may wait to be noticed at the prompt


class LineReader:
    """Lines typed (or piped) on stdin. Raises EOFError at end of input (Ctrl-D), KeyboardInterrupt on Ctrl-C."""

    def __init__(self, stream=None):
        stream = stream or sys.stdin
        try:
            self.fd = stream.fileno() if os.name != "nt" else None  # select() takes no console handle on Windows
        except (AttributeError, io.UnsupportedOperation):
            self.fd = None  # not a real file: plain input()
        self.pending = b""  # bytes read past the last line returned

    def read(self, prompt: str, idle: Callable[[], bool] | None = None) -> str:
        """One line. idle(): work to do while no input is waiting, one short step per call (the
        planner measuring its profile); it returns False when it has nothing left to do."""
        if self.fd is None:
            return input(prompt)
        sys.stdout.write(prompt)
        sys.stdout.flush()
        while b"\n" not in self.pending:
            if not select.select([self.fd], [], [], 0 if idle is not None else WAIT_STEP_S)[0]:
                if idle is not None and not idle():
                    idle = None
                continue  # signal handlers run here
            chunk = os.read(self.fd, 65536)
            if not chunk:  # end of input
                if not self.pending:
                    raise EOFError
                line, self.pending = self.pending, b""
                return line.decode("utf-8", errors="replace")
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return line.decode("utf-8", errors="replace").removesuffix("\r")


@contextmanager
def ctrl_c_stops_the_answer():
    """While answering, the first Ctrl-C (SIGINT) sets the event the engine checks before each target
    pass (`should_stop`: it is never cut mid-pass); a second one interrupts at once (quits)."""
    stop = threading.Event()

    def on_sigint(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)
