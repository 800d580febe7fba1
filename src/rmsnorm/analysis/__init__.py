"""The former name of :mod:`rmsnorm.lab`, kept so that existing imports keep working: it re-exports
the lab's public names and its old submodules, under their old names too, and warns once that it
is deprecated."""

import importlib
import sys
import types
import warnings

from .. import lab as _lab
from ..lab import *  # noqa: F403

warnings.warn(
    "rmsnorm.analysis is deprecated: the lab lives in rmsnorm.lab now; import from rmsnorm.lab "
    "(load_model is now load_runnable_model, LoadedModel is RunnableModel)",
    DeprecationWarning,
    stacklevel=2,
)

# Names that changed with the move: old name -> new name.
_RENAMED = {"load_model": "load_runnable_model", "LoadedModel": "RunnableModel"}
# The old submodules and the modules that now hold their names.
_MOVED = {
    "capture": ("rmsnorm.lab.capture",),
    "corpus": ("rmsnorm.lab.corpus",),
    "inspection": ("rmsnorm.lab.inspection",),
    "io": ("rmsnorm.lab.io",),
    "page": ("rmsnorm.lab.report.page",),
    "plots": ("rmsnorm.lab.simulation", "rmsnorm.lab.inspection", "rmsnorm.lab.report.render"),
    "progress": ("rmsnorm.lab.progress",),
    "report": ("rmsnorm.lab.report",),
    "simulate": ("rmsnorm.lab.simulation",),
    "stats": ("rmsnorm.lab.stats",),
    "timing": ("rmsnorm.lab.report.timing",),
    "train": ("rmsnorm.lab.train",),
    "transformer": ("rmsnorm.lab.transformer",),
}


def _alias(old: str, homes: tuple[str, ...]) -> types.ModuleType:
    """A module named ``rmsnorm.analysis.<old>`` whose attributes are looked up in ``homes``."""
    modules = [importlib.import_module(home) for home in homes]
    alias = types.ModuleType(f"{__name__}.{old}", f"The former {old!r}; see {', '.join(homes)}.")

    def __getattr__(name: str):
        for module in modules:
            try:
                return getattr(module, _RENAMED.get(name, name))
            except AttributeError:
                pass
        raise AttributeError(f"module {alias.__name__!r} has no attribute {name!r}")

    alias.__getattr__ = __getattr__
    return alias


for _old, _homes in _MOVED.items():
    sys.modules[f"{__name__}.{_old}"] = _module = _alias(_old, _homes)
    globals().setdefault(_old, _module)  # as before, `simulate` stays the function

load_model = _lab.load_runnable_model
LoadedModel = _lab.RunnableModel
__all__ = [*_lab.__all__, "load_model"]
