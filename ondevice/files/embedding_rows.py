"""Input embeddings looked up from a GGUF's `token_embd` without loading the matrix: the rows asked
for are read from the memory-mapped file and dequantized (gguf's numpy code, the same values
llama.cpp and our torch model use). For backends fed embeddings instead of token ids: the ONNX
decoder and the VocabTrim drafter, whose own file no longer holds every row.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import gguf
import numpy as np


@dataclass(frozen=True)
class EmbeddingRows:
    path: str  # the GGUF file (the part of a split set) holding the tensor
    offset: int  # where its data starts in that file
    qtype: str  # GGML type name, e.g. "Q4_K"
    rows: int  # vocabulary size
    row_bytes: int
    width: int  # embedding size

    @classmethod
    def of_tensor(cls, tensor, path: str | Path) -> "EmbeddingRows":
        """From a gguf ReaderTensor (token_embd.weight) of the file at `path`."""
        width, rows = (int(d) for d in tensor.shape[:2])
        return cls(str(path), int(tensor.data_offset), tensor.tensor_type.name, rows, int(tensor.n_bytes) // rows, width)

    @classmethod
    def from_dict(cls, d: dict) -> "EmbeddingRows":
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)

    def __call__(self, token_ids) -> np.ndarray:
        """(n, width) float32 embeddings of these token ids."""
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        if len(ids) == 0:
            return np.zeros((0, self.width), dtype=np.float32)
        if ids.min() < 0 or ids.max() >= self.rows:
            raise ValueError(f"token ids must lie in [0, {self.rows})")
        blocks = self._blocks[ids]
        rows = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[self.qtype])
        return np.ascontiguousarray(rows, dtype=np.float32).reshape(len(ids), self.width)

    @property
    def _blocks(self) -> np.ndarray:
        blocks = self.__dict__.get("_mapped")
        if blocks is None:
            blocks = np.memmap(self.path, dtype=np.uint8, mode="r", offset=self.offset, shape=(self.rows, self.row_bytes))
            object.__setattr__(self, "_mapped", blocks)
        return blocks
