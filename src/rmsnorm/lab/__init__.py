"""The lab: when can RMSNorm replace LayerNorm? Its parts, one folder each:

- :mod:`.models`: the models it studies (the simulated transformer and its training loop, the real
  pretrained models and their loaders, which modules of a model are norm layers);
- :mod:`.stats`: the statistics (rows' μ, σ, RMS and the two norms' divergence, the i.i.d.
  reference, where the mean comes from, outliers, the ε and β conventions, norm-site statistics);
- :mod:`.experiments`: the experiments run on those models with those statistics (the simulation
  over seeds with a calibrated verdict, the sweep, trained models, the swap's cost, a planted mean,
  the training comparison, the hooks on any model's norm layers, the real models' study);
- :mod:`.report`: ``rmsnorm report``, every experiment's numbers, figures and words in one page.

:mod:`.io` (JSON and atomic writes), :mod:`.figures` (matplotlib, imported only when a figure
is drawn) and :mod:`.page` (the document model: Markdown and HTML) are what all of them share. The
names below are the lab's public ones; the rest live at their module's path
(``rmsnorm.lab.experiments.comparison`` ...). Importing the lab never imports matplotlib, rich,
scipy or transformers."""

from . import stats
from .experiments.inspection import (
    RunnableModel,
    inspect_model,
    inspect_source,
    load_runnable_model,
)
from .experiments.inspection.capture import NormCapture
from .experiments.planted import planted_in_block
from .experiments.simulation import SimulationConfig, SimulationResult, simulate, write_simulation
from .experiments.simulation.seeds import (
    SeedStudy,
    Verdict,
    centering_verdict,
    replicate,
    seed_verdicts,
)
from .experiments.swap import naive_swap, swap_costs
from .experiments.sweep import SweepConfig, SweepResult, run_sweep
from .experiments.trained import TrainStudy, TrainStudyConfig, run_training_study
from .models.norm_layers import find_norm_layers, norm_kind
from .report import ReportConfig, build_report
from .stats.conventions import beta_fit, eps_table, shrink_factors
from .stats.decomposition import MeanDecomposition
from .stats.iid import IIDReference, iid_reference
from .stats.outliers import blind_spot, channel_outliers
from .stats.rows import *  # noqa: F403 (row statistics: stats.__all__ but median)

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
