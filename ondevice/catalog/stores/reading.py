"""Reading another program's model folder: nothing in it is trusted, nothing is written, and every
way it can fail is one line.

A store may be owned by another user (ollama's Linux service keeps /usr/share/ollama/.ollama/models),
hold symbolic links that loop or point nowhere (the Hugging Face cache is made of links), files cut
short by an interrupted download, or files that are not GGUF at all (ollama keeps safetensors for its
MLX engine). `entries` lists a folder or raises StoreUnreadable; `file_problem` says in a few words
why a file cannot be run as a GGUF model, or None.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from pathlib import Path

from ondevice.errors import OndeviceError
from ondevice.files.gguf_header import GGUF_MAGIC


class StoreUnreadable(OndeviceError):
    """A store's folder cannot be listed (another user's, a broken link): the listing goes on without it."""


def owner(path: Path) -> str:
    """The name of the user owning `path` (its uid if it has no name)."""
    try:
        uid = path.stat().st_uid
    except OSError:
        return "another user"
    try:
        import pwd  # POSIX only

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return f"uid {uid}"


def entries(folder: Path, store: str) -> list[Path]:
    """The folder's entries, sorted; StoreUnreadable (one line) if it cannot be read."""
    try:
        return sorted(folder.iterdir())
    except PermissionError:
        raise StoreUnreadable(
            f"{store}'s folder {folder} is not readable by this user (it belongs to {owner(folder)}); "
            f"run as that user, or give yourself read access (e.g. join its group)"
        ) from None
    except OSError as err:
        raise StoreUnreadable(f"{store}'s folder {folder} cannot be read ({link_problem(folder, err)})") from None


def link_problem(path: Path, err: OSError) -> str:
    """What an OSError on `path` means, in a few words."""
    if err.errno == errno.ELOOP:
        return "a symbolic link that loops"
    if err.errno == errno.ENOENT and path.is_symlink():
        return f"a symbolic link to {os.readlink(path)}, which does not exist"
    if err.errno in (errno.EACCES, errno.EPERM):
        return f"not readable by this user (it belongs to {owner(path)})"
    return err.strerror or type(err).__name__


def is_dir(path: Path) -> bool:
    """A folder (a link to one counts); False for anything that cannot be stat'ed."""
    try:
        return stat.S_ISDIR(path.stat().st_mode)
    except OSError:
        return False


def file_problem(path: Path, expected_size: int | None = None) -> str | None:
    """Why `path` cannot be run as a GGUF model (a few words), or None: a link that loops or points
    nowhere, not a regular file, not readable, shorter than the store says (a partial download), or
    not GGUF (safetensors, or anything else)."""
    try:
        info = path.stat()
    except OSError as err:
        return link_problem(path, err) if err.errno != errno.ENOENT or path.is_symlink() else "missing"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if expected_size is not None and info.st_size < expected_size:
        return f"a partial download ({info.st_size:,} of {expected_size:,} bytes)"
    try:
        with path.open("rb") as f:
            head = f.read(16)
    except OSError as err:
        return link_problem(path, err)
    if head[:4] == GGUF_MAGIC:
        return None
    return f"{file_kind(head)}, not GGUF"


def file_kind(head: bytes) -> str:
    """What the first bytes of a non-GGUF file look like: safetensors (an 8-byte header length, then
    JSON), or something else."""
    if len(head) >= 9 and head[8:9] == b"{" and struct.unpack("<Q", head[:8])[0] < (100 << 20):
        return "safetensors"
    return "empty" if not head else "not a model file"


def starts_as_gguf(path: Path) -> bool:
    """The file begins with GGUF's magic (False if it cannot be read)."""
    try:
        with path.open("rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False
