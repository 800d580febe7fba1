"""Writing lab results: JSON without NaN or infinity (strict parsers reject them; they become
null), and the figure style shared by every plot."""

from __future__ import annotations

import json
import math
from pathlib import Path

__all__ = ["jsonable", "write_json"]


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
    path = Path(path)
    path.write_text(json.dumps(jsonable(obj), indent=1, allow_nan=False) + "\n")
    return path
