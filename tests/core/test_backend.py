"""The one dispatch point: the public API gives the spec's results on every backend; the switch
itself; what ``import rmsnorm`` pulls in; ``rmsnorm info``. The launchers of each backend are
checked in test_launchers.py."""

import subprocess
import sys

import pytest
import torch

import rmsnorm
from launcher_support import AVAILABLE as BACKENDS
from launcher_support import randn
from rmsnorm import _backend
from rmsnorm.testing import assert_close_to_reference

SHAPE = (2, 3, 5, 48)  # leading dims are flattened into 30 rows


def _outputs_and_grads(fn, leaves):
    """fn's outputs and its leaves' gradients of a fixed loss, Σ ramp ⊙ output (in float64)."""
    leaves = [t.detach().clone().requires_grad_() for t in leaves]
    outs = fn(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    ramp = [torch.linspace(-1, 1, o.numel(), dtype=torch.float64).view(o.shape) for o in outs]
    sum((o.double() * c).sum() for o, c in zip(outs, ramp, strict=True)).backward()
    return [o.detach() for o in outs] + [t.grad for t in leaves]


def _api_calls(dtype):
    """(fn, leaves) of every public op with its options, at sizes the Triton interpreter runs
    quickly: 4-D rows, a residual in fp32, rows read in place from wider ones."""
    x, r = randn(*SHAPE, dtype=dtype), randn(*SHAPE, dtype=dtype)
    w, b = randn(48, dtype=dtype), randn(48, dtype=dtype)
    wide = randn(*SHAPE[:-1], 54, dtype=dtype)
    return {
        "rms_norm": (
            lambda x, w, b: rmsnorm.rms_norm(
                x, 48, w, 1e-6, eps_mode="rms", offset=1.0, bias=b, partial=0.5
            ),
            (x, w, b),
        ),
        "add_rms_norm": (
            lambda x, r, w: rmsnorm.add_rms_norm(
                x, r, 48, w, casting_mode="llama", eps_mode="rms", offset=1.0
            ),
            (x, r, w),
        ),
        "add_rms_norm, fp32 residual": (
            lambda x, r, w, b: rmsnorm.add_rms_norm(x, r, 48, w, 1e-6, bias=b, partial=0.5),
            (x, r.float(), w, b),
        ),
        "layer_norm": (lambda x, w, b: rmsnorm.layer_norm(x, 48, w, b), (x, w, b)),
        "layer_norm, strided rows": (
            lambda wide, w, b: rmsnorm.layer_norm(wide[..., 3:51], 48, w, b),
            (wide, w, b),
        ),
    }


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_public_api_on_every_backend(backend, dtype):
    """Every op forward and backward (autograd) on the backend, against the reference backend in
    the same dtype and in float64."""
    for name, (fn, leaves) in _api_calls(dtype).items():
        with rmsnorm.use_backend(backend):
            got = _outputs_and_grads(fn, leaves)
        with rmsnorm.use_backend("reference"):
            eager = _outputs_and_grads(fn, leaves)
            exact = _outputs_and_grads(fn, [t.double() for t in leaves])
        for i, (g, e, e64) in enumerate(zip(got, eager, exact, strict=True)):
            rows = 30 if g.dim() == 1 else 1  # d weight, d bias: sums over the rows
            assert_close_to_reference(g, e64, e, name=f"{backend} {name} {i}", rows=rows)


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
