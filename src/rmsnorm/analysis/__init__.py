"""The former name of :mod:`rmsnorm.lab`, kept so that existing imports keep working: it re-exports
the lab's public names and its old submodules, and warns once that it is deprecated."""

import importlib
import sys
import types
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
    "page": "rmsnorm.lab.report.page",
    "progress": "rmsnorm.lab.progress",
    "report": "rmsnorm.lab.report",
    "simulate": "rmsnorm.lab.simulation",
    "stats": "rmsnorm.lab.stats",
    "timing": "rmsnorm.lab.report.timing",
    "train": "rmsnorm.lab.train",
    "transformer": "rmsnorm.lab.transformer",
}
# The old figure module's functions now live beside their experiments.
_FIGURES = {
    "mean_histograms": "rmsnorm.lab.simulation",
    "ratio_by_layer": "rmsnorm.lab.simulation",
    "cosine_by_layer": "rmsnorm.lab.simulation",
    "inspect_layers": "rmsnorm.lab.inspection",
    "divergence_curve": "rmsnorm.lab.report.render",
    "sigma_mu_plane": "rmsnorm.lab.report.render",
    "timing_bars": "rmsnorm.lab.report.render",
}

plots = types.ModuleType(f"{__name__}.plots", "The lab's figures, from their new homes.")
for _name, _home in _FIGURES.items():
    setattr(plots, _name, getattr(importlib.import_module(_home), _name))
sys.modules[plots.__name__] = plots
for _old, _new in _MOVED.items():
    sys.modules[f"{__name__}.{_old}"] = _module = importlib.import_module(_new)
    globals().setdefault(_old, _module)  # as before, `simulate` stays the function

__all__ = list(_lab_all)
