"""Printing the command's tables: on a terminal, rich's box table fitted to the width, each column
at least as wide as its longest word (a name or a version is wrapped between words, never cut);
anywhere else (a pipe, a file, CI) a Markdown table, one line per row whatever its length, with
``|`` escaped and line breaks inside a cell written ``<br>``, which any Markdown reader shows as
a table."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["markdown_table", "show_table"]


def _plain(cell) -> str:
    if isinstance(cell, Text):
        return cell.plain
    return str(cell) if cell is not None else ""


def _md_cell(text: str) -> str:
    text = text.replace("\\", "\\\\").replace("|", "\\|")
    return "<br>".join(part.strip() for part in text.splitlines()) if "\n" in text else text


def markdown_table(table: Table) -> str:
    """``table`` as Markdown: its title above (a line of its own), its caption below."""
    headers = [_md_cell(_plain(c.header)) for c in table.columns]
    rule = {"right": "---:", "center": ":---:"}
    lines = []
    if table.title:
        lines += [_plain(table.title), ""]
    if not table.show_header:  # a key-value table: Markdown needs a header row anyway
        headers = (["item", "value"] + [""] * len(headers))[: len(headers)]
    lines.append("| " + " | ".join(headers) + " |")
    lines.append("|" + "|".join(rule.get(c.justify, "---") for c in table.columns) + "|")
    rows = zip(*(list(c.cells) for c in table.columns), strict=True)
    for row in rows:
        lines.append("| " + " | ".join(_md_cell(_plain(cell)) for cell in row) + " |")
    if table.caption:
        lines += ["", _plain(table.caption)]
    return "\n".join(lines)


def show_table(console: Console, table: Table) -> None:
    """``table`` on ``console``: a box table on a terminal, Markdown elsewhere."""
    if not console.is_terminal:
        console.print(markdown_table(table), markup=False, highlight=False, soft_wrap=True)
        console.print()
        return
    for column in table.columns:
        words = [w for cell in [column.header, *column.cells] for w in _plain(cell).split()]
        longest = max((len(w) for w in words), default=1)
        column.min_width = max(column.min_width or 0, longest)
    console.print(table)
