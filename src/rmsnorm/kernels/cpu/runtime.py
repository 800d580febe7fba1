"""The CPU kernels' thread runtime (numba): the task block the threads of a call share, how they
claim its blocks, the pool helpers' wait loop, the OpenMP team launch, and the bookkeeping of the
cached entry points. It knows nothing of norms: a task is a compiled block function run over
blocks 0 … nb − 1, each thread with a private float32 scratch of the size the task asks for.
"""

from __future__ import annotations

import inspect
import logging
import os
import platform
import time

import numpy as np
from llvmlite import ir
from numba import carray, types
from numba import njit as _numba_njit
from numba.extending import intrinsic


def njit(fn=None, **options):
    """numba's ``njit`` with ``error_model="numpy"`` (every function of the backend is compiled
    so): float division follows IEEE as torch's ops do (x/0 = ±inf, 0/0 = NaN), where numba's
    default ``"python"`` model raises ZeroDivisionError from inside a kernel (an all-zero row with
    eps = 0) and branches on every divisor. The integer divisors of the kernels (n, k, rows per
    block) are ≥ 1 by construction (the launchers send empty tensors to the reference), and no
    float is converted to an integer, so the model's other difference (integer division by zero
    giving 0) never applies."""
    options = {"error_model": "numpy", **options}
    return _numba_njit(**options) if fn is None else _numba_njit(**options)(fn)


_I8P, I32, _I64 = ir.IntType(8).as_pointer(), ir.IntType(32), ir.IntType(64)


def c32(v: int) -> ir.Constant:
    """A 32-bit integer constant of LLVM IR."""
    return ir.Constant(I32, v)


# ----------------------------------------------------------------------------------------------
# Addresses, atomics, calls through addresses and the spin-wait hint
# ----------------------------------------------------------------------------------------------
def lowered(sig):
    """Decorator: a numba intrinsic typed for exactly ``sig``'s argument types (any other call
    does not type), whose body is the decorated ``emit(builder, *args)``: LLVM values in, the
    result's LLVM value out (None for a void result). The typer declares one parameter per
    argument: numba would fold a ``*args`` typer as a star argument."""
    names = ("typingctx", *(f"a{i}" for i in range(len(sig.args))))
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]

    def make(emit):
        def codegen(context, builder, _sig, args):
            out = emit(builder, *args)
            return context.get_dummy_value() if out is None else out

        def typer(typingctx, *args):
            return (sig, codegen) if args == sig.args else None

        typer.__signature__ = inspect.Signature(params)
        typer.__name__ = typer.__qualname__ = emit.__name__
        typer.__doc__ = emit.__doc__
        return intrinsic(typer)

    return make


_W = types.int64  # an argument word: addresses, counts and bit patterns


def _pointer_intrinsic(elem, llvm_elem: ir.Type):
    @lowered(types.CPointer(elem)(_W))
    def ptr(b, addr):
        """The int64 address as a typed pointer (for ``numba.carray``)."""
        return b.inttoptr(addr, llvm_elem.as_pointer())

    return ptr


ptr_f32 = _pointer_intrinsic(types.float32, ir.FloatType())
ptr_f64 = _pointer_intrinsic(types.float64, ir.DoubleType())
ptr_u16 = _pointer_intrinsic(types.uint16, ir.IntType(16))
ptr_u8 = _pointer_intrinsic(types.uint8, ir.IntType(8))
ptr_i64 = _pointer_intrinsic(types.int64, _I64)


@lowered(_W(types.float64))
def f64_bits(b, v):
    """The bits of a float64 as an int64 (to carry ε in int64 argument words)."""
    return b.bitcast(v, _I64)


@lowered(types.float64(_W))
def bits_f64(b, v):
    return b.bitcast(v, ir.DoubleType())


@lowered(types.int64(_W, _W))
def _atomic_add(b, addr, val):
    """Atomically add val to the int64 at addr; returns the old value (sequentially consistent)."""
    return b.atomic_rmw("add", b.inttoptr(addr, _I64.as_pointer()), val, "seq_cst")


@lowered(types.int64(_W))
def _atomic_load(b, addr):
    return b.load_atomic(b.inttoptr(addr, _I64.as_pointer()), "seq_cst", 8)


@lowered(types.void(_W, _W))
def _atomic_store(b, addr, val):
    b.store_atomic(val, b.inttoptr(addr, _I64.as_pointer()), "seq_cst", 8)


def _at(b, addr, ret: ir.Type, *params: ir.Type, var_arg: bool = False):
    """The function at the int64 address addr, as a callable LLVM value of that type."""
    return b.inttoptr(addr, ir.FunctionType(ret, params, var_arg=var_arg).as_pointer())


@lowered(types.int64(_W, _W, _W, _W, _W, _W))
def _syscall4(b, addr, nr, a1, a2, a3, a4):
    """Call libc's ``long syscall(long nr, ...)`` at addr with four integer arguments (pointers as
    integers), declared variadic as it is."""
    return b.call(_at(b, addr, _I64, _I64, var_arg=True), [nr, a1, a2, a3, a4])


@lowered(types.void(_W, _W, _W, _W))
def _gomp_parallel(b, addr, body, data, threads):
    """Call ``void GOMP_parallel(void (*fn)(void *), void *data, unsigned threads, unsigned
    flags)`` at addr: run body(data) on a team of `threads` (this thread included) and return when
    every member has."""
    fn = _at(b, addr, ir.VoidType(), _I8P, _I8P, I32, I32)
    b.call(fn, [b.inttoptr(body, _I8P), b.inttoptr(data, _I8P), b.trunc(threads, I32), c32(0)])


_ARCH = platform.machine().lower()


@lowered(types.void())
def _pause(b):
    """The CPU's spin-wait hint (x86 ``pause``, ARM ``yield``), nothing elsewhere."""
    if _ARCH in ("x86_64", "amd64", "i386", "i686"):
        fnty = ir.FunctionType(ir.VoidType(), [])
        b.call(b.module.declare_intrinsic("llvm.x86.sse2.pause", fnty=fnty), [])
    elif _ARCH in ("aarch64", "arm64"):
        fnty = ir.FunctionType(ir.VoidType(), [I32])
        b.call(b.module.declare_intrinsic("llvm.aarch64.hint", fnty=fnty), [c32(1)])


@lowered(types.int64(_W))
def _call_int(b, addr):
    """Call ``int f(void)`` at addr (``omp_get_thread_num``) and return its value."""
    return b.sext(b.call(_at(b, addr, I32), []), _I64)


@lowered(types.void(_W))
def _call_int_void(b, addr):
    """Call ``int f(void)`` at addr (``sched_yield``). The address is a run-time value: code that
    embeds a library's address cannot be cached."""
    b.call(_at(b, addr, I32), [])


@lowered(types.void(_W, _W, _W, _W))
def _call_block(b, fn, args, blk, scratch):
    """Call a block function ``void fn(int64 args, int64 block, int64 scratch)`` at address fn."""
    b.call(_at(b, fn, ir.VoidType(), _I64, _I64, _I64), [args, blk, scratch])


# ----------------------------------------------------------------------------------------------
# Streaming stores: an output row written past the caches
# ----------------------------------------------------------------------------------------------
_X86 = _ARCH in ("x86_64", "amd64")


@lowered(types.void(_W, _W))
def stream_line(b, dst, src):
    """Copy the 64 bytes at src (any alignment) to dst (64-byte aligned) with a non-temporal store:
    the line goes to memory without first being read into the cache (an ordinary store reads it:
    a third of a large copy's traffic). Ordered by :func:`stream_fence`."""
    vt = ir.VectorType(_I64, 8)
    value = b.load(b.inttoptr(src, vt.as_pointer()), align=1)
    store = b.store(value, b.inttoptr(dst, vt.as_pointer()), align=64)
    store.set_metadata("nontemporal", b.module.add_metadata([c32(1)]))


@lowered(types.void())
def stream_fence(b):
    """Make this thread's non-temporal stores visible before its later stores (x86 ``sfence``):
    called once a thread's streamed rows are written, before it reports them done."""
    if _X86:
        fnty = ir.FunctionType(ir.VoidType(), [])
        b.call(b.module.declare_intrinsic("llvm.x86.sse.sfence", fnty=fnty), [])
    else:
        b.fence("seq_cst")


STREAM_BYTES_ENV = "RMSNORM_CPU_STREAM_BYTES"


def _last_level_cache_bytes() -> int | None:
    """The size of the largest data cache of CPU 0 (Linux sysfs; glibc's sysconf elsewhere), or None
    where neither says."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    sizes = []
    try:
        for entry in os.listdir(base):
            if not entry.startswith("index"):
                continue
            with open(os.path.join(base, entry, "type")) as f:
                if f.read().strip() == "Instruction":
                    continue
            with open(os.path.join(base, entry, "size")) as f:
                text = f.read().strip().upper()
            unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * unit)
    except (OSError, ValueError):
        pass
    if not sizes:
        for name in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
            try:
                size = os.sysconf(name)
            except (ValueError, OSError):
                continue
            if size > 0:
                sizes.append(size)
    return max(sizes) if sizes else None


def stream_rule(arch: str, cache_bytes: int | None) -> tuple[int | None, str]:
    """From how many bytes of a call's input and output together the forward writes its output with
    non-temporal stores, from the CPU alone (never from a timing): ``(bytes, why)``, None for never.

    - x86-64 with a known last-level cache: from that cache's size. A call whose rows do not fit in
      it leaves nothing of its output there for the next op anyway; its output then streams to
      memory without the read of each line that an ordinary store makes first. On the AMD EPYC
      host (Zen 4, 32 MiB L3) the float32 RMSNorm forward of 8192 × 4096 took 0.61× (one
      thread) and 0.75× (two) the time it takes with ordinary stores, the backwards 0.88-1.10×
      (benchmarks/results/cpu-amd/cpu_stream_stores.md).
    - Elsewhere (ARM, or no cache size known): never (not measured)."""
    if arch not in ("x86_64", "amd64"):
        return None, f"ordinary stores ({arch}: not measured)"
    if not cache_bytes:
        return None, "ordinary stores (the last-level cache's size is unknown)"
    return cache_bytes, f"non-temporal stores from {cache_bytes >> 20} MiB (the last-level cache)"


def _stream_bytes() -> tuple[int | None, str]:
    """This host's threshold: :func:`stream_rule`, unless ``RMSNORM_CPU_STREAM_BYTES`` gives one
    (a byte count; ``never``; ``auto`` or unset: the rule)."""
    at, why = stream_rule(_ARCH, _last_level_cache_bytes())
    wanted = os.environ.get(STREAM_BYTES_ENV, "auto").strip().lower()
    if wanted in ("", "auto"):
        return at, why
    if wanted == "never":
        return None, f"ordinary stores (set by {STREAM_BYTES_ENV}=never)"
    try:
        value = int(wanted)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(
            f"{STREAM_BYTES_ENV} must be a byte count (an integer >= 0), never or auto, "
            f"got {wanted!r}"
        )
    if not _X86:
        raise ValueError(f"{STREAM_BYTES_ENV}={wanted} needs an x86-64 CPU; this one is {_ARCH}")
    return value, f"non-temporal stores from {value} bytes (set by {STREAM_BYTES_ENV})"


STREAM_BYTES, STREAM_WHY = _stream_bytes()


VECTOR_BITS_ENV = "RMSNORM_CPU_VECTOR_BITS"
# Intel's Skylake-SP generation drops its clock on 512-bit instructions (LLVM's own models of every
# Intel part since keep preferring 256-bit vectors for it); the kernels take 256 there.
_CLOCK_DROP = ("skylake-avx512", "cascadelake", "cooperlake")
# AMD's Zen 4 runs a 512-bit instruction as two 256-bit halves (its vector units are 256 bits wide).
_HALF_WIDTH = ("znver4",)


def vector_width_rule(arch: str, cpu: str, features: dict) -> tuple[int | None, int | None, str]:
    """The vector widths the kernels ask LLVM for on a host, from what LLVM reports of its CPU
    alone (never from a timing): ``(forward bits, backward bits, why)``; None where LLVM keeps its
    own choice (no AVX-512 F, BW and VL: 256 bits at most with AVX2; NEON / SVE on ARM).

    - Intel parts after Skylake-SP (512-bit units): 512 both ways; on a ``rocketlake`` host the
      bf16 kernels took 0.72-0.93× their time with them
      (benchmarks/results/cpu-intel/cpu_vector_width*.md).
    - The Skylake-SP generation (``skylake-avx512``, ``cascadelake``, ``cooperlake``): 256, as
      LLVM's own model of them; their clock drops on 512-bit instructions.
    - AMD Zen 4 (``znver4``): 512 in the forward, 256 in the plain norms' backward. Its 512-bit
      instructions run as two halves; with 256-bit vectors the backward took 0.71-1.05× its time
      on one thread and 0.74-1.02× on two, while the bf16 forward of rows in cache took
      1.16-1.29× (benchmarks/results/cpu-amd/cpu_vector_width*.md). The gated kernels keep the
      forward's width both ways (their backward was not compared).
    - Any other AVX-512 part (Zen 5's units are 512 bits wide; later Intel parts): 512."""
    if arch not in ("x86_64", "amd64"):
        return None, None, f"LLVM's choice for {cpu} ({arch})"
    if not all(features.get(f) for f in ("avx512f", "avx512bw", "avx512vl")):
        return None, None, f"LLVM's choice for {cpu} (no AVX-512 BW / VL)"
    if cpu in _CLOCK_DROP:
        return 256, 256, f"{cpu}: its clock drops on 512-bit instructions"
    if cpu in _HALF_WIDTH:
        return 512, 256, f"{cpu}: its 512-bit instructions run as two 256-bit halves"
    return 512, 512, f"{cpu}: 512-bit vector units"


def _vector_widths() -> tuple[int | None, int | None, str]:
    """This host's widths: :func:`vector_width_rule`, unless ``RMSNORM_CPU_VECTOR_BITS`` names one
    for both directions (``256`` or ``512``; ``auto`` or unset: the rule)."""
    import llvmlite.binding as llvm

    cpu, features = llvm.get_host_cpu_name(), llvm.get_host_cpu_features()
    fwd, bwd, why = vector_width_rule(_ARCH, cpu, features)
    wanted = os.environ.get(VECTOR_BITS_ENV, "auto").strip().lower()
    if wanted in ("", "auto"):
        return fwd, bwd, why
    if wanted not in ("256", "512"):
        raise ValueError(f"{VECTOR_BITS_ENV} must be 256, 512 or auto, got {wanted!r}")
    if fwd is None and not (wanted == "256" and _ARCH in ("x86_64", "amd64")):
        raise ValueError(
            f"{VECTOR_BITS_ENV}={wanted} needs an x86-64 CPU"
            + (" with AVX-512 (F, BW, VL)" if wanted == "512" else "")
            + f"; this one is {cpu} ({_ARCH})"
        )
    return int(wanted), int(wanted), f"{cpu}: set by {VECTOR_BITS_ENV}={wanted}"


VECTOR_BITS, VECTOR_BITS_BWD, VECTOR_WHY = _vector_widths()


def _width_attribute(b, bits):
    # "prefer-vector-width" is a string attribute, which llvmlite's attribute set does not list (it
    # knows only enum attributes): it is added to the set directly.
    if bits is not None:
        set.add(b.function.attributes, f'"prefer-vector-width"="{bits}"')


@lowered(types.void())
def wide_vectors(b):
    """Called first in a compiled forward (or shared) function: LLVM vectorizes its loops (and
    those inlined into it) with :data:`VECTOR_BITS`-bit vectors where that is set; nothing
    elsewhere. LLVM reads the attribute per function: the user's own numba code is unaffected
    (numba's CPU features are per process)."""
    _width_attribute(b, VECTOR_BITS)


@lowered(types.void())
def wide_vectors_bwd(b):
    """As :func:`wide_vectors`, first in a function of the plain norms' backward
    (:data:`VECTOR_BITS_BWD`)."""
    _width_attribute(b, VECTOR_BITS_BWD)


# ----------------------------------------------------------------------------------------------
# The task block: one int64 array per work-sharing pool, read by every thread of a call. The words
# the threads update are a cache line (8 words) apart.
# ----------------------------------------------------------------------------------------------
_GEN, _ARRIVED, _DONE, _ACTIVE = 0, 8, 16, 24  # generation (odd while written), arrivals, done
_SLEEPERS = 32  # helpers asleep in futex_wait on the generation word
HELPED = 36  # blocks the helpers have run, in all (for tests and measurements)
HELPER_SPINS = 37  # a helper's pause-loop iterations between a task and sleep (set by the pool)
# What `ctrl` points to: a pool's task block (MODE = POOL), or an OpenMP launch (MODE = OPENMP:
# GOMP_parallel's address, the team body's address, the team size); the call then fills a private
# task block and runs it on an OpenMP team (torch's own threads).
MODE, GOMP, BODY, TEAM = 38, 39, 33, 34
TID = 35  # omp_get_thread_num's address (0 where not found: team members take ranges as they come)
POOL, OPENMP = 0, 1
# set once by the pool: sched_yield's and syscall's addresses, the futex number, a stop flag, and
# the helpers' futex timeout as a struct timespec (seconds, nanoseconds)
YIELD, SYSCALL, SYS_FUTEX, STOP, TIMESPEC = 40, 41, 42, 43, 44  # (44, 45: the timespec)
WANT = 46  # helpers allowed to join the next task (written by the launcher before the call)
# the task: blocks, the block function's address, its argument block, float32 scratch per thread
_NB, _FN, _ARGS, _SCRATCH = 48, 49, 50, 51
_PARTS = 52  # the contiguous ranges the blocks are split into (one per thread of the call)
# The addresses of the registered block functions (BLOCKS), written by the host into every pool
# block and OpenMP launch: a kernel that takes only `ctrl` finds its block function there.
FNS, MAX_FNS = 56, 8
# Range t's claim counter is word _CNT + 8·t (a cache line each), t < MAX_PARTS.
_CNT, MAX_PARTS = 64, 64
WORDS = _CNT + 8 * MAX_PARTS
SPINS = 2000  # pause-loop iterations before a waiting thread starts yielding its core (~20-60 µs)
_FUTEX_WAIT, _FUTEX_WAKE = 128, 129  # FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE
BLOCKS: dict = {}  # {FNS slot: block function}, their addresses written into every task block


def register_block(slot: int, body):
    """Put the block function ``body`` (a C callback of :meth:`Entries.block`) in FNS slot `slot`
    of every task block, for a kernel that takes only `ctrl` (it reads the slot with
    :func:`block_fn`); returns body."""
    if not 0 <= slot < MAX_FNS or BLOCKS.get(slot, body) is not body:
        raise ValueError(f"block function slot {slot} is taken or out of range")
    BLOCKS[slot] = body
    return body


@njit
def block_fn(ctrl, slot):
    """The address of the block function registered in `slot`, from the words at ctrl (≠ 0)."""
    return carray(ptr_i64(ctrl), WORDS)[FNS + slot]


@njit
def _addr(c, i):
    """Address of word i of the task block c."""
    return np.int64(c.ctypes.data) + 8 * i


@njit
def _backoff(c, spins):
    """One step of a wait: spin on the CPU's pause hint, then yield the core between checks (a
    helper that was preempted mid-block finishes sooner when the waiter gives its core away)."""
    if spins >= SPINS and c[YIELD] != 0:
        _call_int_void(c[YIELD])
    else:
        _pause()
    return spins + 1


# ----------------------------------------------------------------------------------------------
# Work sharing. A call's blocks are split into `parts` contiguous ranges, one per thread of the
# call, each with its own claim counter. Thread t of the call (the caller is 0; an OpenMP team
# member's number, a pool helper's index + 1) runs range t's blocks in order, streaming through
# memory as thread t of torch's own parallel_for does — and the same rows in a forward and in the
# backward that follows, which finds them in its core's cache where they fit — then it takes the
# blocks still left in the other ranges, one at a time. So no thread waits for another to start:
# the blocks of a thread that arrives late (or never: a helper the scheduler does not run) are run
# by the others, and the caller only waits for blocks already claimed. Blocks depend on the sizes
# alone, never on the threads, so neither the number of threads nor which thread ran which block
# changes a result.
# ----------------------------------------------------------------------------------------------
@njit
def _set_ranges(c, nb, parts):
    """Split the nb blocks into `parts` contiguous ranges (their claim counters at their starts)."""
    c[_PARTS] = parts
    for t in range(parts):
        c[_CNT + 8 * t] = t * nb // parts


@njit
def _left(c, nb, parts):
    """Whether some range still has a block nobody has claimed."""
    for t in range(parts):
        if _atomic_load(_addr(c, _CNT + 8 * t)) < (t + 1) * nb // parts:
            return True
    return False


@njit
def _claim(c, me):
    """Join the published task as thread `me` (< 0: the next free range, in order of arrival):
    run the blocks of range `me`, then those left in the others' (see above); returns how many
    blocks it ran."""
    nb, parts = c[_NB], c[_PARTS]
    if me < 0:
        me = _atomic_add(_addr(c, _ARRIVED), 1)
    me = me % parts
    if not _left(c, nb, parts):
        return 0
    scratch = np.empty(max(1, c[_SCRATCH]), np.float32)  # this thread's, for all its blocks
    base = np.int64(scratch.ctypes.data)
    fn, args = c[_FN], c[_ARGS]
    ran = 0
    for step in range(parts):
        t = (me + step) % parts
        hi = (t + 1) * nb // parts
        counter = _addr(c, _CNT + 8 * t)
        while _atomic_load(counter) < hi:
            blk = _atomic_add(counter, 1)
            if blk >= hi:
                break
            ran += 1
            _call_block(fn, args, blk, base)
            _atomic_add(_addr(c, _DONE), 1)
    scratch[:0] = 0.0  # the scratch rows live until here
    return ran


@njit
def _publish_begin(c):
    """Mark the task block as being written and wait until no helper is inside the last task (a
    helper registers in ACTIVE, then checks the generation: one of the two sides sees the other)."""
    gen = _atomic_load(_addr(c, _GEN))
    _atomic_store(_addr(c, _GEN), gen + 1)
    spins = 0
    while _atomic_load(_addr(c, _ACTIVE)) != 0:
        spins = _backoff(c, spins)
    return gen + 2


@njit
def _run_published(c, gen, nb):
    """Publish generation gen (the task words are written), run blocks, wait for the blocks others
    claimed."""
    _atomic_store(_addr(c, _ARRIVED), 0)
    _atomic_store(_addr(c, _DONE), 0)
    _atomic_store(_addr(c, _GEN), gen)
    # A helper counts itself in SLEEPERS before its last look at GEN: one of the two sides sees
    # the other, so no wake-up is lost and none is made while every helper is awake.
    if _atomic_load(_addr(c, _SLEEPERS)) > 0:
        _syscall4(c[SYSCALL], c[SYS_FUTEX], _addr(c, _GEN), _FUTEX_WAKE, 1 << 30, 0)
    _claim(c, 0)
    spins = 0
    while _atomic_load(_addr(c, _DONE)) < nb:
        spins = _backoff(c, spins)


@njit
def run_blocks(ctrl, fn, args, nb, scratch):
    """Run blocks 0 … nb − 1 of the block function at address fn (``void fn(int64 args, int64
    block, int64 scratch)``, a C callback of :meth:`Entries.block`) with its argument block at
    args: on this thread alone (ctrl = 0), with the pool's helpers or on an OpenMP team (ctrl as
    :mod:`.pool` gives it). Every thread gets `scratch` private float32s for all its blocks.
    Blocks must depend on the sizes alone, so that results do not depend on the threads."""
    if ctrl == 0:
        rows = np.empty(max(1, scratch), np.float32)
        base = np.int64(rows.ctypes.data)
        for blk in range(nb):
            _call_block(fn, args, blk, base)
        rows[:0] = 0.0
        return
    launch = carray(ptr_i64(ctrl), WORDS)
    pooled = launch[MODE] == POOL
    if pooled:  # the pool's own block: wait out the last task's helpers, then write it
        c = launch
        gen = _publish_begin(c)
    else:  # a private block (every word a task reads is written first)
        c = np.empty(WORDS, np.int64)
        c[_ARRIVED] = 0
        c[_DONE] = 0
        gen = 0
    c[_NB], c[_FN], c[_ARGS], c[_SCRATCH] = nb, fn, args, scratch
    if pooled:
        _set_ranges(c, nb, min(1 + c[WANT], nb, MAX_PARTS))
        _run_published(c, gen, nb)
        return
    team = min(launch[TEAM], nb, MAX_PARTS)  # no more threads than blocks
    _set_ranges(c, nb, team)
    c[TID] = launch[TID]
    if team < 2:
        _claim(c, 0)
    else:
        _gomp_parallel(launch[GOMP], launch[BODY], np.int64(c.ctypes.data), team)


@njit
def _next_task(c, last, forever):
    """Wait for a task newer than generation `last`; its generation, or `last` if none came (after
    a short spin when not `forever`; when the pool stops, always)."""
    spins = 0
    while True:
        gen = _atomic_load(_addr(c, _GEN))
        if gen != last and not gen & 1:
            return gen
        if _atomic_load(_addr(c, STOP)) != 0:
            return last
        if spins < c[HELPER_SPINS]:
            _pause()
            spins += 1
        elif not forever:
            return last
        else:  # sleep until the generation word changes (or the timeout: STOP is re-read)
            _atomic_add(_addr(c, _SLEEPERS), 1)
            if _atomic_load(_addr(c, _GEN)) == gen:
                word, timeout = _addr(c, _GEN), _addr(c, TIMESPEC)
                _syscall4(c[SYSCALL], c[SYS_FUTEX], word, _FUTEX_WAIT, gen & 0xFFFFFFFF, timeout)
            _atomic_add(_addr(c, _SLEEPERS), -1)  # (a timeout goes back to sleep at once)


# ----------------------------------------------------------------------------------------------
# Compiled entry points: one signature each, loaded from numba's on-disk cache where possible
# ----------------------------------------------------------------------------------------------
_CPU_DIR = os.path.dirname(os.path.abspath(__file__))


class Entries:
    """The entry points and C callbacks of one module, compiled with one signature each and cached
    on disk. numba's cache only watches the file of the cached function, while the code it caches
    includes every function it calls: each cache index here is also stamped with the files named
    (this one always), so that an edit of any of them recompiles, and with the vector width (which
    ``RMSNORM_CPU_VECTOR_BITS`` may change on one host: a change recompiles)."""

    def __init__(self, *sources: str) -> None:
        self.items: list = []  # (dispatcher or C callback, argument types or None)
        self.cached = True  # False where no cache directory is writable
        self.sources = [__file__, *sources]

    def _stamp(self, compiled) -> None:
        try:
            cache_file = compiled._cache._cache_file
            stats = [os.stat(f) for f in self.sources]
            cache_file._source_stamp = (
                cache_file._source_stamp,
                *((st.st_mtime, st.st_size) for st in stats),
                ("prefer-vector-width", VECTOR_BITS, VECTOR_BITS_BWD),
            )
        except (AttributeError, OSError):  # another numba, or no cache: nothing to keep fresh
            pass

    def entry(self, *argtypes):
        """Decorator: fn compiled (nogil, cached) for the argument types ``argtypes`` alone."""

        def wrap(fn):
            try:
                disp = njit(nogil=True, cache=True)(fn)
            except RuntimeError:  # numba found no writable cache directory ("no locator")
                self.cached = False
                disp = njit(nogil=True)(fn)
            self._stamp(disp)
            self.items.append((disp, argtypes))
            return disp

        return wrap

    def callback(self, fn, argtypes=(types.voidptr,)):
        """fn as a cached C callback ``void fn(argtypes)``; None where this numba has no such
        class (then nothing runs on an OpenMP team)."""
        try:  # numba's C-callback class, built here so that compile_all compiles it with the rest
            from numba.core.ccallback import CFunc

            body = CFunc(fn, (argtypes, types.void), locals={}, options={"error_model": "numpy"})
        except (ImportError, TypeError):
            return None
        try:
            body.enable_caching()
        except RuntimeError:  # no writable cache directory
            self.cached = False
        self._stamp(body)
        self.items.append((body, None))
        return body

    def block(self, fn):
        """fn(args, block, scratch) as a block function of :func:`run_blocks`."""
        body = self.callback(fn, (types.int64,) * 3)
        if body is None:
            raise ImportError("this numba has no C callbacks (numba.core.ccallback.CFunc)")
        return body

    def compile_all(self) -> int:
        """Load every entry point from the cache, or compile it (and cache it where possible);
        then refuse further compilation, so that an argument of a wrong type fails instead of
        compiling. Returns how many were compiled rather than loaded."""
        misses = 0
        for compiled, argtypes in self.items:
            if argtypes is None:
                compiled.compile()
                misses += not compiled.cache_hits
            else:
                compiled.compile(argtypes)
                compiled.disable_compile()
                misses += sum(compiled.stats.cache_misses.values())
        return misses

    def cache_state(self) -> tuple[bool | None, str | None]:
        """(whether every entry point is in numba's on-disk cache, the cache directory); (False,
        None) where nothing can be cached, (None, None) where this numba does not let it be told."""
        if not self.cached:
            return False, None
        try:
            found = []
            for compiled, argtypes in self.items:
                if argtypes is None:
                    ctx = compiled._targetdescr.target_context
                    key = compiled._cache._index_key(compiled._sig, ctx.codegen())
                else:
                    compiled.targetctx.refresh()
                    key = compiled._cache._index_key(argtypes, compiled.targetctx.codegen())
                found.append(key in compiled._cache._cache_file._load_index())
            return all(found), self.items[0][0]._cache.cache_path
        except Exception:  # private numba API: only the message depends on it
            return None, None


_told_no_cache = False


def load(what: str, *registries: Entries) -> dict:
    """Load the entry points of ``registries`` (compiling them where numba's cache does not hold
    them), saying so once; ``{"compiled", "cached_in", "seconds"}``."""
    global _told_no_cache
    log = logging.getLogger("rmsnorm")
    states = [r.cache_state() for r in registries]
    where = next((w for _, w in states if w is not None), None)
    if any(r.cached is False for r in registries):
        if not _told_no_cache:  # once a process, for every module's kernels
            _told_no_cache = True
            log.warning(
                "rmsnorm: no writable cache directory for the CPU kernels (the package directory, "
                "NUMBA_CACHE_DIR and the user cache are read-only), so this process compiles them "
                "(30–60 s) and no later process can reuse them; set NUMBA_CACHE_DIR to a writable "
                "directory to keep them"
            )
    elif any(cached is False for cached, _ in states):
        log.warning("rmsnorm: compiling %s (once, 30–60 s; cached in %s)", what, where)
    t0 = time.perf_counter()
    misses = sum(r.compile_all() for r in registries)
    seconds = time.perf_counter() - t0
    if misses and all(cached is None for cached, _ in states):  # the cache could not be inspected
        log.warning("rmsnorm: compiled %s in %.0f s (cached in %s)", what, seconds, where)
    return {"compiled": misses > 0, "cached_in": where, "seconds": seconds}


def entry_point(disp):
    """The compiled function behind an entry point's one signature. Calling it skips the
    dispatcher's type resolution (~0.2 µs a call); the arguments must then have exactly the
    signature's types (Python ints and floats), which the launchers guarantee."""
    try:
        (cres,) = disp.overloads.values()
        return cres.entry_point
    except (AttributeError, ValueError):  # another numba: the dispatcher itself
        return disp


ENTRIES = Entries()
_i = types.int64


@ENTRIES.entry(_i, _i, _i, _i)
def serve(ctrl, index, last, forever):
    """A pool helper's work: help with each published task (claim its blocks) while `index` is
    below the task's WANT. With `forever`, loop until STOP, sleeping in futex_wait between tasks
    (Linux); else return after one task (or a short wait for one). Returns the last generation."""
    c = carray(ptr_i64(ctrl), WORDS)
    while True:
        gen = _next_task(c, last, forever)
        if gen == last:
            return last
        last = gen
        _atomic_add(_addr(c, _ACTIVE), 1)
        if _atomic_load(_addr(c, _GEN)) == gen and index < c[WANT]:
            _atomic_add(_addr(c, HELPED), _claim(c, index + 1))
        _atomic_add(_addr(c, _ACTIVE), -1)
        if not forever:
            return last


def _team_member(data):
    """What every member of an OpenMP team runs: claim blocks of the task block at data, from the
    range of its thread number."""
    c = carray(data, (WORDS,), np.int64)
    _claim(c, _call_int(c[TID]) if c[TID] != 0 else -1)


# The team body: a C callback that GOMP_parallel runs on every member of a team (None: another
# numba, where calls are shared with the helper pool only).
TEAM_BODY = ENTRIES.callback(_team_member)
