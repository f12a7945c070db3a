"""What `-m`, `--target` and `--drafter` may name besides a catalog pair or a file: a model another
program keeps on this disk, run where it lies.

- `qwen2.5:7b`, `user/model:tag`, `ollama:NAME`: ollama's (tag `latest` when none is given);
- `lmstudio:publisher/model[:QUANT | /file.gguf]`: LM Studio's;
- `hf:org/repo[:QUANT | /file.gguf]`: the Hugging Face cache's (and llama.cpp's, same layout);
  what is not cached there is downloaded as before (catalog/refs.py);
- `llama.cpp:file.gguf`: llama.cpp's older flat cache;
- any other name: whichever store holds a model of that name.

A name several models answer to is refused with the candidates in one line; without a
quantization, Q4_K_M is taken when it is one of them (llama.cpp's default). A catalog model that a
store already holds (found by its sha256, or by its repo and file in the Hugging Face cache) is
used in place too (`catalog_file`): only what is on no disk is downloaded.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from ondevice.catalog import refs
from ondevice.catalog.pairs import ModelFile, list_pairs
from ondevice.catalog.stores import Scan, digests, hf_cache, llama_cache, lmstudio, ollama, scan_all
from ondevice.catalog.stores.model import DEFAULT_QUANT, StoreModel, possessive
from ondevice.catalog.stores.reading import file_problem, is_dir
from ondevice.errors import OndeviceError
from ondevice.files.gguf_header import read_header
from ondevice.files.gguf_split import model_bytes, part_names

PREFIXES = {ollama.PREFIX: (ollama.STORE,), lmstudio.PREFIX: (lmstudio.STORE,), hf_cache.PREFIX: (hf_cache.STORE, llama_cache.STORE),
            llama_cache.PREFIX: (llama_cache.STORE,)}  # fmt: skip
_QUANT = re.compile(r"i?q\d(_[a-z0-9]+)*|bf16|f16|f32|tq\d_0|mxfp4")


@dataclass(frozen=True)
class LocalModel:
    """A model file to run, and the name it goes by (messages, profiles, acceptance records)."""

    path: Path
    label: str
    sha256: str | None = None  # when known: the digest it was checked against
    store: str | None = None  # the program whose store holds it (None: a file of our own or yours)


def is_store_name(text: str) -> bool:
    """A name for the stores rather than a file: a store prefix (`hf:` included), or no file path's
    look (starting with / . ~, ending in .gguf) and no file of that name."""
    if text.lower().startswith(tuple(PREFIXES)):
        return True
    if text.startswith(("/", ".", "~")) or text.lower().endswith(".gguf") or not text.strip():
        return False
    return not Path(text).is_file()


def check(text: str, flag: str) -> None:
    """Before anything is loaded: a file exists, an hf: reference parses; a store name is looked up later."""
    if is_store_name(text) and not refs.is_hf(text):
        if not text.split(":", 1)[-1].strip() or len(text) > 512:
            raise OndeviceError(f"{flag} {text!r}: name a model, e.g. qwen2.5:7b or lmstudio:publisher/model (see `ondevice models`).")
        return
    refs.check(text, flag)


def local_model(text: str, console: Console) -> LocalModel:
    """The model `text` names (a file, a store's model, an hf: reference), its file on this disk:
    a store's first, downloaded (hf: only) when no store holds it."""
    if not is_store_name(text):
        path = refs.local_model(text, console)
        return LocalModel(path, path.name)
    scan = scan_all()
    found = pick(text, scan)
    if found is not None:
        return use(found, console)
    if refs.is_hf(text):
        repo = "/".join(text[len(hf_cache.PREFIX):].split(":")[0].split("/")[:2])
        for partial in candidates(f"partial:{repo}", scan):
            console.print(f"{text}: the {partial.store} holds {partial.problem}; downloading it here instead", markup=False, highlight=False)
        path = refs.local_model(text, console)
        return LocalModel(path, path.name)
    raise OndeviceError(not_found(text, scan))


def pick(text: str, scan: Scan) -> StoreModel | None:
    """The one model `text` names, None if none; a one-line OndeviceError listing them if several do."""
    found = candidates(text, scan)
    if len(found) > 1 and not explicit_quant(text):
        preferred = [m for m in found if m.quant == DEFAULT_QUANT]
        found = preferred if len(preferred) == 1 else found
    if len(found) > 1:
        listed = ", ".join(f"{m.name} ({m.store})" for m in found[:12]) + (f" and {len(found) - 12} more" if len(found) > 12 else "")
        raise OndeviceError(f"{text} names {len(found)} models on this machine: {listed}; name one of them.")
    return found[0] if found else None


def candidates(text: str, scan: Scan) -> list[StoreModel]:
    """The models whose names `text` is (a store prefix limits the stores), or whose repo or folder
    `text` names with `:QUANT`."""
    query = text.strip().lower()
    stores = next((s for p, s in PREFIXES.items() if query.startswith(p)), None)
    models = [m for m in scan.models if stores is None or m.store in stores]
    exact = [m for m in models if query in m.keys]
    if exact:
        return exact
    base, _, quant = query.rpartition(":")
    if base and _QUANT.fullmatch(quant):
        return [m for m in models if m.group and base in m.keys and (m.quant or "").lower() == quant]
    return []


def explicit_quant(text: str) -> bool:
    return bool(_QUANT.fullmatch(text.rpartition(":")[2].lower())) or text.lower().endswith(".gguf")


def use(model: StoreModel, console: Console) -> LocalModel:
    """A store's model made ready to run: refused in one line if it cannot run, its blobs checked
    against their names once, and (ollama) a line where ollama would prompt it otherwise."""
    if model.problem is not None:
        raise OndeviceError(f"{model.name} ({model.store}, {model.path}) cannot run: {model.problem}.")
    for part in [model.path.with_name(name) for name in part_names(model.path.name)]:
        digest = model.digest if model.store == ollama.STORE else hf_cache.blob_digest(part)
        if digest is not None:
            digests.check_once(part, digest, model.store, model.name, console)
    if model.store == ollama.STORE:
        template = read_header(model.path).metadata.get("tokenizer.chat_template")
        note = ollama.template_note(model, template if isinstance(template, str) else None)
        if note:
            console.print(note, markup=False, highlight=False, soft_wrap=True)
    return LocalModel(model.path, model.name, model.digest, model.store)


def not_found(text: str, scan: Scan) -> str:
    """Why nothing answers to `text`, naming the catalog's pairs, the store's models of that name
    with another tag or quantization, and a store that could not be read."""
    base = _bare(text.strip().lower()).rsplit(":", 1)[0]
    similar = [m.name for m in scan.models if _bare(m.name.lower()).split(":")[0] == base or (m.group or "").lower() == base][:8]
    known = ", ".join(sorted(p.name for p in list_pairs()))
    message = (f"no file, catalog pair ({known}) or model that ollama, LM Studio, the Hugging Face cache or llama.cpp keeps "
               f"on this machine is named {text!r}; see `ondevice models`")
    if similar:
        message += f" (there: {', '.join(similar)})"
    if scan.unreadable:
        message += f"; {scan.unreadable[0]}"
    return message + "."


def _bare(name: str) -> str:
    """A name without its store prefix."""
    return next((name[len(p):] for p in PREFIXES if name.startswith(p)), name)


# ---------------------------------------------------------------------------------------------
# Catalog models another program already holds


def catalog_file(model_file: ModelFile, console: Console) -> LocalModel | None:
    """A catalog model's file kept by another program, to use in place (checked once against its
    sha256: the catalog's pin, or the Hugging Face cache's LFS name, the hub's own digest); None if
    no store holds it, or our own download of it is there."""
    from ondevice.catalog import hub  # lazy: hub imports the Hugging Face client

    if any(hub.part_path(part).exists() for part in model_file.parts()):
        return None
    for store, paths in _copies(model_file):
        try:
            for path, part in zip(paths, model_file.parts()):
                digests.check_once(path, part.sha256 or hf_cache.blob_digest(path), store, model_file.label, console)
        except OndeviceError as err:
            console.print(f"{err}; not using it", markup=False, highlight=False, soft_wrap=True)
            continue
        console.print(f"{model_file.label}: using {possessive(store)} copy where it lies ({paths[0]})", markup=False, highlight=False, soft_wrap=True)
        return LocalModel(paths[0], model_file.label, model_file.sha256 or hf_cache.blob_digest(paths[0]), store)
    return None


def _copies(model_file: ModelFile) -> list[tuple[str, list[Path]]]:
    """(store, the files of every part) for each copy a store holds: an ollama blob or an HF cache
    blob named by the catalog's pinned sha256, or the repo's file in an HF cache snapshot."""
    found = []
    parts = model_file.parts()
    if len(parts) == 1 and model_file.sha256:
        for root in ollama.roots():
            found.append((ollama.STORE, [ollama.blob_path(root, model_file.sha256)]))
    for store, root in _hf_roots():
        if model_file.hf_repo and model_file.hf_file:  # the repo's own file, by its name
            snapshots = root / (hf_cache.REPO_FOLDER + model_file.hf_repo.replace("/", "--")) / "snapshots"
            for snapshot in sorted(snapshots.iterdir()) if is_dir(snapshots) else []:
                files = [snapshot / part.hf_file for part in parts]
                if all(hf_cache.blob_digest(f) is not None and part.sha256 in (None, hf_cache.blob_digest(f)) for f, part in zip(files, parts)):
                    found.append((store, files))
        if len(parts) == 1 and model_file.sha256:  # the same bytes in any repo
            found += [(store, [blob]) for blob in sorted(root.glob(f"{hf_cache.REPO_FOLDER}*/blobs/{model_file.sha256}"))]
    return [(store, files) for store, files in found
            if all(file_problem(f, part.size) is None for f, part in zip(files, parts))]


def _hf_roots() -> list[tuple[str, Path]]:
    return [(hf_cache.STORE, root) for root in hf_cache.roots()] + [(llama_cache.STORE, root) for root in llama_cache.roots()]


# ---------------------------------------------------------------------------------------------
# Drafters among the models on disk


def drafter_candidates(target: Path, store: str | None = None) -> list[StoreModel]:
    """The stores' models that might draft for `target`, smallest first (of one size, those of the
    target's `store` first): runnable, smaller than it, and a tokenizer of the same kind by their
    headers (the caller compares the vocabularies)."""
    kind, size = tokenizer_kind(target), model_bytes(target)
    target_file = os.path.realpath(target)
    found = [m for m in scan_all().models
             if m.problem is None and 0 < m.size < size and os.path.realpath(m.path) != target_file and tokenizer_kind(m.path) == kind]
    return sorted(found, key=lambda m: (m.size, m.store != store, m.name))


def tokenizer_kind(path: Path) -> tuple | None:
    """What must match for two models to share a tokenizer, as far as headers say: its model and
    end-of-text id (None if the header cannot be read). Read once per file version."""
    try:
        info = Path(path).stat()
    except OSError:
        return None
    return _tokenizer_kind(str(path), info.st_size, info.st_mtime_ns, info.st_ino)


@functools.lru_cache(maxsize=512)
def _tokenizer_kind(path: str, *version) -> tuple | None:
    try:
        meta = read_header(path).metadata
    except (OndeviceError, OSError):
        return None
    return (meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.eos_token_id"))
