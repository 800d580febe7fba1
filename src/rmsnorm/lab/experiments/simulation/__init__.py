"""The chapter's experiment (``rmsnorm simulate``): per-token μ, σ and RMS of the residual stream of
the simulated transformer at every layer, at initialization and optionally after a short training.
:mod:`.run` runs it, :mod:`.render` draws and writes it."""

from .render import (
    cosine_by_layer,
    decomposition_figure,
    mean_histograms,
    ratio_by_layer,
    seed_ratio_by_layer,
    write_seed_study,
    write_simulation,
)
from .run import INPUTS, SimulationConfig, SimulationResult, StageStats, simulate

__all__ = [
    "INPUTS",
    "SimulationConfig",
    "StageStats",
    "SimulationResult",
    "simulate",
    "write_simulation",
    "write_seed_study",
    "seed_ratio_by_layer",
    "decomposition_figure",
    "mean_histograms",
    "ratio_by_layer",
    "cosine_by_layer",
]
