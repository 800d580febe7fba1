"""The report's runs: what it runs (:class:`ReportConfig`) and running it once (:func:`run_report`),
one stage per experiment, into one structured object (:class:`ReportResults`). This module runs
experiments only: it imports no section; each section of :mod:`.sections` reads its part of
``report.json``, its figures and its words from the :class:`ReportResults`
(:func:`~.render.report_json` assembles them)."""

from __future__ import annotations

import datetime
import json
import math
import platform
import time
from dataclasses import dataclass, field, replace

import torch

from ... import __version__, info
from ..._progress import ensure
from ..._validate import ArgumentError, finite_number, positive_int
from ..experiments.conventions import eps_demo, measure_conventions
from ..experiments.planted import planted_in_block
from ..experiments.realmodels import RealConfig
from ..experiments.recovery import RecoveryConfig
from ..experiments.simulation import SimulationConfig, SimulationResult
from ..experiments.simulation.seeds import SeedStudy, identity_over_seeds, replicate
from ..experiments.swap import swap_over_seeds
from ..experiments.sweep import SweepConfig, SweepResult, run_sweep
from ..experiments.trained import TrainStudy, TrainStudyConfig, run_training_study
from ..stats.outliers import blind_spot
from .timing import SHAPES, time_norms, timing_ratios

__all__ = [
    "ReportConfig",
    "Provenance",
    "ReportResults",
    "run_report",
    "read_recovery",
]


# The quick mode's model, for the simulation and the training alike.
_TINY_MODEL = dict(n_layers=2, d_model=32, n_heads=2, seq_len=16)


@dataclass
class ReportConfig:
    """What the report runs.

    ``simulation`` at ``seeds`` seeds: the chapter's experiment (12 layers at init) and its
    calibrated verdict; ``sweep``: the architecture sweep at init (None skips it); ``training``:
    LayerNorm and RMSNorm models trained over seeds, and the swap's cost on the LayerNorm ones
    (None skips both); ``planted_bias``: the mean planted on block 1's MLP output, in
    ``planted_seeds`` seeds of each norm (0 skips it); ``model``: a built-in name or a local
    Hugging Face directory to inspect (None skips it), on ``text`` or random tokens; ``real``:
    the pretrained models' study (:mod:`~rmsnorm.lab.experiments.realmodels`, on ``text`` or the
    standard library's docstrings; None skips it, as ``--quick`` does); ``recovery``: a
    ``recovery.json`` written by ``rmsnorm recover`` to read into the section 'What a short
    fine-tune recovers' (None: ``recovery_run``, the recovery run as a stage, which ``--full``
    sets, or the section says it did not run)."""

    simulation: SimulationConfig = field(default_factory=SimulationConfig)
    seeds: int = 8
    sweep: SweepConfig | None = field(default_factory=SweepConfig)
    training: TrainStudyConfig | None = field(default_factory=TrainStudyConfig)
    planted_bias: float = 0.02
    planted_seeds: int = 3
    planted_batch: int = 4
    model: str | None = None
    text: str | None = None
    real: RealConfig | None = field(default_factory=RealConfig)
    timing_shapes: tuple = SHAPES
    timing_rounds: int = 5
    recovery: str | None = None
    recovery_run: RecoveryConfig | None = None
    mode: str = "default"

    def __post_init__(self) -> None:
        for name in ("seeds", "planted_seeds", "planted_batch", "timing_rounds"):
            positive_int(name, getattr(self, name))
        finite_number("planted_bias", self.planted_bias)
        if self.recovery is not None:
            from pathlib import Path

            if not isinstance(self.recovery, (str, Path)) or not Path(self.recovery).is_file():
                raise ArgumentError(
                    "recovery",
                    f"the path of a recovery.json written by `rmsnorm recover`; "
                    f"{self.recovery!r} is not a file",
                )

    @classmethod
    def quick(cls, **overrides) -> ReportConfig:
        """Tiny sizes: every section and file, in seconds (smoke tests, a first look)."""
        base = cls(
            simulation=SimulationConfig(**_TINY_MODEL, batch=4),
            seeds=3,
            sweep=SweepConfig(seeds=3, widths=(16, 32), depths=(1, 2), batch=4),
            training=TrainStudyConfig(**_TINY_MODEL, steps=3, train_batch=2, eval_batch=4, seeds=2),
            planted_seeds=2,
            planted_batch=2,
            timing_shapes=(("64 × 128", 64, 128),),
            timing_rounds=2,
            real=None,
            mode="quick",
        )
        return replace(base, **overrides)

    @classmethod
    def full(cls, **overrides) -> ReportConfig:
        """The larger sweeps: 16 seeds, widths to 1024, depths to 48, 5 training seeds of 300
        steps (about 13 minutes on 2 cores at a load average of 8)."""
        base = cls(
            seeds=16,
            sweep=SweepConfig(seeds=16, widths=(64, 128, 256, 512, 1024), depths=(4, 12, 24, 48)),
            training=TrainStudyConfig(steps=300, seeds=5),
            planted_seeds=8,
            real=RealConfig(cost_seq_len=128, blocks_on_every_text=True, site_bootstrap=100),
            recovery_run=RecoveryConfig(),
            mode="full",
        )
        return replace(base, **overrides)

    @classmethod
    def from_options(
        cls,
        *,
        quick: bool = False,
        full: bool = False,
        model: str | None = None,
        text: str | None = None,
        planted_bias: float | None = None,
        train_steps: int | None = None,
        seeds: int | None = None,
        train_seeds: int | None = None,
        sweep: bool = True,
        real: bool | None = None,
        recovery: str | None = None,
    ) -> ReportConfig:
        """The CLI's options: ``train_steps`` 0 skips training (and the swap), ``planted_bias`` 0
        skips the planted mean, ``sweep`` False the sweep; None keeps the mode's value;
        ``recovery``: a ``recovery.json`` to read (then nothing is fine-tuned)."""
        if quick and full:
            raise ArgumentError("quick", "", template="{quick} and {full} exclude each other")
        cfg = cls.quick() if quick else cls.full() if full else cls()
        training, sweep_cfg = cfg.training, cfg.sweep if sweep else None
        if train_steps == 0:
            training = None
        elif train_steps is not None:
            training = replace(training, steps=train_steps)
        if training is not None and train_seeds is not None:
            training = replace(training, seeds=train_seeds)
        if seeds is not None:
            cfg = replace(cfg, seeds=seeds)
            if sweep_cfg is not None:
                sweep_cfg = replace(sweep_cfg, seeds=max(2, seeds))
        if real is not None:
            keep = cfg.real if cfg.real is not None else RealConfig()
            cfg = replace(cfg, real=keep if real else None)
        return replace(
            cfg,
            model=model,
            text=text,
            training=training,
            sweep=sweep_cfg,
            planted_bias=cfg.planted_bias if planted_bias is None else planted_bias,
            recovery=None if recovery is None else str(recovery),
            recovery_run=None if recovery is not None else cfg.recovery_run,
        )


@dataclass
class Provenance:
    """Where and when the report ran: versions, the machine and how busy it was at the start and
    the end (1-minute load averages; NaN where the OS has none)."""

    rmsnorm: str
    torch: str
    python: str
    machine: str
    cores: int
    created: str
    load_average: float
    load_average_end: float = math.nan

    @classmethod
    def now(cls) -> Provenance:
        load = info.load_average()
        return cls(
            rmsnorm=__version__,
            torch=torch.__version__,
            python=platform.python_version(),
            machine=info.machine_description(),
            cores=info.cpu_cores(),
            created=datetime.datetime.now().isoformat(timespec="seconds"),
            load_average=load[0] if load else math.nan,
        )

    def finish(self) -> None:
        load = info.load_average()
        self.load_average_end = load[0] if load else math.nan


@dataclass
class ReportResults:
    """Everything the report shows, computed once by :func:`run_report`, one field per stage:
    ``study`` the simulation over seeds, ``identity`` RMS² = σ² + μ² checked on its rows,
    ``conventions`` the ε placements and β measured on it, ``eps_demo`` the worked ε example,
    ``sweep``, ``training``, ``swap`` (:func:`~rmsnorm.lab.experiments.swap.swap_over_seeds` on the
    trained LayerNorm models), ``planted``, ``inspected`` (the ``--model``), ``real`` (the
    pretrained models), ``recovery``, ``blind_spot`` and ``timing``. Stages the configuration
    skips are None. :func:`~.render.report_json` is ``report.json`` without its list of files; the
    page states no number that is not in it."""

    config: ReportConfig
    provenance: Provenance
    study: SeedStudy
    timing: dict
    identity: dict
    eps_demo: dict
    conventions: dict = field(default_factory=dict)
    sweep: SweepResult | None = None
    training: TrainStudy | None = None
    swap: dict | None = None
    planted: dict | None = None
    inspected: dict | None = None
    real: dict | None = None
    recovery: dict | None = None
    blind_spot: list = field(default_factory=list)
    seconds: dict = field(default_factory=dict)

    @property
    def simulation(self) -> SimulationResult:
        """The first seed's run, drawn in the per-token figures."""
        return self.study.results[0]

    @property
    def timing_ratios(self) -> dict:
        return timing_ratios(self.timing)


def read_recovery(path) -> dict:
    """A ``recovery.json`` written by ``rmsnorm recover``; ValueError naming the file when it is
    not one."""
    try:
        data = json.loads(open(path, encoding="utf-8").read())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--recovery {path}: not a readable JSON file ({exc})") from None
    if not isinstance(data, dict) or not {"config", "models", "machine"} <= data.keys():
        raise ValueError(
            f"--recovery {path}: not a recovery.json of `rmsnorm recover` (it needs the keys "
            "config, models and machine)"
        )
    return data


def run_report(cfg: ReportConfig, progress=None) -> ReportResults:
    """Run everything in ``cfg``, one progress task per stage: the seeds, the sweep, the planted
    mean, the training and the swap, the optional model and the timing."""
    from ..experiments.inspection import inspect_model, load_runnable_model, make_inputs

    t_start = time.perf_counter()
    progress = ensure(progress)
    provenance = Provenance.now()
    loaded = None
    if cfg.model is not None:
        # first: a bad --model fails in a second, not after minutes of simulation
        loaded = load_runnable_model(cfg.model)
    recovery = None
    if cfg.recovery is not None:  # first too: a file that is not a recovery.json fails at once
        recovery = read_recovery(cfg.recovery)
    seconds: dict = {}

    def stage(name: str, t0: float) -> None:
        seconds[name] = time.perf_counter() - t0

    t0 = time.perf_counter()
    study = replicate(cfg.simulation, cfg.seeds, progress, "simulation")
    stage("simulation", t0)
    # cheap stages on the simulation, untimed: the identity on its rows, the ε and β conventions
    # measured on its stream, and the worked ε example
    identity = identity_over_seeds(study)
    conventions = measure_conventions(study)
    demo = eps_demo()
    sweep = None
    if cfg.sweep is not None:
        t0 = time.perf_counter()
        sweep = run_sweep(cfg.simulation, cfg.sweep, progress, reuse=study)
        stage("sweep", t0)
    planted = None
    if cfg.planted_bias:
        t0 = time.perf_counter()
        # The simulation's network, pre-LN whatever its position: the planted contrast's
        # derivation (lab/experiments/planted.py) holds in pre-LN networks only.
        base = replace(cfg.simulation.transformer_config(), norm_position="pre")
        with progress.task("planted mean inside a block", total=1) as advance:
            planted = planted_in_block(
                cfg.planted_bias, cfg.planted_seeds, base=base, batch=cfg.planted_batch
            )
            advance()
        stage("planted", t0)
    training = swap = None
    if cfg.training is not None:
        t0 = time.perf_counter()
        training = run_training_study(cfg.training, progress)
        stage("training", t0)
        t0 = time.perf_counter()
        with progress.task("swap: naive and exact", total=1) as advance:
            swap = swap_over_seeds(training)
            advance()
        stage("swap", t0)
    t0 = time.perf_counter()
    with progress.task("outliers: the blind spot", total=1) as advance:
        spot = blind_spot(d=cfg.simulation.d_model, counts=(0, 1, 2, 4, 8, 16))
        advance()
    stage("blind_spot", t0)
    inspected = None
    if loaded is not None:
        ids, how = make_inputs(loaded, cfg.text, seed=0)
        with progress.task(f"inspect {loaded.name}", total=1) as advance:
            inspected = inspect_model(
                loaded.model, ids, name=loaded.name, description=how, forward=loaded.forward
            ).to_dict()
            advance()
    real = None
    if cfg.real is not None:
        from ..experiments.realmodels import run_real_models
        from ..models.text import text_string

        t0 = time.perf_counter()
        sources = None if cfg.text is None else {"text": text_string(cfg.text, "--text-file")}
        real = run_real_models(cfg.real, sources, progress)
        stage("real_models", t0)
    if recovery is None and cfg.recovery_run is not None:
        from ..experiments.recovery import run_recovery

        t0 = time.perf_counter()
        recovery = run_recovery(cfg.recovery_run, progress)
        stage("recovery", t0)
    t0 = time.perf_counter()
    timing = time_norms(cfg.timing_shapes, rounds=cfg.timing_rounds, progress=progress)
    stage("timing", t0)
    seconds["runs"] = time.perf_counter() - t_start
    return ReportResults(
        config=cfg,
        provenance=provenance,
        study=study,
        timing=timing,
        identity=identity,
        eps_demo=demo,
        conventions=conventions,
        sweep=sweep,
        training=training,
        swap=swap,
        planted=planted,
        inspected=inspected,
        real=real,
        recovery=recovery,
        blind_spot=spot,
        seconds=seconds,
    )
