"""The lab: when can RMSNorm replace LayerNorm? Statistics of rows (μ, σ, RMS), the simulated
transformer over seeds with a calibrated verdict, where its mean comes from, trained models of both
kinds, the swap's cost, per-channel outliers, hooks on any model's norm layers, the training
comparison and the report. Importing it never imports matplotlib, rich, scipy or transformers."""

from . import stats
from .capture import NormCapture, find_norm_layers, norm_kind
from .conventions import beta_fit, eps_table, shrink_factors
from .decomposition import MeanDecomposition
from .iid import IIDReference, iid_reference
from .inspection import RunnableModel, inspect_model, inspect_source, load_runnable_model
from .outliers import blind_spot, channel_outliers
from .planted import planted_in_block
from .report import ReportConfig, build_report
from .seeds import SeedStudy, Verdict, centering_verdict, replicate, seed_verdicts
from .simulation import SimulationConfig, SimulationResult, simulate, write_simulation
from .stats import *  # noqa: F403 (row statistics: stats.__all__ but median)
from .swap import naive_swap, swap_costs
from .sweep import SweepConfig, SweepResult, run_sweep
from .trained import TrainStudy, TrainStudyConfig, run_training_study

__all__ = [
    *(name for name in stats.__all__ if name != "median"),
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
    "replicate",
    "SeedStudy",
    "Verdict",
    "centering_verdict",
    "seed_verdicts",
    "MeanDecomposition",
    "SweepConfig",
    "SweepResult",
    "run_sweep",
    "TrainStudyConfig",
    "TrainStudy",
    "run_training_study",
    "swap_costs",
    "naive_swap",
    "channel_outliers",
    "blind_spot",
    "planted_in_block",
    "beta_fit",
    "eps_table",
    "shrink_factors",
]
