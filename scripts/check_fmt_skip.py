"""Report every ``# fmt: skip`` marker that changes nothing: the code formats the same without it
(the formatter ignores the marker where it sits, or the hand layout is the formatter's own).

    python scripts/check_fmt_skip.py src tests benchmarks

Exits 1 listing ``path:line`` of each such marker; ``make lint`` runs it after ``ruff format
--check``. Each marker costs one ``ruff format`` run on its file (~5 ms).
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

MARKER = re.compile(r"\s*# fmt: skip\s*$")


def _formatted(text: str, path: Path) -> str | None:
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(path), "-"],
        input=text,
        capture_output=True,
        text=True,
    )
    return proc.stdout if proc.returncode == 0 else None


def _marker_lines(source: str) -> list[int]:
    """0-based lines ending in a ``# fmt: skip`` comment (the text inside strings is not one)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [
        tok.start[0] - 1
        for tok in tokens
        if tok.type == tokenize.COMMENT and tok.string.strip() == "# fmt: skip"
    ]


def inert_markers(path: Path) -> list[int]:
    """1-based line numbers of the markers of ``path`` whose removal leaves formatted code."""
    source = path.read_text()
    lines = io.StringIO(source).readlines()  # the lines tokenize numbers
    inert = []
    for i in _marker_lines(source):
        line = lines[i]
        without = lines.copy()
        without[i] = MARKER.sub("", line.rstrip("\r\n")) + "\n"
        text = "".join(without)
        if _formatted(text, path) == text:
            inert.append(i + 1)
    return inert


def main(roots: list[str]) -> int:
    found = []
    for root in roots:
        paths = [Path(root)] if root.endswith(".py") else sorted(Path(root).rglob("*.py"))
        for path in paths:
            if "# fmt: skip" in path.read_text():
                found += [f"{path}:{line}" for line in inert_markers(path)]
    for where in found:
        print(f"{where}: '# fmt: skip' changes nothing here; remove it")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["src", "tests", "benchmarks"]))
