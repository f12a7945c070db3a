"""OnnxDrafter: the drafter model on ONNX Runtime (CPU), from the drafter GGUF's own weights, 4-bit.

The same model as LlamaDrafter (`model_drafter.ModelDrafter` grows the trees), run by the exported
decoder (`ondevice.onnx`): MatMulNBits reuses every weight block across the nodes of one expansion,
so a batch of 16 costs a fraction of 16 single calls. With VocabTrim the head is the trimmed rows of
the drafter's own LM head (an export of just those rows); inputs are always embeddings of target
ids from the full token_embd, and outputs are full-width logits, −inf outside the kept ids.
"""

from __future__ import annotations

from pathlib import Path

from ondevice.draft.model_drafter import ModelDrafter
from ondevice.draft.onnx_cache import OnnxDraftKV
from ondevice.onnx.decoder import OnnxDecoder
from ondevice.onnx.export import ACCURACY_INT8, ensure_export
from ondevice.onnx.export_files import DRAFTER_INT4_BLOCK as INT4_BLOCK
from ondevice.decode.protocols import MAX_BUDGET
from ondevice.vocabtrim.head import TrimmedHead


class OnnxDrafter(ModelDrafter):
    def __init__(
        self,
        model_path: str | Path,
        n_ctx: int = 4096,
        threads: int | None = None,
        max_batch: int = 64,
        vocab_trim: bool = False,
        target_vocab: int | None = None,
        accuracy_level: int = ACCURACY_INT8,
        int4_block: int | None = INT4_BLOCK,
        show: bool = True,
    ):
        """int4_block: run every matrix requantized to 4 bits, one scale per this many weights (None:
        the GGUF's own codes, 8-bit for Q5_0/Q8_0/Q6_K). The drafts change slightly, exactness does not:
        the target checks every token."""
        head = TrimmedHead.find(model_path) if vocab_trim else None
        rows = head.keep_ids if head else None
        export = ensure_export(model_path, accuracy_level=accuracy_level, head_rows=rows, show=show, int4_block=int4_block)
        self.decoder = OnnxDecoder(export, slots=n_ctx + MAX_BUDGET + max_batch, threads=threads, trimmed=head is not None)
        self.vocab_trimmed = head is not None
        self.n_ctx = n_ctx
        self.n_vocab = export.args.vocab_size
        self.max_batch = max_batch
        self.cache = OnnxDraftKV(self.decoder, columns=head)
        self.limit_vocab(target_vocab)

    def close(self) -> None:
        self.decoder.close()
