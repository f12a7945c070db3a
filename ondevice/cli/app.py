"""The `ondevice` command: one Typer app; each command group lives in its own file."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from ondevice.cli.literal import error_line
from ondevice.errors import OndeviceError

app = typer.Typer(
    name="ondevice",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Run large language models on your own hardware with exact speculative decoding.",
)
err_console = Console(stderr=True)


def main() -> None:
    """Console-script entry point: user errors become one line on stderr and exit code 1, printed as
    they are (cli/literal.py: no markup, no control characters, bounded)."""
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")  # a file name that is not UTF-8 prints, as on stderr
    try:
        app()
    except OndeviceError as err:
        err_console.print(error_line(err), highlight=False, soft_wrap=True)
        sys.exit(1)
    except OSError as oserr:  # a disk or permission failure no command expected (state writes only warn): one line
        where = f" {oserr.filename}" if oserr.filename else ""
        err_console.print(error_line(f"cannot use{where} ({oserr.strerror or oserr}); free some space, check its "
                                     "permissions, or set ONDEVICE_HOME to another folder"), highlight=False, soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)

from ondevice.cli import chat_cmd, run_cmd  # noqa: E402  (commands register after the app exists)

app.command("chat")(chat_cmd.chat)
app.command("generate")(run_cmd.generate)

from ondevice.cli import download_cmd, models_cmd  # noqa: E402

app.command("download")(download_cmd.download)
app.command("models")(models_cmd.models)
app.command("rm")(models_cmd.rm)

from ondevice.cli import bench_cmd  # noqa: E402

app.command("bench")(bench_cmd.bench)

from ondevice.cli import profile_cmd  # noqa: E402

app.command("profile")(profile_cmd.profile)

from ondevice.cli import quant_cmd  # noqa: E402

app.add_typer(quant_cmd.app, name="quant", help="Build drafter variants: VocabTrim (trimmed LM head).")

from ondevice.cli import serve_cmd  # noqa: E402

app.command("serve")(serve_cmd.serve)

from ondevice.cli import worker_cmd  # noqa: E402

app.command("worker")(worker_cmd.worker)
