"""The report's document model (lab/report/page.py): Markdown and HTML from the same blocks."""

from pathlib import Path

from rmsnorm.lab.report import Page


def test_page_renders_escaped_tables():
    page = Page("t")
    page.h2("Numbers")
    page.h2("Notes", numbered=False)
    page.table(["|μ|/σ", "x"], [["0.1", "<b>"]])
    md = page.markdown(Path("."))
    assert "## 1. Numbers" in md and "## Notes" in md and "\\|μ\\|/σ" in md
    html = page.html()
    assert "&lt;b&gt;" in html and "<th>|μ|/σ</th>" in html


def test_figure_alt_text_keeps_its_brackets_inside(tmp_path):
    """A caption with brackets (E[μ²]) must not end the Markdown image's alt text early."""
    png = tmp_path / "f.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n")
    page = Page("t")
    page.figure(png, "share of E[μ²] per layer")
    md = page.markdown(tmp_path)
    assert "![share of E\\[μ²\\] per layer](f.png)" in md
