"""The run loop of ``rmsnorm bench`` for every device: the copy ceiling, then each planned (op,
dtype, shape) over the providers, mode by mode, within a time budget. What differs between devices
(timer, plan, sizes, rounds, CUDA graphs, peers) is a :class:`Setup` from ``gpu.py`` / ``cpu.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from .. import _validate
from . import DEVICES, Row, check_device, format_gbps, make_row
from .measure import cuda_graph_replay, interleaved
from .providers import providers_for, random_inputs, timed_fn

__all__ = ["Item", "Setup", "Timer", "DryTimer", "measure"]

OPS = ("rms_norm", "add_rms_norm", "layer_norm", "gated_rms_norm", "gated_rms_norm_grouped")


@dataclass(frozen=True)
class Item:
    """One entry of a plan. ``kind`` ``"sweep"``: a median time per mode, reported as bandwidth;
    ``"decode"``: wall time per back-to-back call at a decoding size (host overhead included)."""

    op: str
    dtype: torch.dtype
    m: int
    n: int
    modes: tuple[str, ...]
    kind: str = "sweep"

    def shrunk(self) -> Item:
        """The same item at a tiny shape (dry runs)."""
        return Item(self.op, self.dtype, min(self.m, 8), min(self.n, 256), self.modes, self.kind)


class Timer:
    """Times callables on one device. Subclasses give :meth:`median_ms` (the sweeps' number);
    per-call wall time, CUDA-graph replay and the copy ceiling are the same everywhere."""

    device = "cpu"  # where the timed tensors live
    calls, repeats = 200, 5  # per_call_ms: back-to-back calls per repeat, repeats (median)

    def __init__(self) -> None:
        self._copy: dict = {}

    def median_ms(self, fn: Callable) -> float:
        raise NotImplementedError

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def copy_gbps(self, numel: int, dtype: torch.dtype) -> tuple[float, float]:
        """(GB/s, ms) of ``dst.copy_(src)`` over ``numel`` elements (read + write), cached."""
        key = (numel, dtype)
        if key not in self._copy:
            src = torch.randn(numel, device=self.device, dtype=torch.float32).to(dtype)
            dst = torch.empty_like(src)
            dst.copy_(src)  # first touch of dst's pages
            ms = self.median_ms(lambda: dst.copy_(src))
            self._copy[key] = (2 * numel * dtype.itemsize / (ms * 1e-3) / 1e9, ms)
            del src, dst
        return self._copy[key]

    def per_call_ms(self, fn: Callable) -> float:
        """Wall time per back-to-back call (host overhead included), median of the repeats."""
        for _ in range(10):
            fn()
        times = []
        for _ in range(self.repeats):
            self.sync()
            t0 = time.perf_counter()
            for _ in range(self.calls):
                fn()
            self.sync()
            times.append((time.perf_counter() - t0) / self.calls * 1e3)
        return sorted(times)[len(times) // 2]

    def graph_ms(self, fn: Callable, calls: int = 50) -> float:
        """Device time per call replayed from a CUDA graph holding ``calls`` calls."""
        return self.median_ms(cuda_graph_replay(fn, calls)) / calls


class DryTimer(Timer):
    """One call per measurement and no CUDA graphs: exercises the harness, not the kernels."""

    calls, repeats = 2, 1

    def median_ms(self, fn: Callable) -> float:
        t0 = time.perf_counter()
        fn()
        self.sync()
        return max(time.perf_counter() - t0, 1e-9) * 1e3

    def graph_ms(self, fn: Callable, calls: int = 1) -> float:
        return self.median_ms(fn)


@dataclass
class Setup:
    """What one device's run needs: its timer and plan, and how to treat them."""

    meta: dict  # the metadata columns of its rows (:func:`rmsnorm.bench.machine`)
    timer: Timer
    plan: list[Item]  # in priority order: what the budget skips comes last
    budget_s: float  # wall time of the main plan; float("inf") for none
    copy_numel: int  # elements of the copy ceiling's headline rows
    rounds: int = 1  # interleaved samples per (item, mode, provider); their median is reported
    graphs: bool = False  # forward decode calls also replayed from a CUDA graph
    liger: tuple | None = None  # Liger-Kernel's Functions, where importable
    compile: bool = True  # the torch.compile'd reference among the providers
    strict: bool = False  # a provider that fails is an error (dry runs), not a logged skip
    after_item: Callable[[], None] = lambda: None
    # forced kernel layouts: (meta, timer, start, budget_s of this run, log) -> rows
    variants: Callable[[dict, Timer, float, float, Callable], list[Row]] | None = None
    notes: list[str] = field(default_factory=list)  # logged before the run


def measure(
    device: str,
    *,
    quick: bool = False,
    variants: bool = False,
    budget_s: float | None = None,
    log: Callable[[str], object] = print,
    dry_run: bool = False,
    warm: tuple[int, int] | None = None,
    ops: Sequence[str] | None = None,
) -> list[Row]:
    """Time every planned (op, dtype, shape, mode, provider) on ``device``; returns the rows (copy
    rows too).

    ``quick``: a handful of shapes. ``variants``: also forced kernel layouts (GPU only).
    ``budget_s``: seconds for the main plan (default: the device's). ``dry_run``: the quick plan
    at tiny shapes on CPU tensors, one call per timing, no torch.compile: a check of the harness
    itself. ``warm=(i, n)`` (GPU): plan items i, i + n, ... once each, untimed, no rows; fills the
    on-disk kernel caches for a timed run that follows. ``ops``: the plan's items of these ops
    only."""
    from . import cpu, gpu

    setups = {"cuda": gpu.setup, "cpu": cpu.setup}
    if dry_run:
        _validate.one_of("device", device, DEVICES)
        setup = setups[device](quick=True, dry_run=True, warm=warm)
    else:
        setup = setups[check_device(device)](quick=quick, dry_run=False, warm=warm)
    if budget_s is not None and warm is None:
        setup.budget_s = _validate.positive_number("budget_s", budget_s)
    if ops is not None:
        for op in ops:
            _validate.one_of("ops", op, OPS)
        setup.plan = [item for item in setup.plan if item.op in ops]
    rows = _run(setup, variants, log)
    return [] if warm is not None else rows


def _run(setup: Setup, variants: bool, log: Callable[[str], object]) -> list[Row]:
    start = time.monotonic()
    meta, timer = setup.meta, setup.timer
    for note in setup.notes:
        log(note)
    providers = {op: providers_for(op, setup.liger, compile=setup.compile) for op in OPS}
    rows: list[Row] = []
    # The copy ceiling first, over the sweep's element count, once per dtype.
    for dtype in (torch.bfloat16, torch.float32):
        gbps, ms = timer.copy_gbps(setup.copy_numel, dtype)
        numel = setup.copy_numel
        rows.append(make_row(meta, "copy", "forward", "torch", dtype, 1, numel, "eager", ms, gbps))
        log(f"copy {dtype}: {format_gbps(gbps)} GB/s over {numel:,} elements")

    for item in setup.plan:
        if time.monotonic() - start > setup.budget_s:
            budget = f"time budget {setup.budget_s:.0f} s spent"
            log(f"skipped {item.op} {item.dtype} ({item.m}, {item.n}): {budget}")
            continue
        copy_gbps, _ = timer.copy_gbps(item.m * item.n, item.dtype)
        time_item = _decode if item.kind == "decode" else _sweep
        new = time_item(setup, item, providers[item.op], copy_gbps, log)
        rows += new
        setup.after_item()
        log(_progress(new, item, time.monotonic() - start))

    if variants and setup.variants is not None:
        rows += setup.variants(meta, timer, start, setup.budget_s, log)
    elif variants:
        log("variants: this device has one kernel layout; nothing to add")
    return rows


def _failed(setup: Setup, log, what: str, exc: Exception) -> None:
    if setup.strict:
        raise exc
    log(f"{what}: failed: {type(exc).__name__}: {exc}"[:300])


def _sweep(setup: Setup, item: Item, providers: dict, copy_gbps: float, log) -> list[Row]:
    """Each mode: the providers take turns for ``setup.rounds`` rounds on the same inputs, so a
    change in the machine's load hits them alike; the median of each one's samples is kept."""
    timer, rows = setup.timer, []
    inputs = random_inputs(item.op, item.m, item.n, item.dtype, grad=True, dev=timer.device)
    for mode in item.modes:

        def failed(name: str, exc: Exception, mode: str = mode) -> None:
            # a peer that cannot run a shape (Liger past N = 65536)
            _failed(setup, log, f"{item.op} {name} {mode} ({item.m}, {item.n})", exc)

        fns = {}
        for name, fn in providers.items():
            try:
                fns[name] = timed_fn(fn, inputs, mode)
            except Exception as exc:
                failed(name, exc)
        samples = interleaved(
            fns,
            rounds=setup.rounds,
            on_error=None if setup.strict else failed,
            timer=lambda fn: timer.median_ms(fn) * 1e-3,
        )
        for name, s in samples.items():
            ms = sorted(s)[len(s) // 2] * 1e3
            row = (item.op, mode, name, item.dtype, item.m, item.n, "eager", ms, copy_gbps)
            rows.append(make_row(setup.meta, *row))
        del fns
    return rows


def _decode(setup: Setup, item: Item, providers: dict, copy_gbps: float, log) -> list[Row]:
    """Each mode and provider: wall time per back-to-back call, and for the forward (no graph
    kept) per call replayed from a CUDA graph where the device has them."""
    timer, rows = setup.timer, []
    for mode in item.modes:
        forward = mode == "forward"
        inputs = random_inputs(
            item.op, item.m, item.n, item.dtype, grad=not forward, dev=timer.device
        )
        for name, fn in providers.items():
            timed = {}
            try:
                with torch.no_grad() if forward else nullcontext():
                    call = (
                        (lambda fn=fn, x=inputs: fn(*x)) if forward else timed_fn(fn, inputs, mode)
                    )
                    timed["eager"] = timer.per_call_ms(call)
                    if forward and setup.graphs:
                        timed["cuda_graph"] = timer.graph_ms(call)
            except Exception as exc:
                _failed(setup, log, f"{item.op} {name} {mode} ({item.m}, {item.n})", exc)
            for variant, ms in timed.items():
                row = (item.op, mode, name, item.dtype, item.m, item.n, variant, ms, copy_gbps)
                rows.append(make_row(setup.meta, *row))
    return rows


def _progress(rows: list[Row], item: Item, elapsed: float) -> str:
    """One line per item: this library's number per mode (and variant) against the best peer."""
    parts = []
    for mode in item.modes:
        for variant in ("eager", "cuda_graph"):
            cell = [r for r in rows if (r.mode, r.variant) == (mode, variant)]
            ours = next((r for r in cell if r.provider == "rmsnorm"), None)
            if ours is None:
                continue
            others = [r for r in cell if r.provider != "rmsnorm"]
            best = min(others, key=lambda r: r.ms, default=None)
            value = f"{ours.ms * 1e3:.1f}us" if item.kind == "decode" else f"{ours.pct_copy:.0f}%"
            vs = f" ({ours.ms / best.ms:.2f}x {best.provider})" if best else ""
            label = mode if variant == "eager" else f"{mode}/{variant}"
            parts.append(f"{label} {value}{vs}")
    dtype = str(item.dtype).removeprefix("torch.")
    head = f"[{elapsed:5.0f}s] {item.op} {dtype} ({item.m}, {item.n}): rmsnorm "
    return head + (", ".join(parts) or "no result")
