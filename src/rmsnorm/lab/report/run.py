"""The report's runs: what it runs (:class:`ReportConfig`), running it once (:func:`run_report`)
into one structured object (:class:`ReportResults`) that the figures, the page and
``report.json`` are all rendered from, and :func:`build_report`, which does both."""

from __future__ import annotations

import datetime
import math
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from ... import __version__, info
from ..iid import IIDReference, iid_reference
from ..progress import ensure
from ..simulation import SimulationConfig, SimulationResult, simulate
from ..stats import identity_check, measured_divergence, predicted_divergence
from .timing import SHAPES, time_norms

__all__ = [
    "ReportConfig",
    "StageHeadline",
    "IIDComparison",
    "IID_STANDARD_ERRORS",
    "Provenance",
    "ReportResults",
    "run_report",
    "build_report",
    "eps_demo",
    "timing_ratios",
]


@dataclass
class ReportConfig:
    """What the report runs. ``simulation``: the chapter's experiment (12 layers at init);
    ``planted_mean``: the offset of the contrast run (same model, 0 to skip); ``training``: a
    smaller model trained briefly (None to skip); ``model``: a built-in name or a local Hugging
    Face directory to inspect (None to skip), on ``text`` or random tokens."""

    simulation: SimulationConfig = field(default_factory=SimulationConfig)
    planted_mean: float = 0.02
    training: SimulationConfig | None = field(
        default_factory=lambda: SimulationConfig(
            n_layers=4, d_model=128, batch=16, train_steps=60, train_batch=8
        )
    )
    model: str | None = None
    text: str | None = None
    timing_shapes: tuple = SHAPES
    timing_rounds: int = 5

    @classmethod
    def quick(cls, **overrides) -> ReportConfig:
        """Tiny sizes: every section and file, in seconds (smoke tests, a first look)."""
        base = cls(
            simulation=SimulationConfig(n_layers=2, d_model=32, n_heads=2, seq_len=16, batch=4),
            training=SimulationConfig(
                n_layers=2,
                d_model=32,
                n_heads=2,
                seq_len=16,
                batch=4,
                train_steps=3,
                train_batch=2,
            ),
            timing_shapes=(("64 × 128", 64, 128),),
            timing_rounds=2,
        )
        return replace(base, **overrides)

    @classmethod
    def from_options(
        cls,
        *,
        quick: bool = False,
        model: str | None = None,
        text: str | None = None,
        planted_mean: float = 0.02,
        train_steps: int | None = None,
    ) -> ReportConfig:
        """The CLI's options: ``train_steps`` 0 skips training, None keeps the default."""
        cfg = cls.quick() if quick else cls()
        training = cfg.training
        if train_steps == 0:
            training = None
        elif train_steps is not None and not quick:
            training = replace(training, train_steps=train_steps)
        return replace(cfg, model=model, text=text, planted_mean=planted_mean, training=training)


@dataclass
class StageHeadline:
    """The numbers the report quotes for one model state: |μ|/σ over every token of every layer
    (median, 5% and 95% points, mean), the predicted LayerNorm-vs-RMSNorm cosine (mean, worst
    token), the median |μ|/σ per layer, how far the predicted cosine is from the measured one,
    and the row width and tokens per layer they come from."""

    median_mu_over_sigma: float
    q05_mu_over_sigma: float
    q95_mu_over_sigma: float
    mean_mu_over_sigma: float
    mean_cosine: float
    min_cosine: float
    median_per_layer: list[float]
    max_cosine_pred_vs_measured: float
    d: int
    tokens_per_layer: int

    @classmethod
    def of(cls, result: SimulationResult, stage: str = "init") -> StageHeadline:
        st = result.stages[stage]
        ratio = st.ratio[torch.isfinite(st.ratio)]
        return cls(
            median_mu_over_sigma=float(ratio.median()),
            q05_mu_over_sigma=float(torch.quantile(ratio, 0.05)),
            q95_mu_over_sigma=float(torch.quantile(ratio, 0.95)),
            mean_mu_over_sigma=float(ratio.mean()),
            mean_cosine=float(st.cosine.mean()),
            min_cosine=float(st.cosine.min()),
            median_per_layer=[float(r[torch.isfinite(r)].median()) for r in st.ratio],
            max_cosine_pred_vs_measured=float((st.cosine - st.measured_cosine).abs().max()),
            d=result.config.d_model,
            tokens_per_layer=int(st.mean.shape[1]),
        )

    def to_dict(self) -> dict:
        return asdict(self)


# How many standard errors of a median the measured median may differ from the i.i.d. one and
# still be called "at the i.i.d. level": 3 (a 0.3% chance of a false "more/less centered" for
# one median of independent tokens).
IID_STANDARD_ERRORS = 3.0


@dataclass
class IIDComparison:
    """A model state's |μ|/σ against rows of i.i.d. Gaussian entries of the same width, like with
    like. ``median_ratio`` is the measured median over the i.i.d. median; ``tolerance`` is
    :data:`IID_STANDARD_ERRORS` standard errors of a median over one layer's tokens, relative
    (conservative: the layers re-measure the same tokens, so all of them are not independent);
    ``verdict`` is ``"as centered"`` within it, else ``"more centered"`` or ``"less centered"``."""

    reference: IIDReference
    median_ratio: float
    tolerance: float
    verdict: str

    @classmethod
    def of(cls, headline: StageHeadline) -> IIDComparison:
        ref = iid_reference(headline.d)
        ratio = headline.median_mu_over_sigma / ref.median
        tolerance = IID_STANDARD_ERRORS * ref.median_relative_error(headline.tokens_per_layer)
        if abs(ratio - 1) <= tolerance:
            verdict = "as centered"
        else:
            verdict = "more centered" if ratio < 1 else "less centered"
        return cls(ref, ratio, tolerance, verdict)

    def to_dict(self) -> dict:
        return {
            "median_ratio": self.median_ratio,
            "tolerance": self.tolerance,
            "verdict": self.verdict,
        }


@dataclass
class Provenance:
    """Where and when the report ran: versions, the machine and how busy it was."""

    rmsnorm: str
    torch: str
    python: str
    machine: str
    created: str
    load_average: float  # 1-minute; NaN where the OS has none

    @classmethod
    def now(cls) -> Provenance:
        load = info.load_average()
        return cls(
            rmsnorm=__version__,
            torch=torch.__version__,
            python=platform.python_version(),
            machine=info.machine_description(),
            created=datetime.datetime.now().isoformat(timespec="seconds"),
            # other processes on the machine slow every timing; say how busy it was
            load_average=load[0] if load else math.nan,
        )


@dataclass
class ReportResults:
    """Everything the report shows, computed once by :func:`run_report`. ``planted``,
    ``trained`` and ``inspected`` are None when the configuration skips them; ``inspected`` is
    :meth:`~rmsnorm.lab.inspection.InspectResult.to_dict`'s form. :meth:`to_dict` is
    ``report.json`` without its list of files."""

    config: ReportConfig
    provenance: Provenance
    simulation: SimulationResult
    timing: dict
    identity: dict
    eps_demo: dict
    planted: SimulationResult | None = None
    trained: SimulationResult | None = None
    inspected: dict | None = None
    seconds: dict = field(default_factory=dict)

    @property
    def headline(self) -> StageHeadline:
        """The simulation at initialization: the report's main numbers."""
        return StageHeadline.of(self.simulation, "init")

    @property
    def vs_iid(self) -> IIDComparison:
        """The simulation at initialization against i.i.d. Gaussian rows of its width."""
        return IIDComparison.of(self.headline)

    @property
    def planted_headline(self) -> StageHeadline | None:
        return None if self.planted is None else StageHeadline.of(self.planted, "init")

    @property
    def training_headlines(self) -> tuple[StageHeadline, StageHeadline] | None:
        """The small model at initialization and after training."""
        if self.trained is None:
            return None
        return StageHeadline.of(self.trained, "init"), StageHeadline.of(self.trained, "trained")

    @property
    def timing_ratios(self) -> dict:
        return timing_ratios(self.timing)

    def to_dict(self) -> dict:
        cfg = self.config
        out: dict = asdict(self.provenance)
        out["identity"] = self.identity
        out["simulation"] = {
            "config": cfg.simulation.to_dict(),
            **self.headline.to_dict(),
            "iid_gaussian": self.vs_iid.reference.to_dict(),
            "vs_iid": self.vs_iid.to_dict(),
        }
        if self.planted is not None:
            out["planted"] = {"planted_mean": cfg.planted_mean, **self.planted_headline.to_dict()}
        if self.trained is not None:
            init, trained = self.training_headlines
            out["training"] = {
                "config": cfg.training.to_dict(),
                "val_loss": self.trained.val_loss,
                "init": init.to_dict(),
                "trained": trained.to_dict(),
                "train_seconds": self.trained.seconds.get("train"),
            }
        out["eps_demo"] = self.eps_demo
        if self.inspected is not None:
            out["model"] = self.inspected
        out["timing"] = {**self.timing, "rms_over_ln": self.timing_ratios}
        out["seconds"] = dict(self.seconds)
        return out


def eps_demo() -> dict:
    """ε leaves the cosine alone but moves the distance: a worked example on three rows."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 256, generator=gen, dtype=torch.float64) * 0.02
    x = x + torch.tensor([[0.0], [0.01], [0.02]], dtype=torch.float64)
    s_mean, s_std = x.mean(-1), (x - x.mean(-1, keepdim=True)).square().mean(-1).sqrt()
    out = []
    for eps in (0.0, 1e-5, 1e-3):
        p = predicted_divergence(s_mean, s_std, eps)
        cos, sq = measured_divergence(x, eps)
        out.append(
            {
                "eps": eps,
                "mu_over_sigma": (s_mean.abs() / s_std).tolist(),
                "cos_measured": cos.tolist(),
                "cos_predicted": p.predicted_cosine.tolist(),
                "sq_dist_measured": sq.tolist(),
                "sq_dist_eps_free": p.predicted_sq_dist.tolist(),
                "sq_dist_eps_aware": p.predicted_sq_dist_eps.tolist(),
            }
        )
    return {"rows": "256-wide rows, σ ≈ 0.02, μ ≈ 0, 0.01, 0.02", "cases": out}


def timing_ratios(timing: dict) -> dict:
    """Geometric means over shapes of time ratios: RMSNorm / LayerNorm per library ("rmsnorm",
    "torch"), and this library's rms_norm / each of torch's norms ("ours_over_torch_rms_norm",
    "ours_over_torch_layer_norm")."""
    out = {}
    for lib, rms, ln in (
        ("rmsnorm", "rmsnorm.rms_norm", "rmsnorm.layer_norm"),
        ("torch", "torch F.rms_norm", "torch F.layer_norm"),
        ("ours_over_torch_rms_norm", "rmsnorm.rms_norm", "torch F.rms_norm"),
        ("ours_over_torch_layer_norm", "rmsnorm.rms_norm", "torch F.layer_norm"),
    ):
        logs = []
        for shape in dict.fromkeys(r["shape_name"] for r in timing["results"]):
            t = {r["impl"]: r["median_ms"] for r in timing["results"] if r["shape_name"] == shape}
            if rms in t and ln in t and t[ln] > 0:
                logs.append(math.log(t[rms] / t[ln]))
        out[lib] = math.exp(sum(logs) / len(logs)) if logs else math.nan
    return out


def _identity(runs: list[SimulationResult], inspected: dict | None) -> dict:
    """RMS² = σ² + μ² on every row of every run (and every norm input of the inspected model)."""
    checks = [
        identity_check(st.layer(i))
        for res in runs
        for st in res.stages.values()
        for i in range(st.mean.shape[0])
    ]
    identity = {
        "rows": sum(c["rows"] for c in checks),
        "max_rel_error": max(c["max_rel_error"] for c in checks),
        "max_abs_error": max(c["max_abs_error"] for c in checks),
    }
    if inspected is not None:
        identity["model_max_rel_error"] = max(
            layer["identity_max_rel_error"] for layer in inspected["layers"]
        )
    return identity


def run_report(cfg: ReportConfig, progress=None) -> ReportResults:
    """Run everything in ``cfg``: the simulation, the planted-mean contrast, the short training,
    the optional model and the timing."""
    from ..inspection import inspect_model, load_runnable_model, make_inputs

    t_start = time.perf_counter()
    progress = ensure(progress)
    provenance = Provenance.now()
    loaded = None
    if cfg.model is not None:
        # first: a bad --model fails in a second, not after minutes of simulation
        loaded = load_runnable_model(cfg.model)
    base = simulate(cfg.simulation, progress, "simulation")
    planted = None
    if cfg.planted_mean:
        planted_cfg = replace(cfg.simulation, planted_mean=cfg.planted_mean)
        planted = simulate(planted_cfg, progress, "planted mean")
    trained = None
    if cfg.training is not None:
        trained = simulate(cfg.training, progress, "small model")
    inspected = None
    if loaded is not None:
        ids, how = make_inputs(loaded, cfg.text, seed=0)
        with progress.task(f"inspect {loaded.name}", total=1) as advance:
            inspected = inspect_model(
                loaded.model, ids, name=loaded.name, description=how, forward=loaded.forward
            ).to_dict()
            advance()
    timing = time_norms(cfg.timing_shapes, rounds=cfg.timing_rounds, progress=progress)
    runs = [r for r in (base, planted, trained) if r is not None]
    return ReportResults(
        config=cfg,
        provenance=provenance,
        simulation=base,
        timing=timing,
        identity=_identity(runs, inspected),
        eps_demo=eps_demo(),
        planted=planted,
        trained=trained,
        inspected=inspected,
        seconds={"simulation": base.seconds["total"], "runs": time.perf_counter() - t_start},
    )


def build_report(cfg: ReportConfig, out: str | Path = "report", progress=None) -> dict:
    """Run everything in ``cfg`` (:func:`run_report`) and write the report into ``out``
    (:func:`~rmsnorm.lab.report.render.write_report`); returns the summary dict (also written as
    ``report.json``) with the list of files under ``"files"``."""
    from .render import write_report

    return write_report(run_report(cfg, progress), out, progress)
