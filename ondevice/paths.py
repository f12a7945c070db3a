"""Where ondevice keeps its data: one home folder (models, user catalog entries, profiles)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def home() -> Path:
    """$ONDEVICE_HOME, else the user cache dir: $XDG_CACHE_HOME/ondevice (default ~/.cache/ondevice)."""
    if os.environ.get("ONDEVICE_HOME"):
        return Path(os.environ["ONDEVICE_HOME"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "ondevice"


def models_dir() -> Path:
    """Downloaded model files (GGUF), named as in the catalog."""
    return home() / "models"


def write_json(path: Path, data) -> Path:
    """Write JSON atomically (temporary file, then rename): readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
    return path
