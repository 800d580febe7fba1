"""The report (lab/report/): every promised file from the tiny configuration, a self-contained
HTML page and consistent numbers."""

import json
import re
from pathlib import Path

import pytest

from rmsnorm.lab.report import ReportConfig, build_report

FIGURES = (
    "mean_histograms", "ratio_by_layer", "cosine_by_layer", "divergence_curve", "sigma_mu_plane",
    "timing", "trained_mean_histograms", "trained_ratio_by_layer", "model_layers",
)  # fmt: skip


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_quick_report_writes_everything(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative --out, as `make report` passes
    summary = build_report(ReportConfig.quick(model="builtin-rms"), Path("rep"))
    tmp_path = tmp_path / "rep"
    for name in FIGURES:
        path = tmp_path / "figures" / f"{name}.png"
        assert path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    html = (tmp_path / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(FIGURES)
    # self-contained: no external assets or links to local files
    assert not re.search(r'(src|href)="(?!data:)', html)
    md = (tmp_path / "report.md").read_text()
    assert "## 1. The identity" in md
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert len(links) == len(FIGURES)
    for link in links:  # every image the Markdown page shows exists beside it
        assert link.startswith("figures/") and (tmp_path / link).is_file(), link
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["identity"]["max_rel_error"] < 1e-12
    assert data["simulation"]["max_cosine_pred_vs_measured"] < 1e-9
    assert data["planted"]["median_mu_over_sigma"] > data["simulation"]["median_mu_over_sigma"]
    assert data["model"]["norm_layers"] == 25
    assert {r["impl"] for r in data["timing"]["results"]} == {
        "rmsnorm.rms_norm", "rmsnorm.layer_norm", "torch F.rms_norm", "torch F.layer_norm"
    }  # fmt: skip
    assert all(
        r["rounds"] == 2 and r["min_ms"] <= r["median_ms"] for r in data["timing"]["results"]
    )
    # this library's rms_norm against both torch norms, in words and in the table
    assert re.search(r"`rms_norm` took [0-9.]+× the time of torch's `F.rms_norm` and [0-9.]+×", md)
    assert "| torch F.rms_norm | torch F.layer_norm |" in md
    assert set(summary["files"]) >= set(FIGURES) | {"report.md", "report.html", "report.json"}


def test_bad_model_fails_before_running(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such directory"):
        build_report(ReportConfig.quick(model=str(tmp_path / "missing")), tmp_path / "out")
    assert not (tmp_path / "out" / "report.html").exists()
