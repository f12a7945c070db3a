"""`ondevice serve`: load the pair once and answer OpenAI-style HTTP requests (ondevice/serve)."""

from __future__ import annotations

import ipaddress
from typing import Optional

import typer
from rich.text import Text

from ondevice.cli import options as opt
from ondevice.cli.decoding import err, keeping_drafter, load_pipeline, make_spec, run_outliving_lost_workers
from ondevice.cli.literal import literal, say
from ondevice.errors import OndeviceError
from ondevice.loading.options import LoadOptions
from ondevice.sizes import parse_size
from ondevice.decode.verify import Sampling


@opt.load_options
def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on. 0.0.0.0 lets other machines in: set --api-key then."),
    port: int = typer.Option(8080, "--port", min=1, max=65535, help="TCP port."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="ONDEVICE_API_KEY", help="Require `Authorization: Bearer KEY` on /v1 requests."),
    max_tokens: opt.MaxTokens = 1024,
    temperature: opt.Temperature = 0.0,
    top_p: opt.TopP = 1.0,
    top_k: opt.TopK = 0,
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed for requests that send none (default: a fresh one per request)."),
    tree: opt.Tree = "auto",
    budget: opt.Budget = None,
    max_request_size: str = typer.Option("4MiB", "--max-request-size", help="Largest request body accepted (413 above it)."),
    read_timeout: float = typer.Option(10.0, "--read-timeout", min=0.1, help="Seconds a client has to send a request's headers, and again its body (then 408 and the connection closes)."),
    *,
    load: LoadOptions,
) -> None:
    """Serve the model over an OpenAI-compatible HTTP API: /v1/chat/completions, /v1/completions, /v1/models, /health.

    Point a client at http://HOST:PORT/v1. --max-tokens, --temperature, --top-p, --top-k and --seed are the
    defaults for requests that leave them out (temperature 0: the target's exact greedy answer).
    Ctrl-C or SIGTERM: waiting requests get a 503, the answer in progress may finish (30 s; a second Ctrl-C
    stops it), then the models are freed.
    """
    from ondevice.serve.app import ServeConfig  # lazy: starlette, uvicorn, pydantic, only for this command
    from ondevice.serve.schemas import Defaults  # lazy: pydantic, only for this command
    from ondevice.serve.server import bind, serve as run_server  # lazy: uvicorn, only for this command

    sampling = Sampling(temperature, top_p, top_k, seed or 0)  # bad options fail before loading
    spec = make_spec(tree, budget, not load.draft, sampling)
    max_body = parse_size(max_request_size)
    if max_body <= 0:
        raise OndeviceError(f"--max-request-size must be more than 0 bytes (got {max_request_size!r}).")
    if load.rpc is not None:
        run_outliving_lost_workers(load.rpc, "serve")  # bound and loaded in a child started again without a lost worker
    if not is_loopback(host) and not api_key:
        err.print(Text.assemble(("warning:", "yellow"), " ", literal(f"listening on {host} without --api-key: anyone who can reach this "
                                                                     "machine can use the model.")), soft_wrap=True)
    sock = bind(host, port)
    pipe = load_pipeline(keeping_drafter(load, [spec]))
    try:
        if spec is not None and spec.builder == "auto":
            pipe.resolve(spec, sampling)  # profile this machine now (once), not during the first request
        say(err, f"serving {pipe.pair.name} at http://{host}:{port}/v1 (use it as an OpenAI base_url) · Ctrl-C stops")
        counts = run_server(ServeConfig(pipe, spec, Defaults(max_tokens, temperature, top_p, top_k, seed), api_key, max_body), sock,
                            read_seconds=read_timeout)
    finally:
        pipe.close()
    err.print(f"stopped; models freed · {counts['finished']} answers, {counts['cancelled']} cancelled, {counts['failed']} failed,"
              f" {counts['tokens']} tokens generated", soft_wrap=True)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
