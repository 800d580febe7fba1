"""The report's run (lab/report/run.py, with build_report writing through render.py): every
promised file from the tiny configuration, a self-contained HTML page, consistent numbers, and
the simulation set against i.i.d. Gaussian rows like with like."""

import json
import re
from pathlib import Path

import pytest
import torch

from rmsnorm.lab.report import IIDComparison, ReportConfig, StageHeadline, build_report
from rmsnorm.lab.stats import row_stats

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
    # The i.i.d. reference the report quotes is that of the statistic it is set against: |μ|/σ
    # (population σ, as row_stats computes it) of rows of the simulation's width, by Monte Carlo.
    d = data["simulation"]["config"]["d_model"]
    iid = data["simulation"]["iid_gaussian"]
    gen = torch.Generator().manual_seed(0)
    r = row_stats(torch.randn(200_000, d, generator=gen, dtype=torch.float64)).ratio
    assert iid["d"] == d == data["simulation"]["d"]
    assert iid["median"] == pytest.approx(float(r.median()), rel=0.01)
    assert iid["q05"] == pytest.approx(float(torch.quantile(r, 0.05)), rel=0.02)
    assert iid["q95"] == pytest.approx(float(torch.quantile(r, 0.95)), rel=0.01)
    assert iid["mean"] == pytest.approx(float(r.mean()), rel=0.01)
    sim = data["simulation"]
    assert sim["vs_iid"]["median_ratio"] == pytest.approx(
        sim["median_mu_over_sigma"] / iid["median"]
    )
    # like with like in the text: median with median, band with band, mean with mean
    assert f"a median of {iid['median']:.4f}" in md and f"a mean of {iid['mean']:.4f}" in md
    assert f"a median of {sim['median_mu_over_sigma']:.4f}" in md
    assert f"{sim['vs_iid']['median_ratio']:.2f}× the i.i.d. median" in md


def test_bad_model_fails_before_running(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such directory"):
        build_report(ReportConfig.quick(model=str(tmp_path / "missing")), tmp_path / "out")
    assert not (tmp_path / "out" / "report.html").exists()


def headline(median: float, d: int = 256, tokens: int = 1024) -> StageHeadline:
    return StageHeadline(median, 0.0, 0.0, 0.0, 1.0, 1.0, [median], 0.0, d, tokens)


def test_iid_verdict_follows_the_median_and_its_sampling_spread():
    iid = IIDComparison.of(headline(0.0405))  # the default simulation's median
    assert iid.reference.median == pytest.approx(0.0423, abs=1e-4)
    assert iid.verdict == "as centered" and iid.median_ratio == pytest.approx(
        0.0405 / 0.04230, rel=1e-3
    )
    assert iid.tolerance == pytest.approx(0.11, abs=0.005)  # 3 standard errors of 1,024 tokens
    assert IIDComparison.of(headline(0.030)).verdict == "more centered"
    assert IIDComparison.of(headline(0.055)).verdict == "less centered"
    # fewer tokens, wider spread: the same median is then within it
    assert IIDComparison.of(headline(0.030, tokens=64)).verdict == "as centered"
