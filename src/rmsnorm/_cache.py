"""The lab's cache on disk (:func:`cache_dir`): where it is, what is in it, how big it is,
keeping it under a cap, and emptying it.

Three kinds of entries live there:

- ``weights``: weight files joined from parts at install (the Gemma 3 GGUF file), one folder per
  pinned digest. They belong to the installed weights: :func:`clear` and the cap never remove them
  unless this kind is named.
- ``dequantized``: a GGUF model's float32 copy as safetensors (:mod:`.pretrained`), one folder per
  GGUF digest and library versions (about four bytes per parameter).
- ``stages``: the real-model study's per-stage results as JSON, one file per stage and key.

The first write into the cache in a process says once on stderr where the cache is and how big it
has grown. After each write, entries of the two rebuildable kinds are removed, least recently used
first, while the cache is larger than its cap: ``$RMSNORM_CACHE_MAX_GB`` gigabytes (10^9 bytes;
default :data:`DEFAULT_MAX_GB`; ``0`` or ``inf`` for no cap), each removal said on stderr.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "cache_dir",
    "KINDS",
    "DEFAULT_MAX_GB",
    "Entry",
    "entries",
    "total_bytes",
    "max_bytes",
    "clear",
    "used",
    "wrote",
    "human",
]

# kind -> its folder in the cache
KINDS = {"weights": "weights", "dequantized": "dequantized", "stages": "real"}
REBUILDABLE = ("dequantized", "stages")
# The built-in models' dequantized copies and stages take about 1.6 GB: room for them twice over.
DEFAULT_MAX_GB = 5.0
_ENV = "RMSNORM_CACHE_MAX_GB"
_announced = False


def cache_dir() -> Path:
    """Where assembled weight files and the lab's caches go: ``$RMSNORM_CACHE``, else
    ``$XDG_CACHE_HOME/rmsnorm``, else ``~/.cache/rmsnorm``."""
    env = os.environ.get("RMSNORM_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "rmsnorm"


@dataclass(frozen=True)
class Entry:
    kind: str
    path: Path
    bytes: int
    last_used: float  # seconds since the epoch: the entry's modification time, renewed on use

    @property
    def name(self) -> str:
        return self.path.name


def human(n: float) -> str:
    """``n`` bytes in the largest unit that keeps it >= 1 (decimal units, as ``du -h --si``)."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def entries(kinds: tuple[str, ...] | list[str] | None = None) -> list[Entry]:
    """The cache's entries of ``kinds`` (all when None), least recently used first. Hidden
    temporary entries of a write under way are not listed."""
    out = []
    for kind in kinds or KINDS:
        folder = cache_dir() / KINDS[kind]
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            if path.name.startswith("."):
                continue
            try:
                out.append(Entry(kind, path, _size(path), path.stat().st_mtime))
            except OSError:  # removed meanwhile by another process
                continue
    return sorted(out, key=lambda e: e.last_used)


def total_bytes() -> int:
    """Everything under the cache folder, temporary entries included (what the disk holds)."""
    root = cache_dir()
    return _size(root) if root.exists() else 0


def max_bytes() -> float:
    """The cap from ``$RMSNORM_CACHE_MAX_GB`` (inf when 0 or inf); ValueError naming the variable
    for anything but a number >= 0."""
    raw = os.environ.get(_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_MAX_GB * 1e9
    try:
        gb = float(raw)
    except ValueError:
        gb = math.nan
    if not gb >= 0:
        raise ValueError(
            f"{_ENV} must be a number of gigabytes >= 0 (0 or inf: no cap), got {raw!r}"
        )
    return math.inf if gb == 0 else gb * 1e9


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def clear(kinds: tuple[str, ...] | list[str] = REBUILDABLE) -> tuple[int, int]:
    """Remove the entries of ``kinds`` (the rebuildable ones unless ``weights`` is named, which
    the next load of a Gemma 3 model joins again); returns (entries removed, bytes freed)."""
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"cache kind must be one of {', '.join(KINDS)}, got {kind!r}")
    found = entries(kinds)
    for e in found:
        _remove(e.path)
    return len(found), sum(e.bytes for e in found)


def used(path: str | os.PathLike) -> None:
    """Mark the entry ``path`` as just used (for the least-recently-used order)."""
    now = time.time()
    try:
        os.utime(path, (now, now))
    except OSError:
        pass


def _say(message: str) -> None:
    print(f"rmsnorm: {message}", file=sys.stderr, flush=True)


def wrote(path: str | os.PathLike) -> None:
    """After an entry ``path`` was written: the one announcement of the cache per process, then
    the cap kept (never removing ``path`` itself, nor any ``weights`` entry)."""
    global _announced
    path = Path(path)
    used(path)
    total = total_bytes()
    if not _announced:
        _announced = True
        cap = max_bytes()
        limit = "no cap" if math.isinf(cap) else f"cap {human(cap)} ({_ENV})"
        _say(
            f"caching under {cache_dir()} ({human(total)} now, {limit}); "
            "`rmsnorm cache list` shows it, `rmsnorm cache clear` empties it"
        )
    cap = max_bytes()
    if total <= cap:
        return
    for e in entries(REBUILDABLE):
        if total <= cap:
            break
        if e.path == path:
            continue
        _remove(e.path)
        total -= e.bytes
        _say(
            f"the cache is over its {human(cap)} cap ({_ENV}): removed the least recently used "
            f"{e.kind} entry {e.name} ({human(e.bytes)})"
        )
