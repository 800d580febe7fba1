"""The report's runs: what it runs (:class:`ReportConfig`), running it once (:func:`run_report`)
into one structured object (:class:`ReportResults`), whose :meth:`~ReportResults.to_dict` is
``report.json`` and holds every number the page states."""

from __future__ import annotations

import datetime
import math
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field, replace

import torch

from ... import __version__, info
from ..._progress import ensure
from ..._validate import ArgumentError, finite_number, positive_int
from ..experiments.planted import planted_in_block
from ..experiments.realmodels import RealConfig
from ..experiments.simulation import SimulationConfig, SimulationResult
from ..experiments.simulation.seeds import (
    CONFIDENCE,
    SeedStudy,
    centering_verdict,
    paired_spread_test,
    replicate,
)
from ..experiments.sweep import SweepConfig, SweepResult, run_sweep
from ..experiments.trained import TrainStudy, TrainStudyConfig, run_training_study
from ..stats.conventions import eps_table, stream_shrink
from ..stats.iid import iid_reference
from ..stats.outliers import MASSIVE_SHARE_FACTOR, blind_spot
from ..stats.rows import (
    RowStats,
    identity_check,
    measured_divergence,
    median,
    predicted_divergence,
)
from .timing import SHAPES, time_norms

__all__ = [
    "ReportConfig",
    "Provenance",
    "ReportResults",
    "run_report",
    "eps_demo",
    "timing_ratios",
    "seed_headline",
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
    standard library's docstrings; None skips it, as ``--quick`` does)."""

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
    mode: str = "default"

    def __post_init__(self) -> None:
        for name in ("seeds", "planted_seeds", "planted_batch", "timing_rounds"):
            positive_int(name, getattr(self, name))
        finite_number("planted_bias", self.planted_bias)

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
    ) -> ReportConfig:
        """The CLI's options: ``train_steps`` 0 skips training (and the swap), ``planted_bias`` 0
        skips the planted mean, ``sweep`` False the sweep; None keeps the mode's value."""
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
            cfg = replace(cfg, real=RealConfig() if real else None)
        return replace(
            cfg,
            model=model,
            text=text,
            training=training,
            sweep=sweep_cfg,
            planted_bias=cfg.planted_bias if planted_bias is None else planted_bias,
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


def seed_headline(result: SimulationResult, stage: str = "init") -> dict:
    """One run's numbers over every token of every layer: |μ|/σ median, 5% and 95% points, mean;
    the predicted cosine's mean and minimum; how far predicted and measured cosines are apart;
    and per layer the mean μ, mean σ, median and 95% |μ|/σ, mean and minimum cosine."""
    st = result.stages[stage]
    ratio = st.ratio[torch.isfinite(st.ratio)]
    layers = []
    for name, s in zip(result.layer_names, st.summary(), strict=True):
        layers.append(
            {
                "name": name,
                "mean_mu": s["mu"]["mean"],
                "mean_sigma": s["sigma"]["mean"],
                "median_ratio": s["mu_over_sigma"]["q50"],
                "q95_ratio": s["mu_over_sigma"]["q95"],
                "mean_cosine": s["predicted_cosine"]["mean"],
                "min_cosine": s["predicted_cosine"]["min"],
                "cosine_max_abs_diff": s["cosine_max_abs_diff"],
            }
        )
    return {
        "seed": result.config.seed,
        "median_mu_over_sigma": median(ratio),
        "q05_mu_over_sigma": float(torch.quantile(ratio, 0.05)),
        "q95_mu_over_sigma": float(torch.quantile(ratio, 0.95)),
        "mean_mu_over_sigma": float(ratio.mean()),
        "mean_cosine": float(st.cosine.mean()),
        "min_cosine": float(st.cosine.min()),
        "max_cosine_pred_vs_measured": float((st.cosine - st.measured_cosine).abs().max()),
        "layers": layers,
    }


def _spread(values: list[float]) -> dict:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return {"min": math.nan, "median": math.nan, "max": math.nan}
    return {"min": min(vals), "median": statistics.median(vals), "max": max(vals)}


def _simulation_section(study: SeedStudy) -> dict:
    ref = study.reference
    d = study.config.d_model
    cos = [s.mean_cosine for s in study.summaries]
    mean_cos = statistics.fmean(cos)
    verdict = study.verdict
    seed_v = study.seed_verdicts
    token_v = study.token_test_verdicts
    ratio_band = study.band("median_ratio")
    share_band = study.band("shared_share")
    layers = []
    for i, name in enumerate(study.layer_names):
        v = study.layer_verdicts[i]
        layers.append(
            {
                "name": name,
                "median_ratio_median": ratio_band["median"][i],
                "median_ratio_min": ratio_band["min"][i],
                "median_ratio_max": ratio_band["max"][i],
                "vs_iid": v.ratio,
                "vs_iid_ci_low": v.ci_low,
                "vs_iid_ci_high": v.ci_high,
                "verdict": v.verdict,
                "shared_share_median": share_band["median"][i],
                "shared_share_min": share_band["min"][i],
                "shared_share_max": share_band["max"][i],
            }
        )
    return {
        "config": study.config.to_dict(),
        "d": d,
        "n_seeds": len(study.seeds),
        "tokens_per_layer": study.tokens_per_layer,
        "tokens_per_seed": study.tokens_per_layer * len(study.layer_names),
        "iid_gaussian": ref.to_dict(),
        "iid_sqrt_2_over_pi_d": math.sqrt(2 / (math.pi * d)),
        "iid_mean_one_minus_cos": 1 / (2 * (d - 3)),
        "seed0": seed_headline(study.results[0]),
        "seeds": study.to_dict(),
        "pooled_median": verdict.ratio * ref.median,
        "pooled_median_ci": [verdict.ci_low * ref.median, verdict.ci_high * ref.median],
        "verdict": verdict.to_dict(),
        "seed_sd_pct": 100 * verdict.seed_sd,
        "median_ratio_min": min(study.ratios),
        "median_ratio_max": max(study.ratios),
        "mean_cosine": mean_cos,
        "apart_pct": 100 * math.sqrt(max(0.0, 2 - 2 * mean_cos)),
        "seed_verdict_as_centered": None if seed_v is None else seed_v.count("as centered"),
        "token_test_flagged": len(token_v) - token_v.count("as centered"),
        "token_test_tolerance_pct": 100 * study.to_dict()["token_test_tolerance"],
        "layer_confidence": 1 - (1 - verdict.confidence) / len(study.layer_names),
        "layers": layers,
    }


def _decomposition_section(study: SeedStudy, sweep: SweepResult | None) -> dict:
    shares = [s.shared_share[-1] for s in study.summaries]
    out: dict = {
        "last_layer": study.layer_names[-1],
        "last_layer_share_pct": {k: 100 * v for k, v in _spread(shares).items()},
        "origin": study.origin(),
    }
    if out["origin"] is not None:
        out["mlp_explained_pct"] = 100 * out["origin"]["mlp_explained"]
    if sweep is not None:
        acts = {}
        for cell in sweep.group("activation"):
            v = cell.study.verdict
            origin = cell.study.origin() or {}
            acts[cell.label] = {
                "seed_sd_pct": 100 * v.seed_sd,
                "ratio": v.ratio,
                "verdict": v.verdict,
                "last_layer_share_median_pct": 100
                * _spread([s.shared_share[-1] for s in cell.study.summaries])["median"],
                "activation_mean": origin.get("activation_mean"),
                "activation_mean_rms": origin.get("activation_mean_rms"),
            }
        out["activations"] = acts
        cells = {c.label: c.study for c in sweep.group("activation")}
        if "GELU" in cells and "GELU, token mean removed" in cells:
            test = paired_spread_test(
                cells["GELU"].ratios, cells["GELU, token mean removed"].ratios
            )
            out["ablation"] = {
                **test,
                "sd_gelu_pct": 100 * test["sd_a"],
                "sd_centered_pct": 100 * test["sd_b"],
                "narrower": test["p"] < 0.05 and test["sd_b"] < test["sd_a"],
                "wider": test["p"] < 0.05 and test["sd_b"] > test["sd_a"],
            }
    return out


def _sweep_section(sweep: SweepResult) -> dict:
    """The sweep's cells and the counts the text states: verdicts of the settings whose stream
    carries its residual sum (pre-norm and norm-free) and of post-LN."""
    out = sweep.to_dict()
    residual = [
        c for c in sweep.cells if c.config.norm_position == "pre" or c.config.norm == "none"
    ]
    residual = list({repr(c.config): c for c in residual}.values())  # the default counted once
    counts: dict[str, int] = {}
    for c in residual:
        counts[c.study.verdict.verdict] = counts.get(c.study.verdict.verdict, 0) + 1
    widths = sweep.group("width")
    post = [c for c in sweep.group("placement") if c.label == "post-LN"]
    # Each cell's interval is at 95%, so among n settings about n/20 exclude 1 by chance alone; a
    # Bonferroni-adjusted interval keeps that chance at 5% for the whole sweep.
    unique = list({repr(c.config): c for c in sweep.cells}.values())
    conf = 1 - (1 - CONFIDENCE) / len(unique)
    adjusted = {c.label: centering_verdict(c.study.ratios, conf).verdict for c in unique}
    out["summary"] = {
        "residual_settings": len(residual),
        "residual_verdicts": counts,
        "residual_more_centered": [
            c.label for c in residual if c.study.verdict.verdict == "more centered"
        ],
        "residual_less_centered": [
            c.label for c in residual if c.study.verdict.verdict == "less centered"
        ],
        "widths_as_centered": sum(c.study.verdict.verdict == "as centered" for c in widths),
        "widths": len(widths),
        "post_ln": None if not post else post[0].study.verdict.to_dict(),
        "settings": len(unique),
        "chance_flags": (1 - CONFIDENCE) * len(unique),
        "bonferroni_confidence": conf,
        "bonferroni_flagged": {
            label: v for label, v in adjusted.items() if v in ("more centered", "less centered")
        },
    }
    return out


def _training_section(study: TrainStudy) -> dict:
    cfg = study.config
    d = cfg.d_model
    ref = iid_reference(d)
    out: dict = {
        "config": cfg.to_dict(),
        "study": study.to_dict(),
        "iid_median": ref.median,
        "one_over_d": 1 / d,
        "per_norm": {},
    }
    for norm in cfg.norms:
        runs = study.of(norm)
        blocks = range(1, cfg.n_layers + 1)
        sigma_growth = [
            r.trained["median_sigma"][i] / r.init["median_sigma"][i] for r in runs for i in blocks
        ]
        mu_growth = [
            r.trained["median_abs_mu"][i] / r.init["median_abs_mu"][i] for r in runs for i in blocks
        ]
        ratios_init = [r.init["pooled_median_ratio"] for r in runs]
        ratios_trained = [r.trained["pooled_median_ratio"] for r in runs]
        grad = [g for r in runs for g in r.trained["grad_ones_share"]]
        grad_init = [g for r in runs for g in r.init["grad_ones_share"]]
        beta = [r.trained["beta_mean_term_left_share"][i] for r in runs for i in blocks]
        outl = [o for r in runs for o in r.trained["outliers"][1:]]
        trained_vs_iid = [x / ref.median for x in ratios_trained]
        out["per_norm"][norm] = {
            "seeds": [r.seed for r in runs],
            "pooled_ratio_init": ratios_init,
            "pooled_ratio_trained": ratios_trained,
            "pooled_ratio_init_mean": statistics.fmean(ratios_init),
            "pooled_ratio_trained_mean": statistics.fmean(ratios_trained),
            "trained_vs_iid": trained_vs_iid,
            "trained_above_iid": sum(x > 1 for x in trained_vs_iid),
            "trained_rose": sum(b > a for a, b in zip(ratios_init, ratios_trained, strict=True)),
            "trained_verdict": centering_verdict(trained_vs_iid).to_dict(),
            "sigma_growth": _spread(sigma_growth),
            "mu_growth": _spread(mu_growth),
            "grad_ones_share_trained": _spread(grad),
            "grad_ones_share_init": _spread(grad_init),
            "beta_mean_term_left_pct": {k: 100 * v for k, v in _spread(beta).items()},
            "val_loss_init": [r.val_loss["init"] for r in runs],
            "val_loss_trained": [r.val_loss["trained"] for r in runs],
            "val_loss_trained_range": _spread([r.val_loss["trained"] for r in runs]),
            "layers": {
                stage: {
                    key: [
                        statistics.median(getattr(r, stage)[key][i] for r in runs)
                        for i in range(cfg.n_layers + 1)
                    ]
                    for key in ("median_sigma", "median_abs_mu", "median_ratio")
                }
                for stage in ("init", "trained")
            },
            "max_over_rms_median": _spread([o["max_over_rms_median"] for o in outl]),
            "excess_kurtosis_median": _spread([o["excess_kurtosis_median"] for o in outl]),
            "top1_share_pct": {
                k: 100 * v for k, v in _spread([o["top1_share"] for o in outl]).items()
            },
            "top_k_share_pct": {
                k: 100 * v for k, v in _spread([o["top_k_share"] for o in outl]).items()
            },
            "train_seconds": sum(r.train_seconds for r in runs),
        }
    if "rmsnorm" in out["per_norm"]:
        ln, rms = out["per_norm"]["layernorm"], out["per_norm"]["rmsnorm"]
        paired = [
            b / a
            for a, b in zip(ln["pooled_ratio_trained"], rms["pooled_ratio_trained"], strict=True)
        ]
        out["paired_rms_over_ln"] = paired
        out["paired_verdict"] = centering_verdict(paired).to_dict()
    ln0 = study.of("layernorm")[0] if study.of("layernorm") else None
    if ln0 is not None:
        out["outlier_iid_max_over_rms"] = ln0.trained["outliers"][0]["iid_max_over_rms_median"]
        out["outlier_top_k"] = ln0.trained["outliers"][0]["top_k"]
        out["outlier_iid_top_k_share_pct"] = 100 * ln0.trained["outliers"][0]["iid_top_k_share"]
        out["outlier_iid_top1_share_pct"] = 100 / d
        out["outlier_top1_over_iid_max"] = max(
            p["top1_share_pct"]["max"] for p in out["per_norm"].values()
        ) / (100 / d)
        out["n_params"] = sum(p.numel() for p in ln0.model.parameters())
        out["massive_share_factor"] = MASSIVE_SHARE_FACTOR
    return out


# The swap runs 2 × (norms + 1) float64 forwards per model; 8 of the held-out sequences (512
# tokens) keep it to ~1.5 s per seed.
SWAP_SEQUENCES = 8


def _swap_section(study: TrainStudy) -> dict:
    from ..experiments.swap import swap_costs

    per_seed = []
    tokens = study.eval_tokens[:SWAP_SEQUENCES]
    targets = study.eval_targets[:SWAP_SEQUENCES]
    for run in study.of("layernorm"):
        costs = swap_costs(run.model, tokens, targets)
        costs["seed"] = run.seed
        per_seed.append(costs)
    names = per_seed[0]["norms"]

    def spread(kind: str, key: str, scope: str = "all") -> dict:
        if scope == "all":
            return _spread([c[kind]["all"][key] for c in per_seed])
        return _spread([c[kind]["one"][n][key] for c in per_seed for n in names])

    one_worst = {n: max(c["naive"]["one"][n]["kl_mean"] for c in per_seed) for n in names}
    worst = max(one_worst, key=one_worst.get)
    exact = [
        abs(cost[key])
        for c in per_seed
        for cost in [c["exact"]["all"], *c["exact"]["one"].values()]
        for key in ("kl_mean", "max_abs_logit_diff", "delta_loss")
    ]
    exact_max = max(exact)
    return {
        "per_seed": per_seed,
        "reference": "Jiang et al., NeurIPS 2023",
        "tokens": list(tokens.shape),
        "norms": names,
        "loss": _spread([c["loss"] for c in per_seed]),
        "naive_all": {
            k: spread("naive", k)
            for k in ("kl_mean", "kl_max", "delta_loss", "max_abs_logit_diff", "logit_rms")
        },
        "exact_all": {
            k: spread("exact", k) for k in ("kl_mean", "delta_loss", "max_abs_logit_diff")
        },
        "naive_one_kl": spread("naive", "kl_mean", "one"),
        "naive_one_worst_norm": worst,
        "naive_one_worst_kl": one_worst[worst],
        "naive_one_kl_max_by_norm": one_worst,
        "exact_max_abs": exact_max,
    }


def _planted_section(planted: dict) -> dict:
    runs = planted["runs"]
    out: dict = {
        "experiment": planted,
        "seeds": sorted({r["seed"] for r in runs}),
        "per_norm": {},
    }
    for norm in dict.fromkeys(r["norm"] for r in runs):
        rs = [r for r in runs if r["norm"] == norm]
        out["per_norm"][norm] = {
            "beyond_shift_max": max(max(r["beyond_shift"]) for r in rs),
            "beyond_shift_last": _spread([r["beyond_shift"][-1] for r in rs]),
            "kl_mean": _spread([r["kl_mean"] for r in rs]),
            "max_abs_logit_diff": _spread([r["max_abs_logit_diff"] for r in rs]),
            "ratio_block1_planted": _spread([r["median_ratio_planted"][1] for r in rs]),
            "ratio_last_planted": _spread([r["median_ratio_planted"][-1] for r in rs]),
            "ratio_last_clean": _spread([r["median_ratio_clean"][-1] for r in rs]),
            "sigma_block1": _spread([r["median_sigma_block1"] for r in rs]),
        }
    return out


def _conventions_section(study: SeedStudy) -> dict:
    st = study.results[0].init
    d = study.config.d_model
    stats = RowStats(st.mean.flatten(), st.std.flatten(), st.rms.flatten())  # every layer's tokens
    rows_ms = [stream_shrink(stats, eps) for eps in (1e-5, 1e-6)]
    # β: the mean term μ/RMS per token, per layer and seed, with its mean over tokens removed
    left = []
    for res in study.results:
        s = res.init
        for i in range(s.mean.shape[0]):
            m = torch.where(s.rms[i] > 0, s.mean[i] / s.rms[i], torch.zeros_like(s.mean[i]))
            total = float(m.square().sum())
            left.append(float((m - m.mean()).square().sum()) / total if total > 0 else math.nan)
    return {
        "d": d,
        "eps_table": eps_table(d=d),
        "stream": rows_ms,
        "beta_mean_term_left_pct_init": {k: 100 * v for k, v in _spread(left).items()},
    }


def _derivations() -> dict:
    """The divergence curve at a few r = |μ|/σ: cos = 1/√(1 + r²) and the share of cosine lost."""
    rs = [0.1, 0.3, 1.0]
    cos = [1 / math.sqrt(1 + r * r) for r in rs]
    return {
        "r": rs,
        "cosine": cos,
        "cosine_loss_pct": [100 * (1 - c) for c in cos],
        "angle_deg_at_1": math.degrees(math.acos(cos[-1])),
    }


@dataclass
class ReportResults:
    """Everything the report shows, computed once by :func:`run_report`. Sections the
    configuration skips are None. :meth:`to_dict` is ``report.json`` without its list of files;
    the page states no number that is not in it."""

    config: ReportConfig
    provenance: Provenance
    study: SeedStudy
    timing: dict
    identity: dict
    eps_demo: dict
    sweep: SweepResult | None = None
    training: TrainStudy | None = None
    swap: dict | None = None
    planted: dict | None = None
    inspected: dict | None = None
    real: dict | None = None
    blind_spot: list = field(default_factory=list)
    seconds: dict = field(default_factory=dict)

    @property
    def simulation(self) -> SimulationResult:
        """The first seed's run, drawn in the per-token figures."""
        return self.study.results[0]

    @property
    def timing_ratios(self) -> dict:
        return timing_ratios(self.timing)

    def to_dict(self) -> dict:
        out: dict = asdict(self.provenance)
        out["mode"] = self.config.mode
        out["identity"] = self.identity
        out["derivations"] = _derivations()
        out["simulation"] = _simulation_section(self.study)
        out["decomposition"] = _decomposition_section(self.study, self.sweep)
        if self.sweep is not None:
            out["sweep"] = _sweep_section(self.sweep)
        if self.training is not None:
            out["training"] = _training_section(self.training)
        if self.swap is not None:
            out["swap"] = self.swap
        if self.planted is not None:
            out["planted"] = _planted_section(self.planted)
        out["outliers"] = {
            "blind_spot": self.blind_spot,
            "d": self.study.config.d_model,
            "one_channel_limit": 1 / math.sqrt(self.study.config.d_model - 1),
        }
        out["conventions"] = _conventions_section(self.study)
        out["real_models"] = self.real or {
            "skipped": "--quick" if self.config.mode == "quick" else "--no-real"
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
    return {"rows": 3, "d": 256, "sigma": 0.02, "shifts": [0.0, 0.01, 0.02], "cases": out}


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


def _identity(study: SeedStudy, inspected: dict | None) -> dict:
    """RMS² = σ² + μ² on every row of every seed (and every norm input of the inspected model)."""
    checks = [
        identity_check(res.init.layer(i))
        for res in study.results
        for i in range(res.init.mean.shape[0])
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
    seconds: dict = {}

    def stage(name: str, t0: float) -> None:
        seconds[name] = time.perf_counter() - t0

    t0 = time.perf_counter()
    study = replicate(cfg.simulation, cfg.seeds, progress, "simulation")
    stage("simulation", t0)
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
            swap = _swap_section(training)
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
        from ..models.text import stdlib_docstrings, text_string

        t0 = time.perf_counter()
        source = stdlib_docstrings() if cfg.text is None else text_string(cfg.text, "--text-file")
        real = run_real_models(cfg.real, source, progress)
        stage("real_models", t0)
    t0 = time.perf_counter()
    timing = time_norms(cfg.timing_shapes, rounds=cfg.timing_rounds, progress=progress)
    stage("timing", t0)
    seconds["runs"] = time.perf_counter() - t_start
    return ReportResults(
        config=cfg,
        provenance=provenance,
        study=study,
        timing=timing,
        identity=_identity(study, inspected),
        eps_demo=eps_demo(),
        sweep=sweep,
        training=training,
        swap=swap,
        planted=planted,
        inspected=inspected,
        real=real,
        blind_spot=spot,
        seconds=seconds,
    )
