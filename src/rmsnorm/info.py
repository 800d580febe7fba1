"""Facts about this installation and machine, each found in one place: versions, the CPU, the GPU,
the source commit, the load, the backend on each device (``rmsnorm info`` prints them)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

import torch

from . import __version__, _backend
from ._calls import debug_enabled

__all__ = [
    "package_version",
    "cpu_model",
    "cpu_cores",
    "cpu_vector_unit",
    "cpu_kernel_vectors",
    "cpu_kernel_stores",
    "cpu_kernel_threading",
    "gpu_name",
    "source_commit",
    "load_average",
    "describe_backend",
    "machine_description",
    "served_calls",
    "environment",
]


def package_version(dist: str) -> str | None:
    """The installed version of the distribution ``dist`` from its metadata (nothing is
    imported), or None when it is not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU's model name (``model name`` of /proc/cpuinfo on Linux), else what ``platform``
    knows (the processor, or at least the architecture)."""
    try:
        with open("/proc/cpuinfo", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_cores() -> int | None:
    """Logical cores of the machine (None where the OS does not say)."""
    return os.cpu_count()


def cpu_vector_unit() -> str:
    """The widest vector instruction set torch's CPU kernels use here (``"AVX512"``, ``"AVX2"``,
    ``"SVE256"``, ``"DEFAULT"``...): the CPU kernels are compiled for the host too, so two machines
    with one model name but different vector units time differently."""
    try:
        return torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):  # a torch without the query
        return "unknown"


def gpu_name(index: int = 0) -> str | None:
    """The name of CUDA device ``index``, or None when torch sees no CUDA device."""
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(index)


def source_commit(short: bool = False) -> str | None:
    """The commit of the source tree this package runs from: ``$RMSNORM_COMMIT`` when set (for
    copies of the tree without ``.git``), else ``git rev-parse HEAD`` marked ``+dirty`` when
    tracked files differ from it, else None (an installed copy, or no git). ``short``: the first
    12 hex digits of a git hash."""
    env = os.environ.get("RMSNORM_COMMIT", "").strip()
    if env:
        return env
    commit = _git_commit(Path(__file__).resolve().parent)
    if commit is not None and short:
        head, _, dirty = commit.partition("+")
        commit = head[:12] + ("+" + dirty if dirty else "")
    return commit


def _git_commit(package_dir: Path) -> str | None:
    """HEAD of the checkout whose ``src/rmsnorm`` is ``package_dir``. A package installed inside
    some other repository (a virtual environment in a user's project) is not that repository's
    code, so its commit is not reported."""

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["git", *args], cwd=package_dir, capture_output=True, text=True, timeout=10
        )

    try:
        top = git("rev-parse", "--show-toplevel", "HEAD")
        if top.returncode != 0:
            return None
        root, head = top.stdout.split()
        if (Path(root) / "src" / "rmsnorm").resolve() != package_dir.resolve():
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def load_average() -> tuple[float, float, float] | None:
    """The 1-, 5- and 15-minute load averages, rounded to 0.01 (None where the OS has none):
    other processes on the machine slow every timing, and this says how busy it was."""
    try:
        one, five, fifteen = os.getloadavg()
    except (AttributeError, OSError):
        return None
    return round(one, 2), round(five, 2), round(fifteen, 2)


def describe_backend(device_type: str) -> str:
    """The backend ``auto`` uses on ``device_type`` (``"cpu"``, ``"cuda"``), with its reason; a
    forced backend that cannot run there is described, not raised."""
    try:
        return _backend.describe(device_type)
    except RuntimeError as exc:  # a forced backend that cannot run here: say why, not a traceback
        return f"none ({exc})"


def cpu_kernel_vectors() -> str | None:
    """The vector widths the CPU kernels ask LLVM for on this host and why (``docs/cpu.md``,
    "Vector width"): ``"512-bit"``, ``"forward 512-bit, backward 256-bit"`` or ``"LLVM's
    choice"``, then the reason with LLVM's name for the CPU; None where the kernels cannot run."""
    if not _backend.cpu_kernels_available():
        return None
    from .kernels.cpu import runtime

    fwd, bwd = runtime.VECTOR_BITS, runtime.VECTOR_BITS_BWD
    if fwd is None:
        return runtime.VECTOR_WHY
    widths = f"{fwd}-bit" if fwd == bwd else f"forward {fwd}-bit, backward {bwd}-bit"
    return f"{widths} ({runtime.VECTOR_WHY})"


def cpu_kernel_stores() -> str | None:
    """How the CPU kernels' forward writes its outputs on this host (``docs/cpu.md``, "Streaming
    stores"): from how many bytes of a call's input and output it streams them past the caches, or
    that it never does, with the reason; None where the kernels cannot run."""
    if not _backend.cpu_kernels_available():
        return None
    from .kernels.cpu import runtime

    return runtime.STREAM_WHY


def cpu_kernel_threading() -> str | None:
    """How the CPU kernels split a call between threads on this host, with torch's thread count
    read now, and why (``docs/cpu.md``, "Threads" and "Under contention"); None where the kernels
    cannot run. Loads the kernels (from numba's cache) where they are not loaded yet."""
    if not _backend.cpu_kernels_available():
        return None
    from .kernels.cpu import launchers

    return launchers.threading()


def machine_description() -> str:
    """One line for a timing's caption: the CPU model, logical cores, vector unit and torch
    threads, and the GPU when torch sees one."""
    threads = torch.get_num_threads()
    text = (
        f"{cpu_model()}, {cpu_cores()} logical cores, {cpu_vector_unit()}, {threads} torch thread"
    )
    text += "s" * (threads > 1)
    gpu = gpu_name()
    return text + (f"; GPU {gpu}" if gpu else "")


def served_calls(dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float64)):
    """Which path and backend serve a small CPU call of each function, per dtype, found by making
    the calls with :func:`rmsnorm.set_debug` on: ``{"float32": {"rms_norm": "launch path, cpu
    backend", ...}, ...}``, a hand-off to the reference inside the backend named with its reason
    (``"launch path, cpu backend → reference: a float64 tensor ..."``)."""
    from . import _calls, functional

    # The probe's calls are not the process's: its records and counts are put back afterwards.
    was, last, counts = _calls.recording, dict(_calls._last), _calls._fallbacks.copy()
    _calls.recording = True
    found = {}
    try:
        for dtype in dtypes:
            x, r = torch.randn(2, 8, dtype=dtype), torch.randn(2, 8, dtype=dtype)
            w = torch.ones(8, dtype=dtype)
            _calls._last.clear()
            try:
                functional.rms_norm(x, 8, w)
                functional.add_rms_norm(x, r, 8, w)
                functional.gated_rms_norm(x, r, 8, w)
                functional.layer_norm(x, 8, w)
            except RuntimeError as exc:  # a forced backend that cannot run here
                found[str(dtype).removeprefix("torch.")] = f"none ({exc})"
                continue
            calls = _calls.last_calls()
            per_op = {}
            for op in ("rms_norm", "add_rms_norm", "gated_rms_norm", "layer_norm"):
                call = calls[op]
                text = f"{call['path']} path, {call['backend']} backend"
                if call["fallback"]:  # "<backend> <launcher> → reference: <reason>"
                    text += " → " + call["fallback"].split(" → ", 1)[1]
                per_op[op] = text
            found[str(dtype).removeprefix("torch.")] = per_op
    finally:
        _calls.recording = was
        _calls._last.clear()
        _calls._last.update(last)
        _calls._fallbacks.clear()
        _calls._fallbacks.update(counts)
    return found


def environment() -> dict:
    """Versions of rmsnorm / torch / triton / numba / transformers (read from package metadata, so
    nothing is imported), the devices torch sees, and the backend ``auto`` picks on each."""
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [
            f"cuda:{i} ({torch.cuda.get_device_name(i)})" for i in range(torch.cuda.device_count())
        ]
    backends = {"cpu": describe_backend("cpu")}
    if torch.cuda.is_available():
        backends["cuda"] = describe_backend("cuda")
    return {
        "rmsnorm": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": package_version("triton"),
        "numba": package_version("numba"),
        "transformers": package_version("transformers"),
        "machine": f"{platform.machine()} ({cpu_vector_unit()}), {torch.get_num_threads()} torch "
        "threads",
        "devices": devices,
        "backend in force": _backend.current(),
        "backend per device": backends,
        "triton installed": _backend.triton_installed(),
        "cpu kernels available": _backend.cpu_kernels_available(),
        "cpu kernel vectors": cpu_kernel_vectors(),
        "cpu kernel stores": cpu_kernel_stores(),
        "cpu kernel threading": cpu_kernel_threading(),
        "call records": "on"
        if debug_enabled()
        else "off (rmsnorm.set_debug(True) or RMSNORM_DEBUG=1)",
        "lab cache": cache_line(),
        "served on cpu": served_calls(),
    }


def cache_line() -> str:
    """Where the lab's cache is, how big, and its cap (``rmsnorm cache list`` has the entries)."""
    import math

    from . import _cache as cache

    try:
        cap = cache.max_bytes()
        limit = "no cap" if math.isinf(cap) else f"cap {cache.human(cap)}"
    except ValueError as exc:
        limit = str(exc)
    return (
        f"{cache.cache_dir()} ({cache.human(cache.total_bytes())}, {limit}; "
        "rmsnorm cache list / clear)"
    )
