"""Where ondevice keeps its data: one home folder (models, user catalog entries, profiles).

Everything under the home except the model files is a cache (profiles, acceptance records, bench
results, `.verified` markers): losing it costs a re-measurement, never an answer. So state is read
and written through two functions that never raise:

- `read_state(path, parse, what)`: None when the file is missing; when it is unreadable, not JSON or
  of the wrong shape (valid JSON that `parse` rejects), one warning line naming the file, which is
  removed so the next save replaces it.
- `write_json(path, data)`: written atomically (a temporary file renamed over it); on a read-only or
  full disk one warning line (once per process and reason) and nothing left behind, not even an
  empty `*.tmp`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

T = TypeVar("T")
MAX_STATE_BYTES = 64 << 20  # a state file larger than this is not one of ours: refused unread
SHAPE_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError)  # what `parse` raises on a wrong shape
_warned: set[str] = set()


def home() -> Path:
    """$ONDEVICE_HOME, else the user cache dir: $XDG_CACHE_HOME/ondevice (default ~/.cache/ondevice)."""
    if os.environ.get("ONDEVICE_HOME"):
        return Path(os.environ["ONDEVICE_HOME"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "ondevice"


def models_dir() -> Path:
    """Downloaded model files (GGUF), named as in the catalog."""
    return home() / "models"


def warn(message: str, once: str | None = None) -> None:
    """One line on stderr; with `once`, only the first time this process warns under that key."""
    if once is not None:
        if once in _warned:
            return
        _warned.add(once)
    print(f"warning: {message}", file=sys.stderr, flush=True)


def write_json(path: Path, data) -> Path | None:
    """Write JSON atomically (temporary file, then rename): readers never see half a file. Returns
    the path, or None when it could not be written (read-only or full disk: one warning line, the
    temporary file removed; the caller goes on without saving)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except OSError as err:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        reason = err.strerror or type(err).__name__
        warn(f"cannot save {path} ({reason}); going on without saving it (set ONDEVICE_HOME to a writable folder with free space)",
             once=f"write:{err.errno}")
        return None
    return path


def read_state(path: Path, parse: Callable[[Any], T], what: str) -> T | None:
    """The state file at `path` (JSON) turned into a value by `parse`, or None if there is none.

    A file that cannot be read gives one warning line; one that is not JSON or that `parse` rejects
    (any of SHAPE_ERRORS: valid JSON of the wrong shape) gives one warning line naming it and is
    removed, so the caller's next save replaces it instead of failing on every later run."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_STATE_BYTES:
            raise ValueError(f"{path.stat().st_size:,} bytes, more than any {what} holds")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except ValueError as err:
        return _discard(path, what, str(err))
    except OSError as err:
        warn(f"cannot read the {what} {path} ({err.strerror or type(err).__name__}); going on without it")
        return None
    try:
        return parse(json.loads(text))
    except SHAPE_ERRORS as err:
        return _discard(path, what, f"{type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else 'wrong shape'}")


def _discard(path: Path, what: str, reason: str) -> None:
    try:
        path.unlink(missing_ok=True)
        done = "removed; it will be rebuilt"
    except OSError:
        done = "ignored"
    warn(f"the {what} {path} is damaged or of another version ({reason}); {done}")
    return None

