"""A loaded pair wired into one object: tokenizer, drafter, target → engine, and the planner.

`load_pipeline` runs what loading/pair.py opens: the files chosen (catalog/choose.py), the load
planned once (loading/choices.py: backends, threads, context, memory plan), the target and drafter
opened and wired. The files come from the catalog (`--model`) or are your own (`--target`, `--drafter`: a GGUF path or
`hf:owner/repo:QUANT`), see catalog/choose.py. A drafter whose vocabulary differs from the target's
only by padding is accepted (tokenizer.vocab_mismatch); without a drafter model (none compatible, or
left out so that a streamed target keeps more layers) the planner weighs the free drafters (prompt
lookup, suffix, recycle) against the target alone, as it weighs the drafter's trees where there is one.

Public API: `ondevice.load(pair) -> Pipeline`; `Pipeline.stream(messages | prompt, ...)` yields
`Record`s (text, token ids, how many came from the draft) and a final record with `stats`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields, replace
from typing import Callable, Iterator

from ondevice.catalog.hub import PairFiles
from ondevice.decode.engine import SpecEngine
from ondevice.decode.stats import Stats, Step
from ondevice.errors import OndeviceError
from ondevice.loading.drafter_room import DrafterChoice, best_measured, measured_slower
from ondevice.loading.memory import MemoryPlan
from ondevice.loading.options import Answers, LoadOptions
from ondevice.loading.pair import open_pair
from ondevice.machine.ram import anon_rss, peak_rss, return_freed_memory
from ondevice.plan.auto import AutoPlanner
from ondevice.plan.cost_model import Plan, plan_as_dict
from ondevice.plan.profile import ProfileBackends
from ondevice.decode.protocols import DraftSpec
from ondevice.prompt.tokenizer import StreamDecoder, Tokenizer
from ondevice.decode.verify import Sampling

BACKEND_NAMES = {"llama": "llama.cpp", "onnx": "ONNX Runtime", "torch": "PyTorch"}


@dataclass
class Record:
    text: str
    token_ids: list[int]
    from_draft: int = 0
    stats: Stats | None = None  # set on the last record only


@dataclass
class Pipeline:
    pair: PairFiles  # what runs: .name, .description, the files
    tokenizer: Tokenizer
    engine: SpecEngine
    target_backend: str
    placement: str = ""  # the memory plan's description ("target in RAM: …"), or the target's placement summary
    info: dict = field(default_factory=dict)
    backends: ProfileBackends | None = None
    planner: AutoPlanner | None = None
    plan: Plan | None = None  # the planner's plan for the last answer; None when the caller chose the tree
    memory: MemoryPlan | None = None  # where a llama.cpp target lives and how the buffers are sized
    overlap_choice: bool | None = None  # --overlap/--no-overlap; None: as the plan says
    drafter_choice: DrafterChoice | None = None  # a target streaming from disk: the drafter kept or left out, and why
    reload: Callable[[], "Pipeline"] | None = None  # this load again with the drafter left out

    def note_choice(self, choice: DrafterChoice | None) -> None:
        self.drafter_choice = choice
        self.info["drafter_choice"] = choice.to_dict() if choice is not None else None
        if choice is not None:
            self.placement += f"; {choice.describe()}"

    def _leave_out_drafter_measured_slower(self) -> None:
        """After an answer: a drafter kept (on a prediction, or on what earlier sessions measured) that
        the planner now measures slower than the target alone without it (`measured_slower`) is left
        out: the models are loaded again, its RAM given to the target's layers. (What was measured on
        code says little of chat, where drafts are accepted less often.)"""
        choice = self.drafter_choice
        if choice is None or not choice.keep or self.planner is None or self.reload is None:
            return
        measured = best_measured(self.planner.book)
        if measured is None or not measured_slower(measured, choice):
            return
        print(f"ondevice: speculation measured {measured:.2f} tok/s here, the target alone without the drafter "
              f"{choice.without:.2f} ({choice.without_source}): loading again without the drafter", file=sys.stderr)
        self.close()
        lean = self.reload()
        for f in fields(Pipeline):
            setattr(self, f.name, getattr(lean, f.name))
        self.note_choice(replace(choice, keep=False, with_drafter=measured, with_source="measured"))

    def resolve(self, spec: DraftSpec | None, sampling: Sampling, context: int = 0) -> DraftSpec | None:
        """A spec with builder "auto" becomes the planner's choice for this machine (or None: target only)
        for the first round of an answer over `context` tokens; sets `plan` to the incumbent's plan
        (None for a spec the caller fixed)."""
        self.plan = None
        if spec is None or self.engine.drafter is None:
            return None
        if spec.builder != "auto":
            return spec
        planned = self.auto_planner().spec(sampling, context=context, budget=spec.budget or None)  # --budget: trees of that size
        self.plan = self.planner.plan
        return planned

    def auto_planner(self) -> AutoPlanner:
        """The planner, made on first use (it measures nothing then: see plan/auto.py)."""
        if self.planner is None:
            self.planner = AutoPlanner(self.backends)
        return self.planner

    def idle_step(self) -> bool:
        """Use a moment the caller has nothing to do (a chat waiting for its user): measure a sample
        of the profile if the planner lacks one. False when there is nothing left to do."""
        if self.engine.closed or self.backends is None or self.engine.drafter is None or self.engine.drafter.model is None:
            return False
        try:
            return self.auto_planner().idle_step()
        except OndeviceError:  # a backend that cannot be measured here: the planner keeps what it has
            self.backends = None
            return False

    def _replan(self) -> DraftSpec | None:
        """Between rounds of a planned answer: the planner's spec, re-chosen when the pass times moved."""
        spec = self.planner.replan()
        self.plan = self.planner.plan
        self._follow_overlap()
        return spec

    def _follow_overlap(self) -> None:
        """Overlap drafting with verification as --overlap/--no-overlap chose, else as the plan says
        (a tree the caller fixed: where the drafter has its own hardware, `overlap_possible`)."""
        if self.overlap_choice is not None:
            self.engine.overlap = self.overlap_choice
        elif self.plan is not None:
            self.engine.overlap = self.plan.overlap
        elif self.backends is not None:
            self.engine.overlap = self.backends.overlap_possible

    def placement_line(self) -> str:
        """Where the target runs, in words: "llama.cpp target in RAM: …", "PyTorch target: 28 layers: …"."""
        name = BACKEND_NAMES.get(self.target_backend, self.target_backend)
        return f"{name} {self.placement}" if self.memory is not None else f"{name} target: {self.placement}"

    def encode_chat(self, messages: list[dict[str, str]], think: bool | None = None) -> list[int]:
        """The conversation through the target's chat template; think: Qwen3's thinking switch (None: its default)."""
        self._check_open()
        return self.tokenizer.encode_chat(messages, think=think)

    def encode_prompt(self, prompt: str) -> list[int]:
        self._check_open()
        return self.tokenizer.encode(prompt, add_special=True, parse_special=True)

    def close(self) -> None:
        """Free the models and threads now, in this order: the overlap worker, the drafter, the target
        (llama.cpp contexts and models, an offloaded target's streaming threads), the tokenizer; then
        the freed heap goes back to the OS, so that a load made next in this process (the reload
        without the drafter, `bench --rounds`) plans with the memory it really holds (without that it
        keeps a layer or two fewer: docs/measurements/2026-11-27-drafter-or-layers.md). Idempotent;
        `with ondevice.load(...) as pipe:` calls it."""
        self.engine.close()
        self.tokenizer.close()
        self.planner = self.backends = None  # the profile's factories hold the target
        return_freed_memory()

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self.engine.closed:
            raise OndeviceError("this pipeline is closed (its models were freed); load it again.")

    def stream_tokens(
        self, prompt_ids: list[int], max_tokens: int = 256, sampling: Sampling = Sampling(), spec: DraftSpec | None = None,
        rule: str = "specexec", should_stop: Callable[[], bool] | None = None,
    ) -> Iterator[Record]:
        """The answer's records; should_stop() is asked before every target pass (see SpecEngine.generate)."""
        self._check_open()
        decoder = StreamDecoder(self.tokenizer)
        spec = self.resolve(spec, sampling, context=len(prompt_ids) - 1)
        planner = self.planner if self.plan is not None else None  # it learns only from the answers it planned
        self._follow_overlap()
        answer: list[int] = []
        replan = self._replan if planner is not None else None
        observe = planner.observe if planner else None
        for item in self.engine.generate(prompt_ids, max_tokens, sampling, spec, rule, observe, should_stop, replan):
            if isinstance(item, Step):
                answer += item.tokens
                yield Record(decoder.push(item.tokens), item.tokens, item.from_draft)
            else:
                if planner is not None:
                    planner.finish(item, list(prompt_ids) + answer)
                yield Record(decoder.flush(), [], 0, stats=item)
        self._leave_out_drafter_measured_slower()

    def peak_rss(self) -> int:
        """This process's peak resident memory, a streaming target's shared slots counted once."""
        return peak_rss(getattr(self.engine.target, "rss_counted_twice", 0))

    def stats_json(self, stats: Stats) -> dict:
        """How the last answer was made (Stats.to_json) and where: backend, model, plan, placement, memory."""
        return {
            **stats.to_json(),
            "target_backend": self.target_backend,
            "model": self.pair.name,
            "plan": plan_as_dict(self.plan) if self.plan else None,
            "planner": self.planner.summary() if self.plan is not None and self.planner is not None else None,
            **_placement_json(self.engine.target, self.memory),
            "drafter_choice": self.info.get("drafter_choice"),  # a streaming target: the drafter kept or left out, and why
            "peak_rss_bytes": self.peak_rss(),  # this process's own footprint (its memory and mapped pages)
            "anon_rss_bytes": anon_rss(),
        }

    def stream(self, messages: list[dict[str, str]] | str, **kwargs) -> Iterator[Record]:
        ids = self.encode_prompt(messages) if isinstance(messages, str) else self.encode_chat(messages)
        return self.stream_tokens(ids, **kwargs)


def _placement_json(target, memory: MemoryPlan | None = None) -> dict:
    """Where the target lives: its layers' tiers (ollama `ps` style) and the bytes streamed per pass;
    for a llama.cpp target the memory plan (in RAM, or streamed from disk through the page cache)."""
    placement = getattr(target, "placement", None)
    split = getattr(target, "split", None)
    if split is not None:  # --rpc: which layers each machine holds, the traffic per pass
        return {"placement": {**(memory.to_dict() if memory is not None else {}), "target": "rpc", "rpc": split.to_dict()},
                "bytes_streamed_per_pass": 0}
    split = getattr(target, "split", None)
    if split is not None:  # --rpc: which layers each machine holds, the traffic per pass
        return {"placement": {**(memory.to_dict() if memory is not None else {}), "target": "rpc", "rpc": split.to_dict()},
                "bytes_streamed_per_pass": 0}
    if placement is None and memory is not None:
        return {"placement": {"target": memory.placement, **memory.to_dict()}, "bytes_streamed_per_pass": memory.bytes_read_per_pass}
    if placement is None:
        return {"placement": {"on_device": "all", "from_ram": 0, "from_disk": 0}, "bytes_streamed_per_pass": 0}
    return {
        "placement": {"on_device": len(placement.on_device), "encoded_on_device": len(placement.encoded_on_device),
                      "from_ram": len(placement.from_ram), "from_disk": len(placement.from_disk), "summary": target.placement_summary()},
        "bytes_streamed_per_pass": placement.bytes_per_pass,
    }


def load(model: str | None = None, *, answers: Answers | None = None, **kwargs) -> Pipeline:
    """Load a model pair (downloading it on first use); kwargs are `LoadOptions` fields; answers:
    what it will answer, when known (a target streamed from disk gets a context sized to them)."""
    return load_pipeline(LoadOptions(model=model, **kwargs), answers=answers)


def load_pipeline(opts: LoadOptions, status: Callable[[str], None] | None = None, answers: Answers | None = None) -> Pipeline:
    """The pair opened as planned (loading/pair.py), running. status(message): what a long step is
    doing (the CLI's spinner)."""
    pair = open_pair(opts, status, answers)
    pipe = Pipeline(pair.files, pair.tokenizer, pair.engine, pair.plan.target_backend, placement=pair.placement, info=pair.info,
                    backends=pair.backends, memory=pair.plan.memory, overlap_choice=opts.overlap,
                    reload=lambda: load_pipeline(replace(opts, keep_drafter=False), None, answers))
    pipe.note_choice(pair.choice)
    return pipe
