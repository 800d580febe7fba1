"""The one dispatch point: forcing each backend gives the same results; the switch itself; what
``import rmsnorm`` pulls in; ``rmsnorm info``."""

import importlib.util
import subprocess
import sys

import pytest
import torch

import rmsnorm
from rmsnorm import _backend
from rmsnorm.testing import assert_close_to_reference


def _available_backends():
    names = ["reference"]
    if _backend.cpu_kernels_available():
        names.append("cpu")
    if _backend.triton_installed() and importlib.util.find_spec("rmsnorm.kernels.triton"):
        names.append("triton")  # interpreted on CPU tensors
    return names


BACKENDS = _available_backends()


def _all_ops(x, r, w, b):
    """Every public op, forward and backward, on inputs small enough for the Triton interpreter."""
    leaves = [t.detach().clone().requires_grad_() for t in (x, r, w, b)]
    x, r, w, b = leaves
    outs = [
        rmsnorm.rms_norm(x, 32, w, 1e-5, eps_mode="rms", partial=0.5, bias=b),
        *rmsnorm.add_rms_norm(x, r, 32, w, 1e-5, casting_mode="llama", offset=1.0),
        rmsnorm.layer_norm(x, 32, w, b),
    ]
    sum(o.float().square().sum() for o in outs).backward()
    return [o.detach() for o in outs] + [t.grad for t in leaves]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_backend_gives_the_same_results(backend, dtype):
    torch.manual_seed(0)
    x, r = torch.randn(6, 32).to(dtype), torch.randn(6, 32).to(dtype)
    w, b = torch.randn(32).to(dtype), torch.randn(32).to(dtype)
    with rmsnorm.use_backend("reference"):
        eager = _all_ops(x, r, w, b)
        exact = _all_ops(*(t.double() for t in (x, r, w, b)))
    with rmsnorm.use_backend(backend):
        got = _all_ops(x, r, w, b)
    for i, (g, e, e64) in enumerate(zip(got, eager, exact, strict=True)):
        assert_close_to_reference(g, e64, e, name=f"{backend} output {i}", rows=6)


def test_use_backend_context_restores(monkeypatch):
    monkeypatch.delenv(_backend.ENV_VAR, raising=False)
    assert _backend.current() == "auto"
    with rmsnorm.use_backend("reference"):
        assert _backend.current() == "reference"
        with rmsnorm.use_backend("auto"):
            assert _backend.current() == "auto"
        assert _backend.current() == "reference"
    assert _backend.current() == "auto"
    monkeypatch.setenv(_backend.ENV_VAR, "reference")
    assert _backend.current() == "reference"
    assert _backend.launchers("cpu").__name__ == "rmsnorm.reference"


def test_use_backend_as_a_plain_call():
    try:
        rmsnorm.use_backend("reference")
        assert _backend.current() == "reference"
    finally:
        rmsnorm.use_backend(None)
    assert _backend._choice.forced is None


def test_auto_falls_back_to_reference_on_devices_without_kernels():
    assert _backend.launchers("mps").__name__ == "rmsnorm.reference"
    with rmsnorm.use_backend("cpu"), pytest.raises(RuntimeError, match="cpu"):
        _backend.launchers("cuda")


def test_import_pulls_in_no_optional_dependency():
    code = (
        "import sys, rmsnorm, torch; rmsnorm.rms_norm(torch.randn(2, 4), 4); "
        "bad = [m for m in ('triton', 'transformers', 'matplotlib', 'typer') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_info_command_runs():
    res = subprocess.run(
        [sys.executable, "-m", "rmsnorm", "info"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert "torch" in res.stdout and "backend" in res.stdout


# ------------------------------------------------------------------------------------------------
# use_backend is per thread, restores on exit, and is honoured (or refused clearly) by compile
# ------------------------------------------------------------------------------------------------
def test_use_backend_is_per_thread(monkeypatch):
    import threading

    monkeypatch.delenv(_backend.ENV_VAR, raising=False)
    entered, release = threading.Event(), threading.Event()
    seen = {}

    def worker():
        with rmsnorm.use_backend("reference"):
            entered.set()
            release.wait(10)
            seen["inside"] = _backend.current()

    t = threading.Thread(target=worker)
    t.start()
    entered.wait(10)
    seen["main"] = _backend.current()  # the other thread's block does not reach this one
    release.set()
    t.join(10)
    assert seen == {"main": "auto", "inside": "reference"}
    with rmsnorm.use_backend("reference"):
        t = threading.Thread(target=lambda: seen.update(new=_backend.current()))
        t.start()
        t.join(10)
    assert seen["new"] == "auto"  # a new thread starts from the environment


def test_blocks_exiting_out_of_order_in_two_threads_leave_nothing_set(monkeypatch):
    import threading

    monkeypatch.delenv(_backend.ENV_VAR, raising=False)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    def a():
        with rmsnorm.use_backend("reference"):
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def b():
        a_in.wait(10)
        with rmsnorm.use_backend("reference"):
            b_in.set()
            a_out.wait(10)

    threads = [threading.Thread(target=f) for f in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert _backend.current() == "auto"


def test_one_object_entered_twice_runs_both_blocks_with_its_backend(monkeypatch):
    monkeypatch.delenv(_backend.ENV_VAR, raising=False)
    ctx = rmsnorm.use_backend("reference")
    with ctx:
        assert _backend.current() == "reference"
    assert _backend.current() == "auto"
    with ctx:
        assert _backend.current() == "reference"
        with ctx:
            assert _backend.current() == "reference"
        assert _backend.current() == "reference"
    assert _backend.current() == "auto"


def _spy_reference(monkeypatch):
    from rmsnorm import reference

    calls = []
    real = reference.rms_norm_fwd

    def spy(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(reference, "rms_norm_fwd", spy)
    return calls


def test_compiled_code_runs_on_the_backend_in_force_when_it_runs(monkeypatch):
    monkeypatch.delenv(_backend.ENV_VAR, raising=False)
    if "cpu" not in BACKENDS:
        pytest.skip("needs a second CPU backend to tell them apart")
    torch._dynamo.reset()
    calls = _spy_reference(monkeypatch)
    fn = torch.compile(lambda x: rmsnorm.rms_norm(x, 8) * 2, fullgraph=True)
    x = torch.randn(3, 8)
    fn(x)
    assert calls == []
    with rmsnorm.use_backend("reference"):
        fn(x)
    assert calls == [1]


def test_use_backend_inside_a_compiled_function(monkeypatch):
    monkeypatch.delenv(_backend.ENV_VAR, raising=False)
    torch._dynamo.reset()
    calls = _spy_reference(monkeypatch)

    def fn(x):
        with rmsnorm.use_backend("reference"):
            return rmsnorm.rms_norm(x, 8) * 2

    x = torch.randn(3, 8)
    torch.testing.assert_close(torch.compile(fn)(x), rmsnorm.rms_norm(x, 8) * 2)
    assert calls  # honoured: dynamo ran the block eagerly
    assert _backend.current() == "auto"
    torch._dynamo.reset()
    with pytest.raises(Exception, match="enter it around the call to the compiled function"):
        torch.compile(fn, fullgraph=True)(x)
    assert _backend.current() == "auto"


@pytest.mark.parametrize("backend", BACKENDS)
def test_launchers_take_rows_in_their_own_shape(backend):
    """The contract: rows (*, N) contiguous of any rank, or (M, N) with strided rows; outputs in
    x's shape as tensors of their own; statistics (M,)."""
    mod = _backend._load(backend)
    x3, r3 = torch.randn(2, 3, 16), torch.randn(2, 3, 16)
    w = torch.randn(16)
    strided = torch.randn(6, 32)[:, :16]  # the same rows, 2-D with a row stride of 32
    strided.copy_(x3.reshape(6, 16))
    for x in (x3, torch.randn(16), strided):
        y, rstd = mod.rms_norm_fwd(x, w, None, 1e-6, "mean_square", "gemma", 0.0, 16)
        assert y.shape == x.shape and y.is_contiguous() and y._base is None
        assert rstd.shape == (x.numel() // 16,)
        dx, dw, _ = mod.rms_norm_bwd(
            torch.ones_like(x), x, w, None, rstd, None, 1e-6, "mean_square", "gemma", 0.0, 16,
            x.dtype, True,
        )  # fmt: skip
        assert dx.shape == x.shape and dw.shape == (16,)
        y, h, rstd = mod.add_rms_norm_fwd(x, x.clone(), w, None, 1e-6, "rms", "gemma", 0.0, 16)
        assert y.shape == h.shape == x.shape and rstd.shape == (x.numel() // 16,)
        y, mean, rstd = mod.layer_norm_fwd(x, w, w, 1e-5)
        assert y.shape == x.shape and mean.shape == rstd.shape == (x.numel() // 16,)
        dx, dw, db = mod.layer_norm_bwd(torch.ones_like(x), x, w, w, mean, rstd, True)
        assert dx.shape == x.shape and dw.shape == db.shape == (16,)
    y3, _ = mod.rms_norm_fwd(x3, w, None, 1e-6, "mean_square", "gemma", 0.0, 16)
    y2, _ = mod.rms_norm_fwd(strided, w, None, 1e-6, "mean_square", "gemma", 0.0, 16)
    torch.testing.assert_close(y3.reshape(6, 16), y2)
    _, h, _ = mod.add_rms_norm_fwd(x3, r3.reshape(6, 16), w, None, 1e-6, "rms", "gemma", 0.0, 8)
    torch.testing.assert_close(h.reshape(6, 16), (x3 + r3).reshape(6, 16))  # mixed ranks


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_launchers_may_skip_the_statistics(backend):
    """stats=False (an eager call without gradients): same output; the statistics are either
    skipped (None) or the same as with stats=True."""
    mod = _backend._load(backend)
    x, r, w = torch.randn(4, 3, 24), torch.randn(4, 3, 24), torch.randn(24)
    # (call, how many leading outputs are tensors the caller gets: y, and h for add_rms_norm)
    calls = [
        (lambda stats: mod.rms_norm_fwd(x, w, None, 1e-6, "rms", "llama", 0.5, 12, stats), 1),
        (lambda stats: mod.add_rms_norm_fwd(x, r, w, w, 1e-6, "rms", "gemma", 0.0, 24, stats), 2),
        (lambda stats: mod.layer_norm_fwd(x, w, w, 1e-5, stats), 1),
    ]
    for call, outputs in calls:
        full, lean = call(True), call(False)
        assert len(full) == len(lean)
        for i, (a, b) in enumerate(zip(full, lean, strict=True)):
            assert (b is None and i >= outputs) or torch.equal(a, b)
