"""Writing result files atomically (a temporary file beside the target, then one rename), so that an
interrupted or failed run never leaves half a file and a reader never sees one; and the refusal to
replace an earlier run's files unless asked. Used by the lab, the benchmark and the command."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

__all__ = ["atomic_path", "write_text", "existing"]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path in ``path``'s folder to write to; renamed onto ``path`` when the block
    ends without an error, removed when it raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_text(text: str, path: str | os.PathLike) -> Path:
    """``text`` into ``path`` (UTF-8), atomically."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def existing(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Those of ``paths`` that exist already (what a run would replace)."""
    return [Path(p) for p in paths if Path(p).exists()]
