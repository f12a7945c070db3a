"""VocabTrim (Goel et al. 2025): a drafter whose LM head scores only the K tokens the target uses.

1. `calibration_token_counts`: the *target* answers the calibration prompts greedily (llama.cpp);
   every prompt and generated token is counted per id.
2. `top_k_tokens`: the K most frequent ids (ties: lower id first, i.e. earlier BPE merges, which
   are the more common ones), always including the special tokens and the 256 byte tokens.
3. `write_trimmed_gguf`: a copy of the drafter GGUF that keeps only those rows of `output.weight`
   and `token_embd.weight` (quantized blocks sliced by row, bytes untouched) and the matching
   vocabulary, so llama.cpp loads it with n_vocab = K. Draft index i means target id keep_ids[i];
   verification always uses the full vocabulary. Never tokenize with the trimmed file (merges
   whose parts were dropped are gone); inputs are fed as embeddings (see vocabtrim/head.py).
4. `TrimmedVocab`: a JSON record beside the trimmed file (keep_ids, K, which drafter it was built
   from, how it was calibrated). `find_trimmed(drafter)` returns the trimmed file built from
   exactly this drafter, so it is picked up automatically.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import gguf
import numpy as np

from ondevice.errors import OndeviceError
from ondevice.paths import MAX_STATE_BYTES, read_regular_file, write_json
from ondevice.prompt.tokenizer import Tokenizer
from ondevice.decode.reference import greedy_reference
from ondevice.targets.llama_target import LlamaTarget
from ondevice.catalog.stores.derived import trimmed_paths

TRIMMED_TENSORS = ("token_embd.weight", "output.weight")  # rows = vocabulary
TOKENS_KEY = "tokenizer.ggml.tokens"
TOKEN_TYPE_KEY = "tokenizer.ggml.token_type"
SCORES_KEY = "tokenizer.ggml.scores"
MERGES_KEY = "tokenizer.ggml.merges"

GGUFSource = str | Path | gguf.GGUFReader  # a path, or a file already parsed (parsing takes ~10 s)


def open_gguf(source: GGUFSource) -> gguf.GGUFReader:
    return source if isinstance(source, gguf.GGUFReader) else gguf.GGUFReader(source)


# ---------------------------------------------------------------------------------------------
# 1. Counting the target's tokens on calibration prompts


def calibration_token_counts(
    target_gguf: str | Path,
    prompts: Sequence[str],
    max_tokens: int,
    threads: int | None = None,
    on_prompt: Callable[[int, list[int]], None] | None = None,
) -> np.ndarray:
    """(n_vocab,) int64: how often each id occurs in the chat-formatted prompts and in the target's
    greedy answers to them (at most max_tokens each, stopping at the end of the turn).

    on_prompt(index, answer_ids) is called after each prompt (progress bars, coverage checks).
    """
    tokenizer = Tokenizer(target_gguf)
    chats = [tokenizer.encode_user(p) for p in prompts]
    n_ctx = max(max(map(len, chats), default=0) + max_tokens + 1, 1024)  # llama.cpp aborts below n_seq_max cells
    target = LlamaTarget(target_gguf, n_ctx=n_ctx, threads=threads, max_tree_nodes=512)
    counts = np.zeros(target.n_vocab, dtype=np.int64)
    try:
        for index, prompt_ids in enumerate(chats):
            answer = greedy_reference(target, prompt_ids, max_tokens, tokenizer.is_end)
            np.add.at(counts, np.asarray(prompt_ids + answer, dtype=np.int64), 1)
            if on_prompt is not None:
                on_prompt(index, answer)
    finally:
        target.close()
    return counts


# ---------------------------------------------------------------------------------------------
# 2. Choosing the kept set


def top_k_tokens(counts: np.ndarray, k: int, always_keep: Sequence[int] = ()) -> np.ndarray:
    """The kept ids, ascending: every id in always_keep, then the most frequent ids (ties: lower id
    first) until there are k. Raises if k is smaller than always_keep or larger than the vocabulary."""
    counts = np.asarray(counts)
    required = np.unique(np.asarray(always_keep, dtype=np.int64))
    if not len(required) <= k <= len(counts):
        raise OndeviceError(
            f"--k must be between {len(required)} (the special and byte tokens) and {len(counts)} (the whole vocabulary)"
        )
    by_frequency = np.lexsort((np.arange(len(counts)), -counts))  # count descending, then id ascending
    chosen = np.zeros(len(counts), dtype=bool)
    chosen[required] = True
    optional = by_frequency[~chosen[by_frequency]]
    chosen[optional[: k - len(required)]] = True
    return np.flatnonzero(chosen).astype(np.int64)


def always_kept_ids(drafter_gguf: GGUFSource) -> np.ndarray:
    """Ids no trimmed vocabulary may drop: control/user-defined/unknown/byte tokens, the bos/eos/pad
    ids, and the 256 single-byte tokens of a byte-level BPE, so any text stays draftable."""
    reader = open_gguf(drafter_gguf)
    tokens = reader.fields[TOKENS_KEY].contents()
    types = np.asarray(reader.fields[TOKEN_TYPE_KEY].contents())
    plain = (types == gguf.TokenType.NORMAL) | (types == gguf.TokenType.UNUSED)
    byte_chars = set(_byte_level_alphabet())
    single_bytes = [i for i, text in enumerate(tokens) if len(text) == 1 and text in byte_chars]
    special_ids = [int(reader.fields[key].contents()) for key in _token_id_keys(reader)]
    return np.unique(np.concatenate([np.flatnonzero(~plain), single_bytes, special_ids]).astype(np.int64))


def coverage(token_ids: Sequence[int], keep_ids: np.ndarray) -> float:
    """Fraction of token_ids that are in keep_ids (what the trimmed drafter can propose)."""
    token_ids = np.asarray(token_ids, dtype=np.int64)
    return float(np.isin(token_ids, keep_ids).mean()) if len(token_ids) else 1.0


def _byte_level_alphabet() -> list[str]:
    """GPT-2's byte → printable character map (what byte-level BPE vocabularies spell bytes with)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    extra = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + n) for n in range(len(extra))]


def _token_id_keys(reader: gguf.GGUFReader) -> list[str]:
    """Metadata keys holding a token id (bos, eos, pad, eot, ...)."""
    return [key for key in reader.fields if key.startswith("tokenizer.ggml.") and key.endswith("_token_id")]


# ---------------------------------------------------------------------------------------------
# 3. Writing the trimmed GGUF


def write_trimmed_gguf(src: GGUFSource, dst: str | Path, keep_ids: np.ndarray) -> None:
    """Copy the GGUF at src to dst keeping only vocabulary rows keep_ids (ascending, unique).

    Trimmed: the rows of token_embd/output (quantized blocks copied as bytes), the token texts,
    types and scores, the merges (kept only if both parts and the result are kept), and the
    special-token ids (renumbered). Every other key and tensor is copied unchanged.
    """
    keep_ids = np.asarray(keep_ids, dtype=np.int64)
    if len(keep_ids) == 0 or np.any(np.diff(keep_ids) <= 0):
        raise ValueError("keep_ids must be non-empty, ascending and unique")
    reader = open_gguf(src)
    writer = gguf.GGUFWriter(dst, arch=reader.fields["general.architecture"].contents())
    if "general.alignment" in reader.fields:
        writer.data_alignment = int(reader.fields["general.alignment"].contents())
    _copy_metadata(reader, writer, _trimmed_vocab_fields(reader, keep_ids))
    tensors = [(tensor, _rows(tensor, keep_ids)) for tensor in reader.tensors]
    for tensor, data in tensors:
        writer.add_tensor_info(tensor.name, data.shape, data.dtype, data.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, data in tensors:
        writer.write_tensor_data(data, tensor_endianess=reader.endianess)
    writer.close()


def _rows(tensor: gguf.ReaderTensor, keep_ids: np.ndarray) -> np.ndarray:
    """The tensor's data as the reader maps it ((rows, row bytes) when quantized), vocab rows kept."""
    if tensor.name not in TRIMMED_TENSORS:
        return tensor.data
    if tensor.data.shape[0] <= keep_ids[-1]:
        raise ValueError(f"{tensor.name} has {tensor.data.shape[0]} rows; cannot keep id {keep_ids[-1]}")
    return np.ascontiguousarray(tensor.data[keep_ids])


def _trimmed_vocab_fields(reader: gguf.GGUFReader, keep_ids: np.ndarray) -> dict[str, tuple]:
    """New (value, type, sub_type) for every vocabulary key; None as value drops the key."""
    tokens = reader.fields[TOKENS_KEY].contents()
    new_id = {int(old): new for new, old in enumerate(keep_ids)}
    kept = [tokens[i] for i in keep_ids]
    array, t = gguf.GGUFValueType.ARRAY, gguf.GGUFValueType
    types = reader.fields[TOKEN_TYPE_KEY].contents()
    fields = {
        TOKENS_KEY: (kept, array, t.STRING),
        TOKEN_TYPE_KEY: ([types[i] for i in keep_ids], array, t.INT32),
    }
    if SCORES_KEY in reader.fields:
        scores = reader.fields[SCORES_KEY].contents()
        fields[SCORES_KEY] = ([scores[i] for i in keep_ids], array, t.FLOAT32)
    if MERGES_KEY in reader.fields:
        fields[MERGES_KEY] = (_kept_merges(reader.fields[MERGES_KEY].contents(), set(kept)), array, t.STRING)
    for key in _token_id_keys(reader):
        old = int(reader.fields[key].contents())
        if old not in new_id:
            raise ValueError(f"{key} = {old} is not among the kept ids")
        fields[key] = (new_id[old], t.UINT32, None)
    return fields


def _kept_merges(merges: list[str], kept_tokens: set[str]) -> list[str]:
    """Merges "a b" whose parts a, b and result ab are all kept, in their original (rank) order."""
    kept = []
    for merge in merges:
        left, _, right = merge.partition(" ")
        if left in kept_tokens and right in kept_tokens and left + right in kept_tokens:
            kept.append(merge)
    return kept


def _copy_metadata(reader: gguf.GGUFReader, writer: gguf.GGUFWriter, replaced: dict[str, tuple]) -> None:
    """Every key of reader into writer (architecture and GGUF.* are written by the writer itself)."""
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        if field.name in replaced:
            value, value_type, sub_type = replaced[field.name]
        else:
            value_type = field.types[0]
            sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
            value = field.contents()
        writer.add_key_value(field.name, value, value_type, sub_type=sub_type)


# ---------------------------------------------------------------------------------------------
# 4. The record beside the trimmed file, and finding it again


@dataclass(frozen=True)
class TrimmedVocab:
    """What a trimmed drafter is: draft index i ↔ target id keep_ids[i]."""

    keep_ids: tuple[int, ...]  # ascending target ids; len == k
    k: int
    n_vocab: int  # the full vocabulary the ids index (the drafter's and the target's)
    source_file: str  # the drafter it was cut from (file name)
    source_size: int
    source_sha256: str
    source_mtime_ns: int  # lets find_trimmed skip rehashing an unchanged drafter
    trimmed_size: int  # bytes of the trimmed GGUF
    calibration: str  # how keep_ids were chosen, in words
    # Where the drafter's full token_embd lies in the source file, so inputs can be embedded
    # without parsing it again: (rows, row_bytes) uint8 blocks of GGML type embd_type.
    embd_offset: int
    embd_type: str
    embd_rows: int
    embd_row_bytes: int
    n_embd: int

    def save(self, path: Path) -> None:
        write_json(path, asdict(self))

    @classmethod
    def load(cls, path: Path) -> "TrimmedVocab":
        try:
            record = json.loads(read_regular_file(path, MAX_STATE_BYTES)[0])
            record["keep_ids"] = tuple(record["keep_ids"])
            return cls(**record)
        except (OSError, ValueError, TypeError, KeyError) as err:
            raise OndeviceError(f"cannot read the VocabTrim record {path} ({err}); run `ondevice quant vocab-trim` again") from None


def build_trimmed(drafter: Path, keep_ids: np.ndarray, calibration: str, reader: gguf.GGUFReader | None = None) -> TrimmedVocab:
    """Write the trimmed GGUF and its record beside the drafter (replacing any older ones).
    reader: the drafter already parsed, if the caller has it."""
    reader = reader or gguf.GGUFReader(drafter)
    trimmed, record_path = trimmed_paths(drafter)
    trimmed.parent.mkdir(parents=True, exist_ok=True)  # under $ONDEVICE_HOME for a drafter in another program's store
    staged = trimmed.with_name(trimmed.name + ".partial")
    write_trimmed_gguf(reader, staged, keep_ids)
    embd = next(tensor for tensor in reader.tensors if tensor.name == "token_embd.weight")
    stat = drafter.stat()
    record = TrimmedVocab(
        keep_ids=tuple(int(i) for i in keep_ids), k=len(keep_ids), n_vocab=len(reader.fields[TOKENS_KEY].data),
        source_file=drafter.name, source_size=stat.st_size, source_sha256=file_sha256(drafter),
        source_mtime_ns=stat.st_mtime_ns, trimmed_size=staged.stat().st_size, calibration=calibration,
        embd_offset=int(embd.data_offset), embd_type=embd.tensor_type.name, embd_rows=int(embd.shape[-1]),
        embd_row_bytes=int(embd.n_bytes // embd.shape[-1]), n_embd=int(embd.shape[0]),
    )
    record_path.unlink(missing_ok=True)  # never a record beside a half-replaced file
    os.replace(staged, trimmed)
    record.save(record_path)
    return record


def find_trimmed(drafter: str | Path) -> Path | None:
    """The trimmed GGUF built from exactly this drafter file, or None if none was built.

    A trimmed file whose record names another drafter (or that does not match its record)
    is an OndeviceError: it must be rebuilt, never used.
    """
    return trimmed_paths(Path(drafter))[0] if trimmed_record(drafter) is not None else None


def trimmed_record(drafter: str | Path) -> TrimmedVocab | None:
    """The record of the trimmed GGUF built from exactly this drafter file (None: none was built);
    an OndeviceError as `find_trimmed` says."""
    drafter = Path(drafter)
    trimmed, record_path = trimmed_paths(drafter)
    if not trimmed.exists() or not record_path.exists():
        return None
    record = TrimmedVocab.load(record_path)
    stat = drafter.stat()
    same_file = stat.st_size == record.source_size and (
        stat.st_mtime_ns == record.source_mtime_ns or file_sha256(drafter) == record.source_sha256
    )
    if not same_file:
        raise OndeviceError(
            f"{trimmed.name} was built from another drafter ({record.source_file}, sha256 {record.source_sha256[:12]}…); "
            "run `ondevice quant vocab-trim` again"
        )
    if trimmed.stat().st_size != record.trimmed_size:
        raise OndeviceError(f"{trimmed.name} does not match its record (incomplete write?); run `ondevice quant vocab-trim` again")
    return record


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()
