"""What every command shares: the error path (how a library error becomes one line on stderr and
an exit code), the checks of option values as they are parsed, the option types several commands
spell alike, the checks of output paths before any work, the progress display, and
:func:`options`, which hands a command's parsed options on as the keyword arguments of the library
function it calls."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from .._validate import ArgumentError, non_negative_int, positive_int, positive_number

console = Console()
err_console = Console(stderr=True)

# The optional modules some commands need, and the extra that installs each.
_EXTRA_OF = {"matplotlib": "lab", "scipy": "lab", "transformers": "hf"}

# The optional modules some commands need, and the extra that installs each.
_EXTRA_OF = {"matplotlib": "lab", "scipy": "lab", "transformers": "hf"}


# ----------------------------------------------------------------------------------------------
# Errors: one path. Bad values of options are caught where typer parses them (the checks of
# rmsnorm._validate); what the library raises is one line on stderr, "rmsnorm COMMAND: message",
# exit code 2 for a bad argument (ArgumentError, with the library's argument names spelled as this
# command's options) and 1 for anything else the user can act on (a missing file or extra).
# ----------------------------------------------------------------------------------------------
# Library argument names whose option is spelled differently here; any other name `x_y` is the
# option `--x-y`.
_OPTION_OF = {
    "norm_position": "--position",
    "text": "--text-file",
    "batch_size": "--batch",
    "budget_s": "--budget",
    "source": "SOURCE",  # convert's arguments
    "destination": "DESTINATION",
}


def _option(name: str) -> str:
    return _OPTION_OF.get(name, "--" + name.replace("_", "-"))


def _fail(command: str, message: str, code: int = 1) -> typer.Exit:
    err_console.print(
        f"rmsnorm {command}: {message}", markup=False, highlight=False, soft_wrap=True
    )
    return typer.Exit(code=code)


@contextmanager
def _reported(command: str, *errors: type[Exception], interrupt: bool = True) -> Iterator[None]:
    """Library errors raised inside the block, reported as one line (see above): every
    :class:`ArgumentError`, and the exception types ``errors``; a Ctrl-C as "interrupted", exit
    code 130 (unless ``interrupt`` is False: the caller says what was kept)."""
    try:
        yield
    except ArgumentError as exc:
        raise _fail(command, exc.render(_option), code=2) from None
    except KeyboardInterrupt:
        if not interrupt:
            raise
        raise _fail(command, "interrupted", code=130) from None
    except errors as exc:
        raise _fail(command, str(exc)) from None


def _checked(check: Callable[[str, object], object]) -> Callable:
    """A typer callback applying ``check(name, value)`` (from :mod:`rmsnorm._validate`) to an
    option's value as it is parsed; ``None`` (not given) passes."""

    def callback(ctx: typer.Context, param: typer.CallbackParam, value):
        if value is None or ctx.resilient_parsing:
            return value
        try:
            check(param.name or "", value)
        except ArgumentError as exc:
            raise typer.BadParameter(exc.detail) from None
        return value

    return callback


_positive = _checked(positive_int)
_non_negative = _checked(non_negative_int)
_positive_number = _checked(positive_number)


def _require(command: str, *modules: str) -> None:
    """Exit with one line naming the missing modules and their extra before any work starts (a
    run that computed for minutes and then failed on its plot would lose its results)."""
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        extras = ",".join(sorted({_EXTRA_OF[m] for m in missing}))
        raise _fail(
            command,
            f"needs {' and '.join(missing)}, which is not installed (the {extras} extra): "
            f"pip install 'rmsnorm[{extras}]'",
        )


# ----------------------------------------------------------------------------------------------
# Options used by several commands: one spelling and one help each.
# ----------------------------------------------------------------------------------------------
_Threads = Annotated[
    int | None,
    typer.Option(callback=_positive, help="torch CPU threads (default: torch's, one per core)."),
]
# The lab's models are small (width ≤ 256). On a 2-core machine shared with other processes a
# training step of the report's model took 0.2 s with one torch thread and 2.5 s with two (the
# worker threads wait on each other), so these commands default to one.
_LabThreads = Annotated[
    int,
    typer.Option(
        callback=_positive, help="torch CPU threads; 1 suits these small models on a shared CPU."
    ),
]
_TextFile = Annotated[
    Path | None,
    typer.Option("--text-file", exists=True, dir_okay=False, help="A text file to run."),
]
_Json = Annotated[
    Path | None,
    typer.Option("--json", help="Also write the results to this file (a new one, or --overwrite)."),
]


_OverwriteOut = Annotated[
    bool,
    typer.Option("--overwrite", help="Replace the files of an earlier run in --out."),
]


def _check_out(
    command: str, out: Path, overwrite: bool, markers: tuple[str, ...] = (), own=None
) -> None:
    """Before any work: --out can be written (a folder or a new path in a writable folder) and
    holds no earlier run's files (``markers``; anything, where ``own`` names all a run writes)
    unless --overwrite: otherwise one line naming --out and the path, exit code 2."""
    from .._files import check_output_dir

    with _reported(command):
        check_output_dir("out", out, overwrite=overwrite, markers=markers, own=own)


def _check_json_target(command: str, path: Path | None, overwrite: bool) -> None:
    """Before any work: --json names a file that can be written, and an existing one is replaced
    only with --overwrite."""
    from .._files import check_output_file

    if path is not None:
        with _reported(command):
            check_output_file("json", path, overwrite=overwrite)


def _log(message: str) -> None:
    console.print(message, markup=False, highlight=False, soft_wrap=True)


def _progress():
    """Progress bars on a terminal; on anything else (a log file, a pipe, CI) plain timestamped
    lines, which a bar cannot give: rich draws nothing where it cannot redraw. Both on stderr, so
    stdout keeps only the results."""
    from .._progress import LogProgress, RichProgress

    if err_console.is_terminal:
        return RichProgress(err_console)
    return LogProgress()


def _set_torch_threads(n: int | None) -> None:
    if n is not None:
        import torch

        torch.set_num_threads(n)


def options(ctx: typer.Context, *skip: str, **values) -> dict:
    """The command's parsed options as the keyword arguments of the library function it calls, so
    that a command spells each field once, in its signature: every option except those named in
    ``skip``, under its parameter's name (a parameter is named as the library's argument; where
    the option is spelled otherwise, its ``typer.Option`` names the spelling, and
    :data:`_OPTION_OF` spells the argument back in error messages), with ``values`` replacing or
    adding values the command converts first."""
    return {name: v for name, v in ctx.params.items() if name not in skip} | values
