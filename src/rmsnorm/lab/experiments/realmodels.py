"""The pretrained models' study, as the report and ``rmsnorm inspect --swap`` run it. Per model and
text: the statistics at every norm site (:mod:`~rmsnorm.lab.experiments.sites`) and the centering's
end-to-end cost (:mod:`~rmsnorm.lab.experiments.centering`): at every site, per kind of site, one
block at a time for every block (on the primary text), and the interventions that test the
mechanism. Per GGUF model, how far one more rounding through its own format moves the numbers
(:mod:`~rmsnorm.lab.experiments.quantization`). Then, from the per-sequence costs, intervals that
hold at their n (:mod:`~rmsnorm.lab.stats.intervals`), and whether a per-block statistic predicts
the per-block cost (:mod:`~rmsnorm.lab.stats.predict`: within each model, stratified over models,
chosen on one model and tested on the others).

Each stage's result is cached as JSON under ``cache_dir()/real/``, keyed by the sha256 of the
model's weight files, the text's sha256, the stage's settings, and the code's version (rmsnorm's
version, the sha256 of the modules that compute the stage, the torch and transformers versions): a
changed input computes that stage again, never a stale result. Intervals and correlations are
recomputed from the cached per-sequence values on every run (milliseconds). A built-in model whose
weights are not installed is a result that says so and how to install them, not an error.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ... import _cache as cache
from ..._progress import ensure
from ..io import jsonable, write_json
from ..stats.rows import median

__all__ = [
    "RealConfig",
    "PREDICTORS",
    "COST_METRICS",
    "run_model",
    "run_real_models",
    "predictor_points",
    "summarize_costs",
]

# The statistics set against the measured cost: (variant, statistic) of
# :mod:`~rmsnorm.lab.stats.sitestats`, or a site-level number; averaged over the sites of a block
# (the largest |x|: the maximum).
PREDICTORS = {
    "|μ|/σ median": ("all", "ratio_median"),
    "|μ|/σ p95": ("all", "ratio_p95"),
    "|μ|/σ median, no first token": ("no_first", "ratio_median"),
    "|μ|/σ median, no massive channels": ("no_massive", "ratio_median"),
    "1 − σ/RMS": ("all", "one_minus_cos_mean"),
    "shift / σ of ordinary channels": ("all", "shift_median"),
    "shared part of μ²": ("no_first", "shared_mu_share"),
    "excess kurtosis": ("all", "kurtosis_median"),
    "largest |x|": (None, "max_abs"),
}
# Per-sequence costs of a causal model's variant, and of an encoder's (per sentence).
COST_METRICS = ("kl", "kl_first", "kl_rest", "delta_ce", "top1", "top1_rest")
ENCODER_METRICS = ("one_minus_cosine",)
# The model the predictor is chosen on (the most blocks), then tested on the others.
SELECT_ON = "smollm2-135m"

_STATS_CODE = (
    "experiments/sites.py",
    "stats/sitestats.py",
    "models/text.py",
    "models/pretrained.py",
)
_COST_CODE = (
    "experiments/centering.py",
    "experiments/sites.py",
    "models/text.py",
    "models/pretrained.py",
)
_QUANT_CODE = (*_STATS_CODE, *_COST_CODE, "experiments/quantization.py")


@dataclass(frozen=True)
class RealConfig:
    """What the study runs: ``models`` (built-in names or any source :func:`load_pretrained`
    takes) on ``texts`` (built-in names of :data:`~rmsnorm.lab.models.text.TEXTS`; the first is
    the primary text); ``sequences`` × ``seq_len`` tokens of each text's held-in part for the
    statistics; the centering's cost on ``cost_sequences`` held-out windows of ``cost_seq_len``
    tokens, the head evaluated at the first position and every ``head_stride``-th after it (the
    head is a fifth of SmolLM2's forward and three fifths of Gemma 3's, whose vocabulary is
    262,144); one block at a time on the primary text (every text with
    ``blocks_on_every_text``); the interventions on the primary text and those named in
    ``mechanisms_elsewhere`` on the others (None: all of them); ``sentences`` held-out
    sentences for an encoder; ``site_bootstrap``: resamples of whole sequences behind each site
    statistic's interval on the primary text (0: the values alone; the page states ranges over
    sites, never one site's interval, and the resamples were over half of the statistics' time,
    100 s of Gemma 3's); ``quantization``: re-round each GGUF model once more; ``threads``:
    torch threads for this stage (None: :func:`stage_threads`), restored after."""

    models: tuple[str, ...] = ("smollm2-135m", "minilm-l6", "gemma3-270m")
    texts: tuple[str, ...] = ("docstrings", "help-topics")
    sequences: int = 16
    seq_len: int = 128
    cost_sequences: int = 32
    cost_seq_len: int = 64
    head_stride: int = 4
    sentences: int = 256
    batch: int = 4
    blocks_on_every_text: bool = False
    mechanisms_elsewhere: tuple[str, ...] | None = (
        "mean of ordinary channels",
        "first position only",
    )
    site_bootstrap: int = 0
    quantization: bool = True
    threads: int | None = None

    def __post_init__(self) -> None:
        for name in ("sequences", "seq_len", "cost_sequences", "cost_seq_len", "sentences"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("sequences", "cost_sequences"):
            if getattr(self, name) < 2:
                raise ValueError(f"{name} must be at least 2 (intervals over sequences)")
        if self.head_stride is not None and (
            isinstance(self.head_stride, bool)
            or not isinstance(self.head_stride, int)
            or self.head_stride < 1
        ):
            raise ValueError(
                f"head_stride must be None or a positive integer, got {self.head_stride!r}"
            )
        if not self.texts:
            raise ValueError("texts must name at least one text")
        if (
            isinstance(self.site_bootstrap, bool)
            or not isinstance(self.site_bootstrap, int)
            or self.site_bootstrap < 0
        ):
            raise ValueError(f"site_bootstrap must be an integer >= 0, got {self.site_bootstrap!r}")


def _digest(parts: tuple[str, ...]) -> str:
    here = Path(__file__).parents[1]  # the lab's folder
    digest = hashlib.sha256()
    for name in parts:
        path = here / name
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def code_version(parts: tuple[str, ...] = _COST_CODE) -> str:
    import torch
    import transformers

    from ... import __version__

    return (
        f"rmsnorm {__version__}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, code {_digest(parts)}"
    )


def _key(**fields) -> str:
    return hashlib.sha256(json.dumps(jsonable(fields), sort_keys=True).encode()).hexdigest()[:24]


class _Stages:
    """One model's cached stages: each computes on a miss (loading the model once, on the first
    miss) and is read back on a hit."""

    def __init__(self, name: str, located, progress) -> None:
        from ..._cache import cache_dir

        self.name, self.located, self.progress = name, located, progress
        self.folder = cache_dir() / "real"
        self.loaded = None
        self.cached: dict[str, bool] = {}
        self.seconds: dict[str, float] = {}

    def model(self):
        if self.loaded is None:
            from ..models.pretrained import load_pretrained

            t0 = time.perf_counter()
            self.loaded = load_pretrained(self.name, progress=self.progress, located=self.located)
            self.seconds["load"] = time.perf_counter() - t0
        return self.loaded

    def get(self, stage: str, code: tuple[str, ...], fields: dict, compute) -> dict:
        key = _key(
            model=self.name,
            weights=self.located.digests,
            stage=stage,
            code=code_version(code),
            **fields,
        )
        path = self.folder / f"{Path(self.name).name}-{stage.replace(':', '-')}-{key}.json"
        if path.is_file():
            self.cached[stage] = True
            return json.loads(path.read_text())
        t0 = time.perf_counter()
        result = jsonable(compute())
        self.seconds[stage] = time.perf_counter() - t0
        self.cached[stage] = False
        write_json(result, path)
        cache.wrote(path)  # said once per process; the cache kept under its cap
        return result


# ----------------------------------------------------------------------------------------------
# Summaries drawn from the per-sequence values
# ----------------------------------------------------------------------------------------------
def _interval(values: list[float]) -> dict:
    from ..stats.intervals import mean_interval

    finite = [v for v in values if v is not None and math.isfinite(v)]
    if len(finite) < 2:
        return {"value": math.nan, "lo": math.nan, "hi": math.nan, "n": len(finite)}
    return mean_interval(finite)


def summarize_costs(swap: dict, encoder: bool) -> dict:
    """The per-sequence (per-sentence) values of a swap study replaced by their mean with an
    interval and n; the values themselves kept under ``per_sequence``."""
    metrics = ENCODER_METRICS if encoder else COST_METRICS
    out = {k: v for k, v in swap.items() if k not in ("variants", "reference")}
    if "reference" in swap:
        out["loss"] = _interval(swap["reference"]["ce"])
        out["per_sequence_loss"] = swap["reference"]["ce"]
    variants = {}
    for name, v in swap["variants"].items():
        row = {k: val for k, val in v.items() if k not in metrics}
        for metric in metrics:
            if metric in v:
                row[metric] = _interval(v[metric])
        row["per_sequence"] = {m: v[m] for m in metrics if m in v}
        variants[name] = row
    out["variants"] = variants
    return out


def _block_sites(stats: dict) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for s in stats["sites"]:
        if s["layer"] is not None:
            out.setdefault(s["layer"], []).append(s)
    return out


def _statistic(chosen: list[dict], var, stat) -> float:
    if var is None:
        return max(s[stat] for s in chosen)
    return sum(s["variants"][var][stat]["value"] for s in chosen) / len(chosen)


def predictor_points(stats: dict, swap: dict, cost: str) -> list[dict]:
    """One point per block centered (or swapped) alone: the block, its measured cost (the mean KL
    per token for a causal model, the mean 1 − cosine for an encoder) and each
    :data:`PREDICTORS` statistic over the block's sites, plus the shift statistic under each
    channel rule of :data:`~rmsnorm.lab.stats.sitestats.SHIFT_RULES`."""
    by_name = {s["name"]: s for s in stats["sites"]}
    points = []
    for name, result in swap["variants"].items():
        if not (name.startswith("block:") or name.startswith("naive:block:")):
            continue
        chosen = [by_name[n] for n in result["sites"] if n in by_name]
        if not chosen:
            continue
        value = result[cost]["value"] if isinstance(result[cost], dict) else result[cost]
        point = {"block": int(name.rsplit(":", 1)[1]), "variant": name, "cost": value}
        for label, (var, stat) in PREDICTORS.items():
            point[label] = _statistic(chosen, var, stat)
        rules = chosen[0].get("shift_by_rule", {})
        point["shift by rule"] = {
            rule: sum(s["shift_by_rule"][rule]["shift_median"] for s in chosen) / len(chosen)
            for rule in rules
        }
        points.append(point)
    return sorted(points, key=lambda p: p["block"])


def _xy(points: list[dict], label: str, rule: str | None = None):
    xs, ys = [], []
    for p in points:
        x = p["shift by rule"][rule] if rule is not None else p[label]
        if (
            x is not None
            and p["cost"] is not None
            and math.isfinite(x)
            and math.isfinite(p["cost"])
        ):
            xs.append(x)
            ys.append(p["cost"])
    return xs, ys


def prediction(models: list[dict]) -> dict:
    """Does a per-block statistic predict the per-block cost? Per model: Spearman's ρ of every
    statistic with a bootstrap interval over blocks, a permutation p and Holm's correction over
    the statistics tried; pooled: the within-model ρ stratified by model (ranks never compared
    across models); the statistic chosen on :data:`SELECT_ON` and tested on the others; the shift
    statistic's ρ under each channel rule."""
    from ..stats import predict

    per_model = {}
    for m in models:
        if m.get("points"):
            per_model[m["model"]] = {label: _xy(m["points"], label) for label in PREDICTORS}
    out: dict = {"per_model": {}, "stratified": {}, "selected": None, "rules": {}}
    select = SELECT_ON if SELECT_ON in per_model else next(iter(per_model), None)
    if select is not None and len(per_model) >= 2:
        selected = predict.select_then_test(per_model, select_on=select)
        out["per_model"] = selected.pop("all")
        out["selected"] = selected
    else:
        for name, stats in per_model.items():
            rows = {label: predict.spearman(*xy) for label, xy in stats.items()}
            adjusted = predict.holm({k: r["p"] for k, r in rows.items() if r["p"] is not None})
            for k, r in rows.items():
                r["p_holm"] = adjusted.get(k)
            out["per_model"][name] = rows
    if len(per_model) >= 2:
        for label in PREDICTORS:
            out["stratified"][label] = predict.stratified_spearman(
                {name: stats[label] for name, stats in per_model.items()}
            )
    for m in models:
        points = m.get("points") or []
        if points and points[0].get("shift by rule"):
            out["rules"][m["model"]] = {
                rule: predict.spearman(*_xy(points, "", rule))
                for rule in points[0]["shift by rule"]
            }
    return out


# ----------------------------------------------------------------------------------------------
# One model
# ----------------------------------------------------------------------------------------------
def _channels(stats: dict) -> dict:
    """{site name: Channels} of the massive channels the statistics found at each site."""
    from .centering import Channels

    return {
        s["name"]: Channels([o["channel"] for o in s["massive"]], s["massive_threshold"])
        for s in stats["sites"]
        if s.get("massive")
    }


def _massive_weights(loaded, stats: dict) -> list[dict]:
    """Per site with massive channels: the norm's effective weight at each of them against the
    median |weight| of the site (Gemma's 1 + γ included): a weight near 0 means the norm reads
    the channel only through the mean (once centered) and the RMS."""
    from .sites import effective_weight, find_sites

    modules = {s.name: s for s in find_sites(loaded.model)}
    out = []
    for s in stats["sites"]:
        if not s.get("massive") or s["name"] not in modules:
            continue
        w = effective_weight(modules[s["name"]].module, s["width"])
        if w is None:
            continue
        med = median(w.abs())
        out.append(
            {
                "site": s["name"],
                "layer": s["layer"],
                "kind": s["kind"],
                "median_abs_weight": med,
                "channels": [
                    {
                        "channel": o["channel"],
                        "weight": float(w[o["channel"]]),
                        "over_median": float(w[o["channel"]].abs()) / med if med > 0 else None,
                    }
                    for o in s["massive"]
                ],
            }
        )
    return out


def _text_study(stages: _Stages, text_name: str, source, cfg: RealConfig, primary: bool) -> dict:
    from .sites import site_study

    # intervals of the site statistics on the primary text where asked; values alone on the
    # others (the report states ranges over sites, and the resamples are most of the stage's time)
    bootstrap = cfg.site_bootstrap if primary else 0
    stat_fields = {
        "text": source.sha256,
        "sequences": cfg.sequences,
        "seq_len": cfg.seq_len,
        "bootstrap": bootstrap,
    }

    def stats_compute():
        loaded = stages.model()
        stats = site_study(
            loaded,
            source,
            sequences=cfg.sequences,
            seq_len=cfg.seq_len,
            batch=cfg.batch,
            bootstrap=bootstrap,
            progress=stages.progress,
        )
        stats["massive_weights"] = _massive_weights(loaded, stats)
        stats["encoder"] = bool(loaded.encoder)
        stats["vocab_size"] = loaded.vocab_size
        c = loaded.model.config
        stats["config"] = {
            k: getattr(c, k, None) for k in ("model_type", "num_hidden_layers", "hidden_size")
        }
        return stats

    stats = stages.get(f"stats:{text_name}", _STATS_CODE, stat_fields, stats_compute)
    encoder = stats["encoder"]
    blocks = primary or cfg.blocks_on_every_text
    if encoder:
        fields = {"text": source.sha256, "sentences": cfg.sentences, "blocks": blocks}

        def compute():
            from .centering import encoder_swap_study

            loaded = stages.model()
            only = None if blocks else ("naive:all", "centered-writers:all")
            return encoder_swap_study(
                loaded, source, count=cfg.sentences, progress=stages.progress, only=only
            )

    else:
        stride = cfg.head_stride
        channels = _channels(stats)
        mechanisms = None if primary else cfg.mechanisms_elsewhere
        fields = {
            "text": source.sha256,
            "sequences": cfg.cost_sequences,
            "seq_len": cfg.cost_seq_len,
            "head_stride": stride,
            "blocks": blocks,
            "mechanisms": mechanisms,
            "channels": {k: [v.massive, v.clip] for k, v in sorted(channels.items())},
        }

        def compute():
            from .centering import causal_swap_study, mechanism_variants, standard_variants
            from .sites import find_sites

            loaded = stages.model()
            found = find_sites(loaded.model)
            variants = [
                v for v in standard_variants(found) if blocks or not v.name.startswith("block:")
            ] + [
                v
                for v in mechanism_variants(found)
                if mechanisms is None or v.name[5:] in mechanisms
            ]
            return causal_swap_study(
                loaded,
                source,
                sequences=cfg.cost_sequences,
                seq_len=cfg.cost_seq_len,
                variants=variants,
                channels=channels,
                head_stride=stride,
                progress=stages.progress,
            )

    swap = stages.get(f"cost:{text_name}", _COST_CODE, fields, compute)
    return {"stats": stats, "swap": summarize_costs(swap, encoder)}


def _quantization(stages: _Stages, source, cfg: RealConfig, base: dict) -> dict | None:
    """One more rounding of a GGUF model's weights through its own format (each tensor its own
    type, :func:`~rmsnorm.lab.experiments.quantization.requantize`) with every block shifted by
    half its scale group, a fresh rounding of about the size of the file's own (in the file's own
    blocks the rounding gives the file's bytes back: benchmarks/results/quantization/), and the
    held-out loss, each site's statistics and the centering's cost at every norm under it, against
    the model as loaded."""
    if stages.located.gguf_file is None:
        return None
    stride = cfg.head_stride
    fields = {
        "text": source.sha256,
        "sequences": cfg.sequences,
        "seq_len": cfg.seq_len,
        "cost_sequences": cfg.cost_sequences,
        "cost_seq_len": cfg.cost_seq_len,
        "head_stride": stride,
    }

    def compute():
        from .centering import causal_swap_study, standard_variants
        from .quantization import HALF_GROUP, requantize
        from .sites import find_sites, site_study

        loaded = stages.model()
        gguf = stages.located.directory / stages.located.gguf_file
        model, summary = requantize(loaded.model, gguf, shift=dict(HALF_GROUP))
        rerounded = copy.copy(loaded)
        rerounded.model = model
        q_stats = site_study(
            rerounded,
            source,
            sequences=cfg.sequences,
            seq_len=cfg.seq_len,
            batch=cfg.batch,
            bootstrap=0,
            progress=stages.progress,
        )
        q_swap = causal_swap_study(
            rerounded,
            source,
            sequences=cfg.cost_sequences,
            seq_len=cfg.cost_seq_len,
            variants=[v for v in standard_variants(find_sites(model)) if v.name == "all"],
            head_stride=stride,
            progress=stages.progress,
        )
        return {
            "shifted blocks": {
                "weights": summary,
                "stats": _site_digest(q_stats),
                "swap": q_swap,
            },
        }

    raw = stages.get("quantization", _QUANT_CODE, fields, compute)
    return _quantization_summary(raw, base)


def _site_digest(stats: dict) -> list[dict]:
    """What the quantization comparison needs of each site: its median |μ|/σ, shift and largest
    |x|."""
    return [
        {
            "name": s["name"],
            "ratio_median": s["variants"]["all"]["ratio_median"]["value"],
            "shift_median": s["variants"]["all"]["shift_median"]["value"],
            "max_abs": s["max_abs"],
        }
        for s in stats["sites"]
    ]


def _relative_changes(before: list[dict], after: list[dict]) -> dict:
    moved = {}
    for stat in ("ratio_median", "shift_median", "max_abs"):
        rel = [
            abs(b[stat] - a[stat]) / abs(a[stat])
            for a, b in zip(before, after, strict=True)
            if a[stat]
        ]
        moved[stat] = {"median": median(rel), "max": float(max(rel))}
    return moved


def _quantization_summary(raw: dict, base: dict) -> dict:
    before = _site_digest(base["stats"])
    loss0 = base["swap"]["loss"]
    all0 = base["swap"]["variants"]["all"]
    out = {}
    for label, r in raw.items():
        w = r["weights"]["all"]
        row = {
            "weights": {
                "rel_rms_change": w["rel_rms_change"],
                "expected_rel_rms": w["expected_rel_rms"],
                "unchanged": w.get("unchanged"),
                "types": {
                    k: {"rel_rms_change": v["rel_rms_change"], "expected": v["expected_rel_rms"]}
                    for k, v in r["weights"]["types"].items()
                },
                "shift": r["weights"].get("shift"),
            }
        }
        if "swap" in r:
            swap = summarize_costs(r["swap"], encoder=False)
            loss_delta = [
                b - a
                for a, b in zip(
                    base["swap"]["per_sequence_loss"], swap["per_sequence_loss"], strict=True
                )
            ]
            row |= {
                "site_change": _relative_changes(before, r["stats"]),
                "loss": swap["loss"],
                "loss_before": loss0,
                "loss_change": _interval(loss_delta),
                "all_kl": swap["variants"]["all"]["kl"],
                "all_kl_before": all0["kl"],
                "all_delta_ce": swap["variants"]["all"]["delta_ce"],
                "all_delta_ce_before": all0["delta_ce"],
            }
        out[label] = row
    return out


def _encoder_quantization(stages: _Stages, source, cfg: RealConfig, base: dict) -> dict:
    """What GGUF-style rounding does to a model whose original weights we have (MiniLM): every
    linear layer's and embedding table's weights rounded through Q4_1 (SmolLM2's format, blocks of
    32 along each row, the gguf package's own quantizer), then the same statistics and the naive
    swap of every LayerNorm again: the relative change of each site's median |μ|/σ, shift and
    largest |x|, and the swap's 1 − cosine before and after."""
    fields = {"text": source.sha256, "sequences": cfg.sequences, "seq_len": cfg.seq_len}
    fields["sentences"] = cfg.sentences

    def compute():
        import numpy as np
        import torch
        from gguf import GGMLQuantizationType, dequantize, quantize

        from .centering import encoder_swap_study
        from .sites import site_study

        loaded = stages.model()
        qtype = GGMLQuantizationType.Q4_1
        model = copy.deepcopy(loaded.model)
        rounded = 0
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                    w = module.weight
                    if w.shape[-1] % 32 == 0:
                        q = dequantize(
                            quantize(w.detach().numpy().astype(np.float32), qtype), qtype
                        )
                        w.copy_(torch.from_numpy(np.asarray(q, dtype=np.float32)).reshape(w.shape))
                        rounded += w.numel()
        quantized = copy.copy(loaded)
        quantized.model = model
        q_stats = site_study(
            quantized,
            source,
            sequences=cfg.sequences,
            seq_len=cfg.seq_len,
            batch=cfg.batch,
            bootstrap=0,
            progress=stages.progress,
        )
        q_swap = encoder_swap_study(
            quantized, source, count=cfg.sentences, progress=stages.progress, only=("naive:all",)
        )
        return {
            "qtype": "Q4_1",
            "parameters_rounded": rounded,
            "stats": _site_digest(q_stats),
            "naive_all": q_swap["variants"]["naive:all"],
        }

    raw = stages.get("quantization", _QUANT_CODE, fields, compute)
    moved = _relative_changes(_site_digest(base["stats"]), raw["stats"])
    return {
        "qtype": raw["qtype"],
        "parameters_rounded": raw["parameters_rounded"],
        "site_change": moved,
        "naive_all_one_minus_cosine": {
            "original": base["swap"]["variants"]["naive:all"]["one_minus_cosine"],
            "quantized": _interval(raw["naive_all"]["one_minus_cosine"]),
        },
    }


def run_model(name: str, cfg: RealConfig, sources: dict, *, progress=None) -> dict:
    """The study of one model on ``sources`` ({text name: TextSource}, the primary first; see the
    module docstring), from the cache where it holds the stages."""
    from ..models.pretrained import locate
    from ..models.weights import WeightsMissingError

    progress = ensure(progress)
    try:
        located = locate(name)
    except WeightsMissingError as exc:
        return {"model": name, "missing": str(exc), "install": f"rmsnorm weights install {name}"}
    stages = _Stages(name, located, progress)
    texts = {}
    for i, (text_name, source) in enumerate(sources.items()):
        texts[text_name] = _text_study(stages, text_name, source, cfg, primary=i == 0)
    primary = texts[next(iter(sources))]
    stats = primary["stats"]
    encoder = stats["encoder"]
    quantization = None
    if cfg.quantization and not encoder:
        quantization = _quantization(stages, next(iter(sources.values())), cfg, primary)
    elif cfg.quantization and located.gguf_file is None:
        quantization = _encoder_quantization(stages, next(iter(sources.values())), cfg, primary)
    cost = "one_minus_cosine" if encoder else "kl"
    return {
        "model": name,
        "encoder": encoder,
        "provenance": stats["provenance"],
        "config": {**stats["config"], "vocab_size": stats["vocab_size"]},
        "texts": texts,
        "cost": cost,
        "points": predictor_points(stats, primary["swap"], cost),
        "quantization": quantization,
        "cached": dict(stages.cached),
        "seconds": dict(stages.seconds),
    }


def stage_threads(requested: int | None) -> tuple[int, str]:
    """The torch threads of the study and why: ``requested`` if given; else one per core (its
    matrix products are large enough to use them, unlike the lab's small models) unless other
    work already keeps the cores busy (1-minute load average ≥ cores − 0.5), then one: torch's
    threads wait for each other at the end of every parallel region, and a thread the
    scheduler has not run stalls the rest (SmolLM2's costs took 6× as long on 2 threads at a
    load average of 5 as near 1). The numbers do not depend on the choice beyond
    rounding, and the result records it."""
    from ... import info

    if requested is not None:
        return requested, "asked for"
    cores = info.cpu_cores() or 1
    load = info.load_average()
    if cores > 1 and load is not None and load[0] >= cores - 0.5:
        return 1, f"load average {load[0]:.2f} on {cores} cores at the start: one thread"
    return cores, f"one per core ({cores}; load average {load[0]:.2f})" if load else "one per core"


def run_real_models(cfg: RealConfig, sources: dict | None = None, progress=None) -> dict:
    """Every model of ``cfg`` on ``sources`` (default: the built-in texts ``cfg.texts``), then
    the predictor analysis over their blocks."""
    import torch

    from ..models.text import builtin_text

    if sources is None:
        sources = {name: builtin_text(name) for name in cfg.texts}
    before = torch.get_num_threads()
    threads, why = stage_threads(cfg.threads)
    torch.set_num_threads(threads)
    try:
        results = [run_model(name, cfg, sources, progress=progress) for name in cfg.models]
    finally:
        torch.set_num_threads(before)
    measured = [r for r in results if "texts" in r]
    return {
        "config": asdict(cfg),
        "texts": {name: s.describe() for name, s in sources.items()},
        "models": results,
        "threads": {"used": threads, "why": why},
        "prediction": prediction(measured),
        "interval_check": interval_check(measured),
    }


_METHOD_WORDS = {
    "bootstrap_t": "a studentized (bootstrap-t) interval over sequences",
    "t": "Student's t interval over sequences",
    "bca": "a BCa bootstrap interval over sequences",
    "percentile": "a percentile bootstrap interval over sequences",
}


def interval_check(models: list[dict], reps: int = 1000) -> dict:
    """The intervals' coverage at the study's n on cases planted from each model's own costs:
    the per-sequence (per-sentence) cost of the change at every norm, resampled, so that its
    mean is known (:func:`~rmsnorm.lab.stats.intervals.coverage_on_sample`)."""
    from ..stats.intervals import DEFAULT_METHOD, coverage_on_sample

    checks = []
    for m in models:
        v = next(iter(m["texts"].values()))["swap"]["variants"]
        name, metric = ("all", "kl") if m["cost"] == "kl" else ("naive:all", "one_minus_cosine")
        values = v.get(name, {}).get("per_sequence", {}).get(metric)
        if not values or len(values) < 4:
            continue
        c = coverage_on_sample(values, DEFAULT_METHOD, n=len(values), reps=reps)
        c["planted"] = f"{m['model']}'s {metric} per {'sentence' if m['encoder'] else 'sequence'}"
        checks.append(c)
    return {
        "method": DEFAULT_METHOD,
        "method_words": _METHOD_WORDS.get(DEFAULT_METHOD, DEFAULT_METHOD),
        "checks": checks,
    }
