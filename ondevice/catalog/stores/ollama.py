"""ollama's store: `<models>/manifests/<host>/<namespace>/<model>/<tag>` (JSON) and `<models>/blobs/sha256-<hex>`.

Where: $OLLAMA_MODELS, else ~/.ollama/models (macOS, Windows, Linux run by hand) and
/usr/share/ollama/.ollama/models (the Linux service's). In a manifest the layer of media type
`application/vnd.ollama.image.model` names the GGUF blob by its sha256; `…image.template` holds
ollama's chat template (a Go template), `…image.system` its default system prompt, and
`…image.tensor` layers hold safetensors tensors for its MLX engine (no GGUF at all). A name is
`[host/][namespace/]model[:tag]`, with host registry.ollama.ai, namespace library and tag latest
by default, case-insensitive, as ollama reads it. A blob being pulled is `sha256-<hex>-partial`.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path

from ondevice.catalog.stores.model import StoreModel
from ondevice.catalog.stores.reading import entries, file_problem, is_dir

STORE = "ollama"
PREFIX = "ollama:"
MODEL_LAYER = "application/vnd.ollama.image.model"
TEMPLATE_LAYER = "application/vnd.ollama.image.template"
SYSTEM_LAYER = "application/vnd.ollama.image.system"
TENSOR_LAYER = "application/vnd.ollama.image.tensor"
DEFAULT_HOST, DEFAULT_NAMESPACE, DEFAULT_TAG = "registry.ollama.ai", "library", "latest"
MAX_MANIFEST_BYTES = 16 << 20  # an MLX model's manifest lists one layer per tensor
MAX_TEMPLATE_BYTES = 1 << 20
_DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})")
_MARKER = re.compile(r"<\|[A-Za-z0-9_.\-]{1,40}\|>|<(?:start|end)_of_turn>|\[/?INST\]")


def roots() -> list[Path]:
    if os.environ.get("OLLAMA_MODELS"):
        return [Path(os.environ["OLLAMA_MODELS"]).expanduser()]
    return [Path.home() / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]


def scan(root: Path) -> list[StoreModel]:
    """Every model the manifests under `root` name (StoreUnreadable if a folder cannot be listed)."""
    manifests = root / "manifests"
    if not is_dir(manifests):
        return []
    found = []
    for host in _folders(manifests):
        for namespace in _folders(host):
            for model in _folders(namespace):
                for tag in entries(model, STORE):
                    if not tag.name.startswith(".") and not is_dir(tag):
                        found.append(read_manifest(root, (host.name, namespace.name, model.name, tag.name), tag))
    return found


def _folders(folder: Path) -> list[Path]:
    return [p for p in entries(folder, STORE) if is_dir(p) and not p.name.startswith(".")]


def read_manifest(root: Path, parts: tuple[str, str, str, str], manifest: Path) -> StoreModel:
    """The model a manifest names: its GGUF blob, or why there is none to run."""
    name = display_name(*parts)
    model = StoreModel(STORE, name, manifest, 0, keys=frozenset(name_keys(*parts)))
    try:
        if manifest.stat().st_size > MAX_MANIFEST_BYTES:
            return replace(model, problem=f"its manifest {manifest} is larger than any ollama writes")
        layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers")
        if not isinstance(layers, list) or not all(isinstance(layer, dict) for layer in layers):
            raise ValueError("no list of layers")
    except (OSError, ValueError, AttributeError, RecursionError) as err:
        return replace(model, problem=f"its manifest {manifest} cannot be read ({type(err).__name__}: {str(err)[:80]})")
    kinds = [str(layer.get("mediaType", "")) for layer in layers]
    if MODEL_LAYER not in kinds:
        mlx = any(kind.startswith(TENSOR_LAYER) for kind in kinds)
        why = "ollama keeps it as safetensors tensors for its MLX engine, not as a GGUF" if mlx else "its manifest names no model file"
        return replace(model, problem=f"{why}; pull a GGUF tag of it with ollama")
    layer = layers[kinds.index(MODEL_LAYER)]
    digest = _DIGEST.fullmatch(str(layer.get("digest", "")))
    size = layer.get("size")
    if digest is None or type(size) is not int or size <= 0:
        return replace(model, problem=f"its manifest {manifest} gives no sha256 digest and size for the model")
    blob = blob_path(root, digest[1])
    problem = file_problem(blob, size)
    if problem == "missing":
        pulling = any(root.joinpath("blobs").glob(f"sha256-{digest[1]}-partial*"))
        problem = f"a partial download (`ollama pull {name}` finishes it)" if pulling else f"its model blob is missing (`ollama pull {name}`)"
    elif problem is not None:
        problem = f"its model blob is {problem}" + ("; `ollama pull` it again" if "partial" in problem else "")
    return replace(model, path=blob, size=size, digest=digest[1], problem=problem,
                   template=_layer_blob(root, layers, kinds, TEMPLATE_LAYER), system=_layer_blob(root, layers, kinds, SYSTEM_LAYER))


def _layer_blob(root: Path, layers: list[dict], kinds: list[str], kind: str) -> Path | None:
    """The blob of the manifest's first layer of this media type, if any."""
    digest = _DIGEST.fullmatch(str(layers[kinds.index(kind)].get("digest", ""))) if kind in kinds else None
    return blob_path(root, digest[1]) if digest else None


def blob_path(root: Path, hex_digest: str) -> Path:
    """`blobs/sha256-<hex>` (older ollama wrote `sha256:<hex>`)."""
    blobs = root / "blobs"
    legacy = blobs / f"sha256:{hex_digest}"
    return legacy if not (blobs / f"sha256-{hex_digest}").exists() and legacy.exists() else blobs / f"sha256-{hex_digest}"


# ---------------------------------------------------------------------------------------------
# Names


def display_name(host: str, namespace: str, model: str, tag: str) -> str:
    """As `ollama list` shows it: `qwen2.5:7b`, `user/model:tag`, `hf.co/org/repo:Q4_K_M`."""
    if host != DEFAULT_HOST:
        return f"{host}/{namespace}/{model}:{tag}"
    return f"{model}:{tag}" if namespace == DEFAULT_NAMESPACE else f"{namespace}/{model}:{tag}"


def name_keys(host: str, namespace: str, model: str, tag: str) -> set[str]:
    """Every way to write the name (lower case): with and without the defaults, the tag left out
    when it is `latest`, each also after `ollama:`."""
    bases = {f"{host}/{namespace}/{model}"}
    if host == DEFAULT_HOST:
        bases.add(f"{namespace}/{model}")
        if namespace == DEFAULT_NAMESPACE:
            bases.add(model)
    names = {f"{base}:{tag}" for base in bases} | (bases if tag == DEFAULT_TAG else set())
    return {prefix + name.lower() for name in names for prefix in ("", PREFIX)}


# ---------------------------------------------------------------------------------------------
# The chat template


def template_note(model: StoreModel, gguf_template: str | None) -> str | None:
    """One line when ollama would prompt the model otherwise than ondevice does: ondevice runs the
    GGUF's own chat template (jinja), never ollama's Go template, nor its default system prompt.
    None when they write the same special markers and there is no system prompt."""
    system = "; ollama's default system prompt for it is not sent either" if model.system is not None else ""
    if model.template is None:
        return f"{model.name}: the GGUF's own chat template is used{system}" if system else None
    if not gguf_template:
        return (f"{model.name}: its GGUF has no chat template and ollama's is a Go template, which ondevice does not run; "
                f"use `ondevice generate --raw` with a prompt written for it{system}")
    try:
        with model.template.open("rb") as f:
            go_template = f.read(MAX_TEMPLATE_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return f"{model.name}: ondevice uses the GGUF's own chat template (ollama's Go template could not be read){system}"
    ours, theirs = markers(gguf_template), markers(go_template)
    if ours == theirs:
        return f"{model.name}: the GGUF's own chat template is used{system}" if system else None
    return (f"{model.name}: ondevice uses the GGUF's own chat template, not ollama's Go template, and they differ: "
            f"ollama's writes {' '.join(theirs) or 'no special markers'}, the GGUF's {' '.join(ours) or 'none'}{system}")


def markers(template: str) -> list[str]:
    """The special markers a chat template writes (`<|im_start|>`, `<start_of_turn>`, `[INST]`, …), sorted."""
    return sorted(set(_MARKER.findall(template)))
