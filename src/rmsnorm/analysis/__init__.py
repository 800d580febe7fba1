"""The lab: statistics of rows (μ, σ, RMS), the simulated transformer, capture hooks and plots. Pure
functions over tensors; the CLI and the report call them. Importing it never imports matplotlib,
rich or transformers."""

from .capture import NormCapture, find_norm_layers, norm_kind
from .inspection import inspect_model, inspect_source, load_model
from .report import ReportConfig, build_report
from .simulate import SimulationConfig, SimulationResult, simulate, write_simulation
from .stats import (
    Divergence,
    RowStats,
    divergence,
    identity_check,
    measured_divergence,
    predicted_cosine,
    predicted_divergence,
    row_stats,
    summarize,
)

__all__ = [
    "RowStats",
    "Divergence",
    "row_stats",
    "identity_check",
    "predicted_cosine",
    "predicted_divergence",
    "measured_divergence",
    "divergence",
    "summarize",
    "SimulationConfig",
    "SimulationResult",
    "simulate",
    "write_simulation",
    "norm_kind",
    "find_norm_layers",
    "NormCapture",
    "inspect_model",
    "inspect_source",
    "load_model",
    "ReportConfig",
    "build_report",
]
