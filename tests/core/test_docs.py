"""Every ```python block of README.md and docs/*.md runs as written: each in a fresh namespace, in
an empty working directory, on the CPU. A block that cannot run here says so right above its fence
with ``<!-- not-run: why -->``, and is reported as skipped with that reason."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(?P<why>.+?)\s*-->$")
OPTIONAL = {"transformers": "hf", "matplotlib": "lab", "triton": "triton", "kernels": "kernels"}


def python_blocks(path: Path):
    """(first line number of the code, code, not-run reason or None) per ```python block."""
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start, body = i + 1, []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            before = (line.strip() for line in reversed(lines[: start - 1]))
            above = next((line for line in before if line), "")
            marker = NOT_RUN.match(above)
            yield start + 1, "\n".join(body) + "\n", marker["why"] if marker else None
        i += 1


BLOCKS = [
    pytest.param(path, line, code, why, id=f"{path.relative_to(ROOT)}:{line}")
    for path in DOCS
    for line, code, why in python_blocks(path)
]


def test_blocks_are_found():
    """The extraction sees the docs' blocks, and none hides behind another info string."""
    assert len(BLOCKS) >= 9
    for path in DOCS:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.match(r"\s*```\s*(py|python3|pycon|ipython)\b", line):
                pytest.fail(f"{path.name}:{n}: use ```python so that the block is run: {line!r}")


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("path, line, code, why", BLOCKS)
def test_python_block_runs(path, line, code, why, tmp_path, monkeypatch):
    if why is not None:
        pytest.skip(f"marked not-run: {why}")
    monkeypatch.chdir(tmp_path)
    # Leading newlines make a traceback's line numbers those of the Markdown file.
    compiled = compile("\n" * (line - 1) + code, str(path), "exec")
    try:
        exec(compiled, {"__name__": "__main__"})
    except ModuleNotFoundError as exc:
        if exc.name in OPTIONAL:
            pytest.skip(f"needs {exc.name} (the {OPTIONAL[exc.name]} extra)")
        raise
    finally:  # a block that failed half-way must not leave its process group to the next one
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def test_not_run_marker(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "Text.\n\n```python\nprint(1)\n```\n\n<!-- not-run: needs a CUDA GPU -->\n"
        "```python\nimport torch\ntorch.zeros(1, device='cuda')\n```\n"
    )
    assert list(python_blocks(doc)) == [
        (4, "print(1)\n", None),
        (9, "import torch\ntorch.zeros(1, device='cuda')\n", "needs a CUDA GPU"),
    ]
