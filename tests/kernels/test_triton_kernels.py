"""What only the Triton backend has: its kernel layouts (one tile, a looped row, a row split over
cooperating programs; persistent grids) forced at small N, d weight summed over many programs,
float64 accumulation, the launch configs, the FLAGS bits, the version floor, and the tests that need
a GPU. The launchers' results against the spec in every option, shape and row layout are checked
with every backend's in test_launchers.py.

Without a GPU every test runs on CPU tensors under TRITON_INTERPRET=1 (set by conftest), with small
shapes and few programs; with a GPU the same tests run natively on CUDA tensors, plus the tests
marked ``gpu`` (opcheck, torch.compile, CUDA graphs, > 2^31 elements, large N).
"""

from __future__ import annotations

import itertools
import math
import os

import pytest
import torch

import rmsnorm
import rmsnorm.reference as R
from launcher_support import EPS, HAS_CUDA, check_all_ops, param_layout, triton_layouts
from rmsnorm.testing import assert_close_to_reference, check_launcher

triton = pytest.importorskip("triton")
T = pytest.importorskip("rmsnorm.kernels.triton")
from rmsnorm.kernels.triton import Config, _config, override  # noqa: E402

DEVICE = "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(autouse=True)
def _triton_backend():
    with rmsnorm.use_backend("triton"):
        yield


def _d(t):
    return None if t is None else t.detach().to(torch.float64)


def _close(actual, expected, eager, name, rows=1):
    assert_close_to_reference(actual, expected, eager, name=name, rows=rows)


def _rand(*shape, dtype=torch.float32, scale=1.0, shift=0.0):
    return (torch.randn(*shape, dtype=torch.float32) * scale + shift).to(dtype).to(DEVICE)


# ----------------------------------------------------------------------------------------------
# Kernel layouts forced at small N
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "layout, n",
    [
        ("loop", 33),  # 16-column blocks: 2 full blocks and a 1-column tail
        ("loop", 48),  # N an exact multiple of the block: no tail
        ("split", 33),  # 3 cooperating programs, the last holding 1 column
        ("split", 64),  # 4 full chunks
    ],
)
def test_wide_row_layouts(layout, n):
    """The looped and split paths (used on GPU for rows longer than a register tile) forced at
    small N, with a residual in fp32, the "rms" eps placement, partial k across block edges, and a
    large mean (LayerNorm's block-wise variance merge must stay exact)."""
    cfg = triton_layouts(n)[layout]
    m = 7
    x = _rand(m, n, dtype=torch.bfloat16, shift=50.0)
    w = _rand(n, dtype=torch.bfloat16, shift=1.0)
    b = _rand(n, dtype=torch.bfloat16, scale=0.1)
    res = _rand(m, n, dtype=torch.float32)
    with override(fwd=cfg, bwd=cfg, ln_fwd=cfg, ln_bwd=cfg):
        check_all_ops(T, x, w, b, eps_mode="rms", k=n // 2 + 3, res=res)


def test_one_row_block_per_program():
    """The GPU forward default: a grid of one program per row block (no persistent loop, so no
    prefetch), here for every kernel, with rows in several blocks and a masked last block."""
    cfg = Config(8, 64, 4, programs=0)
    m, n = 37, 48
    x = _rand(m, n, dtype=torch.float16)
    w = _rand(n, dtype=torch.float16, shift=1.0)
    b = _rand(n, dtype=torch.float16, scale=0.1)
    with override(fwd=cfg, bwd=cfg, ln_fwd=cfg, ln_bwd=cfg):
        check_all_ops(T, x, w, b, res=_rand(m, n, dtype=torch.float16))


@pytest.mark.parametrize("layout", ["single", "loop", "split"])
@pytest.mark.parametrize("param", ["strided", "expanded", "offset"])
def test_parameter_layouts(param, layout):
    """Weights and biases that are strided, expanded (stride 0) or at a storage offset are read as
    their values, by every launcher in every layout (NaN sits where a unit-stride read from the
    view's first element would land)."""
    m, n = 5, 33
    cfg = triton_layouts(n)
    x = _rand(m, n, dtype=torch.bfloat16)
    w = param_layout(_rand(n, dtype=torch.float32, shift=1.0), param)
    b = param_layout(_rand(n, dtype=torch.float32, scale=0.1), param)
    assert param != "strided" or w.stride() == (2,)
    with override(fwd=cfg[layout], bwd=cfg[layout], ln_fwd=cfg[layout], ln_bwd=cfg[layout]):
        check_all_ops(T, x, w, b, res=_rand(m, n, dtype=torch.bfloat16))
        check_all_ops(T, x, w, b)


def test_weight_gradient_many_rows():
    """d weight / d bias summed over 3000 rows: several row blocks per program and several
    programs' partials; tolerance grows with √rows."""
    m, n = 3000, 24
    x = _rand(m, n, dtype=torch.bfloat16)
    w = _rand(n, dtype=torch.bfloat16, shift=1.0)
    b = _rand(n, dtype=torch.bfloat16)
    dy = _rand(m, n, dtype=torch.bfloat16)
    opts = R.RMSOptions(EPS, "mean_square", "gemma", 0.0, n)
    _, rstd = R.rms_norm_fwd(_d(x), _d(w), None, opts)
    args = (x, w, b, rstd.float(), None, opts, x.dtype, True)
    check_launcher(T, "rms_norm_bwd", dy, *args)


def test_deterministic():
    """Same inputs, same bits: d weight / d bias are fixed-order sums of per-program partials."""
    m, n = 600, 40
    x = _rand(m, n, dtype=torch.bfloat16)
    w = _rand(n, dtype=torch.bfloat16, shift=1.0)
    b = _rand(n, dtype=torch.bfloat16)
    dy = _rand(m, n, dtype=torch.bfloat16)
    rstd = torch.rand(m, device=DEVICE) + 0.5
    args = (x, w, b, rstd, None, R.RMSOptions(EPS, "mean_square", "gemma", 0.0, n), x.dtype, True)
    first = T.rms_norm_bwd(dy, *args)
    second = T.rms_norm_bwd(dy, *args)
    for a, b_ in zip(first, second, strict=True):
        assert torch.equal(a, b_)
    mean = torch.randn(m, device=DEVICE)
    first = T.layer_norm_bwd(dy, x, w, b, mean, rstd, True)
    second = T.layer_norm_bwd(dy, x, w, b, mean, rstd, True)
    for a, b_ in zip(first, second, strict=True):
        assert torch.equal(a, b_)


# ----------------------------------------------------------------------------------------------
# Grouped and gated kernels: both layouts forced at small N
# ----------------------------------------------------------------------------------------------
def _gated_layout(layout: str, g: int) -> Config:
    pow2 = _config._pow2(g)
    return {
        "single": Config(2, pow2, 4, programs=2),  # 2 rows a tile, groups padded, persistent
        "one_per_block": Config(4, pow2, 4, programs=0),
        "loop": Config(2, 4, 4, loop=True, programs=3),  # 4-column blocks, a ragged last one
    }[layout]


@pytest.mark.parametrize("layout", ["single", "one_per_block", "loop"])
@pytest.mark.parametrize(
    "gate, activation",
    [("last", "silu"), ("first", "sigmoid"), ("first", "silu"), ("none", "silu")],
)
@pytest.mark.parametrize("g", [6, 10, 30])  # 5, 3 and 1 groups of N = 30
def test_gated_layouts(layout, gate, activation, g):
    """Every layout with groups whose count and size are not powers of two, partial k across a
    column block's edge, a bias, an offset and a d residual; "rms" placement and "llama" rounding
    in bf16; rows in several blocks, ragged at the end."""
    m, n = 7, 30
    x = _rand(m, n, dtype=torch.bfloat16, shift=0.5)
    z = _rand(m, n, dtype=torch.float32, scale=3.0) if gate != "none" else None
    w = _rand(n, dtype=torch.bfloat16, shift=1.0)
    b = _rand(n, dtype=torch.bfloat16, scale=0.1)
    k = R.partial_size(g, 0.7)
    opts = R.RMSOptions(EPS, "rms", "llama", 0.5, k)
    gating = R.GateOptions(None if g == n else g, gate != "first", activation)
    cfg = _gated_layout(layout, g)
    with override(gated_fwd=cfg, gated_bwd=cfg):
        (y, rstd), eager, exact = check_launcher(T, "gated_rms_norm_fwd", x, z, w, b, opts, gating)
        dy = _rand(m, n, dtype=y.dtype)
        dres = _rand(m, n, dtype=torch.bfloat16)
        rstd = exact[1].to(eager[1].dtype)
        args = (dy, x, z, w, b, rstd, dres, opts, gating, x.dtype, True)
        check_launcher(T, "gated_rms_norm_bwd", *args)


def test_gated_weight_gradient_many_rows_is_deterministic():
    """d weight / d bias of the gated backward over 2000 rows and several programs: within the
    tolerance for √rows, and bitwise the same on a second run."""
    m, n, g = 2000, 24, 8
    x = _rand(m, n, dtype=torch.bfloat16)
    z = _rand(m, n, dtype=torch.bfloat16, scale=2.0)
    w = _rand(n, dtype=torch.bfloat16, shift=1.0)
    b = _rand(n, dtype=torch.bfloat16)
    dy = _rand(m, n, dtype=torch.bfloat16)
    opts, gating = R.RMSOptions(EPS, "mean_square", "gemma", 0.0, g), R.GateOptions(g, True, "silu")
    _, rstd = R.gated_rms_norm_fwd(_d(x), _d(z), _d(w), _d(b), opts, gating)
    args = (dy, x, z, w, b, rstd.float(), None, opts, gating, x.dtype, True)
    first, _, _ = check_launcher(T, "gated_rms_norm_bwd", *args)
    for a, b_ in zip(first, T.gated_rms_norm_bwd(*args), strict=True):
        assert torch.equal(a, b_)


def test_gated_gradcheck_float64():
    """gated_rms_norm through the Triton kernels in float64 (accumulated in float64): analytical
    against numerical derivatives of x, the gate, the weight and the bias."""
    m, n = 3, 12
    x = _rand(m, n, dtype=torch.float64).requires_grad_()
    z = _rand(m, n, dtype=torch.float64).requires_grad_()
    w = _rand(n, dtype=torch.float64, shift=1.0).requires_grad_()
    b = _rand(n, dtype=torch.float64).requires_grad_()
    for order in (True, False):

        def fn(x, z, w, b, order=order):
            return rmsnorm.gated_rms_norm(
                x,
                z,
                n,
                w,
                1e-3,
                group_size=4,
                norm_before_gate=order,
                bias=b,
                partial=0.75,
                eps_mode="rms",
            )

        assert torch.autograd.gradcheck(fn, (x, z, w, b), fast_mode=True)


# ----------------------------------------------------------------------------------------------
# The public API in float64 on the Triton backend
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm", "layer_norm"])
def test_gradcheck_float64(op):
    """Analytical vs numerical derivatives in float64: the kernels accumulate in float64 for
    float64 inputs (fast mode: a few random directions)."""
    m, n = 3, 8
    x = _rand(m, n, dtype=torch.float64).requires_grad_()
    w = _rand(n, dtype=torch.float64, shift=1.0).requires_grad_()
    b = _rand(n, dtype=torch.float64).requires_grad_()
    if op == "rms_norm":
        inputs = (x, w, b)

        def fn(x, w, b):
            return rmsnorm.rms_norm(x, n, w, 1e-3, eps_mode="rms", bias=b, partial=0.5)
    elif op == "add_rms_norm":
        res = _rand(m, n, dtype=torch.float64).requires_grad_()
        inputs = (x, res, w)

        def fn(x, res, w):
            return rmsnorm.add_rms_norm(x, res, n, w, 1e-3, offset=0.5)
    else:
        inputs = (x, w, b)

        def fn(x, w, b):
            return rmsnorm.layer_norm(x, n, w, b, 1e-3)

    assert torch.autograd.gradcheck(fn, inputs, fast_mode=True)


# ----------------------------------------------------------------------------------------------
# Launch configs (pure Python: the GPU table is checked without a GPU)
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", [k for k in _config.KINDS if not k.startswith("gated")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_gpu_config_table(kind, dtype):
    """Every N from 1 to 2^21 gets a config that covers the row: power-of-two tiles, a split grid
    no larger than the SM count (its programs must be co-resident), or a looped one."""
    sms = 132
    ns = sorted({1, 2, 3} | {2**e + d for e in range(1, 22) for d in (-1, 0, 1)})
    for n in ns:
        cfg = _config.gpu_config(kind, n, dtype.itemsize, sms)
        assert cfg.block_n & (cfg.block_n - 1) == 0 and cfg.block_m & (cfg.block_m - 1) == 0
        if cfg.split > 1:
            assert cfg.block_n * cfg.split >= n > cfg.block_n * (cfg.split - 1)
            assert cfg.programs <= sms and cfg.programs % cfg.split == 0
        elif not cfg.loop:
            assert cfg.block_n >= n
        for m in (1, 7, 4096, 2**20):
            assert cfg.slots(m) * cfg.block_m * cfg.split >= 1
            if cfg.programs:
                assert cfg.slots(m) * cfg.split <= max(cfg.programs, cfg.split)


@pytest.mark.parametrize("kind", ["gated_fwd", "gated_bwd"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_gpu_gated_config_table(kind, dtype):
    """Every N and group size gets a config whose tile covers a row's padded groups (GP · block_n
    ≥ G · g), or a looped one walking each group in power-of-two column blocks; the backward is
    persistent (one partial d weight row per program)."""
    sms = 132
    for n in sorted({1, 6, 24, 96, 128, 300} | {2**e for e in range(1, 18)}):
        for g in sorted({d for d in (1, 2, 3, 8, 64, 128, 1024, n) if n % d == 0}):
            cfg = _config.gated_gpu_config(kind, n, g, dtype.itemsize, sms)
            assert cfg.block_n & (cfg.block_n - 1) == 0 and cfg.block_m & (cfg.block_m - 1) == 0
            if cfg.loop:
                assert cfg.block_m == 1 and cfg.block_n <= _config._pow2(g) and cfg.programs
            else:
                assert cfg.block_n >= g
                assert cfg.block_m * _config._pow2(n // g) * cfg.block_n <= 8192
            assert kind == "gated_fwd" or cfg.programs > 0


# ----------------------------------------------------------------------------------------------
# The FLAGS bits (pure Python and source checks: a misnumbered bit fails here, not in results)
# ----------------------------------------------------------------------------------------------
_FLAG_OPTIONS = {
    "LOOP": {"loop": True},
    "PREFETCH": {"prefetch": True},
    "PHASE": {"phase": 3},
    "RES": {"res": True},
    "W": {"w": True},
    "B": {"b": True},
    "DW": {"dw": True},
    "DB": {"db": True},
    "RMS_EPS": {"rms_eps": True},
    "PARTIAL": {"partial": True},
    "CAST": {"cast": 3},
}


def test_flag_fields_are_disjoint_and_each_option_sets_its_own():
    from rmsnorm.kernels.triton import _flags as flag

    fields = flag.BITS
    for (a, va), (b, vb) in itertools.combinations(fields.items(), 2):
        assert va & vb == 0, f"flag fields {a} and {b} overlap"
    assert all(0 < v < 1 << flag.FINGERPRINT_SHIFT for v in fields.values())
    assert fields["PHASE"] == flag.FIELD_MASK << flag.PHASE_SHIFT
    assert fields["CAST"] == flag.FIELD_MASK << flag.CAST_SHIFT
    assert max(flag.CAST_GEMMA, flag.CAST_LLAMA, flag.CAST_NONE) <= flag.FIELD_MASK
    base = flag.flags()
    assert base >> flag.FINGERPRINT_SHIFT == flag.FINGERPRINT
    assert bool(base & flag.RNE) == flag.INTERPRETED
    assert set(_FLAG_OPTIONS) | {"RNE"} == set(fields)
    for name, kwargs in _FLAG_OPTIONS.items():
        assert flag.flags(**kwargs) ^ base == fields[name], name


def test_fingerprint_changes_with_the_numbering():
    """Renumbering a bit changes FLAGS for every launch, so Triton's on-disk cache never serves a
    kernel compiled under the old numbering (FLAGS is in its key; the bit values are not)."""
    import zlib

    from rmsnorm.kernels.triton import _flags as flag

    def fingerprint(bits):
        return zlib.crc32(repr(sorted(bits.items())).encode()) & 0xFFFF

    assert fingerprint(flag.BITS) == flag.FINGERPRINT
    swapped = dict(flag.BITS, RES=flag.BITS["W"], W=flag.BITS["RES"])
    assert fingerprint(swapped) != flag.FINGERPRINT


def test_kernels_decode_flags_by_name_only():
    """Every FLAGS test in the kernels goes through a name of ``_flags`` (``FLAGS & flag.RES``);
    a bare number there would silently keep the old meaning when a bit is renumbered."""
    import inspect
    import re

    from rmsnorm.kernels.triton import _common, _flags, _gated, _layer_norm, _rms

    decoded = 0
    for mod in (_common, _rms, _layer_norm, _gated):
        src = inspect.getsource(mod)
        assert not re.search(r"FLAGS\s*(&|>>|<<|\||==)\s*\(?\s*\d", src), mod.__name__
        for name in re.findall(r"FLAGS\s*(?:&|>>)\s*flag\.(\w+)", src):
            assert hasattr(_flags, name), name
            decoded += 1
    assert decoded >= 30  # the four kernels' prologues


# ----------------------------------------------------------------------------------------------
# Version floor and the split layout's co-residency (pure Python: no GPU needed)
# ----------------------------------------------------------------------------------------------
def test_an_older_triton_is_refused_with_its_version_and_the_way_out():
    import subprocess
    import sys

    code = (
        "import triton; triton.__version__ = '3.3.1'\n"
        "try:\n    import rmsnorm.kernels.triton\n"
        "except ImportError as e:\n    print(e)\n"
    )
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert "need triton >= 3.4, found triton 3.3.1" in out.stdout, out.stdout + out.stderr
    assert "RMSNORM_BACKEND=reference" in out.stdout
    assert T._version("3.10.0+git1234") == (3, 10) >= T.MIN_TRITON


def test_split_launches_are_cooperative(monkeypatch):
    """On a GPU a split layout's programs wait for each other: the launch asks the driver to make
    them co-resident (or refuse), never to hope they are."""
    monkeypatch.setattr(T.flag, "INTERPRETED", False)
    layouts = triton_layouts(64)
    split = T._launches(layouts["split"], 0, {})
    assert [kw.get("launch_cooperative_grid") for kw in split] == [True]
    assert "launch_cooperative_grid" not in T._launches(layouts["loop"], 0, {})[0]


def test_a_refused_cooperative_launch_falls_back_to_the_looped_layout(monkeypatch):
    calls = []
    real = T._launch

    def launch(kernel, cfg, launches, m, args):
        calls.append(cfg.split)
        if len(calls) == 1:
            raise T._SplitRefused("too many blocks in cooperative launch")
        return real(kernel, cfg, launches, m, args)

    monkeypatch.setattr(T, "_launch", launch)
    monkeypatch.setattr(_config, "_split_refused", False)
    x = _rand(3, 40)
    opts = R.RMSOptions(EPS, "mean_square", "gemma", 0.0, 40)
    with pytest.warns(RuntimeWarning, match="looped layout"):
        y, _ = T.rms_norm_fwd(x, None, None, opts)
    assert len(calls) == 2 and _config._split_refused
    y_e, _ = R.rms_norm_fwd(x, None, None, opts)
    _close(y, R.rms_norm_fwd(_d(x), None, None, opts)[0], y_e, "y")
    for n in (65536, 262144, 2**20):  # no split config once refused
        assert _config.gpu_config("fwd", n, 2, 132).split == 1
    monkeypatch.setattr(_config, "_split_refused", False)
    _config.gpu_config.cache_clear()
    assert _config.gpu_config("fwd", 65536, 2, 132).split > 1


def test_override_is_scoped():
    cfg = Config(1, 16, 4, loop=True)
    with override(fwd=cfg):
        assert _config.choose("fwd", 1000, torch.float32, torch.device("cpu")) is cfg
    assert _config.choose("fwd", 1000, torch.float32, torch.device("cpu")) is not cfg
    with pytest.raises(ValueError, match="unknown kernel kinds"):
        with override(backward=cfg):
            pass


# ----------------------------------------------------------------------------------------------
# GPU only
# ----------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("n", [8192, 16384, 65536, 1048576])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_large_rows(n, dtype):
    """The production configs of the wide shape classes (bf16 / fp32): a persistent single tile
    (16384 / 8192 forward), rows split over cooperating programs (forward past 16384 / 8192,
    backward past 8192 / 4096), and the looped fallback (fp32 backward at 2^20 needs more chunks
    than SMs)."""
    m = max(4, min(512, 2**24 // n))
    x = _rand(m, n, dtype=dtype)
    w = _rand(n, dtype=dtype, shift=1.0)
    b = _rand(n, dtype=dtype, scale=0.1)
    check_all_ops(T, x, w, b, res=_rand(m, n, dtype=torch.float32) if n == 65536 else None)


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_qk_norm_shape():
    x = _rand(2**16, 128, dtype=torch.bfloat16)
    w = _rand(128, dtype=torch.bfloat16, shift=1.0)
    check_all_ops(T, x, w, None)


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_more_than_2_31_elements():
    """A (2^31 + 2 rows) bf16 tensor (~8.6 GB in, ~8.6 GB out): the last rows sit past 2^31."""
    n = 4096
    m = 2**31 // n + 2
    free, _ = torch.cuda.mem_get_info()
    if free < 4 * m * n * 2 + 2**30:
        pytest.skip("needs ~18 GB of free GPU memory")
    x = torch.randn(m, n, dtype=torch.bfloat16, device="cuda")
    opts = R.RMSOptions(EPS, "mean_square", "gemma", 0.0, n)
    y, rstd = T.rms_norm_fwd(x, None, None, opts)
    tail = x[-3:]
    y_e, _ = R.rms_norm_fwd(tail, None, None, opts)
    y_x, _ = R.rms_norm_fwd(_d(tail), None, None, opts)
    _close(y[-3:], y_x, y_e, "y tail")
    del y
    dy = torch.randn_like(x)
    dx, _, _ = T.rms_norm_bwd(dy, x, None, None, rstd, None, opts, x.dtype, True)
    dx_e, _, _ = R.rms_norm_bwd(dy[-3:], tail, None, None, rstd[-3:], None, opts, x.dtype, True)
    dx_x, _, _ = R.rms_norm_bwd(
        _d(dy[-3:]), _d(tail), None, None, _d(rstd[-3:]), None, opts, torch.float64, True
    )
    _close(dx[-3:], dx_x, dx_e, "dx tail")


@pytest.mark.gpu
def test_gpu_opcheck():
    x = _rand(8, 64, dtype=torch.bfloat16)
    w = _rand(64, dtype=torch.bfloat16, shift=1.0)
    b = _rand(64, dtype=torch.bfloat16)
    res = _rand(8, 64, dtype=torch.float32)
    _, rstd = torch.ops.rmsnorm.rms_norm_fwd(x, 1, w, b, EPS, "rms", "llama", 1.0, 40)
    _, mean, lrstd = torch.ops.rmsnorm.layer_norm_fwd(x, 1, w, b, EPS)
    dy = _rand(8, 64, dtype=torch.float32)
    samples = [
        (torch.ops.rmsnorm.rms_norm_fwd, (x, 1, w, b, EPS, "rms", "llama", 1.0, 40)),
        (
            torch.ops.rmsnorm.add_rms_norm_fwd,
            (x, res, 1, w, None, EPS, "mean_square", "gemma", 0.0, 64),
        ),
        (
            torch.ops.rmsnorm.rms_norm_bwd,
            (dy, x, 1, w, b, rstd, None, EPS, "rms", "llama", 1.0, 40, torch.bfloat16, True),
        ),
        (torch.ops.rmsnorm.layer_norm_fwd, (x, 1, w, b, EPS)),
        (torch.ops.rmsnorm.layer_norm_bwd, (dy.bfloat16(), x, 1, w, b, mean, lrstd, True)),
    ]
    for op, args in samples:
        torch.library.opcheck(op, args)


@pytest.mark.gpu
def test_gpu_compile_fullgraph():
    x = _rand(4, 6, 256, dtype=torch.bfloat16).requires_grad_()
    res = _rand(4, 6, 256, dtype=torch.bfloat16)
    w = _rand(256, dtype=torch.bfloat16, shift=1.0).requires_grad_()

    def fn(x, res, w):
        y, h = rmsnorm.add_rms_norm(x, res, 256, w, 1e-6)
        return rmsnorm.rms_norm(y, 256, w, 1e-6) + rmsnorm.layer_norm(h, 256, w)

    compiled = torch.compile(fn, fullgraph=True)
    out = compiled(x, res, w)
    out.sum().backward()
    assert x.grad is not None and w.grad is not None
    ref = fn(x.detach(), res, w.detach())
    # Our ops are opaque nodes; only the final add is compiled (one bf16 rounding either way).
    torch.testing.assert_close(out.detach(), ref)


@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    x = _rand(32, 4096, dtype=torch.bfloat16)
    w = _rand(4096, dtype=torch.bfloat16, shift=1.0)
    y = rmsnorm.rms_norm(x, 4096, w, 1e-6)  # compile + warm-up outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        rmsnorm.rms_norm(x, 4096, w, 1e-6)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_g = rmsnorm.rms_norm(x, 4096, w, 1e-6)
    x.copy_(_rand(32, 4096, dtype=torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y_g, rmsnorm.rms_norm(x, 4096, w, 1e-6))
    assert not torch.equal(y_g, y)


def _split_shape_inputs(m=256, n=65536, dtype=torch.bfloat16):
    """Inputs at a shape whose production config is the split layout (checked)."""
    assert _config.gpu_config("fwd", n, dtype.itemsize, _config._sm_count(0)).split > 1
    assert _config.gpu_config("bwd", n, dtype.itemsize, _config._sm_count(0)).split > 1
    x = _rand(m, n, dtype=dtype)
    w = _rand(n, dtype=dtype, shift=1.0)
    return x, w, _rand(m, n, dtype=dtype)


def _split_norms(x, w, dy):
    """Forward and backward (dx, d weight) of RMSNorm and LayerNorm on split-layout shapes."""
    n = x.shape[1]
    opts = R.RMSOptions(EPS, "mean_square", "gemma", 0.0, n)
    y, rstd = T.rms_norm_fwd(x, w, None, opts)
    g = T.rms_norm_bwd(dy, x, w, None, rstd, None, opts, x.dtype, True)
    yl, mean, lr = T.layer_norm_fwd(x, w, None, EPS)
    gl = T.layer_norm_bwd(dy, x, w, None, mean, lr, True)
    return (y, rstd, *g[:2], yl, mean, lr, *gl[:2])


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_split_rows_under_contention():
    """Split-layout norms on two streams while a third runs a long matmul loop: every launch
    must finish (the caller bounds the run with a timeout) and give the bits of a quiet run."""
    x, w, dy = _split_shape_inputs()
    quiet = _split_norms(x, w, dy)
    torch.cuda.synchronize()
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    side, s1, s2 = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    results = []
    with torch.cuda.stream(side):
        for _ in range(60):  # ~1 s of matmuls on an H200
            a = (a @ a).clamp_(-1, 1)
    for _ in range(10):
        for s in (s1, s2):
            with torch.cuda.stream(s):
                results.append(_split_norms(x, w, dy))
    torch.cuda.synchronize()
    for got in results:
        for q, g in zip(quiet, got, strict=True):
            assert torch.equal(q, g)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n", [(4096, 4096), (256, 65536)])
def test_gpu_weight_gradient_is_bitwise_deterministic(m, n):
    """d weight / d bias are fixed-order sums: the same bits on every run, in the single-tile and
    the split layouts at production configs."""
    x, dy = _rand(m, n, dtype=torch.bfloat16), _rand(m, n, dtype=torch.bfloat16)
    w = _rand(n, dtype=torch.bfloat16)
    b = _rand(n, dtype=torch.bfloat16)
    rstd = torch.rand(m, device=DEVICE) + 0.5
    mean = torch.randn(m, device=DEVICE)
    args = (x, w, b, rstd, None, R.RMSOptions(EPS, "mean_square", "gemma", 0.0, n), x.dtype, True)
    first = T.rms_norm_bwd(dy, *args)
    first_ln = T.layer_norm_bwd(dy, x, w, b, mean, rstd, True)
    for _ in range(3):
        for a, b_ in zip(first, T.rms_norm_bwd(dy, *args), strict=True):
            assert torch.equal(a, b_)
        for a, b_ in zip(first_ln, T.layer_norm_bwd(dy, x, w, b, mean, rstd, True), strict=True):
            assert torch.equal(a, b_)


@pytest.mark.gpu
def test_gpu_cuda_graph_capture_of_split_rows():
    """A split-layout (cooperative) launch captured in a CUDA graph replays to the eager bits."""
    x, w, dy = _split_shape_inputs(m=64)
    n = x.shape[1]
    eager = rmsnorm.rms_norm(x, n, w, EPS)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        rmsnorm.rms_norm(x, n, w, EPS)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_g = rmsnorm.rms_norm(x, n, w, EPS)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y_g, eager)


def test_float_scalars_reach_kernels_exactly():
    """eps and offset are fp64 kernel arguments: an fp64 row sees eps = 0.1 exactly (an fp32 eps
    would differ from the reference by ~1e-9 relative, far outside the float64 tolerance)."""
    x = _rand(4, 16, dtype=torch.float64, scale=0.1)
    w = _rand(16, dtype=torch.float64)
    opts = R.RMSOptions(0.1, "mean_square", "gemma", 0.3, 16)
    y, rstd = T.rms_norm_fwd(x, w, None, opts)
    y_e, rstd_e = R.rms_norm_fwd(x, w, None, opts)
    assert math.isclose(rstd[0].item(), rstd_e[0].item(), rel_tol=1e-15)
    _close(y, y_e, y_e, "y")


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize(
    "n, g", [(128, None), (4096, None), (8192, 1024), (32768, None), (16384, 128)]
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_gated_production_configs(n, g, dtype):
    """The gated kernels at the shapes of the models that use them, with their default configs:
    Qwen3-Next's per-head rows (N = 128, many to a tile), a row a tile (4096), Mamba2's 8 groups
    of 1024 and a wide row (the looped layout), 128 groups of 128; both orders, forward and
    backward, against float64."""
    m = max(4, min(512, 2**22 // n))
    x = _rand(m, n, dtype=dtype)
    z = _rand(m, n, dtype=dtype, scale=2.0)
    w = _rand(n, dtype=dtype, shift=1.0)
    for order in (True, False):
        opts = R.RMSOptions(EPS, "mean_square", "llama", 0.0, n if g is None else g)
        gating = R.GateOptions(g, order, "silu")
        (y, _), eager, exact = check_launcher(T, "gated_rms_norm_fwd", x, z, w, None, opts, gating)
        dy = _rand(m, n, dtype=y.dtype)
        rstd = exact[1].to(eager[1].dtype)
        args = (dy, x, z, w, None, rstd, None, opts, gating, dtype, True)
        check_launcher(T, "gated_rms_norm_bwd", *args)


@pytest.mark.gpu
def test_gpu_gated_opcheck_compile_and_cuda_graph():
    x = _rand(8, 6, 64, dtype=torch.bfloat16).requires_grad_()
    z = _rand(8, 6, 64, dtype=torch.bfloat16).requires_grad_()
    w = _rand(64, dtype=torch.float32, shift=1.0).requires_grad_()
    args = (x, z, 2, w, None, EPS, "mean_square", "llama", 0.0, 16, 16, False, "silu", None)
    torch.library.opcheck(torch.ops.rmsnorm.gated_rms_norm_fwd, args)

    def fn(x, z, w):
        return rmsnorm.gated_rms_norm(x, z, (6, 64), w.reshape(6, 64), 1e-6, group_size=16)

    w6 = _rand(6 * 64, dtype=torch.float32, shift=1.0).requires_grad_()
    out = torch.compile(fn, fullgraph=True)(x, z, w6)
    out.float().sum().backward()
    assert x.grad is not None and z.grad is not None and w6.grad is not None
    torch.testing.assert_close(out.detach(), fn(x.detach(), z.detach(), w6.detach()))
    xs, zs = x.detach()[0].clone(), z.detach()[0].clone()
    wv = w6.detach()
    rmsnorm.gated_rms_norm(xs, zs, (6, 64), wv.reshape(6, 64), 1e-6)  # warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_g = rmsnorm.gated_rms_norm(xs, zs, (6, 64), wv.reshape(6, 64), 1e-6)
    xs.copy_(_rand(6, 64, dtype=torch.bfloat16))
    graph.replay()
    want = rmsnorm.gated_rms_norm(xs, zs, (6, 64), wv.reshape(6, 64), 1e-6)
    torch.testing.assert_close(y_g, want)
