"""Writing lab results: JSON without NaN or infinity (strict parsers reject them; they become
null), every file written atomically (a temporary file beside it, then renamed), so that an
interrupted run never leaves half a file."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["jsonable", "write_json", "write_text", "atomic_path"]


def jsonable(obj):
    """``obj`` with every non-finite float replaced by None, tuples by lists, Paths by strings."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
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


def write_text(text: str, path: str | Path) -> Path:
    """``text`` into ``path`` (UTF-8), atomically."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def write_json(obj, path: str | Path) -> Path:
    """``obj`` as JSON (non-finite floats as null) into ``path``, atomically."""
    return write_text(json.dumps(jsonable(obj), indent=1, allow_nan=False) + "\n", path)
