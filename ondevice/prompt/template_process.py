"""Chat templates rendered in a child process, under a time, memory and output budget.

A chat template comes from the model file, so from anyone. jinja2's sandbox (chat_template.py)
stops escapes — no reaching Python internals — but not runaway work: nested `range(99999)` loops run
at 100% CPU until killed, `{{ 'x' * 10**8 }}` takes gigabytes, and in `ondevice serve` such a
template would block the event loop.

Why a process and not hooks in the sandbox: jinja2 compiles a template to Python code, and a thread
running it cannot be stopped from outside. Stopping it from inside means a deadline check in every
place that can loop or allocate — `range`, `*` on strings and lists, filters such as `center`,
`indent`, `wordwrap`, `batch`, str methods such as `zfill` or `ljust`, format widths, `lipsum` —
and one place forgotten is a hang or an out-of-memory kill of the whole server. A process can be
killed whatever it runs, and the kernel bounds its memory (RLIMIT_AS). So one worker per process
(started on first use: ~0.1 s, it imports only jinja2) renders every template; a render is one pipe
round trip (~1 ms for a chat). Past `TEMPLATE_SECONDS` the worker is killed and the next render
starts a fresh one; the worker also stops itself with an alarm, so one whose parent died cannot
spin on. Memory past `WORKER_MEMORY_BYTES` is a MemoryError in the worker, an output longer than
`MAX_OUTPUT_CHARS` is refused there, a prompt that is not text (a lone surrogate) is refused here:
each is one OndeviceError line. Whatever else a template raises is its own error line (the worker
never dies of it); a worker that does die (killed from outside) is said to have died, not to have
run out of time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

from ondevice.errors import OndeviceError
from ondevice.prompt.chat_template import render as render_here
from ondevice.prompt.text import check_text

TEMPLATE_SECONDS = 5.0  # a real template renders a long conversation in milliseconds
STARTUP_SECONDS = 120.0  # a worker starting (Python, jinja2: ~0.1 s) where the page cache thrashes (a model
# streaming from disk in a 1.2 GB cgroup) can take more than 5 s: its start is not the template's time
WORKER_MEMORY_BYTES = 1 << 30  # the worker's address space: Python, jinja2 and the render
MAX_OUTPUT_CHARS = 32 << 20  # a prompt longer than any context window holds


class TemplateProcess:
    """One worker process and the lock that gives it one render at a time."""

    def __init__(self):
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None  # reads the answer, so that waiting for it can time out
        self._stopped = False

    def render(self, request: dict, model: str) -> str:
        with self._lock:
            started = time.monotonic()
            line = self._ask(json.dumps(request))
            if line == "":  # the worker had died (killed from outside): once more with a fresh one
                line = self._ask(json.dumps(request))
            if not line:
                self.close_locked()
                if self._stopped:
                    raise OndeviceError("the chat template was not rendered: ondevice is shutting down")
                if line == "":
                    raise OndeviceError(f"the chat template of {model} was not rendered: its worker process died after "
                                        f"{time.monotonic() - started:.1f} s; use `ondevice generate --raw` to send a prompt without it")
                raise OndeviceError(f"the chat template of {model} did not render within {TEMPLATE_SECONDS:.0f} s "
                                    "(a runaway loop?); use `ondevice generate --raw` to send a prompt without it")
        answer = json.loads(line)
        if "error" in answer:
            raise OndeviceError(answer["error"])
        return check_text(answer["text"], f"the prompt the chat template of {model} wrote",
                          "use `ondevice generate --raw` to send a prompt without it")

    def _ask(self, request: str) -> str | None:
        """The worker's answer line; "" if it is dead, None if it gave none in time."""
        if self._proc is None or self._proc.poll() is not None:
            self.close_locked()
            if self._stopped:
                return ""
            self._proc = _start()
            if self._read_line(STARTUP_SECONDS) != "ready\n":  # imported what it needs, before the clock runs
                self.close_locked()
                return ""
        try:
            self._proc.stdin.write(request + "\n")
            self._proc.stdin.flush()
        except OSError:
            self.close_locked()
            return ""
        line = self._read_line(TEMPLATE_SECONDS)
        if line == "":
            self.close_locked()
        return line

    def _read_line(self, seconds: float) -> str | None:
        """The worker's next line within `seconds` ("" at the end of its output, None if none came)."""
        result: list[str] = []
        self._reader = threading.Thread(target=lambda proc=self._proc: result.append(proc.stdout.readline()), daemon=True)
        self._reader.start()
        self._reader.join(seconds)
        return result[0] if result else None

    def close_locked(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            if self._reader is not None:
                self._reader.join()  # it sees the end of the pipe now
            for stream in (self._proc.stdin, self._proc.stdout):
                stream.close()
            self._proc = self._reader = None

    def close(self) -> None:
        with self._lock:
            self.close_locked()

    def stop(self) -> None:
        """From any thread, without waiting for a render to finish (a server's shutdown): the worker is
        killed, the render in progress and every later one fail at once."""
        self._stopped = True
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()


def _start() -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # the same ondevice as ours
    return subprocess.Popen([sys.executable, "-m", "ondevice.prompt.template_process"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, encoding="utf-8", env=env,
                            start_new_session=True)  # Ctrl-C in a terminal is the parent's to handle, not the worker's


_shared = TemplateProcess()


def stop() -> None:
    _shared.stop()


def render(template: str, messages: list[dict], *, model: str, **options) -> str:
    """chat_template.render(...) in the worker, within the budgets above."""
    return _shared.render({"template": template, "messages": messages, "model": model, "options": options}, model)


# --- the worker ------------------------------------------------------------------------------------


def _limit_self() -> None:
    try:
        import resource  # lazy: Unix only, and only the worker sets its limit

        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    except (ImportError, ValueError, OSError):  # no such limit here (Windows, macOS): time still bounds it
        pass


def _serve() -> None:
    """Read one JSON request per line, answer one JSON line: {"text"} or {"error"}."""
    _limit_self()
    os.nice(10)  # a runaway template spins at the lowest priority there is room for, behind the server

    def out_of_time(signum, frame):
        raise TimeoutError

    alarm = hasattr(signal, "setitimer")  # not on Windows: the parent's kill still bounds the time
    if alarm:
        signal.signal(signal.SIGALRM, out_of_time)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        request = json.loads(line)
        model = request["model"]
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, TEMPLATE_SECONDS + 1)
        try:
            text = render_here(request["template"], request["messages"], model=model, **request["options"])
            answer = {"text": text} if len(text) <= MAX_OUTPUT_CHARS else {
                "error": f"the chat template of {model} wrote a prompt of {len(text):,} characters (more than {MAX_OUTPUT_CHARS:,}); "
                         "use `ondevice generate --raw` to send a prompt without it"}
        except OndeviceError as err:
            answer = {"error": str(err)}
        except (TimeoutError, MemoryError) as err:
            what = f"took more than {TEMPLATE_SECONDS:.0f} s" if isinstance(err, TimeoutError) else f"needed more than {WORKER_MEMORY_BYTES >> 20} MiB"
            answer = {"error": f"the chat template of {model} {what} to render (a runaway loop?); use `ondevice generate --raw` to send a prompt without it"}
        except Exception as err:  # noqa: BLE001 - chat_template.render names every template failure; anything left is said, not fatal
            answer = {"error": f"the chat template of {model} failed to render ({type(err).__name__}); use `ondevice generate --raw` to send a prompt without it"}
        finally:
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()
