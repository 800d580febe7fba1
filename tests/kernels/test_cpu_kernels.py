"""What only the CPU backend (``rmsnorm.kernels.cpu``) has: rows past every vector width and block,
bit conversions identical to torch's, float64 handed to the reference, callers' storages left
resizable, results independent of the thread count, threads (torch's settings, Python threads,
forked children), and loading (lazy, compiled once, the fallback where numba is missing or broken).
The launchers' results against the spec are checked with every backend's in test_launchers.py."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rmsnorm
from launcher_support import bitwise_equal, randn
from rmsnorm import reference as R
from rmsnorm.kernels import cpu
from rmsnorm.testing import check_launcher

pytestmark = pytest.mark.skipif(not cpu.available(), reason="numba is not installed")

HALF = (torch.bfloat16, torch.float16)
DTYPES = (torch.float32, *HALF)


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_rows_and_many_blocks(dtype):
    # N past every vector width / unroll and M past many forward and d-weight blocks
    m, n = 300, 5003
    x, w, dy = randn(m, n, dtype=dtype), randn(n, dtype=dtype), randn(m, n, dtype=dtype)
    opts = R.RMSOptions(1e-6, "mean_square", "gemma", 0.0, n)
    (y, rstd), _, exact = check_launcher(cpu, "rms_norm_fwd", x, w, None, opts)
    assert torch.equal(y, R.rms_norm_apply(x, rstd, w, None, opts, dtype))
    check_launcher(cpu, "rms_norm_bwd", dy, x, w, None, exact[1].float(), None, opts, dtype, True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_caller_tensors_stay_resizable(dtype):
    # Tensor.numpy() marks a storage non-resizable for good; FSDP2 frees parameters by resizing
    # their storage to 0, which then failed
    x, dy = torch.randn(300, 300).to(dtype), torch.randn(300, 300).to(dtype)
    w, b = torch.randn(300).to(dtype), torch.randn(300).to(dtype)
    opts = R.RMSOptions(1e-6, "mean_square", "gemma", 0.0, 300)
    y, rstd = cpu.rms_norm_fwd(x, w, b, opts)
    grads = cpu.rms_norm_bwd(dy, x, w, b, rstd, dy, opts, dtype)
    yl, mean, rl = cpu.layer_norm_fwd(x, w, b, 1e-5)
    for t in (x, dy, w, b, y, rstd, *grads, yl, mean, rl):
        t.untyped_storage().resize_(0)


def test_float64_and_mixed_float64_go_to_the_reference():
    x = torch.randn(5, 12, dtype=torch.float64)
    w = torch.randn(12, dtype=torch.float64)
    opts = R.RMSOptions(1e-6, "rms", "gemma", 0.0, 12)
    assert torch.equal(cpu.rms_norm_fwd(x, w, None, opts)[0], R.rms_norm_fwd(x, w, None, opts)[0])
    # "llama" with a float64 weight promotes the output to float64
    xf = x.float()
    llama = opts._replace(eps_mode="mean_square", casting_mode="llama")
    y, rstd = cpu.rms_norm_fwd(xf, w, None, llama)
    assert y.dtype == torch.float64
    assert torch.equal(y, R.rms_norm_fwd(xf, w, None, llama)[0])
    # "gemma" casts a float64 weight to the fp32 compute dtype and stays on the kernels
    y, _ = cpu.rms_norm_fwd(xf, w, None, llama._replace(casting_mode="gemma"))
    assert y.dtype == torch.float32
    assert cpu.layer_norm_fwd(x, None, None, 1e-5)[0].dtype == torch.float64


def test_plans_hold_the_options_of_their_key(monkeypatch):
    # a plan is keyed by the RMSOptions value and holds its k, eps and offset as the kernels take
    # them: options that differ in one of those alone each get a plan of their own
    from rmsnorm.kernels.cpu import gated_launchers as GL
    from rmsnorm.kernels.cpu import launchers as L

    x, w, dy, z = randn(4, 64), randn(64), randn(4, 64), randn(4, 64)
    base = R.RMSOptions(1e-6, "mean_square", "gemma", 0.0, 64)
    for opts in (base, base._replace(eps=0.5), base._replace(offset=1.0), base._replace(k=16)):
        (_, rstd), _, _ = check_launcher(cpu, "rms_norm_fwd", x, w, None, opts)
        check_launcher(cpu, "rms_norm_bwd", dy, x, w, None, rstd, None, opts, x.dtype)
        gating = R.GateOptions(32, True, "silu")
        grouped = opts._replace(k=min(opts.k, 32))
        (_, rstd), _, _ = check_launcher(cpu, "gated_rms_norm_fwd", x, z, w, None, grouped, gating)
        args = (dy, x, z, w, None, rstd, None, grouped, gating, x.dtype)
        check_launcher(cpu, "gated_rms_norm_bwd", *args)
    # a NaN scalar is not kept (no later key would equal it), and a cache is bounded
    before = len(L._rms_fwd_plans)
    cpu.rms_norm_fwd(x, w, None, base._replace(eps=float("nan")))
    assert len(L._rms_fwd_plans) == before
    monkeypatch.setattr(L, "_MAX_PLANS", 2)
    for eps in (0.1, 0.2, 0.3):
        cpu.rms_norm_fwd(x, w, None, base._replace(eps=eps))
        cpu.gated_rms_norm_fwd(
            x, z, w, None, base._replace(eps=eps), R.GateOptions(None, True, "silu")
        )
    assert len(L._rms_fwd_plans) <= 2 and len(GL._fwd_plans) <= 2


# ----------------------------------------------------------------------------------------------
# Rounding: bit conversions match torch's, special values included
# ----------------------------------------------------------------------------------------------
def _stored_sum(x: torch.Tensor, residual_dtype: torch.dtype) -> torch.Tensor:
    """h = x + (−0.0) stored in residual_dtype by the kernel: x converted to float32 and rounded to
    residual_dtype, with nothing else in between (adding −0.0 is exact, signed zeros included)."""
    res = torch.full(x.shape, -0.0, dtype=residual_dtype)
    n = x.shape[1]
    opts = R.RMSOptions(1e-6, "mean_square", "gemma", 0.0, n)
    _, h, _ = cpu.add_rms_norm_fwd(x, res, None, None, opts)
    return h


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns, except that any NaN matches any NaN (torch's own NaN bits differ between
    its scalar and vector paths)."""
    nan = a.isnan()
    if not torch.equal(nan, b.isnan()):
        return False
    ints = {2: torch.int16, 4: torch.int32}
    return torch.equal(a[~nan].view(ints[a.element_size()]), b[~nan].view(ints[b.element_size()]))


@pytest.mark.parametrize("dtype", HALF)
def test_every_half_bit_pattern_converts_exactly(dtype):
    # all 65536 patterns: NaNs, infinities, subnormals, signed zeros
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)[None]
    assert _same_bits(_stored_sum(x, torch.float32), x.float())  # half -> float32
    assert _same_bits(_stored_sum(x, dtype), x)  # and back


@pytest.mark.parametrize("dtype", HALF)
def test_float32_to_half_rounds_like_torch(dtype):
    # rounding ties of the half grid, the overflow threshold, subnormals, special values
    fi = torch.finfo(dtype)
    grid = torch.randn(3000).to(dtype)
    above = torch.nextafter(grid, torch.full_like(grid, float("inf")))
    ties = (grid.float() + above.float()) / 2
    vals = torch.cat(
        [
            torch.randn(4000) * 10.0 ** torch.randint(-9, 6, (4000,)).float(),
            ties,
            torch.nextafter(ties, torch.zeros_like(ties)),
            torch.tensor([fi.max, fi.max * 1.0004, fi.max * 1.001, fi.tiny, fi.tiny / 3, 2e-8]),
            torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), -1.0 - 2.0**-9]),
        ]
    )[None]
    assert _same_bits(_stored_sum(vals, dtype), vals.to(dtype))


# ----------------------------------------------------------------------------------------------
# Determinism and thread-count independence
# ----------------------------------------------------------------------------------------------
def _everything(dtype):
    gen = torch.Generator().manual_seed(1)
    m, n = 257, 300  # 9 d-weight blocks, the last one short
    x = torch.randn(m, n, generator=gen).to(dtype)
    r = torch.randn(m, n, generator=gen).to(dtype)
    dy = torch.randn(m, n, generator=gen).to(dtype)
    w = torch.randn(n, generator=gen).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype)
    opts = R.RMSOptions(1e-6, "rms", "llama", 0.0, n)
    y, h, rstd = cpu.add_rms_norm_fwd(x, r, w, b, opts)
    grads = cpu.rms_norm_bwd(dy, h, w, b, rstd, dy, opts, dtype, True)
    yl, mean, rl = cpu.layer_norm_fwd(x, w, b, 1e-5)
    lgrads = cpu.layer_norm_bwd(dy, x, w, b, mean, rl, True)
    gated = []
    for order in (True, False):  # the gated kernels share calls through kernels.run_blocks
        opts = R.RMSOptions(1e-6, "mean_square", "llama", 0.0, 60)
        gating = R.GateOptions(60, order, "silu")
        yg, rg = cpu.gated_rms_norm_fwd(x, r, w, b, opts, gating)
        gated += [
            yg,
            rg,
            *cpu.gated_rms_norm_bwd(dy, x, r, w, b, rg, dy, opts, gating, dtype, True),
        ]
    return [y, h, rstd, *grads, yl, mean, rl, *lgrads, *gated]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deterministic_and_independent_of_thread_count(dtype):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # the kernels use as many threads as torch does
        first, second = _everything(dtype), _everything(dtype)
        torch.set_num_threads(1)
        single = _everything(dtype)
    finally:
        torch.set_num_threads(before)
    assert bitwise_equal(first, second)
    assert bitwise_equal(first, single)


def test_auto_picks_the_cpu_kernels():
    from rmsnorm import _backend

    assert _backend.launchers("cpu") is cpu


# ----------------------------------------------------------------------------------------------
# Loading: lazy, and a clean fallback where numba cannot be used
# ----------------------------------------------------------------------------------------------
def test_numba_is_imported_on_first_use_not_on_import():
    code = (
        "import sys, torch, rmsnorm; assert 'numba' not in sys.modules; "
        "from rmsnorm.kernels import cpu; assert cpu.available(); assert 'numba' not in sys.modules"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_without_numba_the_reference_runs():
    code = (
        "import sys; sys.modules['numba'] = None\n"  # as if numba were not installed
        "import torch, rmsnorm\n"
        "from rmsnorm import _backend\n"
        "from rmsnorm.kernels import cpu\n"
        "assert not cpu.available()\n"
        "assert _backend.launchers('cpu').__name__ == 'rmsnorm.reference'\n"
        "x = torch.randn(3, 8, requires_grad=True)\n"
        "rmsnorm.rms_norm(x, 8).sum().backward()\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def _run(code: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter (this checkout's package first on the path)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=full_env
    )


def test_a_broken_numba_warns_once_and_falls_back():
    code = (
        "import importlib, warnings, torch\n"
        "from rmsnorm import reference as R\n"
        "from rmsnorm.kernels import cpu\n"
        "real = importlib.import_module\n"
        "def broken(name, package=None):\n"
        "    if name == '.launchers':\n"
        "        raise ImportError('numba built for another numpy')\n"
        "    return real(name, package)\n"
        "importlib.import_module = broken\n"
        "x = torch.randn(3, 8)\n"
        "opts = R.RMSOptions(1e-6, 'mean_square', 'gemma', 0.0, 8)\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    y, _ = cpu.rms_norm_fwd(x, None, None, opts)\n"
        "    cpu.rms_norm_fwd(x, None, None, opts)\n"
        "msgs = [w for w in caught if 'CPU kernels are unavailable' in str(w.message)]\n"
        "assert len(msgs) == 1, caught\n"
        "assert not cpu.available() and not cpu.warmup()['available']\n"
        "ref = R.rms_norm_fwd(x, None, None, opts)[0]\n"
        "assert torch.equal(y, ref)\n"
    )
    res = _run(code)
    assert res.returncode == 0, res.stderr


def test_this_process_runs_the_compiled_kernels():
    # the suite would otherwise pass on the reference fallback without noticing
    assert cpu.warmup()["available"]
    assert cpu._load_launchers().__name__ == "rmsnorm.kernels.cpu.launchers"


# ----------------------------------------------------------------------------------------------
# Threads: torch's settings untouched, Python threads, forked children
# ----------------------------------------------------------------------------------------------
_WORK = (
    "import torch, rmsnorm\n"
    "def work(m=512, n=512):\n"  # 2^18 elements: the work-sharing path where threads allow it
    "    x = torch.randn(m, n, requires_grad=True)\n"
    "    w = torch.randn(n, requires_grad=True)\n"
    "    y = rmsnorm.rms_norm(x, n, w)\n"
    "    y.sum().backward()\n"
    "    rmsnorm.layer_norm(x.detach(), n, w.detach())\n"
    "    return y\n"
)


def test_torch_thread_settings_are_left_as_set():
    # numba's OpenMP threading layer shares libgomp with torch: starting it reset torch's count
    code = _WORK + (
        "for threads in (1, 3, 2, 1):\n"
        "    torch.set_num_threads(threads)\n"
        "    work()\n"
        "    work(2, 64)\n"
        "    assert torch.get_num_threads() == threads, (threads, torch.get_num_threads())\n"
    )
    res = _run(code, timeout=300)
    assert res.returncode == 0, res.stderr


def test_concurrent_calls_from_python_threads():
    import threading

    gen = torch.Generator().manual_seed(3)
    cases = []
    for m, n in ((1, 768), (300, 300), (512, 512), (64, 4096)):
        x = torch.randn(m, n, generator=gen)
        dy = torch.randn(m, n, generator=gen)
        w = torch.randn(n, generator=gen).to(torch.bfloat16)
        cases.append((x, dy, w))

    def run(x, dy, w):
        n = x.shape[1]
        opts = R.RMSOptions(1e-6, "mean_square", "gemma", 0.0, n)
        y, rstd = cpu.rms_norm_fwd(x, w, None, opts)
        g = cpu.rms_norm_bwd(dy, x, w, None, rstd, None, opts, x.dtype, True)
        yl, mean, rl = cpu.layer_norm_fwd(x, w, w, 1e-5)
        gl = cpu.layer_norm_bwd(dy, x, w, w, mean, rl, True)
        return [y, rstd, *g, yl, mean, rl, *gl]

    want = [run(*c) for c in cases]
    barrier = threading.Barrier(4)
    failures: list[str] = []

    def worker(t: int) -> None:
        barrier.wait()
        for i in range(12):
            c = (t + i) % len(cases)
            if not bitwise_equal(run(*cases[c]), want[c]):
                failures.append(f"thread {t}, case {c}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not failures, failures


@pytest.mark.parametrize("team", ["openmp", "futex", "lock"])
def test_shared_calls_match_single_threaded_ones(team, monkeypatch):
    # Every call that can be shared is shared (no adaptive choice): on torch's OpenMP threads, or
    # on the pool's helpers sleeping in futex_wait (Linux) or on Python locks (elsewhere). Results
    # are bitwise those of one thread, and the helpers do take blocks.
    from rmsnorm.kernels.cpu import pool as P
    from rmsnorm.kernels.cpu import runtime as rt

    if team == "openmp" and not P._gomp:
        pytest.skip("torch does not use an OpenMP runtime here")
    if team == "futex" and not P._libc_addresses()[2]:
        pytest.skip("no futex on this platform")
    if team == "lock":
        monkeypatch.setattr(P, "_libc_addresses", lambda: (0, 0, 0))
    monkeypatch.setattr(P, "_pool", None)
    monkeypatch.setattr(P, "USE_OPENMP", team == "openmp")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        want = [_everything(dtype) for dtype in (torch.float32, torch.bfloat16)]
        torch.set_num_threads(2)
        helped = 0
        for _ in range(50):  # the helpers join calls that outlast their wake-up
            got = [_everything(dtype) for dtype in (torch.float32, torch.bfloat16)]
            assert bitwise_equal(got[0], want[0]) and bitwise_equal(got[1], want[1])
            if team == "openmp":
                break
            pool = P._pool
            if pool.max_helpers < 1:
                pytest.skip("one core: nothing to share")
            helped = int(pool.block[rt.HELPED])
            if helped:
                break
    finally:
        torch.set_num_threads(before)
    if team != "openmp":
        assert P._pool.futex == (team == "futex")
        if not helped:  # possible only where another process holds every other core throughout
            pytest.skip("the helpers never got a core in time")


def test_sharing_depends_on_the_sizes_and_thread_count_alone(monkeypatch):
    # No timing decides: below PARALLEL_MIN elements or on one torch thread a call runs alone,
    # from there on every call is shared, however long the earlier ones took.
    from rmsnorm.kernels.cpu import pool as P

    shared = []
    acquire = P._acquire
    monkeypatch.setattr(P, "_acquire", lambda pool, t: shared.append(t) or acquire(pool, t))
    before = torch.get_num_threads()
    small = torch.randn(8, 1024)  # 2^13 elements
    large = torch.randn(64, 1024)  # 2^16
    opts = R.RMSOptions(1e-6, "mean_square", "gemma", 0.0, 1024)
    try:
        torch.set_num_threads(2)
        for _ in range(20):
            cpu.rms_norm_fwd(small, None, None, opts)
        assert shared == []
        for _ in range(20):
            cpu.rms_norm_fwd(large, None, None, opts)
            cpu.layer_norm_fwd(large, None, None, 1e-5)
        assert shared == [2] * 40
        torch.set_num_threads(1)
        cpu.rms_norm_fwd(large, None, None, opts)
        assert len(shared) == 40
    finally:
        torch.set_num_threads(before)


def test_a_helper_that_never_runs_does_not_stall_a_call(monkeypatch):
    # A pool helper the scheduler never runs (an oversubscribed machine, taken to the limit): the
    # caller runs the blocks of the helper's range too, and the results are those of one thread.
    from rmsnorm.kernels.cpu import pool as P
    from rmsnorm.kernels.cpu import runtime as rt

    monkeypatch.setattr(P, "_pool", None)
    monkeypatch.setattr(P, "USE_OPENMP", False)
    monkeypatch.setattr(P._Pool, "_spawn", lambda self: setattr(self, "helpers", self.helpers + 1))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        want = [_everything(dtype) for dtype in (torch.float32, torch.bfloat16)]
        torch.set_num_threads(2)
        got = [_everything(dtype) for dtype in (torch.float32, torch.bfloat16)]
    finally:
        torch.set_num_threads(before)
    if P._pool is None or P._pool.max_helpers < 1:
        pytest.skip("one core: nothing to share")
    assert bitwise_equal(got[0], want[0]) and bitwise_equal(got[1], want[1])
    assert int(P._pool.block[rt.HELPED]) == 0  # every block ran on the calling thread


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_dataloader_workers_forked_after_multithreaded_work_run_the_kernels():
    # A parent that ran multi-threaded torch work and the kernels forks DataLoader workers (which
    # set one torch thread) that call rms_norm: they used to hang. A timeout makes a hang a failure.
    code = _WORK + (
        "import warnings\n"
        "import torch.nn.functional as F\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "torch.set_num_threads(2)\n"
        "a = torch.randn(512, 512)\n"
        "for _ in range(3):\n"
        "    a = F.layer_norm(a @ a, (512,))\n"  # torch's own OpenMP pool, two threads
        "    work()\n"
        "class Rows(Dataset):\n"
        "    def __len__(self):\n"
        "        return 8\n"
        "    def __getitem__(self, i):\n"
        "        g = torch.Generator().manual_seed(i)\n"
        "        x = torch.randn(256, 512, generator=g)\n"
        "        with warnings.catch_warnings():\n"  # no fallback to the reference, no warning
        "            warnings.simplefilter('error')\n"
        "            y = rmsnorm.rms_norm(x, 512)\n"
        "        return y, F.rms_norm(x, (512,))\n"
        "loader = DataLoader(Rows(), batch_size=2, num_workers=2, multiprocessing_context='fork')\n"
        "for y, ref in loader:\n"
        "    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)\n"
        "print('ok')\n"
    )
    res = _run(code, timeout=240)
    assert res.returncode == 0 and "ok" in res.stdout, res.stdout + res.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_keeps_two_threads_and_the_kernels():
    # A plain fork keeps torch's thread count: the child starts its own helper threads (torch's
    # OpenMP pool, by contrast, hangs such a child at its first multi-threaded op)
    code = _WORK + (
        "import os\n"
        "torch.set_num_threads(2)\n"
        "g = torch.Generator().manual_seed(0)\n"
        "x = torch.randn(512, 512, generator=g)\n"
        "want = rmsnorm.rms_norm(x, 512)\n"
        "work()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        # compared through numpy: torch's own multi-threaded ops (torch.equal) hang in such a child
        "    want = want.numpy().tobytes()\n"
        "    ok = all(rmsnorm.rms_norm(x, 512).numpy().tobytes() == want for _ in range(20))\n"
        "    os._exit(0 if ok and torch.get_num_threads() == 2 else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "assert os.waitstatus_to_exitcode(status) == 0, status\n"
    )
    res = _run(code, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr


# ----------------------------------------------------------------------------------------------
# Compilation: said once; done ahead of time by warmup(); without a writable cache, in-process
# ----------------------------------------------------------------------------------------------
_COMPILE_CHECK = (
    "import torch, rmsnorm\n"
    "from rmsnorm.kernels import cpu\n"
    "x = torch.randn(8, 64, requires_grad=True)\n"
    "for _ in range(2):\n"
    "    rmsnorm.rms_norm(x, 64).sum().backward()\n"
    "    rmsnorm.layer_norm(x, 64).sum().backward()\n"
    "status = cpu.warmup()\n"
    "assert status['available'], status\n"
    "print('STATUS', status)\n"
)


def test_the_first_compilation_is_announced_once_and_cached(tmp_path):
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    first = _run(_COMPILE_CHECK, timeout=600, env=env)
    assert first.returncode == 0, first.stderr
    lines = [line for line in first.stderr.splitlines() if "compiling the CPU kernels" in line]
    assert len(lines) == 1, first.stderr
    assert "once" in lines[0] and str(tmp_path / "cache") in lines[0]
    gated = [line for line in first.stderr.splitlines() if "compiling the grouped" in line]
    assert len(gated) == 1 and str(tmp_path / "cache") in gated[0], first.stderr
    second = _run(_COMPILE_CHECK, timeout=600, env=env)
    assert second.returncode == 0, second.stderr
    assert "compiling" not in second.stderr and "'compiled': False" in second.stdout


def _package_imports(path: Path) -> set[Path]:
    """The module at ``path`` and every module of its package that it imports, directly or through
    another (the relative imports of the source)."""
    seen, todo = set(), [path]
    while todo:
        file = todo.pop()
        if file in seen:
            continue
        seen.add(file)
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                names = [node.module] if node.module else [a.name for a in node.names]
                todo += [p for n in names if (p := path.parent / f"{n}.py").exists()]
    return seen


def test_each_cache_index_is_stamped_with_the_files_its_code_includes():
    # numba's cache watches only the file of the cached function, while the code it caches
    # includes the functions of every module of the package that the kernels import (the row
    # toolkit, the flag fields, the runtime): an edit of any of them must recompile.
    cpu.warmup()
    from rmsnorm.kernels.cpu import gated as G
    from rmsnorm.kernels.cpu import kernels as K
    from rmsnorm.kernels.cpu import runtime as rt

    root = Path(cpu.__file__).resolve().parent
    for registry, module in ((rt.ENTRIES, rt), (K.ENTRIES, K), (G.ENTRIES, G)):
        files = _package_imports(Path(module.__file__).resolve())
        if module is not rt:
            assert {root / "rows.py", root / "flags.py", root / "runtime.py"} <= files
        assert {Path(f).resolve() for f in registry.sources} >= files, module.__name__
        if not registry.cached:
            pytest.skip("no writable cache directory here")
        for compiled, _ in registry.items:
            stamp = compiled._cache._cache_file._source_stamp
            for file in files:
                st = os.stat(file)
                assert (st.st_mtime, st.st_size) in stamp, (compiled, file.name)
            # ... and with the vector widths, which RMSNORM_CPU_VECTOR_BITS may change
            assert ("prefer-vector-width", rt.VECTOR_BITS, rt.VECTOR_BITS_BWD) in stamp


def test_without_a_writable_cache_the_kernels_compile_in_process(tmp_path):
    # A read-only install: the package directory, NUMBA_CACHE_DIR and the user cache directory all
    # refuse writes (paths under a regular file, which fail even for root).
    import shutil

    pkg = tmp_path / "site"
    shutil.copytree(
        os.path.dirname(rmsnorm.__file__),
        pkg / "rmsnorm",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (pkg / "rmsnorm" / "kernels" / "cpu" / "__pycache__").write_text("not a directory")
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = {
        "PYTHONPATH": str(pkg),
        "PYTHONDONTWRITEBYTECODE": "1",
        "NUMBA_CACHE_DIR": str(blocker / "numba"),
        "XDG_CACHE_HOME": str(blocker / "cache"),
        "HOME": str(blocker),
    }
    res = _run(
        _COMPILE_CHECK + "assert rmsnorm.__file__.startswith(" + repr(str(pkg)) + ")\n",
        timeout=600,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    assert "'compiled': True" in res.stdout and "'cached_in': None" in res.stdout, res.stdout
    lines = [line for line in res.stderr.splitlines() if "rmsnorm:" in line]
    assert len(lines) == 1 and "no writable cache directory" in lines[0], res.stderr


def test_warmup_command():
    pytest.importorskip("typer")
    res = subprocess.run(
        [sys.executable, "-m", "rmsnorm", "warmup"], capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr
    assert "rmsnorm warmup: CPU kernels" in res.stdout and "cached in" in res.stdout


def test_gated_rows_do_not_depend_on_the_batch():
    """A row's gated forward output is bitwise the same whatever rows share its call (one row, a
    decoding batch, a prefill past the shared-call threshold), as the plain kernels'."""
    gen = torch.Generator().manual_seed(2)
    n = 512
    big_x = torch.randn(300, n, generator=gen).to(torch.bfloat16)
    big_z = torch.randn(300, n, generator=gen).to(torch.bfloat16)
    w = torch.randn(n, generator=gen).to(torch.bfloat16)
    opts = R.RMSOptions(1e-6, "mean_square", "llama", 0.0, 64)
    gating = R.GateOptions(64, False, "silu")
    whole, _ = cpu.gated_rms_norm_fwd(big_x, big_z, w, None, opts, gating)
    for rows in (slice(7, 8), slice(0, 16), slice(100, 300)):
        part, _ = cpu.gated_rms_norm_fwd(big_x[rows], big_z[rows], w, None, opts, gating)
        assert torch.equal(part, whole[rows]), rows


def test_gated_float64_goes_to_the_reference_and_a_float64_gate_is_read():
    x64, z64 = torch.randn(5, 12, dtype=torch.float64), torch.randn(5, 12, dtype=torch.float64)
    opts, gating = R.RMSOptions(1e-6, "rms", "gemma", 0.0, 6), R.GateOptions(6, True, "sigmoid")
    assert torch.equal(
        cpu.gated_rms_norm_fwd(x64, z64, None, None, opts, gating)[0],
        R.gated_rms_norm_fwd(x64, z64, None, None, opts, gating)[0],
    )
    x = x64.float()
    check_launcher(
        cpu, "gated_rms_norm_fwd", x, z64, None, None, opts, gating
    )  # the gate read in fp32


# ----------------------------------------------------------------------------------------------
# The runtime's code generation helpers: lowered intrinsics and the vector width
# ----------------------------------------------------------------------------------------------
def test_a_lowered_intrinsic_types_only_for_its_signature():
    numba = pytest.importorskip("numba")
    from rmsnorm.kernels.cpu import runtime as rt

    @rt.lowered(numba.types.int64(numba.types.int64, numba.types.int64))
    def _add3(b, u, v):
        """u + v + v"""
        return b.add(u, b.add(v, v))

    assert _add3.__doc__ == "u + v + v"
    assert rt.njit(lambda u, v: _add3(u, v))(1, 20) == 41
    with pytest.raises(numba.core.errors.TypingError):
        rt.njit(lambda u, v: _add3(u, v))(1.5, 2)


def test_compiled_functions_ask_for_the_vector_width_of_their_direction():
    np = pytest.importorskip("numpy")
    pytest.importorskip("numba")
    from rmsnorm.kernels.cpu import runtime as rt

    @rt.njit
    def total(x):
        rt.wide_vectors()
        s = 0.0
        for v in x:
            s += v
        return s

    @rt.njit
    def total_bwd(x):
        rt.wide_vectors_bwd()
        s = 0.0
        for v in x:
            s += v
        return s

    for fn, bits in ((total, rt.VECTOR_BITS), (total_bwd, rt.VECTOR_BITS_BWD)):
        assert fn(np.ones(64, np.float32)) == 64.0
        ir = next(iter(fn.inspect_llvm().values()))
        wanted = f'"prefer-vector-width"="{bits}"'
        assert (wanted in ir) == (bits is not None) and ("prefer-vector-width" in ir) == (
            bits is not None
        )


_AVX512 = ("avx512f", "avx512bw", "avx512vl")


@pytest.mark.parametrize(
    "arch, cpu, features, widths",
    [
        ("x86_64", "rocketlake", _AVX512, (512, 512)),  # Intel with 512-bit units
        ("x86_64", "sapphirerapids", (*_AVX512, "avx512bf16", "amx-tile"), (512, 512)),
        ("x86_64", "znver4", (*_AVX512, "avx512bf16"), (512, 256)),  # AMD Zen 4: two halves
        ("x86_64", "znver5", (*_AVX512, "avx512bf16"), (512, 512)),  # AMD Zen 5: 512-bit units
        ("x86_64", "cascadelake", _AVX512, (256, 256)),  # Skylake-SP: clock drop
        ("x86_64", "skylake-avx512", _AVX512, (256, 256)),
        ("x86_64", "znver3", ("avx2",), (None, None)),
        ("x86_64", "knl", ("avx512f",), (None, None)),  # no BW / VL
        ("aarch64", "neoverse-v1", ("sve",), (None, None)),
    ],
)
def test_the_vector_width_rule(monkeypatch, arch, cpu, features, widths):
    pytest.importorskip("numba")
    import llvmlite.binding as llvm

    from rmsnorm.kernels.cpu import runtime as rt

    fwd, bwd, why = rt.vector_width_rule(arch, cpu, {f: True for f in features})
    assert (fwd, bwd) == widths and cpu in why
    # what the host reports goes through the same rule, unless the variable overrides it
    monkeypatch.setattr(rt, "_ARCH", arch)
    monkeypatch.setattr(llvm, "get_host_cpu_name", lambda: cpu)
    monkeypatch.setattr(llvm, "get_host_cpu_features", lambda: {f: True for f in features})
    monkeypatch.delenv(rt.VECTOR_BITS_ENV, raising=False)
    assert rt._vector_widths()[:2] == widths
    monkeypatch.setenv(rt.VECTOR_BITS_ENV, "auto")
    assert rt._vector_widths()[:2] == widths
    for value in ("256", "512"):
        monkeypatch.setenv(rt.VECTOR_BITS_ENV, value)
        if fwd is None and (value == "512" or arch != "x86_64"):
            with pytest.raises(ValueError, match=f"{rt.VECTOR_BITS_ENV}={value} needs an x86-64"):
                rt._vector_widths()
        else:
            bits, bits_bwd, why = rt._vector_widths()
            assert bits == bits_bwd == int(value) and rt.VECTOR_BITS_ENV in why


def test_a_bad_vector_width_setting_is_refused_by_name(monkeypatch):
    pytest.importorskip("numba")
    from rmsnorm.kernels.cpu import runtime as rt

    monkeypatch.setenv(rt.VECTOR_BITS_ENV, "1024")
    with pytest.raises(ValueError, match="RMSNORM_CPU_VECTOR_BITS must be 256, 512 or auto"):
        rt._vector_widths()


@pytest.mark.parametrize("bits", ["256", "512"])
def test_the_kernels_are_correct_at_either_forced_vector_width(tmp_path, bits):
    """The kernels compiled for one width in both directions (the variable), in a fresh cache:
    forward and backward of both norms, float32 and bfloat16, against the spec. The width this
    process compiled is tested by every other test here."""
    pytest.importorskip("numba")
    from rmsnorm.kernels.cpu import runtime as rt

    if (rt.VECTOR_BITS, rt.VECTOR_BITS_BWD) == (int(bits), int(bits)):
        pytest.skip(f"this process's kernels are already {bits}-bit both ways")
    if rt.VECTOR_BITS is None and bits == "512":
        pytest.skip("this CPU has no AVX-512 (F, BW, VL)")
    if rt._ARCH not in ("x86_64", "amd64"):
        pytest.skip("the width is set on x86-64 only")
    code = (
        "import torch\n"
        "from rmsnorm import reference as ref\n"
        "from rmsnorm.testing import check_launcher\n"
        "from rmsnorm.kernels.cpu import launchers as cpu, runtime as rt\n"
        f"assert (rt.VECTOR_BITS, rt.VECTOR_BITS_BWD) == ({bits}, {bits}), rt.VECTOR_WHY\n"
        "torch.manual_seed(0)\n"
        "for dtype in (torch.float32, torch.bfloat16):\n"
        "    for m, n in ((5, 77), (40, 1000)):\n"
        "        x, dy = torch.randn(m, n, dtype=dtype), torch.randn(m, n, dtype=dtype)\n"
        "        w, b = torch.rand(n, dtype=dtype) + 0.5, torch.randn(n, dtype=dtype)\n"
        "        opts = ref.RMSOptions(1e-6, 'mean_square', 'gemma', 0.0, n)\n"
        "        _, _, e = check_launcher(cpu, 'rms_norm_fwd', x, w, None, opts)\n"
        "        check_launcher(cpu, 'rms_norm_bwd', dy, x, w, None, e[1].float(), None, opts,\n"
        "                       dtype, True)\n"
        "        _, _, e = check_launcher(cpu, 'layer_norm_fwd', x, w, b, 1e-5)\n"
        "        check_launcher(cpu, 'layer_norm_bwd', dy, x, w, b, e[1].float(), e[2].float(),\n"
        "                       True)\n"
        "print('OK')\n"
    )
    env = {rt.VECTOR_BITS_ENV: bits, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    done = _run(code, timeout=600, env=env)
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr


def test_every_compiled_kernel_function_asks_for_the_vector_width():
    """Each function of the kernel modules that numba compiles on its own (decorated with njit,
    not inlined) starts with ``rt.wide_vectors()`` (or ``rt.wide_vectors_bwd()`` in the plain
    norms' backward): the width is a per-function attribute, so a function without the call would
    keep LLVM's default."""
    root = Path(cpu.__file__).parent
    missing, seen = [], 0
    for name in ("rows.py", "kernels.py", "gated.py"):
        for node in ast.walk(ast.parse((root / name).read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            jit = [d for d in node.decorator_list if "njit" in ast.unparse(d)]
            if not jit or any("inline" in ast.unparse(d) for d in jit):
                continue
            seen += 1
            body = node.body[1:] if ast.get_docstring(node) else node.body
            if ast.unparse(body[0]) not in ("rt.wide_vectors()", "rt.wide_vectors_bwd()"):
                missing.append(f"{name}:{node.name}")
    assert seen > 20 and missing == []


@pytest.mark.parametrize("dtype", DTYPES)
def test_streamed_outputs_hold_the_same_bits_as_ordinary_ones(monkeypatch, dtype):
    """Outputs written with non-temporal stores (every call streams where the threshold is 0) hold
    the bits the ordinary stores write: rows whose starts are not 64-byte aligned (n = 77, 1000),
    rows longer than a streamed piece (n = 5003), a strided input, the residual's h, LayerNorm,
    the fused and the rounding casting modes, dx of both backwards (with a residual's gradient
    added), one thread and shared calls."""
    from rmsnorm.kernels.cpu import launchers as L

    def run():
        torch.manual_seed(0)
        out = []
        for m, n in ((3, 77), (40, 1000), (300, 5003)):
            x, r = randn(m, n, dtype=dtype), randn(m, n, dtype=dtype)
            xs = randn(m, n + 9, dtype=dtype)[:, 3 : n + 3]  # rows 9 elements apart
            w, b = torch.rand(n, dtype=dtype) + 0.5, randn(n, dtype=dtype)
            for mode in ("llama", "gemma", "none"):
                opts = R.RMSOptions(1e-6, "mean_square", mode, 0.0, n)
                out += L.rms_norm_fwd(x, w, None, opts)
                out += L.rms_norm_fwd(xs, w, b, opts)
                out += L.add_rms_norm_fwd(x, r, w, None, opts)
                y, rstd = out[-3], out[-1]
                out += L.rms_norm_bwd(y, x, w, None, rstd.float(), None, opts, dtype, True)
                out += L.rms_norm_bwd(y, xs, w, b, rstd.float(), r, opts, dtype, True)
            yl, mean, rstd = L.layer_norm_fwd(x, w, b, 1e-5)
            out += [yl, mean, rstd, *L.layer_norm_bwd(r, x, w, b, mean, rstd, True)]
        return out

    monkeypatch.setattr(L, "_STREAM_AT", 1 << 62)
    ordinary = run()
    monkeypatch.setattr(L, "_STREAM_AT", 0)
    streamed = run()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        streamed_alone = run()
    finally:
        torch.set_num_threads(before)
    assert bitwise_equal(ordinary, streamed)
    assert bitwise_equal(ordinary, streamed_alone)


@pytest.mark.parametrize(
    "arch, cache, at",
    [
        ("x86_64", 32 << 20, 32 << 20),  # from the last-level cache's size
        ("amd64", 1 << 30, 1 << 30),
        ("x86_64", None, None),  # its size unknown: never
        ("aarch64", 32 << 20, None),  # not measured on ARM: never
    ],
)
def test_the_stream_rule(monkeypatch, arch, cache, at):
    pytest.importorskip("numba")
    from rmsnorm.kernels.cpu import runtime as rt

    threshold, why = rt.stream_rule(arch, cache)
    assert threshold == at and why
    monkeypatch.setattr(rt, "_ARCH", arch)
    monkeypatch.setattr(rt, "_X86", arch in ("x86_64", "amd64"))
    monkeypatch.setattr(rt, "_last_level_cache_bytes", lambda: cache)
    for value in (None, "auto", " AUTO "):
        if value is None:
            monkeypatch.delenv(rt.STREAM_BYTES_ENV, raising=False)
        else:
            monkeypatch.setenv(rt.STREAM_BYTES_ENV, value)
        assert rt._stream_bytes()[0] == at
    monkeypatch.setenv(rt.STREAM_BYTES_ENV, "never")
    assert rt._stream_bytes()[0] is None
    monkeypatch.setenv(rt.STREAM_BYTES_ENV, "4096")
    if arch in ("x86_64", "amd64"):
        said = f"non-temporal stores from 4096 bytes (set by {rt.STREAM_BYTES_ENV})"
        assert rt._stream_bytes() == (4096, said)
    else:
        with pytest.raises(ValueError, match="needs an x86-64 CPU"):
            rt._stream_bytes()
    for bad in ("-1", "lots", "1e6"):
        monkeypatch.setenv(rt.STREAM_BYTES_ENV, bad)
        with pytest.raises(ValueError, match="RMSNORM_CPU_STREAM_BYTES must be a byte count"):
            rt._stream_bytes()


def test_this_host_reports_its_last_level_cache():
    pytest.importorskip("numba")
    from rmsnorm.kernels.cpu import runtime as rt

    size = rt._last_level_cache_bytes()
    assert size is None or size >= 1 << 16  # no data cache that small holds the last level
