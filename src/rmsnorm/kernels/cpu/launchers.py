"""The five launchers of the backend contract (:class:`rmsnorm._contract.Backend`) for the CPU
kernels: each reads the rows and parameters in place (nothing is copied), allocates the outputs,
and hands the kernel their addresses, strides and sizes.

float64 anywhere but in a parameter (input, residual, the output of a "llama" product with a float64
weight) and empty tensors go to the reference: the kernels compute in float32. Importing this module
loads the kernels from numba's on-disk cache, or compiles them (saying so once).
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import sys
import threading
import time

import numpy as np
import torch

from ... import _calls
from ... import reference as ref
from ..._contract import LAUNCHERS
from . import kernels as K

__all__ = list(LAUNCHERS[:5])  # the gated two are in gated_launchers.py

log = logging.getLogger("rmsnorm")

_CODES = {torch.float32: K.F32, torch.bfloat16: K.BF16, torch.float16: K.F16}
_PARAM_CODES = {**_CODES, torch.float64: K.F64}  # weights and biases may also be float64
_F32 = torch.float32
# Outputs come from Tensor.new_empty / torch.empty_like (~0.55 µs) rather than torch.empty (~0.8
# µs): they also ignore torch.set_default_device, which would put an output on another device.
_F32_CPU = torch.empty(0, dtype=_F32, device="cpu")

# Below this many elements (up to four blocks of ~16 K) a call runs on its own thread: sharing it
# saves less than starting a team costs (measured in docs/cpu.md). From there on every call is
# shared by torch.get_num_threads() threads: the choice depends on the sizes and the thread count
# alone, never on a timing (which a noisy neighbour would flip).
PARALLEL_MIN = 1 << 16
USE_OPENMP = True  # False: share calls with the pool's helpers even where torch uses OpenMP
# After a task, a pool helper spins this long for the next one before it sleeps: back-to-back calls
# then find it awake (a futex wake-up took ~45 µs on this project's VM), and an idle pool costs
# nothing.
HELPER_SPIN_S = 100e-6


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------
def _load() -> dict:
    """Load the kernels (compiling them where numba's cache does not hold them); say so once."""
    cached, where = K.cache_state()
    if cached is False and where is None:
        log.warning(
            "rmsnorm: no writable cache directory for the CPU kernels (the package directory, "
            "NUMBA_CACHE_DIR and the user cache are read-only), so this process compiles them "
            "(~15 s) and no later process can reuse them; set NUMBA_CACHE_DIR to a writable "
            "directory to keep them"
        )
    elif cached is False:
        log.warning("rmsnorm: compiling the CPU kernels (once, ~15 s; cached in %s)", where)
    t0 = time.perf_counter()
    K.compile_all()
    seconds = time.perf_counter() - t0
    misses = sum(sum(disp.stats.cache_misses.values()) for disp, _ in K.ENTRIES)
    misses += K.TEAM_BODY is not None and not K.TEAM_BODY.cache_hits
    if misses and cached is None:  # compiled where the cache could not be inspected beforehand
        log.warning("rmsnorm: compiled the CPU kernels in %.0f s (cached in %s)", seconds, where)
    return {"compiled": misses > 0, "cached_in": where}


STATUS = _load()
# The compiled entry points, called without the dispatcher's type resolution (~0.2 µs a call)
_forward, _backward, _serve = (K.entry_point(d) for d in (K.forward, K.backward, K.serve))


# ----------------------------------------------------------------------------------------------
# Work sharing: a few helper threads, woken per call, that claim blocks of rows alongside the
# calling thread (see kernels.py). Nothing here sets a thread count anywhere: a call uses as many
# threads as torch.get_num_threads() says at that moment.
# ----------------------------------------------------------------------------------------------
def _address(lib: ctypes.CDLL, name: str) -> int:
    try:
        return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0
    except AttributeError:
        return 0


def _libc_addresses() -> tuple[int, int, int]:
    """(sched_yield, syscall, the futex syscall's number); 0 for what this platform lacks. Helpers
    sleep in futex_wait only on little-endian Linux x86-64 / ARM64 (the kernels wait on the low 32
    bits of a 64-bit word); elsewhere they sleep on a Python lock."""
    try:
        if os.name == "nt":
            return _address(ctypes.WinDLL("kernel32"), "SwitchToThread"), 0, 0
        libc = ctypes.CDLL(None)
    except OSError:
        return 0, 0, 0
    futex = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(
        platform.machine().lower(), 0
    )
    if not sys.platform.startswith("linux") or sys.byteorder != "little":
        futex = 0
    return _address(libc, "sched_yield"), _address(libc, "syscall") if futex else 0, futex


def _openmp_runtime() -> tuple[int, int]:
    """(GOMP_parallel's, omp_get_thread_num's) addresses in the OpenMP runtime that torch's own
    kernels use (libgomp, libomp and libiomp5 all export both), or zeros where torch does not use
    OpenMP or it is not found."""
    try:
        if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
            return 0, 0
    except Exception:  # noqa: BLE001 - an unusual build: no OpenMP sharing
        return 0, 0
    names = ("libgomp", "libiomp", "libomp")
    paths = []
    try:  # Linux: the runtime already loaded (by torch), found by its path
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip()
                if os.path.basename(path).startswith(names) and path.startswith("/"):
                    paths.append(path)
    except OSError:
        pass
    lib_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
    if os.path.isdir(lib_dir):  # elsewhere: the runtime torch ships
        paths += [os.path.join(lib_dir, f) for f in os.listdir(lib_dir) if f.startswith(names)]
    for path in dict.fromkeys(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        addr = _address(lib, "GOMP_parallel")
        if addr:
            return addr, _address(lib, "omp_get_thread_num")
    return 0, 0


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class _Pool:
    """The task block the kernels share, its helper threads, and the lock that gives it to one call
    at a time (a concurrent call from another thread runs alone on its own thread).

    A helper spends its life inside the compiled ``serve`` (no GIL): it spins briefly after a task,
    then sleeps in futex_wait until the kernel that publishes the next task wakes it. Where there
    is no futex, it sleeps on a Python lock that the launcher releases, then serves one task."""

    def __init__(self) -> None:
        self.block = np.zeros(K.WORDS, np.int64)
        self.addr = self.block.ctypes.data
        sched_yield, syscall, futex = _libc_addresses()
        self.block[K.YIELD] = sched_yield
        self.block[K.SYSCALL], self.block[K.SYS_FUTEX] = syscall, futex
        self.block[K.TIMESPEC : K.TIMESPEC + 2] = (0, 100_000_000)  # futex timeout: 0.1 s
        # How many pause instructions make HELPER_SPIN_S: a pause takes 10 to 140 cycles depending
        # on the CPU. Timed here with a helper's own wait for a task that does not come.
        self.block[K.HELPER_SPINS] = 2000
        t0 = time.perf_counter()
        _serve(self.addr, 0, 0, 0)
        pause_s = max((time.perf_counter() - t0) / 2000, 1e-9)
        self.block[K.HELPER_SPINS] = max(100, int(HELPER_SPIN_S / pause_s))
        self.futex = bool(syscall and futex)
        self.busy = threading.Lock()
        self.wakes: list[threading.Lock] = []  # one per lock-waiting helper: released = "work"
        self.helpers = 0
        self.max_helpers = max(0, _cores() - 1)

    def _sleep_on_futex(self, index: int) -> None:
        _serve(self.addr, index, 0, 1)  # returns only when STOP is set

    def _sleep_on_lock(self, index: int, wake: threading.Lock) -> None:
        last = 0
        while not self.block[K.STOP]:
            wake.acquire()
            last = _serve(self.addr, index, last, 0)

    def _spawn(self) -> None:
        index = self.helpers
        if self.futex:
            target, args = self._sleep_on_futex, (index,)
        else:
            wake = threading.Lock()
            wake.acquire()
            self.wakes.append(wake)
            target, args = self._sleep_on_lock, (index, wake)
        name = f"rmsnorm-cpu-{index}"
        threading.Thread(target=target, args=args, name=name, daemon=True).start()
        self.helpers += 1

    def acquire(self, threads: int) -> int:
        """The task block's address with up to threads − 1 helpers allowed in (and woken, where
        they sleep on locks), or 0 if another call has it."""
        helpers = min(threads - 1, self.max_helpers)
        if helpers < 1 or not self.busy.acquire(blocking=False):
            return 0
        while self.helpers < helpers:
            self._spawn()
        self.block[K.WANT] = helpers
        for wake in self.wakes[:helpers]:
            if wake.locked():
                wake.release()
        return self.addr


_pool: _Pool | None = None
_pool_lock = threading.Lock()
# Shared calls run on torch's OpenMP threads where this is not 0 (never in a forked process).
_gomp, _gomp_tid = (
    (0, 0) if sys.modules[__package__].forked or K.TEAM_BODY is None else _openmp_runtime()
)
_launch = threading.local()  # per calling thread: the words that ask a kernel for an OpenMP team


def _forget_pool() -> None:
    # A forked child has none of its parent's threads: it starts its own pool when it needs one.
    # GNU OpenMP hangs in a child whose parent ran a team (torch's own ops do): the child shares
    # calls with the pool's helpers instead.
    global _pool, _pool_lock, _gomp
    _pool, _pool_lock, _gomp = None, threading.Lock(), 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _acquire(pool: _Pool, threads: int) -> int:
    """What a shared call's kernel gets: the words of an OpenMP team of `threads` (torch's own
    runtime, whose threads are awake right after torch's own ops), or the pool's task block, or 0
    where the pool is taken by another call."""
    if USE_OPENMP and _gomp:
        block = getattr(_launch, "block", None)
        if block is None:
            block = _launch.block = np.zeros(K.WORDS, np.int64)
            block[K.MODE], block[K.GOMP], block[K.BODY] = K.OPENMP, _gomp, K.TEAM_BODY.address
            block[K.TID] = _gomp_tid
            _launch.addr = block.ctypes.data
        block[K.TEAM] = threads
        return _launch.addr
    return pool.acquire(threads)


def _shared(kernel, *args) -> None:
    """kernel(ctrl, *args) on an OpenMP team or with the pool's helpers, or kernel(0, *args) on
    this thread alone where torch is set to one thread or another call holds the pool. The blocks
    a call is split into depend on the sizes alone, so the way it runs never changes a result;
    under an oversubscribed machine the caller runs the blocks of a thread that does not start
    (kernels.py, work sharing)."""
    global _pool
    threads = torch.get_num_threads()
    if threads < 2:
        kernel(0, *args)
        return
    pool = _pool
    if pool is None:
        with _pool_lock:
            pool = _pool = _pool or _Pool()
    ctrl = _acquire(pool, threads)
    try:
        kernel(ctrl, *args)
    finally:
        if ctrl and ctrl == pool.addr:
            pool.busy.release()


# ----------------------------------------------------------------------------------------------
# Plans: the output dtype and kernel flags of each combination of dtypes and options, built once
# ----------------------------------------------------------------------------------------------
_REFERENCE = (None, 0)
_rms_fwd_plans: dict[tuple, tuple] = {}
_rms_bwd_plans: dict[tuple, tuple] = {}
_ln_fwd_plans: dict[tuple, tuple] = {}
_ln_bwd_plans: dict[tuple, tuple] = {}


def _check_modes(eps_mode: str, casting_mode: str) -> None:
    if eps_mode not in ref.EPS_MODES:
        raise ValueError(f"eps_mode must be one of {ref.EPS_MODES}, got {eps_mode!r}")
    if casting_mode not in ref.CASTING_MODES:
        raise ValueError(f"casting_mode must be one of {ref.CASTING_MODES}, got {casting_mode!r}")


def _to_reference(op: str, dtypes: bool) -> None:
    """Say (:func:`rmsnorm._calls.fallback`) that ``op`` runs the reference: for its dtypes (a
    float64 tensor or statistic: the kernels compute in float32) or for an empty tensor."""
    why = "a float64 tensor or statistic (the kernels compute in float32)" if dtypes else "no rows"
    _calls.fallback("cpu", op, why)


def _pc(dtype: torch.dtype | None) -> int:
    """A parameter's dtype code (0 where there is none)."""
    return 0 if dtype is None else _PARAM_CODES[dtype]


def _kernel_dtypes(*dtypes: torch.dtype | None, params: tuple = ()) -> bool:
    return all(d is None or d in _CODES for d in dtypes) and all(
        p is None or p in _PARAM_CODES for p in params
    )


def _rms_fwd_plan(key: tuple) -> tuple:
    xdt, wdt, bdt, rdt, casting_mode, eps_mode = key
    _check_modes(eps_mode, casting_mode)
    out = torch.promote_types(xdt, wdt) if casting_mode == "llama" and wdt is not None else xdt
    plan = _REFERENCE
    if _kernel_dtypes(xdt, rdt, out, params=(wdt, bdt)):
        cin, cout = _CODES[xdt], _CODES[out]
        # rounding points as in reference.rms_norm_apply: "gemma" rounds once at the store;
        # "llama" rounds x·r to the input dtype and the products to the output dtype; "none"
        # rounds the input, r and every product to the input dtype. The parameters are rounded to
        # the dtype their product is taken in.
        pre, r, mul, last = {
            "gemma": (K.F32,) * 4, "llama": (K.F32, K.F32, cin, cout), "none": (cin,) * 4
        }[casting_mode]  # fmt: skip
        param = {"gemma": K.F32, "llama": cout, "none": cin}[casting_mode]
        flags = K.pack(
            x=(K.FX, cin), r=(K.FR, _CODES[rdt] if rdt else 0), y=(K.FY, cout),
            res=(K.FHAS_RES, rdt is not None), norm=(K.FNORM, K.RMS_NORM),
            eps=(K.FEPS, K.RMS if eps_mode == "rms" else K.MEAN_SQUARE),
            pre=(K.FC_PRE, pre), cr=(K.FC_R, r), mul=(K.FC_MUL, mul), out=(K.FC_OUT, last),
            w=(K.FW, _pc(wdt)), has_w=(K.FHAS_W, wdt is not None),
            b=(K.FB, _pc(bdt)), has_b=(K.FHAS_B, bdt is not None),
            param=(K.FC_PARAM, param),
        )  # fmt: skip
        plan = (out, flags)
    _rms_fwd_plans[key] = plan
    return plan


def _rms_bwd_plan(key: tuple) -> tuple:
    dydt, xdt, wdt, bdt, drdt, input_dtype, casting_mode, eps_mode, sdt = key
    _check_modes(eps_mode, casting_mode)
    plan = _REFERENCE
    stats_ok = sdt == _F32
    if stats_ok and _kernel_dtypes(dydt, xdt, drdt, input_dtype, params=(wdt, bdt)):
        flags = K.pack(
            dy=(K.BDY, _CODES[dydt]), x=(K.BX, _CODES[xdt]),
            dr=(K.BDR, _CODES[drdt] if drdt else 0), has_dr=(K.BHAS_DR, drdt is not None),
            norm=(K.BNORM, K.RMS_NORM), eps=(K.BEPS, K.RMS if eps_mode == "rms" else K.MEAN_SQUARE),
            xhat=(K.BC_XHAT, _CODES[input_dtype] if casting_mode == "llama" else K.F32),
            w=(K.BW, _pc(wdt)), has_w=(K.BHAS_W, wdt is not None), dw=(K.BDW, _pc(wdt)),
            db=(K.BDB, _pc(bdt)),
        )  # fmt: skip
        plan = (xdt, flags)
    _rms_bwd_plans[key] = plan
    return plan


def _row_layout(t: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:
    """(t, its row stride) as the kernels read rows: a 2-D tensor with a unit last stride keeps
    its row stride (strided rows are read in place); anything else is read contiguous."""
    if t.dim() == 2 and (t.stride(1) == 1 or n == 1):
        return t, t.stride(0)
    return (t if t.is_contiguous() else t.contiguous()), n


_scratch_rows = torch.empty(1024, dtype=_F32)


def _scratch(count: int) -> int:
    """The address of ``count`` float32s the kernel may write and nobody reads: the per-row
    statistics of a forward whose caller said it needs none (``stats=False``; an eager call without
    gradients), which then costs no allocation. Calls on several threads may share it: the values
    written there are never read."""
    global _scratch_rows
    rows = _scratch_rows
    if rows.shape[0] < count:
        rows = _scratch_rows = torch.empty(max(count, 2 * rows.numel()), dtype=_F32)
    return rows.data_ptr()


_NEED_DW = K.pack(f=(K.BNEED_DW, 1))
_NEED_DB = K.pack(f=(K.BNEED_DB, 1))


def _ln_fwd_plan(key: tuple) -> tuple:
    xdt, wdt, bdt = key
    plan = _REFERENCE
    if _kernel_dtypes(xdt, params=(wdt, bdt)):
        cx = _CODES[xdt]
        flags = K.pack(
            x=(K.FX, cx), y=(K.FY, cx), norm=(K.FNORM, K.LAYER_NORM),
            w=(K.FW, _pc(wdt)), has_w=(K.FHAS_W, wdt is not None),
            b=(K.FB, _pc(bdt)), has_b=(K.FHAS_B, bdt is not None),
        )  # fmt: skip
        plan = (xdt, flags)
    _ln_fwd_plans[key] = plan
    return plan


# The launchers below are written flat, without helper calls: at decoding sizes each Python-level
# step (~0.05-0.2 µs) is a visible part of the call.
# ----------------------------------------------------------------------------------------------
# RMSNorm
# ----------------------------------------------------------------------------------------------
def rms_norm_fwd(x, weight, bias, eps, eps_mode, casting_mode, offset, k, stats=True):
    """RMSNorm forward (:func:`rmsnorm.reference.rms_norm_fwd`)."""
    key = (
        x.dtype, None if weight is None else weight.dtype, None if bias is None else bias.dtype,
        None, casting_mode, eps_mode,
    )  # fmt: skip
    out, flags = _rms_fwd_plans.get(key) or _rms_fwd_plan(key)
    n = x.shape[-1]
    m = x.numel() // n if n else 0
    if out is None or not m:
        _to_reference("rms_norm_fwd", out is None)
        return ref.rms_norm_fwd(x, weight, bias, eps, eps_mode, casting_mode, offset, k)
    if x.is_contiguous():
        xs = n
    else:
        x, xs = _row_layout(x, n)
    wp = ws = bp = bs = 0
    if weight is not None:
        wp, ws = weight.data_ptr(), weight.stride(0)
    if bias is not None:
        bp, bs = bias.data_ptr(), bias.stride(0)
    y = torch.empty_like(x) if out is x.dtype else torch.empty_like(x, dtype=out)
    if stats:
        rstd = _F32_CPU.new_empty(m)
        rp = rstd.data_ptr()
    else:
        rstd = None
        rp = _scratch(m)
    if m * n < PARALLEL_MIN:  # the decoding-size case: called directly, no argument tuple
        _forward(
            0, x.data_ptr(), xs, 0, 0, 0, y.data_ptr(), wp, ws, bp, bs, 0, rp, m, n, k,
            float(eps), float(offset), flags,
        )  # fmt: skip
    else:
        _shared(
            _forward, x.data_ptr(), xs, 0, 0, 0, y.data_ptr(), wp, ws, bp, bs, 0, rp, m, n,
            k, float(eps), float(offset), flags,
        )  # fmt: skip
    return y, rstd


def add_rms_norm_fwd(x, residual, weight, bias, eps, eps_mode, casting_mode, offset, k, stats=True):
    """Residual add + RMSNorm forward (:func:`rmsnorm.reference.add_rms_norm_fwd`)."""
    key = (
        x.dtype, None if weight is None else weight.dtype, None if bias is None else bias.dtype,
        residual.dtype, casting_mode, eps_mode,
    )  # fmt: skip
    out, flags = _rms_fwd_plans.get(key) or _rms_fwd_plan(key)
    n = x.shape[-1]
    m = x.numel() // n if n else 0
    if out is None or not m:
        _to_reference("add_rms_norm_fwd", out is None)
        return ref.add_rms_norm_fwd(
            x, residual, weight, bias, eps, eps_mode, casting_mode, offset, k
        )
    x, xs = _row_layout(x, n)
    residual, rs = _row_layout(residual, n)
    wp = ws = bp = bs = 0
    if weight is not None:
        wp, ws = weight.data_ptr(), weight.stride(0)
    if bias is not None:
        bp, bs = bias.data_ptr(), bias.stride(0)
    y = torch.empty_like(x, dtype=out)
    h = torch.empty_like(x, dtype=residual.dtype)
    rstd = _F32_CPU.new_empty(m) if stats else None
    args = (
        x.data_ptr(), xs, residual.data_ptr(), rs, h.data_ptr(), y.data_ptr(), wp, ws, bp, bs, 0,
        rstd.data_ptr() if stats else _scratch(m), m, n, k, float(eps), float(offset), flags,
    )  # fmt: skip
    if m * n < PARALLEL_MIN:
        _forward(0, *args)
    else:
        _shared(_forward, *args)
    return y, h, rstd


def _bwd(dy, x, weight, bias, mean, rstd, dresidual, k, offset, flags, need_weight_grad):
    """The backward kernel's call: (dx, dw, db) with empty float32 tensors for absent gradients."""
    n = x.shape[-1]
    m = x.numel() // n
    if x.is_contiguous():  # (the common case, inline: a decoding-size call is mostly this code)
        xs = n
    else:
        x, xs = _row_layout(x, n)
    if dy.is_contiguous():
        dys = n
    else:
        dy, dys = _row_layout(dy, n)
    drp = drs = meanp = wp = ws = dwp = dbp = 0
    if dresidual is not None:
        dresidual, drs = _row_layout(dresidual, n)
        drp = dresidual.data_ptr()
    if not rstd.is_contiguous():
        rstd = rstd.contiguous()
    if mean is not None:
        mean = mean if mean.is_contiguous() else mean.contiguous()
        meanp = mean.data_ptr()
    dx = torch.empty_like(x)
    if need_weight_grad and weight is not None:
        dw = weight.new_empty(n)
        dwp = dw.data_ptr()
        flags |= _NEED_DW
    else:
        dw = _F32_CPU.new_empty(0)
    if need_weight_grad and bias is not None:
        db = bias.new_empty(n)
        dbp = db.data_ptr()
        flags |= _NEED_DB
    else:
        db = _F32_CPU.new_empty(0)
    if weight is not None:
        wp, ws = weight.data_ptr(), weight.stride(0)
    if m * n < PARALLEL_MIN:  # the decoding-size case: called directly, no argument tuple
        _backward(
            0, dy.data_ptr(), dys, x.data_ptr(), xs, drp, drs, dx.data_ptr(), wp, ws, meanp,
            rstd.data_ptr(), dwp, dbp, m, n, k, float(offset), flags,
        )  # fmt: skip
    else:
        _shared(
            _backward, dy.data_ptr(), dys, x.data_ptr(), xs, drp, drs, dx.data_ptr(), wp, ws,
            meanp, rstd.data_ptr(), dwp, dbp, m, n, k, float(offset), flags,
        )  # fmt: skip
    return dx, dw, db


def rms_norm_bwd(
    dy, x, weight, bias, rstd, dresidual, eps, eps_mode, casting_mode, offset, k, input_dtype,
    need_weight_grad=True,
):  # fmt: skip
    """RMSNorm backward (:func:`rmsnorm.reference.rms_norm_bwd`)."""
    key = (
        dy.dtype, x.dtype, None if weight is None else weight.dtype,
        None if bias is None else bias.dtype, None if dresidual is None else dresidual.dtype,
        input_dtype, casting_mode, eps_mode, rstd.dtype,
    )  # fmt: skip
    dxdt, flags = _rms_bwd_plans.get(key) or _rms_bwd_plan(key)
    if dxdt is None or not x.numel():
        _to_reference("rms_norm_bwd", dxdt is None)
        return ref.rms_norm_bwd(
            dy, x, weight, bias, rstd, dresidual, eps, eps_mode, casting_mode, offset, k,
            input_dtype, need_weight_grad,
        )  # fmt: skip
    return _bwd(dy, x, weight, bias, None, rstd, dresidual, k, offset, flags, need_weight_grad)


# ----------------------------------------------------------------------------------------------
# LayerNorm
# ----------------------------------------------------------------------------------------------
def layer_norm_fwd(x, weight, bias, eps, stats=True):
    """LayerNorm forward (:func:`rmsnorm.reference.layer_norm_fwd`)."""
    key = (x.dtype, None if weight is None else weight.dtype, None if bias is None else bias.dtype)
    out, flags = _ln_fwd_plans.get(key) or _ln_fwd_plan(key)
    n = x.shape[-1]
    m = x.numel() // n if n else 0
    if out is None or not m:
        _to_reference("layer_norm_fwd", out is None)
        return ref.layer_norm_fwd(x, weight, bias, eps)
    if x.is_contiguous():
        xs = n
    else:
        x, xs = _row_layout(x, n)
    wp = ws = bp = bs = 0
    if weight is not None:
        wp, ws = weight.data_ptr(), weight.stride(0)
    if bias is not None:
        bp, bs = bias.data_ptr(), bias.stride(0)
    y = torch.empty_like(x)
    if stats:
        mean, rstd = _F32_CPU.new_empty(m), _F32_CPU.new_empty(m)
        mp, rp = mean.data_ptr(), rstd.data_ptr()
    else:
        mean = rstd = None
        mp = _scratch(2 * m)
        rp = mp + 4 * m
    if m * n < PARALLEL_MIN:  # the decoding-size case: called directly, no argument tuple
        _forward(
            0, x.data_ptr(), xs, 0, 0, 0, y.data_ptr(), wp, ws, bp, bs, mp, rp, m, n, n,
            float(eps), 0.0, flags,
        )  # fmt: skip
    else:
        _shared(
            _forward, x.data_ptr(), xs, 0, 0, 0, y.data_ptr(), wp, ws, bp, bs, mp, rp, m, n,
            n, float(eps), 0.0, flags,
        )  # fmt: skip
    return y, mean, rstd


def layer_norm_bwd(dy, x, weight, bias, mean, rstd, need_weight_grad=True):
    """LayerNorm backward (:func:`rmsnorm.reference.layer_norm_bwd`)."""
    key = (
        dy.dtype, x.dtype, None if weight is None else weight.dtype,
        None if bias is None else bias.dtype, mean.dtype, rstd.dtype,
    )  # fmt: skip
    dxdt, flags = _ln_bwd_plans.get(key) or _ln_bwd_plan(key)
    if dxdt is None or not x.numel():
        _to_reference("layer_norm_bwd", dxdt is None)
        return ref.layer_norm_bwd(dy, x, weight, bias, mean, rstd, need_weight_grad)
    return _bwd(dy, x, weight, bias, mean, rstd, None, x.shape[-1], 0.0, flags, need_weight_grad)


def _ln_bwd_plan(key: tuple) -> tuple:
    dydt, xdt, wdt, bdt, meandt, sdt = key
    plan = _REFERENCE
    if meandt == _F32 and sdt == _F32 and _kernel_dtypes(dydt, xdt, params=(wdt, bdt)):
        flags = K.pack(
            dy=(K.BDY, _CODES[dydt]), x=(K.BX, _CODES[xdt]), norm=(K.BNORM, K.LAYER_NORM),
            w=(K.BW, _pc(wdt)), has_w=(K.BHAS_W, wdt is not None), dw=(K.BDW, _pc(wdt)),
            db=(K.BDB, _pc(bdt)),
        )  # fmt: skip
        plan = (xdt, flags)
    _ln_bwd_plans[key] = plan
    return plan
