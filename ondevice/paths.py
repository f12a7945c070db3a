"""Where ondevice keeps its data: one home folder (models, user catalog entries, profiles).

Everything under the home except the model files is a cache (profiles, acceptance records, bench
results, `.verified` markers): losing it costs a re-measurement, never an answer. So state is read
and written through two functions that never raise:

- `read_state(path, parse, what)`: None when the file is missing; when it is not a regular file (a
  FIFO, a link to /dev/zero), larger than MAX_STATE_BYTES, unreadable, not JSON or of the wrong
  shape (valid JSON that `parse` rejects), one warning line naming the file. A file that does not
  parse is read again while it keeps changing (another process may be replacing it); it is never
  removed: the caller's next save replaces it.
- `write_json(path, data)`: written atomically (a temporary file of this writer's own, renamed over
  it: two processes saving the same file never share one); on a read-only or full disk one warning
  line (once per process and reason) and nothing left behind, not even an empty `*.tmp`.

Names that become paths (a catalog entry's, a model's, a download's) go through `inside`, and state
file names through `state_file`: nothing outside its folder under the home is read, written or
deleted because of a name.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from ondevice.errors import OndeviceError

T = TypeVar("T")
MAX_STATE_BYTES = 64 << 20  # a state file larger than this is not one of ours: refused unread
READ_TRIES = 5  # reads of a state file that does not parse while it keeps changing
RETRY_SECONDS = 0.05
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


PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")  # a name that is one file name anywhere: no /, \\, NUL, "..", spaces


def is_plain_name(text: object) -> bool:
    return isinstance(text, str) and PLAIN_NAME.fullmatch(text) is not None


def inside(folder: Path, relative: str, what: str) -> Path:
    """`folder / relative`, where `relative` comes from a catalog entry, a model name or a download:
    refused in one line naming `what` unless it stays inside `folder` — no NUL, no absolute part, no
    `..`, and the folder it names, resolved (links followed), inside `folder` resolved. The last part
    itself is not resolved: a link placed there by the user is the user's (writes replace the link
    and deletes remove it, never its target)."""
    parts = relative.replace("\\", "/").split("/") if isinstance(relative, str) else []
    if not parts or "\0" in relative or any(part in ("", ".", "..") for part in parts):
        raise OndeviceError(f"{what}: {relative!r} is not a path inside {folder} (no absolute path, '..' or NUL); fix the name.")
    path = Path(folder, *parts)
    top = Path(folder).resolve()
    if path.parent.resolve() != top and top not in path.parent.resolve().parents:
        raise OndeviceError(f"{what}: {relative!r} leads out of {folder} (through a link); fix the name or the link.")
    return path


def state_file(folder: str, name: str) -> Path:
    """The state file `name` (one plain file name, e.g. "<fingerprint>-<pair>-<backend>.json") in the
    home's `folder` (profiles, acceptance, …): refused in one line if it would be anywhere else."""
    if "/" in name or "\\" in name:
        raise OndeviceError(f"the state file name {name!r} holds a path separator; rename the model pair.")
    return inside(home() / folder, name, "state file")


def warn(message: str, once: str | None = None) -> None:
    """One line on stderr; with `once`, only the first time this process warns under that key."""
    if once is not None:
        if once in _warned:
            return
        _warned.add(once)
    print(f"warning: {message}", file=sys.stderr, flush=True)


def read_regular_file(path: Path, limit: int) -> tuple[bytes, tuple]:
    """The bytes of the regular file at `path` (links followed) and its identity (inode, size, mtime),
    read without blocking on a FIFO or a device and never more than `limit` bytes: OSError if it is
    missing, unreadable or not a regular file, ValueError if it is larger than `limit`."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(0, "not a regular file")
        if info.st_size > limit:
            raise ValueError(f"{info.st_size:,} bytes, more than {limit:,}")
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise ValueError(f"more than {limit:,} bytes")
        return b"".join(chunks), (info.st_ino, info.st_size, info.st_mtime_ns)
    finally:
        os.close(fd)


def write_json(path: Path, data) -> Path | None:
    """Write JSON atomically (a temporary file of this writer's own, then rename): readers never see
    half a file, and two writers never write into one temporary file. Returns the path, or None when
    it could not be written (read-only or full disk: one warning line, the temporary file removed;
    the caller goes on without saving)."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except OSError as err:
        try:
            if tmp is not None:
                os.unlink(tmp)
        except OSError:
            pass
        reason = err.strerror or type(err).__name__
        warn(f"cannot save {path} ({reason}); going on without saving it (set ONDEVICE_HOME to a writable folder with free space)",
             once=f"write:{err.errno}")
        return None
    return path


def read_state(path: Path, parse: Callable[[Any], T], what: str) -> T | None:
    """The state file at `path` (JSON) turned into a value by `parse`, or None if there is none.

    A file that cannot be read (not a regular file, too large, no permission) gives one warning line;
    one that is not JSON or that `parse` rejects (any of SHAPE_ERRORS: valid JSON of the wrong shape)
    is read again while it keeps changing (a writer in another process), then gives one warning line
    naming it. Nothing is removed: the caller's next save replaces the file."""
    path = Path(path)
    for attempt in range(READ_TRIES):
        try:
            data, identity = read_regular_file(path, MAX_STATE_BYTES)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            reason = err.strerror if isinstance(err, OSError) else f"{err}; no {what} is that large"
            warn(f"cannot read the {what} {path} ({reason or type(err).__name__}); going on without it", once=f"unreadable:{path}")
            return None
        try:
            return parse(json.loads(data))
        except SHAPE_ERRORS as err:
            problem = f"{type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else 'wrong shape'}"
        time.sleep(RETRY_SECONDS * (attempt + 1))
        if _identity(path) == identity:  # not being replaced: what is there is what is damaged
            break
    warn(f"the {what} {path} is damaged or of another version ({problem}); ignored, the next save replaces it", once=f"damaged:{path}")
    return None


def _identity(path: Path) -> tuple | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns
