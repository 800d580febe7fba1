"""A mean planted inside a block, LayerNorm against RMSNorm: its part of ``report.json``
(:func:`data`, from :func:`numbers`) and its words; no figure of its own (its points are on the
divergence curve)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ...models.transformer import NORM_NAMES
from ...page import Page
from ...stats.rows import spread
from .common import range_text

if TYPE_CHECKING:
    from ..run import ReportResults


def numbers(planted: dict) -> dict:
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
            "beyond_shift_last": spread([r["beyond_shift"][-1] for r in rs]),
            "kl_mean": spread([r["kl_mean"] for r in rs]),
            "max_abs_logit_diff": spread([r["max_abs_logit_diff"] for r in rs]),
            "ratio_block1_planted": spread([r["median_ratio_planted"][1] for r in rs]),
            "ratio_last_planted": spread([r["median_ratio_planted"][-1] for r in rs]),
            "ratio_last_clean": spread([r["median_ratio_clean"][-1] for r in rs]),
            "sigma_block1": spread([r["median_sigma_block1"] for r in rs]),
        }
    return out


def data(r: ReportResults) -> dict:
    """``planted``: :func:`numbers` of the planted mean ({} when it did not run)."""
    return {} if r.planted is None else {"planted": numbers(r.planted)}


def figures(r: ReportResults, out: Path) -> dict[str, Path]:
    """None: its points are on the divergence curve."""
    return {}


def words(page: Page, j: dict, figures: dict[str, Path]) -> None:
    pl = j.get("planted")
    if pl is None:
        return
    exp = pl["experiment"]
    page.h2("A mean planted inside a block")
    page.p(
        "A constant added to the input embeddings (`rmsnorm simulate --planted-mean`) rides a "
        "LayerNorm network's stream unchanged: every block reads the stream through a LayerNorm, "
        "which subtracts it, so that run is the clean run plus the constant — arithmetic, not a "
        f"mechanism. Here the mean is planted inside a block: a bias of {exp['bias']:g} on every "
        f"unit of block {exp['block']}'s MLP output, in the same random network with LayerNorm "
        f"and with RMSNorm (seeds {pl['seeds'][0]}–{pl['seeds'][-1]}, float64), "
        "against the clean network."
    )
    rows = []
    for n, p in pl["per_norm"].items():
        rows.append(
            [
                NORM_NAMES[n],
                f"{p['beyond_shift_max']:.1e}",
                range_text(p["beyond_shift_last"], ".2g"),
                range_text(p["kl_mean"], ".1e"),
                range_text(p["max_abs_logit_diff"], ".1e"),
                range_text(p["ratio_block1_planted"], ".2f"),
                f"{range_text(p['ratio_last_clean'], '.3f')} → "
                f"{range_text(p['ratio_last_planted'], '.3f')}",
            ]
        )
    page.table(
        [
            "network",
            "largest stream change beyond h + c·𝟙 (÷‖h‖)",
            "same, last layer",
            "KL(clean ‖ planted), nats",
            "max |Δ logits|",
            "median |μ|/σ after block 1",
            "median |μ|/σ, last layer, clean → planted",
        ],
        rows,
    )
    ln, rms = pl["per_norm"].get("layernorm"), pl["per_norm"].get("rmsnorm")
    text = ""
    if ln is not None:
        text += (
            f"In the LayerNorm network the stream stays exactly h + c·𝟙 (to "
            f"{ln['beyond_shift_max']:.0e}) and the logits do not move (to "
            f"{ln['max_abs_logit_diff']['max']:.0e}): no block sees the mean. "
        )
    if rms is not None:
        text += (
            f"In the RMSNorm network every later block reads (h + c·𝟙)/RMS: the stream moves by "
            f"{range_text(rms['beyond_shift_last'], '.2f')} of its norm at the last layer and the "
            f"next-token distributions by KL {range_text(rms['kl_mean'], '.1e')} nats. A mean in "
            "the stream is invisible to a LayerNorm network and part of an RMSNorm network's input."
        )
    page.p(text)
