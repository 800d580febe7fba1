"""The training comparison behind ``rmsnorm compare``: the same small GPT-style language model
trained with LayerNorm, RMSNorm, partial RMSNorm (and optionally no normalization), changing nothing
but the normalization. One module per job: :mod:`.config` (what runs), :mod:`.models` (models that
differ only in the norm), :mod:`.run` (the training and timing), :mod:`.summary` (statistics and
verdicts), :mod:`.render` (JSON, PNG and Markdown)."""

from .config import (
    BASELINE,
    CPU_REFUSE_S,
    DEFAULT_VARIANTS,
    LABELS,
    MODEL_OPTIONS,
    PRESETS,
    TRAIN_OPTIONS,
    VARIANTS,
    ArgumentError,
    CompareConfig,
    compare_config,
    cpu_matmul_rate,
    estimate_seconds,
    format_duration,
    load_corpus,
    parse_variants,
    resolve_device,
    torch_threads,
    training_flops,
)
from .models import build_models, fingerprint, norm_parameter_names, shared_parameters
from .render import (
    OUTPUT_FILES,
    output_dir,
    plot_losses,
    render_markdown,
    reproduce_command,
    write_outputs,
)
from .run import busy_machine_warnings, machine_info, run_comparison
from .summary import (
    RULE,
    SPREAD_FACTOR,
    SUMMARY_COLUMNS,
    TIMING_SKIP_STEPS,
    summarize,
    summary_rows,
    verdict,
)

__all__ = [
    "VARIANTS",
    "DEFAULT_VARIANTS",
    "BASELINE",
    "LABELS",
    "PRESETS",
    "MODEL_OPTIONS",
    "TRAIN_OPTIONS",
    "CPU_REFUSE_S",
    "ArgumentError",
    "CompareConfig",
    "compare_config",
    "parse_variants",
    "resolve_device",
    "training_flops",
    "cpu_matmul_rate",
    "estimate_seconds",
    "format_duration",
    "load_corpus",
    "torch_threads",
    "norm_parameter_names",
    "shared_parameters",
    "fingerprint",
    "build_models",
    "machine_info",
    "run_comparison",
    "busy_machine_warnings",
    "SPREAD_FACTOR",
    "RULE",
    "TIMING_SKIP_STEPS",
    "summarize",
    "verdict",
    "SUMMARY_COLUMNS",
    "summary_rows",
    "OUTPUT_FILES",
    "output_dir",
    "write_outputs",
    "plot_losses",
    "render_markdown",
    "reproduce_command",
]
