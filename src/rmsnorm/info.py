"""Facts about this installation: versions, devices and the backend on each (``rmsnorm info``)."""

from __future__ import annotations

import importlib.metadata
import platform

import torch

from . import __version__, _backend


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _describe(device_type: str) -> str:
    try:
        return _backend.describe(device_type)
    except RuntimeError as exc:  # a forced backend that cannot run here: say why, not a traceback
        return f"none ({exc})"


def environment() -> dict:
    """Versions of rmsnorm / torch / triton / numba / transformers (read from package metadata, so
    nothing is imported), the devices torch sees, and the backend ``auto`` picks on each."""
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [
            f"cuda:{i} ({torch.cuda.get_device_name(i)})" for i in range(torch.cuda.device_count())
        ]
    backends = {"cpu": _describe("cpu")}
    if torch.cuda.is_available():
        backends["cuda"] = _describe("cuda")
    return {
        "rmsnorm": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "numba": _version("numba"),
        "transformers": _version("transformers"),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads",
        "devices": devices,
        "backend in force": _backend.current(),
        "backend per device": backends,
        "triton installed": _backend.triton_installed(),
        "cpu kernels available": _backend.cpu_kernels_available(),
    }
