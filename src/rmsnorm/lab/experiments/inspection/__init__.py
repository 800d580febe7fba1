"""Model inspection (``rmsnorm inspect``): hooks on every norm layer of a model, how centered its
inputs are and what swapping LayerNorm for RMSNorm (or back) would change. :mod:`.run` loads and
runs the model, :mod:`.render` shows the result."""

from . import render, run
from .render import *  # noqa: F403
from .run import *  # noqa: F403

__all__ = [*run.__all__, *render.__all__]
