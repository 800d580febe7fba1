"""Writing lab results: JSON without NaN or infinity (strict parsers reject them; they become
null), every file written atomically (:mod:`rmsnorm._files`: a temporary file beside it, then
renamed), so that an interrupted run never leaves half a file."""

from __future__ import annotations

import json
import math
from pathlib import Path

from .._files import atomic_path, write_text

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


def write_json(obj, path: str | Path) -> Path:
    """``obj`` as JSON (non-finite floats as null) into ``path``, atomically."""
    return write_text(json.dumps(jsonable(obj), indent=1, allow_nan=False) + "\n", path)
