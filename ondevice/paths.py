"""Where ondevice keeps its data: one home folder (models, user catalog entries, profiles)."""

from __future__ import annotations

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
