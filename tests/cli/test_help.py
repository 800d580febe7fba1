"""Every command's ``--help`` as the user reads it, held to the text stored in ``tests/cli/help/``:
the root, each command and each command of a group, found by walking the command itself (a new
command needs its snapshot). The help is drawn 100 columns wide, without colour, so the text does
not depend on the terminal. After an intended change of a command's options or help, rewrite the
snapshots with ``RMSNORM_WRITE_HELP=1 python -m pytest tests/cli/test_help.py`` and read the
diff."""

import os
from pathlib import Path

import pytest
import typer.main
import typer.rich_utils
from typer.testing import CliRunner

from rmsnorm.cli import app

HELP_DIR = Path(__file__).parent / "help"
WIDTH = 100


def _paths(command, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The argument path of ``command`` and of every command below it, in the order listed."""
    found = [prefix]
    if hasattr(command, "list_commands"):  # a group (typer's own click, not the installed one)
        ctx = command.context_class(command)
        for name in command.list_commands(ctx):
            found += _paths(command.get_command(ctx, name), prefix + (name,))
    return found


PATHS = _paths(typer.main.get_command(app))


def _snapshot(path: tuple[str, ...]) -> Path:
    return HELP_DIR / ("_".join(("rmsnorm",) + path) + ".txt")


def _help(path: tuple[str, ...]) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], prog_name="rmsnorm", color=False)
    assert result.exit_code == 0, result.output
    return "\n".join(line.rstrip() for line in result.output.splitlines()) + "\n"


@pytest.fixture(autouse=True)
def _fixed_terminal(monkeypatch):
    # typer reads these from the environment when it is first imported: set them on the module
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", WIDTH)
    monkeypatch.setattr(typer.rich_utils, "FORCE_TERMINAL", False)
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("RMSNORM_BACKEND", raising=False)


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(("rmsnorm",) + p))
def test_help_is_the_stored_one(path):
    text = _help(path)
    snapshot = _snapshot(path)
    if os.environ.get("RMSNORM_WRITE_HELP"):
        HELP_DIR.mkdir(exist_ok=True)
        snapshot.write_text(text)
    assert snapshot.exists(), f"no stored help for {' '.join(path)}: see this file's docstring"
    assert text == snapshot.read_text()


def test_every_stored_help_is_of_a_command():
    stored = {p.name for p in HELP_DIR.glob("*.txt")}
    assert stored == {_snapshot(p).name for p in PATHS}
