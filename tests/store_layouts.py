"""Other programs' model stores, laid out as they document them, in a temporary HOME; each model
file hard-linked (never copied) from a GGUF the test wrote.

    ollama_model(home, "tiny", "latest", gguf)                    # ~/.ollama/models/{manifests,blobs}
    lmstudio_model(home, "tester/tiny-GGUF", gguf)                # ~/.lmstudio/models/<publisher>/<model>/
    hf_cache_model(home, "org/tiny-GGUF", "tiny-F32.gguf", gguf)  # ~/.cache/huggingface/hub/models--org--tiny-GGUF/
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MODEL = "application/vnd.ollama.image.model"
TEMPLATE = "application/vnd.ollama.image.template"
TENSOR = "application/vnd.ollama.image.tensor"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def link(source: Path, dest: Path) -> Path:
    """Hard-link `source` at `dest` (the same bytes, no second copy)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if not dest.exists():
        os.link(source, dest)
    return dest


def ollama_root(home: Path) -> Path:
    return Path(home) / ".ollama" / "models"


def ollama_blob(home: Path, data: bytes) -> str:
    """A small blob (template, config) written into the store; its digest."""
    digest = hashlib.sha256(data).hexdigest()
    path = ollama_root(home) / "blobs" / f"sha256-{digest}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return digest


def ollama_model(home: Path, model: str, tag: str, gguf: Path | None, template: str | None = None, namespace: str = "library",
                 host: str = "registry.ollama.ai", layers: list[dict] | None = None, digest: str | None = None, size: int | None = None,
                 link_blob: bool = True) -> Path:
    """A manifest at manifests/<host>/<namespace>/<model>/<tag> whose model layer is `gguf`, linked
    as blobs/sha256-<its digest> (digest/size: what the manifest says instead; link_blob=False: no
    blob; layers: instead of a model layer)."""
    root = ollama_root(home)
    config = ollama_blob(home, json.dumps({"model_format": "gguf", "model_family": "qwen2"}).encode())
    if layers is None:
        digest = digest or sha256(gguf)
        if link_blob:
            link(gguf, root / "blobs" / f"sha256-{digest}")
        layers = [{"mediaType": MODEL, "digest": f"sha256:{digest}", "size": size or gguf.stat().st_size}]
    if template is not None:
        layers = layers + [{"mediaType": TEMPLATE, "digest": f"sha256:{ollama_blob(home, template.encode())}", "size": len(template)}]
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": f"sha256:{config}", "size": 60},
                "layers": layers}  # fmt: skip
    path = root / "manifests" / host / namespace / model / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return path


def lmstudio_model(home: Path, folder: str, gguf: Path, name: str | None = None) -> Path:
    return link(gguf, Path(home) / ".lmstudio" / "models" / folder / (name or gguf.name))


def hf_cache_root(home: Path) -> Path:
    return Path(home) / ".cache" / "huggingface" / "hub"


def hf_cache_model(home: Path, repo: str, file: str, gguf: Path) -> Path:
    """blobs/<sha256> linked to `gguf`, snapshots/<rev>/<file> a relative link to it, refs/main the revision."""
    folder = hf_cache_root(home) / ("models--" + repo.replace("/", "--"))
    blob = link(gguf, folder / "blobs" / sha256(gguf))
    snapshot = folder / "snapshots" / REVISION / file
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    snapshot.symlink_to(os.path.relpath(blob, snapshot.parent))
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(REVISION)
    return snapshot


def store_state(home: Path) -> dict[str, tuple]:
    """Every entry under the stores of `home` with its size and mtime: what must not change."""
    state = {}
    for top in (Path(home) / ".ollama", Path(home) / ".lmstudio", Path(home) / ".cache" / "huggingface"):
        for folder, dirs, files in os.walk(top):
            for name in dirs + files:
                path = Path(folder) / name
                info = path.lstat()
                state[str(path)] = (info.st_size, info.st_mtime_ns)
    return state
