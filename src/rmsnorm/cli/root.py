"""The root of the ``rmsnorm`` command: the app, the check every command runs first, and the
registration of each family's commands (one module each) and groups of commands."""

from __future__ import annotations

import sys

import typer

from . import compare, experiments, library, store
from ._shared import _reported

app = typer.Typer(
    help="rmsnorm: RMSNorm / LayerNorm kernels and the lab that compares them.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root(ctx: typer.Context) -> None:
    """rmsnorm: RMSNorm / LayerNorm kernels and the lab that compares them."""
    if "--help" in sys.argv[1:]:  # `rmsnorm CMD --help` needs no backend, nor torch's import time
        return
    from .. import _backend

    with _reported(ctx.invoked_subcommand or "", ValueError):
        _backend.current()  # a bad RMSNORM_BACKEND is one line here, not a deep traceback


# The help lists the commands in this order, then the groups.
for command in (*library.COMMANDS, *experiments.COMMANDS, compare.compare):
    app.command()(command)
for name, group in store.GROUPS.items():
    app.add_typer(group, name=name)


def main() -> None:
    app()
