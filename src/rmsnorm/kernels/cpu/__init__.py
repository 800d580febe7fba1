"""The CPU backend: numba kernels behind the seven launchers of the backend contract
(:class:`rmsnorm._contract.Backend`).

Importing this package is cheap: numba is imported, and the kernels loaded from numba's on-disk
cache (or compiled, once per machine, saying so), on the first launcher call or :func:`warmup`.
:func:`available` only checks that numba is installed; if it then fails to import, a warning says
so once and the reference runs.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import time
import warnings
from types import ModuleType

from ..._contract import LAUNCHERS

__all__ = ["available", "warmup", *LAUNCHERS]

_GATED_NAMES = tuple(name for name in LAUNCHERS if name.startswith("gated_"))
_NAMES = tuple(name for name in LAUNCHERS if name not in _GATED_NAMES)
_available: bool | None = None
_impl: ModuleType | None = None
_gated: ModuleType | None = None
# True in a process forked after this package was imported: its OpenMP runtime may hold a parent's
# thread team that the fork did not copy, so shared calls must not go to it (they would hang).
forked = False


def _note_fork() -> None:
    global forked
    forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_note_fork)


def available() -> bool:
    """True where the compiled kernels can run: numba and llvmlite are installed (and, once tried,
    importable). Cheap: it neither imports nor compiles anything."""
    global _available
    if _available is None:
        _available = all(importlib.util.find_spec(m) is not None for m in ("numba", "llvmlite"))
    return _available


def _load_launchers() -> ModuleType:
    global _impl, _available
    if _impl is None:
        try:
            impl = importlib.import_module(".launchers", __name__)
        except Exception as exc:  # numba present but unusable (e.g. built for another numpy)
            _available = False
            warnings.warn(
                f"rmsnorm: the CPU kernels are unavailable ({type(exc).__name__}: {exc}); "
                "using the reference implementation",
                RuntimeWarning,
                stacklevel=3,
            )
            impl = importlib.import_module("rmsnorm.reference")
        _impl = impl
        # From now on callers reach the launchers without this module's wrappers (~0.2 µs a call).
        globals().update({name: getattr(impl, name) for name in _NAMES})
    return _impl


def _load_gated() -> ModuleType:
    """The grouped / gated launchers (their own kernels, loaded or compiled on first use)."""
    global _gated
    if _gated is None:
        impl = _load_launchers()
        if impl.__name__ == "rmsnorm.reference":  # numba failed to import: the reference runs
            _gated = impl
        else:
            _gated = importlib.import_module(".gated_launchers", __name__)
        globals().update({name: getattr(_gated, name) for name in _GATED_NAMES})
    return _gated


def warmup() -> dict:
    """Load the CPU kernels now: from numba's on-disk cache, or by compiling them (1–2 min, once per
    machine and numba version; ``rmsnorm warmup`` and ``make setup`` do this), so that the first op
    does not wait. Returns ``{"available", "compiled", "cached_in", "seconds"}``: whether the
    kernels run here, whether this process compiled them, their cache directory (None where none
    is writable: then every process compiles them) and the seconds this call took."""
    t0 = time.perf_counter()
    status = {"available": False, "compiled": False, "cached_in": None}
    if available():
        status.update(getattr(_load_launchers(), "STATUS", {}))  # none: numba failed to import
        gated = getattr(_load_gated(), "STATUS", {})
        status["compiled"] = status["compiled"] or gated.get("compiled", False)
        status["available"] = _available is not False
    status["seconds"] = time.perf_counter() - t0
    return status


def __getattr__(name: str):
    # The launchers are looked up here only until their first use loads them: the loaders then
    # bind them as this module's own attributes, so later calls go straight to them.
    if name in _NAMES:
        return getattr(_load_launchers(), name)
    if name in _GATED_NAMES:
        return getattr(_load_gated(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
