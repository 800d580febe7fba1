"""``rmsnorm bench``: this library against its peers, in two modes on one harness
(``harness.py``): throughput (``throughput.py``; ``gpu.py`` / ``cpu.py`` say what differs per
device) and time per call (``latency.py``). Every mode returns long-form :class:`Row` objects
(``rows.py``); :func:`run` writes them under ``out`` as ``<device>_bench.{csv,md,png}`` or
``<device>_latency.{csv,md,png}``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from .. import info
from .._files import existing
from . import rows
from .rows import *  # noqa: F403 (re-exports rows.__all__: the row schema, devices, CSV)
from .rows import Row, write_csv
from .throughput import measure, summary, write_markdown, write_plot

__all__ = [*rows.__all__, "measure", "summary", "write_markdown", "write_plot", "run"]


# ----------------------------------------------------------------------------------------------
# Entry point (``rmsnorm bench``)
# ----------------------------------------------------------------------------------------------
def run(
    device: str = "cuda",
    quick: bool = False,
    out: str | os.PathLike = "benchmarks/results",
    variants: bool = False,
    budget_s: float | None = None,
    log=print,
    latency: bool = False,
    progress=None,
    ops: Sequence[str] | None = None,
    overwrite: bool = False,
) -> list[Row]:
    """Run the benchmark for `device` ("cuda" or "cpu"), write ``<stem>_bench.{csv,md,png}``
    under `out` (stem ``gpu`` or ``cpu``), and return the rows. `quick` runs a handful of shapes;
    `ops` keeps the plan's items of those ops only (all by default);
    `variants` also times forced kernel layouts of this library (tuning data, providers named
    ``rmsnorm[...]``); `budget_s` bounds the run's wall time (items that do not fit are skipped and
    logged). `latency` times the per-call grid of :mod:`rmsnorm.bench.latency` instead and writes
    ``<stem>_latency.{csv,md,png}``; `progress` (an :mod:`rmsnorm._progress` object) shows the
    advance of either mode. Files of an earlier run in `out` are replaced only with `overwrite`
    (FileExistsError before anything is timed otherwise); each file is written atomically."""
    stem = ("gpu" if device == "cuda" else "cpu") + ("_latency" if latency else "_bench")
    found = existing(Path(out) / f"{stem}{suffix}" for suffix in (".csv", ".md", ".png"))
    if found and not overwrite:
        raise FileExistsError(
            f"{out} already holds {', '.join(p.name for p in found)} from an earlier run; pass "
            "--overwrite to replace them, or choose another --out"
        )
    if latency:
        return _run_latency(device, quick, out, budget_s, log, progress)
    rows = measure(
        device,
        quick=quick,
        variants=variants,
        budget_s=budget_s,
        log=log,
        ops=ops,
        progress=progress,
    )
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    stem = "gpu" if device == "cuda" else "cpu"
    write_csv(rows, outdir / f"{stem}_bench.csv")
    write_markdown(rows, outdir / f"{stem}_bench.md")
    if write_plot(rows, outdir / f"{stem}_bench.png"):
        log(f"wrote {outdir / f'{stem}_bench.png'}")
    log(f"wrote {outdir / f'{stem}_bench.csv'} and {outdir / f'{stem}_bench.md'}")
    return rows


def _load_average() -> float | None:
    load = info.load_average()
    return None if load is None else load[0]


def _run_latency(device, quick, out, budget_s, log, progress) -> list[Row]:
    from . import latency

    load = [_load_average()]
    rows = latency.run(device=device, quick=quick, budget_s=budget_s, log=log, progress=progress)
    load.append(_load_average())
    # Other processes stall torch's threads: a reader must see how busy the machine was.
    note = (
        f"Load average (1 min) {load[0]:.1f} at the start, {load[1]:.1f} at the end, on "
        f"{info.cpu_cores()} logical cores."
        if None not in load
        else ""
    )
    log(note)
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    stem = outdir / ("gpu_latency" if device == "cuda" else "cpu_latency")
    write_csv(rows, stem.with_suffix(".csv"))
    latency.write_markdown(rows, stem.with_suffix(".md"), note=note)
    wrote = [stem.with_suffix(".csv"), stem.with_suffix(".md")]
    if latency.write_plot(rows, stem.with_suffix(".png")):
        wrote.append(stem.with_suffix(".png"))
    log(latency.summary(rows))
    log("wrote " + ", ".join(str(p) for p in wrote))
    return rows
