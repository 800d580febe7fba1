"""Which implementation served a call: with :func:`set_debug` (or ``RMSNORM_DEBUG=1``) each call of
the functional API is recorded and logged at DEBUG on the ``rmsnorm.calls`` logger with its path and
backend; a backend that hands a call to the reference says so on that logger whether or not
recording is on, and counts it (:func:`fallbacks`)."""

from __future__ import annotations

import logging
import os
from collections import Counter

import torch

__all__ = ["PATHS", "set_debug", "debug_enabled", "last_calls", "fallbacks", "served", "fallback"]

# The functional API's four paths, in the order of its path numbers.
PATHS = ("launch", "function", "op", "spec")
ENV_VAR = "RMSNORM_DEBUG"

log = logging.getLogger("rmsnorm.calls")

# Read on every call of the functional API: a module global, so the check costs one attribute load
# (~20 ns) rather than a logger's level lookup (~150 ns, the size of a decoding-step norm's margin
# over torch's own).
recording: bool = os.environ.get(ENV_VAR, "").strip().lower() in ("1", "true", "yes", "on")

_last: dict[str, dict] = {}
_current: dict | None = None
_fallbacks: Counter = Counter()


def set_debug(on: bool = True) -> None:
    """Record, and log at DEBUG on the ``rmsnorm.calls`` logger, which path and backend serve each
    call of :func:`rmsnorm.rms_norm`, :func:`~rmsnorm.add_rms_norm`,
    :func:`~rmsnorm.gated_rms_norm` and :func:`~rmsnorm.layer_norm` (and of the modules, which call
    them); ``set_debug(False)`` stops. ``RMSNORM_DEBUG=1`` turns it on at import. The records are
    :func:`last_calls`; the log shows once logging is configured at DEBUG
    (``logging.basicConfig(level=logging.DEBUG)``).

    Args:
        on (bool): record and log (``True``) or stop (``False``). Default: ``True``.

    Example::

        >>> rmsnorm.set_debug(True)
        >>> y = rmsnorm.rms_norm(torch.randn(2, 8), 8)
        >>> rmsnorm.last_calls()["rms_norm"]["path"]
        'launch'
        >>> rmsnorm.set_debug(False)
    """
    if not isinstance(on, bool):
        raise TypeError(f"on must be True or False, got {on!r}")
    global recording
    recording = on


def debug_enabled() -> bool:
    """Whether calls are being recorded (:func:`set_debug`, ``RMSNORM_DEBUG``)."""
    return recording


def served(op: str, path: str, x: torch.Tensor, backend: str) -> None:
    """Record that ``op`` on x takes ``path`` with ``backend`` (called only while
    :data:`recording`; the caller names the backend, so that this module, which the backends
    themselves report to, imports none of the package)."""
    global _current
    record = {
        "path": path,
        "backend": backend,
        "dtype": str(x.dtype).removeprefix("torch."),
        "device": str(x.device),
        "shape": tuple(x.shape),
        "fallback": None,
    }
    _last[op] = _current = record
    log.debug(
        "rmsnorm.%s %s %s: %s path, %s backend", op, record["dtype"], record["shape"], path, backend
    )


def fallback(backend: str, op: str, reason: str) -> None:
    """A launcher of ``backend`` hands ``op`` to the reference, because ``reason``: counted, logged
    at DEBUG, and added to the call being recorded."""
    _fallbacks[(backend, op, reason)] += 1
    if _current is not None and recording:
        _current["fallback"] = f"{backend} {op} → reference: {reason}"
    log.debug("rmsnorm: the %s backend's %s runs the reference: %s", backend, op, reason)


def last_calls() -> dict[str, dict]:
    """The last recorded call of each function (:func:`set_debug`): its path (``"launch"``,
    ``"function"``, ``"op"`` or ``"spec"``, as :mod:`rmsnorm.functional` names them), backend,
    dtype, device, shape and the hand-off to the reference inside the backend (None when there was
    none), keyed by function name.

    Args:
        none.

    Example::

        >>> rmsnorm.set_debug(True)
        >>> y = rmsnorm.layer_norm(torch.randn(2, 8, dtype=torch.float64), 8)
        >>> call = rmsnorm.last_calls()["layer_norm"]
        >>> call["path"], call["dtype"]
        ('launch', 'float64')
        >>> rmsnorm.set_debug(False)
    """
    return {op: dict(record) for op, record in _last.items()}


def fallbacks() -> dict[tuple[str, str, str], int]:
    """How many calls each (backend, launcher, reason) handed to the reference in this process,
    recorded or not."""
    return dict(_fallbacks)


def clear() -> None:
    """Forget the records and the fallback counts."""
    global _current
    _last.clear()
    _fallbacks.clear()
    _current = None
