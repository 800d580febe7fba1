"""Test configuration. Without a GPU, Triton kernels run under the interpreter, which must be chosen
before triton is imported; ``import torch`` does not import triton, so torch can decide here."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

HAS_CUDA = torch.cuda.is_available()

# Under pytest-xdist, share the cores between workers: two workers of two torch threads each on two
# cores wait on each other's threads (a training step measured 10x slower that way).
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _workers))


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module of tiny models: on a busy 2-core machine a forward+backward
    spent ~2 s in thread contention instead of ~30 ms of arithmetic."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        # The marker, not item.keywords: keywords also hold parent directory names (a checkout
        # in a directory called "gpu" would skip everything).
        if item.get_closest_marker("gpu") is not None and not HAS_CUDA:
            item.add_marker(skip_gpu)


# The tiny preset shortened further: enough steps for the loss to fall well below ln 256 ≈ 5.55.
COMPARISON_STEPS, COMPARISON_EVAL_INTERVAL = 30, 10
COMPARISON_VARIANTS = "layernorm,rmsnorm,prmsnorm,none"
# two rates: every variant at LayerNorm's rate and at its own
COMPARISON_LRS = "3e-3,1e-2"


@pytest.fixture(scope="session")
def comparison_run(tmp_path_factory):
    """One ``rmsnorm compare`` through the CLI with every variant, two rates and two seeds, shared
    by the tests of the comparison's run, its files and its command: (out dir, results.json,
    output)."""
    import json

    from typer.testing import CliRunner

    from rmsnorm.cli import app
    from rmsnorm.lab.experiments.comparison import OUTPUT_FILES

    out = tmp_path_factory.mktemp("compare")
    args = ["compare", "--preset", "tiny", "--variants", COMPARISON_VARIANTS, "--seeds", "2"]
    args += ["--threads", "1", "--out", str(out), "--steps", str(COMPARISON_STEPS)]
    args += ["--eval-interval", str(COMPARISON_EVAL_INTERVAL), "--lrs", COMPARISON_LRS]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return out, json.loads((out / OUTPUT_FILES["json"]).read_text()), result.output


@pytest.fixture
def logged_subclass():
    """A tensor subclass whose __torch_function__ records each function's name: (class, names)."""
    seen: list[str] = []

    class Logged(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", str(func)))
            return super().__torch_function__(func, types, args, kwargs or {})

    return Logged, seen
