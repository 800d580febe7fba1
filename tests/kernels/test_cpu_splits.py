"""The CPU kernels' results do not depend on how a call is split between threads: torch's thread
count, torch's OpenMP team or the helper pool, how many ranges the blocks are split into, and
which thread runs which block (a helper that never runs leaves its blocks to the caller). Each
row is computed by one thread in a fixed order and d weight / d bias are summed over per-block
partial rows in block order, so every split must give the bits of the calling thread alone —
forward, dx and the parameter gradients alike. And which way a call is shared is chosen by its
size alone: from ``pool.POOL_FROM`` elements on the helper pool."""

from __future__ import annotations

import pytest
import torch

from launcher_support import bitwise_equal
from rmsnorm import reference as R
from rmsnorm.kernels import cpu

pytestmark = pytest.mark.skipif(not cpu.available(), reason="numba is not installed")

# (M, N): from the pool's threshold (2^22 elements: 1024 × 4096) and below it (on torch's team),
# rows that fill no whole block, and more backward blocks than a split has threads
SHAPES = ((1024, 4096), (1031, 700), (96, 1000))


def _calls(x, dy, w, b):
    """Every output of the RMSNorm and LayerNorm launchers, forward and backward."""
    n = x.shape[-1]
    opts = R.RMSOptions(1e-6, "mean_square", "gemma", 0.0, n)
    y, rstd = cpu.rms_norm_fwd(x, w, None, opts)
    dx, dw, _ = cpu.rms_norm_bwd(dy, x, w, None, rstd, None, opts, x.dtype, True)
    yl, mean, rl = cpu.layer_norm_fwd(x, w, b, 1e-5)
    dxl, dwl, dbl = cpu.layer_norm_bwd(dy, x, w, b, mean, rl, True)
    return [y, rstd, dx, dw, yl, mean, rl, dxl, dwl, dbl]


def _inputs(m, n, dtype):
    g = torch.Generator().manual_seed(m * 7919 + n)
    x = (torch.randn(m, n, generator=g) * 3 + 0.5).to(dtype)
    dy = torch.randn(m, n, generator=g).to(dtype)
    w = torch.randn(n, generator=g).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    return x, dy, w, b


def _split(t, team=None, cores=None, never_run=False):
    """A function that sets one way of sharing a call up (with a monkeypatch context m)."""
    from rmsnorm.kernels.cpu import pool as P

    def setup(m):
        m.setattr(P, "_pool", None)  # a fresh pool for each split
        if cores is not None:  # more helpers than this machine has cores: more ranges
            m.setattr(P, "_cores", lambda: cores)
        if never_run:  # helpers that the scheduler never runs: the caller runs every block
            m.setattr(P._Pool, "_spawn", lambda self: setattr(self, "helpers", self.helpers + 1))
        if team is True:  # torch's OpenMP team for every shared call, whatever its size
            m.setattr(P, "POOL_FROM", 1 << 62)
        elif team is False:  # the pool for every shared call
            m.setattr(P, "USE_OPENMP", False)
        torch.set_num_threads(t)

    return setup


SPLITS = {
    "2 threads, by size": _split(2),
    "2 threads, team": _split(2, team=True),
    "2 threads, pool": _split(2, team=False),
    "3 threads, pool of 2 helpers": _split(3, team=False, cores=3),
    "4 threads, pool of 3 helpers": _split(4, team=False, cores=4),
    "4 threads, by size, 3 helpers": _split(4, cores=4),
    "4 threads, team": _split(4, team=True),
    "2 threads, helpers never run": _split(2, team=False, never_run=True),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_split_gives_the_bits_of_one_thread(dtype, monkeypatch):
    from rmsnorm.kernels.cpu import pool as P
    from rmsnorm.kernels.cpu import runtime as rt

    inputs = [_inputs(m, n, dtype) for m, n in SHAPES]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        want = [_calls(*args) for args in inputs]
        for name, setup in SPLITS.items():
            with monkeypatch.context() as m:
                setup(m)
                for shape, args, expected in zip(SHAPES, inputs, want, strict=True):
                    assert bitwise_equal(_calls(*args), expected), f"{name}, {shape}, {dtype}"
                made = P._pool
            if made is not None and made is not P._pool:  # this split's own helpers: stopped
                made.block[rt.STOP] = 1
    finally:
        torch.set_num_threads(before)


def test_the_pool_serves_calls_from_its_threshold_and_the_team_below(monkeypatch):
    # The way a call is shared depends on its size alone (and the thread count): below
    # POOL_FROM elements on torch's OpenMP team where torch has one, from it on the helper pool,
    # whose caller never waits for a helper that has not begun a block.
    from rmsnorm.kernels.cpu import pool as P

    team, pooled = [], []
    acquire, pool_acquire = P._acquire, P._Pool.acquire
    monkeypatch.setattr(P, "_acquire", lambda pool, t: team.append(t) or acquire(pool, t))
    monkeypatch.setattr(
        P._Pool, "acquire", lambda self, t: pooled.append(t) or pool_acquire(self, t)
    )
    n = 4096
    opts = R.RMSOptions(1e-6, "mean_square", "gemma", 0.0, n)
    below = torch.randn(P.POOL_FROM // n - 1, n)
    at = torch.randn(P.POOL_FROM // n, n)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        cpu.rms_norm_fwd(below, None, None, opts)
        cpu.layer_norm_fwd(below, None, None, 1e-5)
        assert (len(team), len(pooled)) == (2, 0 if P.USE_OPENMP and P._gomp else 2)
        team.clear()
        pooled.clear()
        y, rstd = cpu.rms_norm_fwd(at, None, None, opts)
        cpu.rms_norm_bwd(at, at, None, None, rstd, None, opts, at.dtype, True)
        cpu.layer_norm_fwd(at, None, None, 1e-5)
        assert (team, pooled) == ([], [2, 2, 2])
    finally:
        torch.set_num_threads(before)
