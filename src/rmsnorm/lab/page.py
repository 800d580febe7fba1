"""The lab's tiny document model: headings, paragraphs, bullet lists, tables, figures and code
blocks, rendered once as Markdown (figures linked as files) and once as a self-contained HTML page
(figures embedded as base64 PNG, inline CSS, no external assets). ``rmsnorm report`` writes its page
with it, and ``rmsnorm compare`` its ``summary.md``."""

from __future__ import annotations

import base64
import html
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Page"]

_CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; max-width: 60rem;
       margin: 2rem auto; padding: 0 1rem; line-height: 1.5; color: #222; }
h1 { border-bottom: 2px solid #ddd; padding-bottom: .3rem; }
h2 { border-bottom: 1px solid #eee; padding-bottom: .2rem; margin-top: 2.2rem; }
table { border-collapse: collapse; margin: 1rem 0; font-size: .88rem; }
th, td { border: 1px solid #ccc; padding: .25rem .55rem; text-align: right; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
figure { margin: 1.2rem 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: .9rem; color: #555; }
code { background: #f4f4f4; padding: 0 .2rem; border-radius: 3px; }
pre { background: #f6f8fa; padding: .8rem; overflow-x: auto; font-size: .85rem; }
.note { color: #555; font-size: .92rem; }
"""


def _inline_html(text: str) -> str:
    """Escape, then the two inline marks the report uses: `code` and **bold**."""
    out = html.escape(text, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)


def _md_cell(text: str) -> str:
    """A Markdown table cell: a literal ``|`` (as in |μ|) would end the cell."""
    return text.replace("|", "\\|")


@dataclass
class Page:
    title: str
    blocks: list[tuple] = field(default_factory=list)
    _sections: int = 0
    _keys: dict = field(default_factory=dict)

    def h2(self, text: str, numbered: bool = True, key: str | None = None) -> None:
        """A section heading, numbered in order unless ``numbered`` is False; ``key`` names the
        section for :meth:`ref`."""
        if numbered:
            self._sections += 1
            text = f"{self._sections}. {text}"
            if key is not None:
                self._keys[key] = self._sections
        self.blocks.append(("h2", text))

    def ref(self, key: str) -> str:
        """ "section N" for the section headed with ``key`` (KeyError before it is on the page: a
        pointer to a section that is not there would mislead)."""
        return f"section {self._keys[key]}"

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def bullets(self, items: list[str]) -> None:
        self.blocks.append(("ul", list(items)))

    def table(self, headers: list[str], rows: list[list]) -> None:
        self.blocks.append(("table", list(headers), [[str(c) for c in r] for r in rows]))

    def figure(self, path: Path, caption: str) -> None:
        self.blocks.append(("figure", Path(path), caption))

    def code(self, text: str) -> None:
        self.blocks.append(("code", text))

    def markdown(self, relative_to: Path) -> str:
        lines = [f"# {self.title}", ""]
        for block in self.blocks:
            kind = block[0]
            if kind == "h2":
                lines += [f"## {block[1]}", ""]
            elif kind == "p":
                lines += [block[1], ""]
            elif kind == "ul":
                lines += [f"- {item}" for item in block[1]] + [""]
            elif kind == "table":
                headers, rows = block[1], block[2]
                lines.append("| " + " | ".join(map(_md_cell, headers)) + " |")
                lines.append("|" + "|".join("---" for _ in headers) + "|")
                lines += ["| " + " | ".join(map(_md_cell, r)) + " |" for r in rows]
                lines.append("")
            elif kind == "figure":
                # relpath works whether the report folder was given as a relative or absolute path
                rel = Path(os.path.relpath(block[1], relative_to)).as_posix()
                # brackets in the alt text (E[μ²]) would end it early
                alt = block[2].replace("[", "\\[").replace("]", "\\]")
                lines += [f"![{alt}]({rel})", "", f"*{block[2]}*", ""]
            elif kind == "code":
                lines += ["```", block[1], "```", ""]
        return "\n".join(lines)

    def html(self) -> str:
        parts = [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{html.escape(self.title)}</title><style>{_CSS}</style></head><body>",
            f"<h1>{html.escape(self.title)}</h1>",
        ]
        for block in self.blocks:
            kind = block[0]
            if kind == "h2":
                parts.append(f"<h2>{_inline_html(block[1])}</h2>")
            elif kind == "p":
                parts.append(f"<p>{_inline_html(block[1])}</p>")
            elif kind == "ul":
                parts.append("<ul>" + "".join(f"<li>{_inline_html(i)}</li>" for i in block[1]))
                parts.append("</ul>")
            elif kind == "table":
                head = "".join(f"<th>{_inline_html(h)}</th>" for h in block[1])
                body = "".join(
                    "<tr>" + "".join(f"<td>{_inline_html(c)}</td>" for c in r) + "</tr>"
                    for r in block[2]
                )
                parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            elif kind == "figure":
                data = base64.b64encode(block[1].read_bytes()).decode("ascii")
                alt = html.escape(block[2])
                parts.append(
                    f'<figure><img alt="{alt}" src="data:image/png;base64,{data}">'
                    f"<figcaption>{_inline_html(block[2])}</figcaption></figure>"
                )
            elif kind == "code":
                parts.append(f"<pre><code>{html.escape(block[1])}</code></pre>")
        parts.append("</body></html>")
        return "\n".join(parts)
