"""Model inspection (``rmsnorm inspect``): hooks on every norm layer of a model, how centered its
inputs are and what swapping LayerNorm for RMSNorm (or back) would change. :mod:`.run` loads and
runs the model, :mod:`.render` shows the result."""

from .render import inspect_layers, render_outlier_table, render_table
from .run import (
    BUILTIN_MODELS,
    InspectResult,
    RunnableModel,
    inspect_model,
    inspect_source,
    load_runnable_model,
    make_inputs,
)

__all__ = [
    "BUILTIN_MODELS",
    "RunnableModel",
    "load_runnable_model",
    "make_inputs",
    "inspect_model",
    "inspect_source",
    "InspectResult",
    "render_table",
    "render_outlier_table",
    "inspect_layers",
]
