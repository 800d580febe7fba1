"""The project's main job (``rmsnorm report``): run the centering lab end to end — the simulated
transformer at initialization, a planted-mean contrast, a short training run, optionally a real
model, and a timing — and write the figures, ``report.json``, ``report.md`` and a self-contained
``report.html`` that ties them together."""

from __future__ import annotations

import datetime
import math
import platform
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from .. import __version__, info
from .page import Page
from .progress import ensure
from .simulation import SimulationConfig, SimulationResult, simulate
from .stats import identity_check, measured_divergence, predicted_divergence
from .timing import SHAPES

__all__ = ["ReportConfig", "build_report"]


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


def _f(x: float, spec: str = ".3g") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _layer_rows(result: SimulationResult, stage: str) -> list[list[str]]:
    rows = []
    per_layer = result.stages[stage].summary()
    for name, s in zip(result.layer_names, per_layer, strict=True):
        rows.append(
            [
                name,
                _f(s["mu"]["mean"], ".2e"),
                _f(s["sigma"]["mean"], ".3g"),
                _f(s["mu_over_sigma"]["q50"], ".3g"),
                _f(s["mu_over_sigma"]["q95"], ".3g"),
                _f(s["predicted_cosine"]["mean"], ".5f"),
                _f(s["predicted_cosine"]["min"], ".5f"),
                _f(s["cosine_max_abs_diff"], ".1e"),
            ]
        )
    return rows


_LAYER_HEADERS = [
    "residual after",
    "mean μ",
    "mean σ",
    "median |μ|/σ",
    "95% |μ|/σ",
    "mean cos",
    "min cos",
    "max |pred − meas| cos",
]


def _stage_headline(result: SimulationResult, stage: str) -> dict:
    st = result.stages[stage]
    ratio = st.ratio[torch.isfinite(st.ratio)]
    return {
        "median_mu_over_sigma": float(ratio.median()),
        "q95_mu_over_sigma": float(torch.quantile(ratio, 0.95)),
        "mean_cosine": float(st.cosine.mean()),
        "min_cosine": float(st.cosine.min()),
        "median_per_layer": [float(r[torch.isfinite(r)].median()) for r in st.ratio],
        "max_cosine_pred_vs_measured": float((st.cosine - st.measured_cosine).abs().max()),
    }


def _eps_demo() -> dict:
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


def _timing_ratios(timing: dict) -> dict:
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


def build_report(cfg: ReportConfig, out: str | Path = "report", progress=None) -> dict:
    """Run everything in ``cfg`` and write the report into ``out``; returns the summary dict
    (also written as ``report.json``) with the list of files under ``"files"``."""
    from . import plots
    from .inspection import inspect_layers
    from .simulation import cosine_by_layer, mean_histograms, ratio_by_layer
    from .io import write_json
    from .timing import time_norms

    t_start = time.perf_counter()
    progress = ensure(progress)
    out = Path(out)
    fig_dir = out / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    load = info.load_average()
    summary: dict = {
        "rmsnorm": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": info.machine_description(),
        "created": datetime.datetime.now().isoformat(timespec="seconds"),
        # other processes on the machine slow every timing below; say how busy it was
        "load_average": load[0] if load else math.nan,
    }
    files: dict[str, Path] = {}

    # --- runs -----------------------------------------------------------------------------------
    if cfg.model is not None:
        # load first: a bad --model fails in a second, not after the simulations
        from .inspection import load_model, make_inputs

        loaded = load_model(cfg.model)
    base = simulate(cfg.simulation, progress, "simulation")
    planted = None
    if cfg.planted_mean:
        planted_cfg = replace(cfg.simulation, planted_mean=cfg.planted_mean)
        planted = simulate(planted_cfg, progress, "planted mean")
    trained = None
    if cfg.training is not None:
        trained = simulate(cfg.training, progress, "small model")
    inspected = None
    if cfg.model is not None:
        from .inspection import inspect_model

        ids, how = make_inputs(loaded, cfg.text, seed=0)
        with progress.task(f"inspect {loaded.name}", total=1) as advance:
            inspected = inspect_model(
                loaded.model, ids, name=loaded.name, description=how, forward=loaded.forward
            ).to_dict()
            advance()
    timing = time_norms(cfg.timing_shapes, rounds=cfg.timing_rounds, progress=progress)

    # --- numbers --------------------------------------------------------------------------------
    idents = []
    for res in [base, planted, trained]:
        if res is None:
            continue
        for st in res.stages.values():
            for i in range(st.mean.shape[0]):
                idents.append(identity_check(st.layer(i)))
    identity = {
        "rows": sum(i["rows"] for i in idents),
        "max_rel_error": max(i["max_rel_error"] for i in idents),
        "max_abs_error": max(i["max_abs_error"] for i in idents),
    }
    if inspected is not None:
        identity["model_max_rel_error"] = max(
            layer["identity_max_rel_error"] for layer in inspected["layers"]
        )
    summary["identity"] = identity
    summary["simulation"] = {"config": cfg.simulation.to_dict(), **_stage_headline(base, "init")}
    if planted is not None:
        summary["planted"] = {"planted_mean": cfg.planted_mean, **_stage_headline(planted, "init")}
    if trained is not None:
        summary["training"] = {
            "config": cfg.training.to_dict(),
            "val_loss": trained.val_loss,
            "init": _stage_headline(trained, "init"),
            "trained": _stage_headline(trained, "trained"),
            "train_seconds": trained.seconds.get("train"),
        }
    summary["eps_demo"] = _eps_demo()
    if inspected is not None:
        summary["model"] = inspected
    summary["timing"] = {**timing, "rms_over_ln": _timing_ratios(timing)}

    # --- figures --------------------------------------------------------------------------------
    points = [
        {
            "label": n,
            "group": "simulated, init",
            "r": base.init.ratio[i],
            "cos": base.init.measured_cosine[i],
        }
        for i, n in enumerate(base.layer_names)
    ]
    if planted is not None:
        points += [
            {"label": n, "group": f"planted mean {cfg.planted_mean:g}", "r": planted.init.ratio[i]}
            for i, n in enumerate(planted.layer_names)
        ]
    if trained is not None:
        points += [
            {"label": n, "group": "small model, trained", "r": trained.trained.ratio[i]}
            for i, n in enumerate(trained.layer_names)
        ]
    if inspected is not None:
        for layer in inspected["layers"]:
            q = layer["mu_over_sigma"]["q50"]
            if q is not None:
                points.append(
                    {
                        "label": layer["name"],
                        "group": f"model {inspected['model']}",
                        "r": torch.tensor([q], dtype=torch.float64),
                    }
                )
    plane_panels = [("simulated transformer at init (centered)", base.init)]
    if planted is not None:
        plane_panels.append((f"same model, planted mean {cfg.planted_mean:g}", planted.init))
    extra = {"planted": planted.init} if planted is not None else None
    jobs = [
        ("mean_histograms", lambda p: mean_histograms(base, p)),
        ("ratio_by_layer", lambda p: ratio_by_layer(base, p, extra)),
        ("cosine_by_layer", lambda p: cosine_by_layer(base, p, extra)),
        ("divergence_curve", lambda p: plots.divergence_curve(points, p)),
        ("sigma_mu_plane", lambda p: plots.sigma_mu_plane(plane_panels, p)),
        ("timing", lambda p: plots.timing_bars(timing, p)),
    ]
    if trained is not None:
        jobs += [
            ("trained_mean_histograms", lambda p: mean_histograms(trained, p, "trained")),
            ("trained_ratio_by_layer", lambda p: ratio_by_layer(trained, p)),
        ]
    if inspected is not None:
        jobs.append(("model_layers", lambda p: inspect_layers(inspected, p)))
    with progress.task("report: figures", total=len(jobs)) as advance:
        for name, job in jobs:
            files[name] = job(fig_dir / f"{name}.png")
            advance()

    summary["seconds"] = {
        "simulation": base.seconds["total"],
        "total_before_pages": time.perf_counter() - t_start,
    }
    page = _page(cfg, summary, files, base, planted, trained, inspected, timing)
    files["report.md"] = out / "report.md"
    files["report.md"].write_text(page.markdown(out))
    files["report.html"] = out / "report.html"
    files["report.html"].write_text(page.html())
    summary["seconds"]["total"] = time.perf_counter() - t_start
    summary["files"] = {k: str(v.relative_to(out)) for k, v in files.items()}
    files["report.json"] = write_json(summary, out / "report.json")
    summary["files"]["report.json"] = "report.json"
    return summary


def _page(cfg, summary, files, base, planted, trained, inspected, timing) -> Page:
    sim = summary["simulation"]
    sc = cfg.simulation
    page = Page("When does RMSNorm equal LayerNorm? — the centering report")
    page.p(
        f"Generated by `rmsnorm report` (rmsnorm {summary['rmsnorm']}, torch {summary['torch']}) "
        f"on {summary['created']}, machine: {summary['machine']} (load average "
        f"{summary['load_average']:.1f} at the start)."
    )

    page.h2("The answer in one paragraph", numbered=False)
    text = (
        "LayerNorm subtracts each row's mean μ and divides by its standard deviation σ; RMSNorm "
        "skips the subtraction and divides by the root mean square RMS = √(σ² + μ²). With γ = 1 "
        "and β = 0 the two outputs differ only through the ratio μ/σ: RMSNorm(x) = (σ/RMS)·LN(x) "
        "+ (μ/RMS)·𝟙, so the cosine between them is σ/RMS = 1/√(1 + (μ/σ)²) and "
        "‖LN(x) − RMSNorm(x)‖²/d = 2 − 2σ/RMS. "
        f"In the simulated {sc.n_layers}-layer transformer at initialization the median token has "
        f"**|μ|/σ = {sim['median_mu_over_sigma']:.3f}** (95% of tokens below "
        f"{sim['q95_mu_over_sigma']:.3f}), so the two normalizations agree to a mean cosine of "
        f"**{sim['mean_cosine']:.5f}** (worst token {sim['min_cosine']:.4f}). "
    )
    if trained is not None:
        tr = summary["training"]
        text += (
            "After a short training run of a smaller model the median |μ|/σ moved from "
            f"{tr['init']['median_mu_over_sigma']:.3f} to "
            f"{tr['trained']['median_mu_over_sigma']:.3f} "
            f"(mean cosine {tr['trained']['mean_cosine']:.5f}). "
        )
    if planted is not None:
        pl = summary["planted"]
        text += (
            f"Adding a constant {cfg.planted_mean:g} to every input embedding (σ is about "
            f"{float(base.init.std[0].mean()):.3g}) is detected at once: median |μ|/σ "
            f"{pl['median_mu_over_sigma']:.2f}, mean cosine {pl['mean_cosine']:.3f}."
        )
    page.p(text)
    page.p(
        "Centered is the rule, not a coincidence, at initialization: each coordinate of the "
        "residual stream is a sum of many independent zero-mean terms, so the mean of a row of d "
        "coordinates is about σ/√d — for i.i.d. Gaussian rows E|μ|/σ ≈ √(2/(πd)) = "
        f"{math.sqrt(2 / (math.pi * sc.d_model)):.3f} at d = {sc.d_model}. Still, a mean cosine "
        f"of {sim['mean_cosine']:.4f} leaves the two unit-RMS outputs "
        f"{100 * math.sqrt(max(0.0, 2 - 2 * sim['mean_cosine'])):.1f}% apart per element (RMS "
        "of the difference), and a trained network can plant a mean (a bias, a dominant token, "
        "a massive activation); that is what this report and `rmsnorm inspect` measure."
    )

    page.h2("The identity RMS² = σ² + μ²")
    ident = summary["identity"]
    text = (
        f"Checked on {ident['rows']:,} rows (every token at every layer of the simulated runs, "
        "μ and σ computed two-pass in float64, RMS directly): largest relative error "
        f"**{ident['max_rel_error']:.1e}**, i.e. rounding only."
    )
    if "model_max_rel_error" in ident:
        text += (
            f" On the inputs of every norm layer of {inspected['model']}: "
            f"{ident['model_max_rel_error']:.1e}."
        )
    page.p(text)
    page.p(
        "Read it as geometry: put each row at the point (σ, μ). LayerNorm divides the row by the "
        "point's horizontal coordinate σ, RMSNorm by its distance from the origin RMS; the angle "
        "θ of the point above the σ axis has cos θ = σ/RMS, which is exactly the cosine between "
        "the two outputs. Centered rows lie on the σ axis, where the two divisors coincide."
    )
    page.figure(
        files["sigma_mu_plane"],
        "Each token of three layers as a point (σ, μ). Dashed: circles of constant RMS. The "
        "starred token shows the two divisors (blue σ, red RMS) and the angle θ between them.",
    )

    page.h2("The chapter's experiment: a transformer at initialization")
    page.p(
        f"A GPT-style decoder with residual connections and standard initialization "
        f"(weights N(0, {sc.init_std}²), output projections scaled by 1/√(2·layers)): "
        f"{sc.n_layers} layers, width {sc.d_model}, {sc.n_heads} heads, {sc.norm_position}-norm "
        f"{sc.norm}, fed {sc.batch} × {sc.seq_len} random tokens through its random embeddings "
        f"(seed {sc.seed}). At every layer the residual stream of each of the "
        f"{sc.batch * sc.seq_len} tokens gives one row; the figure is the histogram of the rows' "
        "means, one panel per layer."
    )
    page.figure(
        files["mean_histograms"],
        "Per-token mean μ of the residual stream, one panel per layer; each panel also gives the "
        f"layer's average σ and median |μ|/σ (over all layers: {sim['median_mu_over_sigma']:.3f}).",
    )
    page.table(_LAYER_HEADERS, _layer_rows(base, "init"))
    page.p(
        "‘mean cos’ is the predicted σ/RMS averaged over tokens; the last column compares it with "
        "the cosine measured between this library's `layer_norm` and `rms_norm` outputs of the "
        f"same rows (float64): they agree to {sim['max_cosine_pred_vs_measured']:.0e}."
    )
    page.figure(
        files["ratio_by_layer"],
        "|μ|/σ per token at each layer: median and bands over tokens, against the i.i.d. "
        "Gaussian level √(2/(πd)). Orange: the planted-mean contrast run.",
    )
    page.figure(
        files["cosine_by_layer"],
        "1 − cos(LayerNorm, RMSNorm) per layer on a log axis: predicted mean and 95th percentile, "
        "and the measured mean (crosses) from the actual outputs.",
    )

    page.h2("The divergence curve")
    page.p(
        "The cosine depends on nothing but r = |μ|/σ: cos = 1/√(1 + r²) ≈ 1 − r²/2 for small r. "
        "So |μ|/σ = 0.1 costs 0.5% of cosine, |μ|/σ = 0.3 about 4%, and at |μ| = σ the outputs are "
        "45° apart (cos 0.707). Each layer of each run is a point on the curve; the grey dots are "
        "the individual tokens of the first layer with their measured cosine, which sit on the "
        "curve exactly."
    )
    page.figure(files["divergence_curve"], "cos(LayerNorm, RMSNorm) against |μ|/σ; points: layers.")
    demo = summary["eps_demo"]["cases"]
    rows = []
    for case in demo:
        for j in range(3):
            rows.append(
                [
                    _f(case["eps"], "g"),
                    f"{case['mu_over_sigma'][j]:.3f}",
                    f"{case['cos_measured'][j]:.6f}",
                    f"{case['sq_dist_measured'][j]:.5f}",
                    f"{case['sq_dist_eps_free'][j]:.5f}",
                    f"{case['sq_dist_eps_aware'][j]:.5f}",
                ]
            )
    page.p(
        "ε does not move the cosine: with ε > 0 each output is its ε-free value times one positive "
        "number per row (a = σ/√(σ² + ε) for LayerNorm, b = RMS/√(RMS² + ε) for RMSNorm). It does "
        "move the distance, to a² + b² − 2ab·σ/RMS, which the library predicts exactly. Three rows "
        "with σ ≈ 0.02 (so σ² = 4e-4 is comparable to a large ε):"
    )
    page.table(
        ["ε", "|μ|/σ", "cos (measured)", "‖Δ‖²/d measured", "2 − 2σ/RMS", "ε-aware prediction"],
        rows,
    )

    if trained is not None:
        tc = cfg.training
        tr = summary["training"]
        page.h2("After training")
        page.p(
            "A freshly initialized network is the chapter's case; a trained one is yours. A "
            f"smaller model ({tc.n_layers} layers, width {tc.d_model}, {tc.norm}) trained for "
            f"{tc.train_steps} steps of {tc.train_batch} × {tc.seq_len} bytes of the Python "
            f"standard-library source (validation loss {tr['val_loss']['init']:.2f} → "
            f"{tr['val_loss']['trained']:.2f} nats/byte, {_f(tr['train_seconds'], '.0f')} s), "
            "then measured on held-out text at init and after training:"
        )
        page.table(
            ["residual after", "median |μ|/σ init", "median |μ|/σ trained"],
            [
                [n, f"{a:.3f}", f"{b:.3f}"]
                for n, a, b in zip(
                    trained.layer_names,
                    tr["init"]["median_per_layer"],
                    tr["trained"]["median_per_layer"],
                    strict=True,
                )
            ],
        )
        page.p(
            f"Mean cosine at init {tr['init']['mean_cosine']:.5f}, trained "
            f"{tr['trained']['mean_cosine']:.5f} (worst token {tr['trained']['min_cosine']:.4f}). "
            "A few hundred steps is not a trained language model: run `rmsnorm inspect --model "
            "DIR` on a real checkpoint to see where its norm inputs sit on the curve."
        )
        page.figure(files["trained_ratio_by_layer"], "|μ|/σ per layer, init vs trained.")
        page.figure(files["trained_mean_histograms"], "Per-token means per layer after training.")

    if planted is not None:
        pl = summary["planted"]
        page.h2("A planted mean is detected")
        page.p(
            f"The same {sc.n_layers}-layer model with {cfg.planted_mean:g} added to every element "
            "of every input embedding: the median |μ|/σ goes from "
            f"{sim['median_mu_over_sigma']:.3f} to {pl['median_mu_over_sigma']:.3f} and the mean "
            f"cosine from {sim['mean_cosine']:.5f} to {pl['mean_cosine']:.4f}. In a pre-LN network "
            "the offset "
            "rides the residual stream through every layer (orange in the figures above), and "
            "RMSNorm, which never subtracts it, would see a different input than LayerNorm."
        )

    if inspected is not None:
        page.h2(f"Model: {inspected['model']}")
        page.p(
            f"Forward hooks on all {inspected['norm_layers']} norm layers, input "
            f"{inspected['inputs']}. ‘swap’ is the output difference if the layer were the other "
            "kind with the same γ, β, ε (a LayerNorm replaced by RMSNorm, or an RMSNorm by "
            "LayerNorm): largest absolute difference and ‖Δy‖/‖y‖."
        )
        page.table(
            [
                "layer",
                "kind",
                "median |μ|/σ",
                "95% |μ|/σ",
                "μ²/RMS²",
                "mean cos",
                "max |Δy|",
                "rel ‖Δy‖",
            ],
            [
                [
                    layer["name"],
                    layer["kind"],
                    _f(layer["mu_over_sigma"]["q50"]),
                    _f(layer["mu_over_sigma"]["q95"]),
                    _f(layer["mean_energy_share"]["mean"], ".2e"),
                    _f(layer["predicted_cosine"]["mean"], ".5f"),
                    _f(layer["swap_max_abs_diff"]),
                    _f(layer["swap_rel_diff"]),
                ]
                for layer in inspected["layers"]
            ],
        )
        page.figure(files["model_layers"], f"Centering of the norm inputs of {inspected['model']}.")

    page.h2("Speed: RMSNorm vs LayerNorm, forward + backward")
    headers = ["shape"] + list(dict.fromkeys(r["impl"] for r in timing["results"]))
    rows = []
    for shape in dict.fromkeys(r["shape_name"] for r in timing["results"]):
        row = [shape]
        for impl in headers[1:]:
            ms = [
                r["median_ms"]
                for r in timing["results"]
                if r["shape_name"] == shape and r["impl"] == impl
            ]
            row.append(f"{ms[0]:.3g} ms" if ms else "–")
        rows.append(row)
    ratios = _timing_ratios(timing)
    text = (
        f"Median of {cfg.timing_rounds} interleaved samples of one forward + backward call "
        "(`torch.autograd.grad` of the output with respect to the input and the parameters, each "
        "sample a `torch.utils.benchmark` `blocked_autorange` median, the implementations taking "
        f"turns), {timing['dtype']}, on "
        f"{timing['machine']} (load average {summary['load_average']:.1f} when the report "
        f"started); this library's backend here: `{timing['backend']}`. On this machine this "
        f"library's RMSNorm took {_f(ratios['rmsnorm'], '.2f')}× the time of its LayerNorm, and "
        f"torch's `F.rms_norm` {_f(ratios['torch'], '.2f')}× its `F.layer_norm`; this library's "
        f"`rms_norm` took {_f(ratios['ours_over_torch_rms_norm'], '.2f')}× the time of torch's "
        f"`F.rms_norm` and {_f(ratios['ours_over_torch_layer_norm'], '.2f')}× that of its "
        "`F.layer_norm` (geometric means over shapes). RMSNorm skips one reduction (the mean) "
        "and the bias, so a fused kernel should be a little faster; where it is not, the "
        "implementation is why. "
    )
    if timing["backend"] == "reference":
        text += (
            "The `reference` backend is the plain-PyTorch spec (several elementwise passes, an "
            "explicit backward), not a kernel. "
        )
    text += (
        "Treat one machine's numbers as indicative (other processes may share the cores); "
        "`rmsnorm bench --latency` times every path of this library against both torch norms "
        "over a grid of shapes, and `benchmarks/` holds the careful measurements."
    )
    page.p(text)
    page.table(headers, rows)
    page.figure(files["timing"], "Forward + backward time per implementation and shape.")

    page.h2("Reproduce", numbered=False)
    secs = summary["seconds"]
    page.p(
        f"This report took {secs['total_before_pages']:.0f} s to compute (plus page writing). "
        "Every number is in `report.json`; the figures are in `figures/`. On a machine shared "
        "with other busy processes, `--threads 1` keeps torch's worker threads from waiting on "
        "each other and is often faster."
    )
    cmd = "rmsnorm report --out report"
    if cfg.model:
        cmd += f" --model {cfg.model}"
    page.code(
        f"{cmd}\nrmsnorm simulate --out sim --n-layers {sc.n_layers} --d-model {sc.d_model}\n"
        "rmsnorm inspect --model PATH_OR_BUILTIN --json inspect.json"
    )
    return page
