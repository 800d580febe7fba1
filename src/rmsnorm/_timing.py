"""The one loop that times a call, used by ``rmsnorm bench`` (both modes), the report's timing
and ``rmsnorm compare``'s norm-only timing: ``torch.utils.benchmark``'s ``blocked_autorange`` at the
process's torch thread count, the callables taking turns so that a change in the machine's load
hits all of them alike; and the one capture of calls in a CUDA graph that GPU timings replay."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable, Mapping, Sequence

import torch

from ._validate import positive_int

__all__ = ["per_call_s", "interleaved", "cuda_graph_replay", "median", "sync"]


def per_call_s(fn: Callable[[], object], min_run_time: float = 0.05) -> float:
    """Median seconds per call of ``fn``: ``blocked_autorange`` runs blocks of back-to-back calls
    for at least ``min_run_time`` seconds and reports the median over blocks of the mean per call.

    The timer runs at ``torch.get_num_threads()`` threads (``Timer`` sets 1 by default, which
    would time every multithreaded CPU kernel single-threaded) and, where a CUDA device is
    present, synchronizes it at the start and end of each block, so a GPU time is wall time per
    back-to-back call."""
    from torch.utils.benchmark import Timer

    timer = Timer("fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time).median


def interleaved(
    fns: Mapping[Hashable, Callable[[], object]],
    *,
    rounds: int = 3,
    min_run_time: float = 0.05,
    start: int = 0,
    warmup: int = 1,
    on_error: Callable[[Hashable, Exception], None] | None = None,
    on_round: Callable[[], None] | None = None,
    timer: Callable[[Callable[[], object]], float] | None = None,
) -> dict[Hashable, list[float]]:
    """Seconds per call of each of ``fns``, one :func:`per_call_s` sample per round (or one
    ``timer(fn)`` sample, seconds per call, where a device has a better clock: the GPU benchmark
    passes Triton's ``do_bench``).

    Within a round every callable is timed once, in turn; the order rotates by one from round to
    round (starting at index ``start``), so no callable always runs first or right after a given
    one. Each is called ``warmup`` times first (JIT compilation, caches, first touch of buffers).
    A callable that raises is dropped and reported to ``on_error(key, exc)``; without
    ``on_error`` the exception propagates. ``on_round()`` is called after each round (progress).
    """
    positive_int("rounds", rounds)
    live: dict[Hashable, Callable[[], object]] = {}
    for key, fn in fns.items():
        try:
            for _ in range(warmup):
                fn()
        except Exception as exc:
            if on_error is None:
                raise
            on_error(key, exc)
            continue
        live[key] = fn
    samples: dict[Hashable, list[float]] = {key: [] for key in live}
    keys = list(live)
    for i in range(rounds):
        for j in range(len(keys)):
            key = keys[(start + i + j) % len(keys)]
            if key not in live:
                continue
            try:
                fn = live[key]
                samples[key].append(per_call_s(fn, min_run_time) if timer is None else timer(fn))
            except Exception as exc:
                if on_error is None:
                    raise
                on_error(key, exc)
                del live[key], samples[key]
        if on_round is not None:
            on_round()
    return samples


def cuda_graph_replay(fn: Callable[[], object], calls: int) -> Callable[[], None]:
    """The replay of a CUDA graph holding ``calls`` back-to-back calls of ``fn``, captured after
    three warm-up calls on a side stream (compilation, allocator pools); time a replay and divide
    by ``calls`` for the device time per call."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph.replay


def median(samples: Sequence[float]) -> float:
    """The median of ``samples`` (the mean of the middle two for an even count)."""
    return statistics.median(samples)


def sync(device: str) -> None:
    """Wait for the work queued on ``device`` (a CUDA device; nothing to wait for on the CPU)."""
    if device == "cuda":
        torch.cuda.synchronize()
