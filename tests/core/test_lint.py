"""The repository's own habits: CI runs the lint and format checks besides the tests, every make
target does what it says, and no ``# fmt: skip`` marker is inert."""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def test_ci_runs_lint_and_the_readmes_test_command():
    script = (ROOT / ".ci" / "run").read_text()
    assert "make lint test" in script


@needs_make
@pytest.mark.parametrize(
    "target, command",
    [
        ("test", "pytest -n 2"),
        ("lint", "ruff check"),
        ("lint", "ruff format --check"),
        ("lint", "check_fmt_skip.py"),
        ("bench", "rmsnorm bench --out benchmarks/results --overwrite"),
        ("test-gpu", "tests/kernels/test_triton_kernels.py"),
        ("test-gpu", "-m gpu tests"),
        ("gpu-check", "bash benchmarks/gpu_check.sh"),
    ],
)
def test_make_targets_run_their_command(target, command):
    # -n prints the commands without running them; -o setup leaves the environment out.
    proc = subprocess.run(
        ["make", "-n", "-o", "setup", target], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert command in proc.stdout


@needs_make
@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal needs a machine without a GPU")
def test_make_test_gpu_refuses_without_a_gpu():
    bin_dir = Path(sys.executable).parent
    proc = subprocess.run(
        ["make", "-s", "-o", "setup", "test-gpu", f"BIN={bin_dir}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode != 0
    assert "torch sees no CUDA device" in proc.stderr and "pytest" not in proc.stdout


CODE = '''\
table = [
    1,  # fmt: skip
    2,
]
x = 1  # fmt: skip
pairs = [(1, 2),
         (3, 4)]  # fmt: skip
text = """
not a comment  # fmt: skip
"""
'''


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="needs ruff (dev extra)")
def test_inert_fmt_skip_markers_are_reported(tmp_path):
    path = tmp_path / "example.py"
    path.write_text(CODE)
    script = ROOT / "scripts" / "check_fmt_skip.py"
    proc = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    # Inside a literal the formatter ignores the marker; `x = 1` is formatted already. The third
    # keeps a layout the formatter would change, so it stays; the last is text in a string.
    reported = [line.split(": ")[0] for line in proc.stdout.splitlines()]
    assert reported == [f"{path}:2", f"{path}:5"]
