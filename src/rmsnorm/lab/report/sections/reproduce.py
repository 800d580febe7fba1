"""The report's last words: the command that reproduces it and how long it took."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ...page import Page

if TYPE_CHECKING:
    from ..run import ReportResults


def data(r: ReportResults) -> dict:
    """None of its own: the run's ``seconds`` are the report's (:func:`~.render.report_json`)."""
    return {}


def figures(r: ReportResults, out: Path) -> dict[str, Path]:
    """None."""
    return {}


def words(page: Page, j: dict, figures: dict[str, Path]) -> None:
    page.h2("Reproduce", numbered=False)
    sec = j["seconds"]
    page.p(
        f"This report took {sec['total_before_pages']:.0f} s to compute (plus page writing) at "
        f"one torch thread. Every number it states is in `report.json`; the figures are in "
        "`figures/`. `--seeds N` and `--train-seeds N` set the replication; `--full` runs the "
        "larger sweeps (more seeds, wider and deeper models, longer training)."
    )
    cmd = "rmsnorm report --out report"
    if j.get("model"):
        cmd += f" --model {j['model']['model']}"
    sc = j["simulation"]["config"]
    page.code(
        f"{cmd}\nrmsnorm simulate --out sim --seeds {j['simulation']['n_seeds']} "
        f"--n-layers {sc['n_layers']} --d-model {sc['d_model']}\n"
        "rmsnorm inspect --model PATH_OR_BUILTIN --json inspect.json"
    )
