"""The lab: when can RMSNorm replace LayerNorm? Statistics of rows (μ, σ, RMS), the simulated
transformer, hooks on any model's norm layers, the training comparison and the report. Importing it
never imports matplotlib, rich or transformers."""

from .capture import NormCapture, find_norm_layers, norm_kind
from .iid import IIDReference, iid_reference
from .inspection import RunnableModel, inspect_model, inspect_source, load_runnable_model
from .report import ReportConfig, build_report
from .simulation import SimulationConfig, SimulationResult, simulate, write_simulation
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
    "IIDReference",
    "iid_reference",
    "SimulationConfig",
    "SimulationResult",
    "simulate",
    "write_simulation",
    "norm_kind",
    "find_norm_layers",
    "NormCapture",
    "inspect_model",
    "inspect_source",
    "RunnableModel",
    "load_runnable_model",
    "ReportConfig",
    "build_report",
]
