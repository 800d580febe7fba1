"""The one place that decides which implementation runs a normalization op.

Backends are modules defining the seven launchers of the backend contract
(:class:`rmsnorm._contract.Backend`): ``reference`` (the spec itself), ``cpu`` (the CPU kernels)
and ``triton`` (the GPU kernels; on CPU tensors they run under the Triton interpreter). ``auto``
picks the fastest one that supports the tensor's device. Forced with ``RMSNORM_BACKEND`` or
:func:`use_backend`.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
from types import ModuleType
from typing import TYPE_CHECKING

import torch

# Imported now (cheap: no numba) so that its fork hook is registered before any fork: a process
# forked from one whose OpenMP runtime ran a team must not hand a shared call to that runtime.
from .kernels import cpu as _cpu_kernels  # noqa: F401

if TYPE_CHECKING:
    from ._contract import Backend

BACKENDS = ("auto", "reference", "cpu", "triton")
ENV_VAR = "RMSNORM_BACKEND"


class _Choice(threading.local):
    """The override of :func:`use_backend`, per thread (as torch's own mode switches are: a block in
    one thread never changes what another thread runs). New threads start without one."""

    forced: str | None = None


_choice = _Choice()
_modules: dict[str, ModuleType] = {}
_probes: dict[str, bool] = {}  # per-process answers to "is X usable here?" (ops ask on every call)


def _check_name(name: object, what: str) -> str:
    if not isinstance(name, str) or name not in BACKENDS:
        raise ValueError(f"{what} must be one of {BACKENDS}, got {name!r}")
    return name


def current() -> str:
    """The backend in force in this thread: :func:`use_backend`, else ``$RMSNORM_BACKEND``, else
    ``"auto"``."""
    forced = _choice.forced
    if forced is not None:
        return forced
    if _environ is not None and _environ.get(_ENV_KEY) is None:
        return "auto"  # the common case, without os.environ's per-read encoding (~0.5 µs)
    env = os.environ.get(ENV_VAR)
    if not env:
        return "auto"
    return _check_name(env, f"the environment variable {ENV_VAR}")


# The mapping behind os.environ (CPython keeps the process environment there, keys encoded).
_environ: dict | None = getattr(os.environ, "_data", None)
_ENV_KEY = os.environ.encodekey(ENV_VAR) if hasattr(os.environ, "encodekey") else ENV_VAR


_IN_COMPILE = (
    "rmsnorm.use_backend is not traced by torch.compile: enter it around the call to the compiled "
    "function (compiled ops choose their backend each time they run)"
)


def _not_traced() -> None:
    """A graph break with the reason when dynamo traces a use_backend block (importing dynamo at
    import time instead, for torch.compiler.disable, would add ~1 s to ``import rmsnorm``)."""
    if torch.compiler.is_compiling():
        from torch import _dynamo

        _dynamo.graph_break(msg=_IN_COMPILE)


class use_backend:
    """Force a backend for the ops this thread runs.

    ``rmsnorm.use_backend("reference")`` sets it until changed; ``with rmsnorm.use_backend("cpu"):``
    sets it for the block and restores, on leaving, what was in force on entering (blocks may nest,
    and one object may be entered again). ``"auto"`` returns to automatic selection; ``None``
    removes the override, so ``$RMSNORM_BACKEND`` applies again.

    The choice is per thread, like ``torch.set_grad_enabled``: other threads are unaffected, and a
    new thread starts from ``$RMSNORM_BACKEND``.

    ``torch.compile``: compiled code runs on the backend in force when it runs (the ops choose it at
    run time, not at trace time), so set it around the call to a compiled function. Used inside a
    function being compiled, it is not traced: dynamo runs that function eagerly from there (a
    graph break), and with ``fullgraph=True`` it is an error that says so.

    Args:
        name (str or None): ``"auto"``, ``"reference"`` (the spec, :mod:`rmsnorm.reference`),
            ``"cpu"`` (the CPU kernels) or ``"triton"`` (the GPU kernels); ``None`` removes the
            override.

    Example::

        >>> x = torch.randn(4, 8)
        >>> with rmsnorm.use_backend("reference"):  # this block runs the spec itself
        ...     y = rmsnorm.rms_norm(x, 8)
        >>> torch.allclose(y, rmsnorm.rms_norm(x, 8), atol=1e-6)  # the automatic choice again
        True
    """

    def __init__(self, name: str | None):
        _not_traced()
        if name is not None:
            _check_name(name, "backend name")
        self.name = name
        self._before_init = _choice.forced
        self._restore: list[str | None] = []
        self._fresh = True
        _choice.forced = name

    def __enter__(self) -> use_backend:
        _not_traced()
        # The first entry restores what was in force before the constructor set the choice.
        self._restore.append(self._before_init if self._fresh else _choice.forced)
        self._fresh = False
        _choice.forced = self.name
        return self

    def __exit__(self, *exc: object) -> None:
        _not_traced()
        _choice.forced = self._restore.pop()

    def __repr__(self) -> str:
        return f"use_backend({self.name!r})"


def triton_installed() -> bool:
    found = _probes.get("triton")
    if found is None:
        found = _probes["triton"] = importlib.util.find_spec("triton") is not None
    return found


def cpu_kernels_available() -> bool:
    """True where the compiled CPU kernels can run (their module decides; imported lazily)."""
    found = _probes.get("cpu")
    if found is None:
        try:
            found = bool(_load("cpu").available())
        except ImportError:
            found = False
        _probes["cpu"] = found
    return found


def _load(name: str) -> ModuleType:
    mod = _modules.get(name)
    if mod is None:
        if name == "reference":
            mod = importlib.import_module("rmsnorm.reference")
        elif name == "cpu":
            mod = importlib.import_module("rmsnorm.kernels.cpu")
        else:
            mod = importlib.import_module("rmsnorm.kernels.triton")
        _modules[name] = mod
    return mod


def _triton_for(device_type: str) -> ModuleType:
    if not triton_installed():
        raise RuntimeError(
            "backend 'triton' needs the triton package: pip install 'rmsnorm[triton]'"
        )
    if device_type == "cpu":
        # CPU tensors run under Triton's interpreter, which must be chosen before triton is
        # imported.
        if "triton" not in sys.modules:
            os.environ["TRITON_INTERPRET"] = "1"
        elif os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                "backend 'triton' on CPU tensors needs the Triton interpreter, but triton was "
                "already imported without TRITON_INTERPRET=1; set TRITON_INTERPRET=1 before "
                "importing triton"
            )
    elif device_type != "cuda":
        raise RuntimeError(f"backend 'triton' has no kernels for {device_type!r} tensors")
    return _load("triton")


def launchers(device_type: str) -> Backend:
    """The backend module that runs ops on tensors of ``device_type`` under the current choice."""
    name = _choice.forced
    if name is None:  # current(), inlined: every op call asks
        name = "auto" if _environ is not None and _environ.get(_ENV_KEY) is None else current()
    mod = _resolved.get((name, device_type))
    if mod is None:
        mod = _resolved[(name, device_type)] = _resolve(name, device_type)
    return mod


_resolved: dict[tuple[str, str], ModuleType] = {}  # (choice, device type) -> backend module


def _resolve(name: str, device_type: str) -> ModuleType:
    if name == "auto":
        if device_type == "cuda" and triton_installed():  # CUDA and ROCm
            return _load("triton")
        if device_type == "cpu" and cpu_kernels_available():
            return _load("cpu")
        return _load("reference")
    if name == "reference":
        return _load("reference")
    if name == "cpu":
        if device_type != "cpu":
            raise RuntimeError(f"backend 'cpu' cannot run on {device_type!r} tensors")
        if not cpu_kernels_available():
            missing = [m for m in ("numba", "llvmlite") if importlib.util.find_spec(m) is None]
            why = (
                f"{' and '.join(missing)} not installed (pip install numba)"
                if missing
                else "numba is installed but failed to import (see the warning above)"
            )
            raise RuntimeError(f"backend 'cpu' needs the numba CPU kernels: {why}")
        return _load("cpu")
    return _triton_for(device_type)


def describe(device_type: str) -> str:
    """Name of the backend that ``auto`` would pick for ``device_type`` (for ``rmsnorm info``)."""
    mod = launchers(device_type)
    return {v: k for k, v in _modules.items()}[mod]
