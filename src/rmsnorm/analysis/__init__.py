"""The former name of :mod:`rmsnorm.lab`, kept so that existing imports keep working: it re-exports
the lab's public names and its old submodules, and warns once that it is deprecated."""

import importlib
import sys
import warnings

from ..lab import *  # noqa: F403
from ..lab import __all__ as _lab_all

warnings.warn(
    "rmsnorm.analysis is deprecated: the lab lives in rmsnorm.lab now (same names); "
    "import from rmsnorm.lab",
    DeprecationWarning,
    stacklevel=2,
)

# The old submodules, by their new homes: `import rmsnorm.analysis.transformer` finds these.
_MOVED = {
    "capture": "rmsnorm.lab.capture",
    "corpus": "rmsnorm.lab.corpus",
    "inspection": "rmsnorm.lab.inspection",
    "io": "rmsnorm.lab.io",
    "page": "rmsnorm.lab.page",
    "plots": "rmsnorm.lab.plots",
    "progress": "rmsnorm.lab.progress",
    "report": "rmsnorm.lab.report",
    "simulate": "rmsnorm.lab.simulate",
    "stats": "rmsnorm.lab.stats",
    "timing": "rmsnorm.lab.timing",
    "train": "rmsnorm.lab.train",
    "transformer": "rmsnorm.lab.transformer",
}
for _old, _new in _MOVED.items():
    sys.modules[f"{__name__}.{_old}"] = _module = importlib.import_module(_new)
    globals().setdefault(_old, _module)  # as before, `simulate` stays the function

__all__ = list(_lab_all)
