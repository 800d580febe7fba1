"""The pretrained models' study, as the report and ``rmsnorm inspect --swap`` run it: per model, the
statistics at every norm site (:mod:`~rmsnorm.lab.experiments.sites`), the centering's end-to-end
cost (:mod:`~rmsnorm.lab.experiments.centering`), and whether a per-site statistic predicts that
cost (rank correlations over the blocks and kinds of site swapped, per model and pooled).

Each model's result is cached as JSON under ``cache_dir()/real/``, keyed by the sha256 of its
weight files, the text's sha256, the study's settings, and the code's version (rmsnorm's version,
the sha256 of the modules that compute the numbers, and the torch and transformers versions): a
changed input computes again, never a stale result. A built-in model whose weights are not
installed is a result that says so and how to install them, not an error.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..._progress import ensure
from ..io import jsonable, write_json

__all__ = ["RealConfig", "PREDICTORS", "run_model", "run_real_models", "predictor_points"]

# The statistics set against the measured cost: (variant, statistic) of
# :mod:`~rmsnorm.lab.stats.sitestats`, or a site-level number; averaged over the sites of a block
# or kind (the largest |x|: the maximum).
PREDICTORS = {
    "|μ|/σ median": ("all", "ratio_median"),
    "|μ|/σ p95": ("all", "ratio_p95"),
    "|μ|/σ median, no first token": ("no_first", "ratio_median"),
    "|μ|/σ median, no outlier channels": ("no_outliers", "ratio_median"),
    "1 − σ/RMS": ("all", "one_minus_cos_mean"),
    "shift / σ of ordinary channels": ("all", "shift_median"),
    "shared part of μ²": ("no_first", "shared_mu_share"),
    "excess kurtosis": ("all", "kurtosis_median"),
    "largest |x|": (None, "max_abs"),
}
_CODE = (
    "experiments/sites.py",
    "stats/sitestats.py",
    "experiments/centering.py",
    "models/text.py",
    "experiments/realmodels.py",
    "models/pretrained.py",
)


@dataclass(frozen=True)
class RealConfig:
    """What the study runs: ``models`` (built-in names or any source :func:`load_pretrained`
    takes); ``sequences`` × ``seq_len`` tokens for the statistics; the centering on
    ``swap_sequences`` held-out windows, one block at a time for every ``layer_stride``-th block
    (and the last; 1: every block); ``sentences`` for an encoder."""

    models: tuple[str, ...] = ("smollm2-135m", "minilm-l6", "gemma3-270m")
    sequences: int = 16
    seq_len: int = 128
    swap_sequences: int = 4
    layer_stride: int = 6
    sentences: int = 64
    batch: int = 4

    def __post_init__(self) -> None:
        for name in ("sequences", "seq_len", "swap_sequences", "layer_stride", "sentences"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")


def code_version() -> str:
    import torch
    import transformers

    from ... import __version__

    here = Path(__file__).parents[1]  # the lab's folder
    digest = hashlib.sha256()
    for name in _CODE:
        digest.update((here / name).read_bytes())
    return f"rmsnorm {__version__}, torch {torch.__version__}, transformers " + (
        f"{transformers.__version__}, code {digest.hexdigest()[:16]}"
    )


def _key(name: str, digests: dict, source, cfg: RealConfig) -> str:
    fields = {k: v for k, v in asdict(cfg).items() if k != "models"}
    blob = json.dumps(
        {
            "model": name,
            "weights": digests,
            "text": source.sha256,
            "cfg": fields,
            "code": code_version(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _layers(n_blocks: int, stride: int) -> list[int]:
    return sorted({*range(0, n_blocks, stride), n_blocks - 1})


def predictor_points(stats: dict, swap: dict, cost: str = "kl") -> list[dict]:
    """One point per block or kind of site swapped alone: the measured cost (``kl``'s value for
    a causal model, ``one_minus_cosine_mean`` for an encoder) and each :data:`PREDICTORS`
    statistic over the swapped sites."""
    by_name = {s["name"]: s for s in stats["sites"]}
    points = []
    for variant, result in swap["variants"].items():
        if "layer:" not in variant and "kind:" not in variant:
            continue
        chosen = [by_name[n] for n in result["sites"] if n in by_name]
        if not chosen:
            continue
        value = result[cost]["value"] if isinstance(result[cost], dict) else result[cost]
        point = {"variant": variant, "cost": value}
        for label, (var, stat) in PREDICTORS.items():
            if var is None:
                point[label] = max(s[stat] for s in chosen)
            else:
                point[label] = sum(s["variants"][var][stat]["value"] for s in chosen) / len(chosen)
        points.append(point)
    return points


def rank_correlations(points: list[dict]) -> dict:
    """Spearman's ρ of each predictor against the cost over ``points``, with its p-value and n
    (None where fewer than 4 points or a constant)."""
    from scipy.stats import spearmanr

    out = {}
    for label in PREDICTORS:
        xs = [p[label] for p in points if math.isfinite(p[label]) and math.isfinite(p["cost"])]
        ys = [p["cost"] for p in points if math.isfinite(p[label]) and math.isfinite(p["cost"])]
        if len(xs) < 4 or len(set(xs)) < 2 or len(set(ys)) < 2:
            out[label] = {"rho": None, "p": None, "n": len(xs)}
            continue
        res = spearmanr(xs, ys)
        out[label] = {"rho": float(res.statistic), "p": float(res.pvalue), "n": len(xs)}
    return out


def run_model(name: str, source, cfg: RealConfig, *, layers=None, progress=None) -> dict:
    """The study of one model (see the module docstring), from the cache when it holds it;
    ``layers``: the blocks swapped one at a time (default: every ``cfg.layer_stride``-th)."""
    from ..models.pretrained import load_pretrained, locate
    from ..models.weights import WeightsMissingError, cache_dir
    from .centering import causal_swap_study, encoder_swap_study
    from .sites import site_study

    progress = ensure(progress)
    try:
        located = locate(name)
    except WeightsMissingError as exc:
        return {"model": name, "missing": str(exc), "install": f"rmsnorm weights install {name}"}
    key = _key(name, located.digests, source, cfg) + ("" if layers is None else f"-{layers}")
    path = cache_dir() / "real" / f"{Path(name).name}-{key}.json"
    if path.is_file():
        result = json.loads(path.read_text())
        result["cached"] = True
        return result
    t0 = time.perf_counter()
    loaded = load_pretrained(name, progress=progress, located=located)
    t_load = time.perf_counter() - t0
    stats = site_study(
        loaded,
        source,
        sequences=cfg.sequences,
        seq_len=cfg.seq_len,
        batch=cfg.batch,
        progress=progress,
    )
    t_stats = time.perf_counter() - t0 - t_load
    quantization = None
    if loaded.encoder:
        swap = encoder_swap_study(loaded, source, count=cfg.sentences, progress=progress)
        cost = "one_minus_cosine_mean"
        if "dequantized" not in stats["provenance"]["format"]:
            quantization = quantization_effect(loaded, source, cfg, stats, swap, progress)
    else:
        blocks = sorted({s["layer"] for s in stats["sites"] if s["layer"] is not None})
        chosen = layers if layers is not None else _layers(len(blocks), cfg.layer_stride)
        swap = causal_swap_study(
            loaded,
            source,
            sequences=cfg.swap_sequences,
            seq_len=cfg.seq_len,
            layers=chosen,
            progress=progress,
        )
        cost = "kl"
    points = predictor_points(stats, swap, cost)
    result = {
        "model": name,
        "key": key,
        "code": code_version(),
        "encoder": loaded.encoder,
        "config": {
            k: getattr(loaded.model.config, k, None)
            for k in ("model_type", "num_hidden_layers", "hidden_size")
        },
        "stats": stats,
        "swap": swap,
        "cost": cost,
        "points": points,
        "correlations": rank_correlations(points),
        "quantization": quantization,
        "seconds": {
            "load": t_load,
            "stats": t_stats,
            "swap": time.perf_counter() - t0 - t_load - t_stats,
        },
    }
    result = jsonable(result)
    write_json(result, path)
    result["cached"] = False
    return result


def quantization_effect(loaded, source, cfg: RealConfig, stats: dict, swap: dict, progress=None):
    """How much GGUF-style quantization moves the numbers, on a model whose original weights we
    have (MiniLM): every linear layer's and embedding table's weights rounded through Q4_1 (the
    SmolLM2 file's format, blocks of 32 along each row, with the gguf package's own quantizer),
    then the same statistics and the naive swap of every LayerNorm again. Returns the relative
    change of each site's median |μ|/σ and largest |x|, and the swap's 1 − cosine before and
    after."""
    import copy

    import numpy as np
    import torch
    from gguf import GGMLQuantizationType, dequantize, quantize

    from .centering import encoder_swap_study
    from .sites import site_study

    qtype = GGMLQuantizationType.Q4_1
    model = copy.deepcopy(loaded.model)
    rounded = 0
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                w = module.weight
                if w.shape[-1] % 32 == 0:
                    q = dequantize(quantize(w.detach().numpy().astype(np.float32), qtype), qtype)
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
        progress=progress,
    )
    q_swap = encoder_swap_study(
        quantized, source, count=cfg.sentences, progress=progress, only=("naive:all",)
    )
    ratio, peak = [], []
    for a, b in zip(stats["sites"], q_stats["sites"], strict=True):
        ra, rb = (
            a["variants"]["all"]["ratio_median"]["value"],
            b["variants"]["all"]["ratio_median"]["value"],
        )
        ratio.append(abs(rb - ra) / ra)
        peak.append(abs(b["max_abs"] - a["max_abs"]) / a["max_abs"])
    return {
        "qtype": "Q4_1",
        "parameters_rounded": rounded,
        "ratio_median_rel_change": {"median": float(np.median(ratio)), "max": max(ratio)},
        "max_abs_rel_change": {"median": float(np.median(peak)), "max": max(peak)},
        "naive_all_one_minus_cosine": {
            "original": swap["variants"]["naive:all"]["one_minus_cosine_mean"],
            "quantized": q_swap["variants"]["naive:all"]["one_minus_cosine_mean"],
        },
    }


def run_real_models(cfg: RealConfig, source, progress=None) -> dict:
    """Every model of ``cfg``, then the predictors' rank correlations pooled over the models
    whose cost is KL."""
    results = [run_model(name, source, cfg, progress=progress) for name in cfg.models]
    pooled = [p for r in results if r.get("cost") == "kl" for p in r["points"]]
    return {
        "config": asdict(cfg),
        "text": source.describe(),
        "models": results,
        "pooled": {"points": len(pooled), "correlations": rank_correlations(pooled)},
    }
