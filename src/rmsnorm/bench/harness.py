"""The one harness of ``rmsnorm bench``, for both modes and every device: a plan of items run in
priority order within a time budget (with a progress bar and a line per item), the device's timer,
and the timing of providers taking turns. The throughput mode times an item as bandwidth or per-call
time (here), the latency mode as a cell of passes (``latency.py``); what differs between devices
(timer, plan, sizes, rounds, CUDA graphs, peers) is a :class:`Setup` from ``gpu.py`` / ``cpu.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from .._progress import ensure
from .._timing import cuda_graph_replay, interleaved, median, sync
from . import providers as _providers
from .providers import random_inputs, timed_fn
from .rows import Row, format_gbps, make_row

__all__ = [
    "Item",
    "Setup",
    "Timer",
    "DryTimer",
    "run",
    "time_interleaved",
    "graph_replays",
    "time_throughput_item",
]


@dataclass(frozen=True)
class Item:
    """One entry of a plan. Throughput kinds: ``"sweep"``, a median time per mode reported as
    bandwidth; ``"decode"``, wall time per back-to-back call at a decoding size (host overhead
    included). Latency kinds: ``"cell"``, every pass of every provider at one (M, N, dtype);
    ``"generate"``, greedy generate() of a model of hidden size N."""

    op: str
    dtype: torch.dtype
    m: int
    n: int
    modes: tuple[str, ...]
    kind: str = "sweep"

    def shrunk(self) -> Item:
        """The same item at a tiny shape (dry runs)."""
        return Item(self.op, self.dtype, min(self.m, 8), min(self.n, 256), self.modes, self.kind)

    def label(self) -> str:
        """The item as the run's log names it."""
        dtype = str(self.dtype).removeprefix("torch.")
        if self.kind == "cell":
            return f"({self.m}, {self.n}) {dtype}"
        if self.kind == "generate":
            return f"generate (hidden {self.n})"
        return f"{self.op} {self.dtype} ({self.m}, {self.n})"


class Timer:
    """Times callables on one device. Subclasses give :meth:`median_ms` (the sweeps' number);
    per-call wall time, CUDA-graph replay and the copy ceiling are the same everywhere."""

    device = "cpu"  # where the timed tensors live
    calls, repeats = 200, 5  # per_call_ms: back-to-back calls per repeat, repeats (median)

    def __init__(self, device: str | None = None) -> None:
        if device is not None:
            self.device = device
        self._copy: dict = {}

    def median_ms(self, fn: Callable) -> float:
        raise NotImplementedError

    def sync(self) -> None:
        sync(self.device)

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


# (setup, item, log) -> the item's rows
TimeItem = Callable[["Setup", Item, Callable[[str], object]], list[Row]]
# (the item's rows, item, seconds since the start) -> its progress line, or None for none
ItemLine = Callable[[list[Row], Item, float], "str | None"]


@dataclass
class Setup:
    """What one run needs: its timer and plan, how to time an item, and how to treat them."""

    meta: dict  # the metadata columns of its rows (:func:`rmsnorm.bench.rows.machine`)
    timer: Timer
    plan: list[Item]  # in priority order: what the budget skips comes last
    budget_s: float  # wall time of the main plan; float("inf") for none
    copy_numel: int | None = None  # elements of the copy ceiling's headline rows; None: none
    rounds: int = 1  # interleaved samples per (item, mode, provider); their median is reported
    graphs: bool = False  # forward decode calls also replayed from a CUDA graph
    liger: tuple | None = None  # Liger-Kernel's Functions, where importable
    compile: bool = True  # the torch.compile'd reference among the providers
    strict: bool = False  # a provider that fails is an error (dry runs), not a logged skip
    after_item: Callable[[], None] = lambda: None
    # forced kernel layouts: (meta, timer, start, budget_s of this run, log) -> rows
    variants: Callable[[dict, Timer, float, float, Callable], list[Row]] | None = None
    notes: list[str] = field(default_factory=list)  # logged before the run
    title: str = "bench"  # the progress bar's
    time_item: TimeItem | None = None  # None: the throughput mode's (time_throughput_item)
    item_line: ItemLine | None = None  # None: the throughput mode's
    providers: dict = field(default_factory=dict)  # op -> {name: fn}, filled as items need them


def run(
    setup: Setup,
    variants: bool = False,
    log: Callable[[str], object] = print,
    progress=None,
) -> list[Row]:
    """Time the copy ceiling (where the setup has one), then every item of the plan in order until
    the budget is spent (the rest skipped, a line each), then the forced kernel layouts
    (``variants``, where the device has them). ``progress``: an :mod:`rmsnorm._progress` object."""
    start = time.monotonic()
    meta, timer = setup.meta, setup.timer
    time_item = setup.time_item or time_throughput_item
    item_line = setup.item_line or _throughput_line
    for note in setup.notes:
        log(note)
    rows: list[Row] = []
    if setup.copy_numel is not None:  # the copy ceiling over the sweep's elements, per dtype
        for dtype in (torch.bfloat16, torch.float32):
            gbps, ms = timer.copy_gbps(setup.copy_numel, dtype)
            numel = setup.copy_numel
            rows.append(
                make_row(meta, "copy", "forward", "torch", dtype, 1, numel, "eager", ms, gbps)
            )
            log(f"copy {dtype}: {format_gbps(gbps)} GB/s over {numel:,} elements")

    with ensure(progress).task(setup.title, total=len(setup.plan)) as advance:
        for item in setup.plan:
            if time.monotonic() - start > setup.budget_s:
                log(f"skipped {item.label()}: time budget {setup.budget_s:.0f} s spent")
                advance()
                continue
            new = time_item(setup, item, log)
            rows += new
            setup.after_item()
            line = item_line(new, item, time.monotonic() - start)
            if line is not None:
                log(line)
            advance()

    if variants and setup.variants is not None:
        rows += setup.variants(meta, timer, start, setup.budget_s, log)
    elif variants:
        log("variants: this device has one kernel layout; nothing to add")
    return rows


def time_interleaved(
    fns: Mapping[Hashable, Callable[[], object]],
    *,
    rounds: int,
    sample_s: Callable[[Callable[[], object]], float] | None = None,
    min_run_time: float = 0.05,
    warmup: int = 1,
    on_error: Callable[[Hashable, Exception], None] | None = None,
) -> dict[Hashable, float]:
    """{key: median ms per call} of ``fns`` taking turns over ``rounds`` rounds
    (:func:`rmsnorm._timing.interleaved`; ``sample_s``: seconds per call of one sample, default
    a ``blocked_autorange`` median over ``min_run_time`` seconds). A callable that raises is
    dropped and reported to ``on_error``; without it the exception propagates."""
    samples = interleaved(
        fns,
        rounds=rounds,
        min_run_time=min_run_time,
        warmup=warmup,
        on_error=on_error,
        timer=sample_s,
    )
    return {key: median(s) * 1e3 for key, s in samples.items()}


def graph_replays(
    fns: Mapping[Hashable, Callable[[], object]],
    calls: int,
    on_error: Callable[[Hashable, Exception], None] | None = None,
) -> dict[Hashable, Callable[[], None]]:
    """{key: the replay of a CUDA graph holding ``calls`` calls of fn}; one that cannot be
    captured is reported to ``on_error`` (raised without it) and left out."""
    out = {}
    for key, fn in fns.items():
        try:
            out[key] = cuda_graph_replay(fn, calls)
        except Exception as exc:
            if on_error is None:
                raise
            on_error(key, exc)
    return out


# ----------------------------------------------------------------------------------------------
# The throughput mode's items
# ----------------------------------------------------------------------------------------------
def _failed(setup: Setup, log, what: str, exc: Exception) -> None:
    if setup.strict:
        raise exc
    log(f"{what}: failed: {type(exc).__name__}: {exc}"[:300])


def time_throughput_item(setup: Setup, item: Item, log) -> list[Row]:
    """A ``"sweep"`` or ``"decode"`` item over the providers of its op."""
    if item.op not in setup.providers:
        table = _providers.providers_for(item.op, setup.liger, compile=setup.compile)
        setup.providers[item.op] = table
    copy_gbps, _ = setup.timer.copy_gbps(item.m * item.n, item.dtype)
    time_kind = _decode if item.kind == "decode" else _sweep
    return time_kind(setup, item, setup.providers[item.op], copy_gbps, log)


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
        times = time_interleaved(
            fns,
            rounds=setup.rounds,
            sample_s=lambda fn: timer.median_ms(fn) * 1e-3,
            on_error=None if setup.strict else failed,
        )
        for name, ms in times.items():
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


def _throughput_line(rows: list[Row], item: Item, elapsed: float) -> str:
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
