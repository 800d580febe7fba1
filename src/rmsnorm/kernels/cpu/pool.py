"""Where a shared CPU kernel call runs: on an OpenMP team of torch's own threads, or with this
module's pool of helper threads (a forked process, where the parent's OpenMP team cannot run), or
on the calling thread alone. Nothing here sets a thread count anywhere: a call uses as many threads
as torch.get_num_threads() says at that moment.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import threading
import time

import numpy as np
import torch

from . import runtime as rt

USE_OPENMP = True  # False: share calls with the pool's helpers even where torch uses OpenMP
# From this many elements a shared call runs with the pool's helpers even where torch's OpenMP team
# could take it. On a machine that other work keeps busy the team's end barrier waits (spinning)
# for a member the scheduler has not run, while the pool's caller waits for no helper that has not
# begun a block: on 2 threads, under load, the pool took 0.18-0.93x the team's time at 1024 x 4096
# and 0.80-1.06x at 8192 x 4096 (docs/cpu.md, "Under contention"). Below it the team's threads,
# awake after torch's own ops, start a call sooner than a sleeping helper (a futex wake-up, ~45 µs
# idle) and the call is too short for a straggler to cost much. A size, never a timing.
POOL_FROM = 1 << 22
# After a task, a pool helper spins this long for the next one before it sleeps: back-to-back calls
# then find it awake (a futex wake-up took ~45 µs on this project's VM), and an idle pool costs
# nothing.
HELPER_SPIN_S = 100e-6


def _blocks(words: np.ndarray) -> None:
    """Write the registered block functions' addresses into task block or launch words."""
    for slot, body in rt.BLOCKS.items():
        words[rt.FNS + slot] = body.address


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
        serve = rt.entry_point(rt.serve)
        self.serve = serve
        self.block = np.zeros(rt.WORDS, np.int64)
        self.addr = self.block.ctypes.data
        _blocks(self.block)
        sched_yield, syscall, futex = _libc_addresses()
        self.block[rt.YIELD] = sched_yield
        self.block[rt.SYSCALL], self.block[rt.SYS_FUTEX] = syscall, futex
        self.block[rt.TIMESPEC : rt.TIMESPEC + 2] = (0, 100_000_000)  # futex timeout: 0.1 s
        # How many pause instructions make HELPER_SPIN_S: a pause takes 10 to 140 cycles depending
        # on the CPU. Timed here with a helper's own wait for a task that does not come, the
        # fastest of five tries: a try the scheduler interrupts only reads longer, so the minimum
        # is the CPU's own figure, not the machine's load. (It sets how long an idle helper spins
        # before it sleeps, nothing that decides which thread runs what.)
        self.block[rt.HELPER_SPINS] = 400
        tries = []
        for _ in range(5):
            t0 = time.perf_counter()
            serve(self.addr, 0, 0, 0)
            tries.append(time.perf_counter() - t0)
        pause_s = max(min(tries) / 400, 1e-9)
        self.block[rt.HELPER_SPINS] = max(100, int(HELPER_SPIN_S / pause_s))
        self.futex = bool(syscall and futex)
        self.busy = threading.Lock()
        self.wakes: list[threading.Lock] = []  # one per lock-waiting helper: released = "work"
        self.helpers = 0
        self.max_helpers = max(0, _cores() - 1)

    def _sleep_on_futex(self, index: int) -> None:
        self.serve(self.addr, index, 0, 1)  # returns only when STOP is set

    def _sleep_on_lock(self, index: int, wake: threading.Lock) -> None:
        last = 0
        while not self.block[rt.STOP]:
            wake.acquire()
            last = self.serve(self.addr, index, last, 0)

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
        self.block[rt.WANT] = helpers
        for wake in self.wakes[:helpers]:
            if wake.locked():
                wake.release()
        return self.addr


_pool: _Pool | None = None
_pool_lock = threading.Lock()
# Shared calls run on torch's OpenMP threads where this is not 0 (never in a forked process).
_gomp, _gomp_tid = (
    (0, 0) if sys.modules[__package__].forked or rt.TEAM_BODY is None else _openmp_runtime()
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
            block = _launch.block = np.zeros(rt.WORDS, np.int64)
            block[rt.MODE], block[rt.GOMP], block[rt.BODY] = rt.OPENMP, _gomp, rt.TEAM_BODY.address
            block[rt.TID] = _gomp_tid
            _blocks(block)
            _launch.addr = block.ctypes.data
        block[rt.TEAM] = threads
        return _launch.addr
    return pool.acquire(threads)


def shared(kernel, *args, elements: int = 0) -> None:
    """kernel(ctrl, *args) on an OpenMP team or with the pool's helpers (a call of ``elements`` ≥
    :data:`POOL_FROM`: the helpers), or kernel(0, *args) on this thread alone where torch is set to
    one thread or another call holds the pool. The blocks
    a call is split into depend on the sizes alone, so the way it runs never changes a result;
    under an oversubscribed machine the caller runs the blocks of a thread that does not start
    (runtime.py, work sharing)."""
    global _pool
    threads = torch.get_num_threads()
    if threads < 2:
        kernel(0, *args)
        return
    pool = _pool
    if pool is None:
        with _pool_lock:
            pool = _pool = _pool or _Pool()
    ctrl = pool.acquire(threads) if elements >= POOL_FROM else _acquire(pool, threads)
    try:
        kernel(ctrl, *args)
    finally:
        if ctrl and ctrl == pool.addr:
            pool.busy.release()
