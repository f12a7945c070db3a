"""The HTTP API: routes, the API key, and how one request becomes a queued job and its answer.

    GET  /health                 no key needed: {"status": "ok", "model", "queue": {waiting, running, …}}
    GET  /v1/models              the served pair (a request may also name it "default")
    POST /v1/chat/completions    messages → answer (whole, or streamed as server-sent events)
    POST /v1/completions         a raw prompt (text or token ids) → continuation
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ondevice.errors import OndeviceError
from ondevice.machine.ram import trim_heap, unmap_large_frees
from ondevice.pipeline import Pipeline
from ondevice.prompt import template_process
from ondevice.decode.protocols import DraftSpec
from ondevice.serve.body_limit import BodyLimit
from ondevice.serve.errors import HANDLERS, ApiError
from ondevice.serve.generation import run_job
from ondevice.serve.queue import Delta, Failed, Finished, GenerationQueue, Job
from ondevice.serve.responses import Envelope, sse
from ondevice.serve.schemas import ChatRequest, CompletionRequest, Defaults, GenerationRequest, parse


@dataclass
class ServeConfig:
    pipe: Pipeline
    spec: DraftSpec | None  # --tree/--budget (None: the target alone); temperature and seed come per request
    defaults: Defaults
    api_key: str | None = None
    max_body_bytes: int = 4 << 20

    @property
    def model(self) -> str:
        return self.pipe.pair.name


class Api:
    def __init__(self, config: ServeConfig):
        self.config = config
        self.pipe = config.pipe
        self.queue = GenerationQueue(lambda job: run_job(self.pipe, job))
        self._prompts = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ondevice-prompt", initializer=_yield_to_the_loop)
        self._hand_back_queued = threading.Event()

    def close(self) -> None:
        """Shutdown: prompts not started yet are dropped; a template render in progress is stopped."""
        self._prompts.shutdown(wait=False, cancel_futures=True)
        template_process.stop()

    # --- routes -----------------------------------------------------------------------------
    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "model": self.config.model, "queue": self.queue.snapshot()})

    async def models(self, request: Request) -> JSONResponse:
        self._check_key(request)
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request) -> JSONResponse:
        self._check_key(request)
        self._check_model(request.path_params["name"])
        return JSONResponse(self._model_card())

    async def chat(self, request: Request) -> Response:
        self._check_key(request)
        req, ids = await self._off_loop(self._chat_prompt, await request.body())
        return await self._answer(request, req, ids, Envelope("chat.completion", self.config.model))

    async def completions(self, request: Request) -> Response:
        self._check_key(request)
        req, ids = await self._off_loop(self._completion_prompt, await request.body())
        return await self._answer(request, req, ids, Envelope("text_completion", self.config.model))

    # --- the prompt, in the prompt thread ---------------------------------------------------------
    async def _off_loop(self, prepare, body: bytes):
        """prepare(body) in the prompt thread: parsing 4 MiB of JSON, a chat template (its own process,
        up to seconds) and tokenizing a long prompt (seconds: docs/measurements/code-notes.md) must not
        stop the event loop, which answers /health and other clients meanwhile. One thread: prompts
        wait their turn. After a large request, the memory its body took goes back to the OS
        (`_hand_back`): a burst of 4 MiB requests left the server hundreds of MB larger."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._prompts, prepare, body)
        finally:
            if len(body) >= LARGE_BODY_BYTES and not self._hand_back_queued.is_set():
                self._hand_back_queued.set()
                self._prompts.submit(_hand_back, self._hand_back_queued)

    def _chat_prompt(self, body: bytes) -> tuple[ChatRequest, list[int]]:
        req = self._parse(ChatRequest, body)
        messages = [message.as_template_message() for message in req.messages]
        try:
            return req, self.pipe.encode_chat(messages, think=req.think())
        except OndeviceError as err:  # e.g. the template refuses this order of roles
            raise ApiError(400, str(err), param="messages") from None

    def _completion_prompt(self, body: bytes) -> tuple[CompletionRequest, list[int]]:
        req = self._parse(CompletionRequest, body)
        prompt = req.single_prompt()
        if not isinstance(prompt, str):
            return req, self._checked_ids(prompt)
        try:
            return req, self.pipe.encode_prompt(prompt)
        except OndeviceError as err:  # text the tokenizer cannot take
            raise ApiError(400, str(err), param="prompt") from None

    # --- checks -----------------------------------------------------------------------------
    def _parse(self, kind: type[GenerationRequest], body: bytes) -> GenerationRequest:
        req = parse(kind, body)
        self._check_model(req.model)
        req.refuse_unsupported()
        return req

    def _check_key(self, request: Request) -> None:
        key = self.config.api_key
        if key is None:
            return
        given = request.headers.get("authorization", "")
        if not given.lower().startswith("bearer "):
            raise ApiError(401, "missing API key: send the header `Authorization: Bearer KEY`.", code="invalid_api_key")
        if not hmac.compare_digest(given[7:].strip().encode(), key.encode()):
            raise ApiError(401, "incorrect API key.", code="invalid_api_key")

    def _check_model(self, name: str) -> None:
        if name not in (self.config.model, "default"):
            raise ApiError(404, f"the model {name!r} does not exist here; this server runs {self.config.model!r} (or say \"default\").",
                           code="model_not_found", param="model")

    def _checked_ids(self, ids: list[int]) -> list[int]:
        n_vocab = self.pipe.tokenizer.n_vocab
        if any(not 0 <= t < n_vocab for t in ids):
            raise ApiError(400, f"prompt token ids must be in 0..{n_vocab - 1}.", param="prompt")
        return ids

    def _model_card(self) -> dict:
        return {"id": self.config.model, "object": "model", "created": 0, "owned_by": "ondevice"}

    # --- one answer -------------------------------------------------------------------------
    async def _answer(self, request: Request, req: GenerationRequest, ids: list[int], envelope: Envelope) -> Response:
        n_ctx = self.pipe.engine.target.n_ctx
        if len(ids) >= n_ctx:
            raise ApiError(400, f"the prompt is {len(ids)} tokens but the context holds {n_ctx}; shorten it or restart the server with a larger --ctx.",
                           code="context_length_exceeded", param="messages" if envelope.chat else "prompt")
        sampling = req.sampling(self.config.defaults)
        spec = self.config.spec and replace(self.config.spec, temperature=sampling.temperature, seed=sampling.seed)
        job = Job(ids, req.max_new_tokens(self.config.defaults, n_ctx), sampling, spec, req.stops(), asyncio.get_running_loop())
        self.queue.submit(job)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return EventStream(self._events(job, envelope, include_usage), on_close=lambda: self.queue.cancel(job))
        try:
            done = await _until_finished(job, request)
        finally:
            self.queue.cancel(job)  # a no-op once finished; a client that left stops its generation
        return JSONResponse(envelope.whole(done)) if done is not None else Response(status_code=499)  # 499: client closed request

    async def _events(self, job: Job, envelope: Envelope, include_usage: bool):
        yield sse(envelope.chunk("" if envelope.chat else None, first=True))
        while True:
            event = await job.events.get()
            if isinstance(event, Delta):
                yield sse(envelope.chunk(event.text))
            elif isinstance(event, Finished):
                yield sse(envelope.chunk(finish=event.completion))
                if include_usage:
                    yield sse(envelope.usage_chunk(event.completion))
                break
            else:  # failed after the stream began (e.g. the server is shutting down): an error event
                yield sse(event.error.body())
                break
        yield sse("[DONE]")


class EventStream(StreamingResponse):
    """Server-sent events; `on_close` runs however the response ends (done, client gone, shutdown)."""

    media_type = "text/event-stream"

    def __init__(self, events, on_close):
        super().__init__(events, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


LARGE_BODY_BYTES = 256 << 10


def _hand_back(queued: threading.Event) -> None:
    """In the prompt thread, after the large requests before it: their garbage collected (what a
    request leaves in cycles: an exception and its frames, holding the parsed body; milliseconds,
    since `create_app` froze what loading made) and glibc's free heap returned to the OS. Request
    bodies and other blocks over 128 KiB go back when freed: `create_app` keeps glibc unmapping them."""
    queued.clear()
    gc.collect()
    trim_heap()


def _yield_to_the_loop() -> None:
    """The prompt thread runs 5 nice levels below the event loop (Linux sets nice per thread), so
    that on a busy CPU the loop still answers at once."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5))
    except (AttributeError, OSError):  # not Linux: the thread keeps the process's priority
        pass


async def _until_finished(job: Job, request: Request):
    """The job's completion, or None if the client disconnects first."""
    finished = asyncio.ensure_future(_completion(job))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({finished, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not finished.done():
        finished.cancel()
        return None
    return finished.result()


async def _completion(job: Job):
    while True:
        event = await job.events.get()
        if isinstance(event, Finished):
            return event.completion
        if isinstance(event, Failed):
            raise event.error


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(config: ServeConfig) -> Starlette:
    unmap_large_frees()  # request bodies and the prompts made of them are unmapped when freed, not kept in the heap
    gc.collect()
    gc.freeze()  # what loading made lives as long as the server: later collections (_hand_back) look only at requests' objects
    api = Api(config)
    routes = [
        Route("/health", api.health, methods=["GET"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/models/{name:path}", api.model, methods=["GET"]),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers=HANDLERS, middleware=[Middleware(BodyLimit, max_bytes=config.max_body_bytes)])
    app.state.queue = api.queue
    app.state.api = api
    return app
