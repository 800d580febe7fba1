"""The long-form rows every benchmark mode writes: the bytes model, one :class:`Row` per
measurement with the machine's metadata, the devices a run can ask for, and CSV in and out."""

from __future__ import annotations

import csv
import datetime
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields

import torch

from .. import _validate, info
from .._files import atomic_path

__all__ = [
    "COLUMNS",
    "OPS",
    "MODES",
    "VARIANTS",
    "DEVICES",
    "Row",
    "bytes_moved",
    "machine",
    "make_row",
    "write_csv",
    "read_csv",
    "run_header",
    "format_gbps",
    "check_device",
    "resolve_device",
]

# "generate": greedy generate() of a whole model per token (latency mode; no bytes model)
OPS = (
    "rms_norm",
    "add_rms_norm",
    "layer_norm",
    "gated_rms_norm",
    "gated_rms_norm_grouped",
    "copy",
    "generate",
)
# forward_backward_leaf: forward + backward into the leaves' .grad (latency mode)
MODES = ("forward", "backward", "forward_backward", "forward_backward_leaf")
VARIANTS = ("eager", "cuda_graph")

# Minimal traffic in units of M·N elements (docs/performance.md). Weights and per-row statistics are
# negligible at benchmark sizes and not counted.
_UNITS = {
    # read x + write y
    ("rms_norm", "forward"): 2,
    ("layer_norm", "forward"): 2,
    # read x, dy + write dx
    ("rms_norm", "backward"): 3,
    ("layer_norm", "backward"): 3,
    # read x, residual + write y, h
    ("add_rms_norm", "forward"): 4,
    # read h, dy, dh + write dx (d residual aliases d input)
    ("add_rms_norm", "backward"): 4,
    # gated (norm then gate, Qwen3-Next; gate then norm in groups, Mamba2): read x, z + write y
    ("gated_rms_norm", "forward"): 3,
    ("gated_rms_norm_grouped", "forward"): 3,
    # read x, z, dy + write dx, dz
    ("gated_rms_norm", "backward"): 5,
    ("gated_rms_norm_grouped", "backward"): 5,
    # read + write
    ("copy", "forward"): 2,
}


def bytes_moved(op: str, mode: str, m: int, n: int, elem: int) -> int:
    """Bytes an ideal kernel moves for (op, mode) on an (m, n) problem of `elem`-byte elements;
    forward_backward (and forward_backward_leaf) is the sum of the two."""
    if mode in ("forward_backward", "forward_backward_leaf"):
        return bytes_moved(op, "forward", m, n, elem) + bytes_moved(op, "backward", m, n, elem)
    try:
        return _UNITS[(op, mode)] * m * n * elem
    except KeyError:
        raise ValueError(f"no bytes model for op {op!r} in mode {mode!r}") from None


@dataclass
class Row:
    """One measurement: the long-form CSV schema shared by every mode (column order = fields)."""

    device: str  # "cuda" or "cpu"
    device_name: str
    torch: str
    triton: str
    commit: str
    timestamp: str
    op: str  # one of OPS
    mode: str  # one of MODES
    provider: str  # rmsnorm, torch, torch_compile_reference, hf_llama_eager, liger, torch_add, ...
    dtype: str  # "bfloat16", "float32", ...
    M: int
    N: int
    variant: str  # one of VARIANTS
    ms: float  # median time per call, milliseconds
    gbps: float  # bytes / time, GB/s (1e9 bytes)
    copy_gbps: float  # copy bandwidth over the same M·N elements, same process
    pct_copy: float  # 100 · gbps / copy_gbps
    bytes: int  # from bytes_moved


COLUMNS = tuple(f.name for f in fields(Row))


def _version(dist: str) -> str:
    return info.package_version(dist) or "none"


def _commit() -> str:
    """The git commit measured (:func:`rmsnorm.info.source_commit`, 12 hex digits), else
    "unknown"."""
    return info.source_commit(short=True) or "unknown"


def machine(device: str) -> dict:
    """The metadata columns of every row: device, its name, torch / triton versions, commit and
    time."""
    return {
        "device": device,
        "device_name": (info.gpu_name() if device == "cuda" else None) or info.cpu_model(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "commit": _commit(),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def make_row(
    meta: dict,
    op: str,
    mode: str,
    provider: str,
    dtype: torch.dtype,
    m: int,
    n: int,
    variant: str,
    ms: float,
    copy_gbps: float,
) -> Row:
    """A row from a median time; GB/s and % of copy follow from the bytes model (0 GB/s and no
    bytes for ``generate``, a whole model's step)."""
    if op not in OPS or mode not in MODES or variant not in VARIANTS:
        raise ValueError(f"unknown op/mode/variant {op!r}/{mode!r}/{variant!r}")
    nbytes = 0 if op == "generate" else bytes_moved(op, mode, m, n, dtype.itemsize)
    gbps = nbytes / (ms * 1e-3) / 1e9
    pct = 100.0 * gbps / copy_gbps if copy_gbps > 0 else float("nan")
    return Row(
        **meta,
        op=op,
        mode=mode,
        provider=provider,
        dtype=str(dtype).removeprefix("torch."),
        M=m,
        N=n,
        variant=variant,
        ms=ms,
        gbps=gbps,
        copy_gbps=copy_gbps,
        pct_copy=pct,
        bytes=nbytes,
    )


def write_csv(rows: Iterable[Row], path: str | os.PathLike) -> None:
    """The rows as CSV into ``path``, atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow(asdict(r))


def save_plot(fig, title: str, path: str | os.PathLike) -> bool:
    """Finish a benchmark figure (its title, a tight layout), write it atomically and close it;
    returns True, what the plot writers return once a plot is written."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    return True


def read_csv(path: str | os.PathLike) -> list[Row]:
    """Rows back from :func:`write_csv`."""
    types = {f.name: f.type for f in fields(Row)}
    conv = {"int": int, "float": float, "str": str}
    with open(path, newline="") as f:
        return [Row(**{k: conv[types[k]](v) for k, v in rec.items()}) for rec in csv.DictReader(f)]


def run_header(rows: Sequence[Row]) -> str:
    """What the rows were measured on: device, torch, triton, commit and time (a title line)."""
    r = rows[0]
    return (
        f"{r.device_name} ({r.device}) · torch {r.torch} · triton {r.triton} · "
        f"commit {r.commit} · {r.timestamp}"
    )


def format_gbps(gbps: float) -> str:
    """A bandwidth in GB/s as printed in the tables."""
    # GPU numbers are in the thousands, CPU numbers in single digits: keep two significant figures
    return f"{gbps:.0f}" if gbps >= 100 else f"{gbps:.1f}"


DEVICES = ("cuda", "cpu")


def check_device(device: str) -> str:
    """``device`` if it is one of :data:`DEVICES` and torch can run it, else ArgumentError."""
    _validate.one_of("device", device, DEVICES)
    if device == "cuda" and not torch.cuda.is_available():
        raise _validate.ArgumentError("device", "'cuda' was asked for but torch sees no GPU")
    return device


def resolve_device(device: str) -> str:
    """``"auto"`` -> ``"cuda"`` when torch sees a GPU, else ``"cpu"``; checks explicit choices."""
    _validate.one_of("device", device, ("auto", *DEVICES))
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return check_device(device)
