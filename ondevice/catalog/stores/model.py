"""One model found in another program's store, and the names it answers to."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from ondevice.files.gguf_split import SPLIT_NAME

DEFAULT_QUANT = "Q4_K_M"  # what a name without a quantization means when a repo holds several (llama.cpp's -hf default)
_QUANT = re.compile(r"(?:^|[-._])(I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32|TQ\d_0|MXFP4)(?=[-._]|$)", re.IGNORECASE)


@dataclass(frozen=True)
class StoreModel:
    """A GGUF model another program keeps, read where it lies."""

    store: str  # "ollama", "LM Studio", "HF cache", "llama.cpp"
    name: str  # what `-m` takes to run it
    path: Path  # the GGUF (its first part if split), as the store keeps it
    size: int  # bytes (all parts)
    keys: frozenset[str] = field(default_factory=frozenset)  # every name it answers to, lower case
    group: str | None = None  # the key shared with the other files of its repo or folder (a quantization picks among them)
    digest: str | None = None  # the sha256 the store names its file by (ollama's blob, the HF cache's LFS blob)
    problem: str | None = None  # why it cannot run (a few words), else None
    template: Path | None = None  # ollama: its own chat template (a Go template; the GGUF's is used instead)
    system: Path | None = None  # ollama: its default system prompt (not sent: ondevice sends what the user writes)

    @property
    def quant(self) -> str | None:
        """The quantization its file name says (None for ollama's blobs, which have no name)."""
        return quant_of(self.path.name) if self.store != "ollama" else None


def possessive(store: str) -> str:
    """"ollama's", "LM Studio's", "the HF cache's", "llama.cpp's"."""
    return f"the {store}'s" if store == "HF cache" else f"{store}'s"


def quant_of(file_name: str) -> str | None:
    """Q4_K_M, IQ4_XS, Q8_0, F16, … from a GGUF's file name, upper case; None if it names none."""
    match = _QUANT.search(re.sub(r"(-\d{5}-of-\d{5})?\.gguf$", "", file_name, flags=re.IGNORECASE))
    return match[1].upper() if match else None


def is_model_file(path: Path) -> bool:
    """A GGUF model's file (the first part of a split one): not a vision projector, not hidden."""
    name = path.name.lower()
    split = SPLIT_NAME.match(path.name)
    return name.endswith(".gguf") and not name.startswith((".", "mmproj")) and (split is None or int(split["no"]) == 1)


def group_names(models: list[StoreModel], prefix: str) -> list[StoreModel]:
    """The models of one store with their shortest names: `prefix + group` when a group (repo, folder)
    holds one model, `prefix + group:QUANT` when its quantization is the only one of its kind there,
    else the full key (`prefix + group/file.gguf`), which `models` must already carry as `name`."""
    by_group: dict[str, list[StoreModel]] = {}
    for model in models:
        by_group.setdefault(model.group or model.name, []).append(model)
    named = []
    for group, members in by_group.items():
        for model in members:
            quants = [m.quant for m in members]
            if len(members) == 1 and model.group:
                name = prefix + group
            elif model.group and model.quant and quants.count(model.quant) == 1:
                name = f"{prefix}{group}:{model.quant}"
            else:
                name = model.name
            named.append(_renamed(model, name))
    return named


def _renamed(model: StoreModel, name: str) -> StoreModel:
    return replace(model, name=name, keys=model.keys | {name.lower()})
