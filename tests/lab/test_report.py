"""The report (lab/report/) and the progress lines of long steps (rmsnorm/_progress.py): the
document model, the prose, and the run that writes every promised file."""

import json
import math
import re
from pathlib import Path

import pytest
import torch

from rmsnorm._progress import LogProgress
from rmsnorm.lab.experiments.simulation.seeds import centering_verdict
from rmsnorm.lab.report import Page, ReportConfig, build_report
from rmsnorm.lab.report.sections.common import verdict_sentence
from rmsnorm.lab.report.sections.simulation import centering_vs_iid
from rmsnorm.lab.stats import row_stats
from rmsnorm.lab.stats.iid import iid_reference

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# --------------------------------------------------------------------------------------------------
# The lab's document model (lab/page.py): Markdown and HTML from the same blocks.


def test_page_renders_escaped_tables():
    page = Page("t")
    page.h2("Numbers")
    page.h2("Notes", numbered=False)
    page.table(["|μ|/σ", "x"], [["0.1", "<b>"]])
    md = page.markdown(Path("."))
    assert "## 1. Numbers" in md and "## Notes" in md and "\\|μ\\|/σ" in md
    html = page.html()
    assert "&lt;b&gt;" in html and "<th>|μ|/σ</th>" in html


def test_model_section_labels_gated_and_grouped_norms():
    """The report's model table uses the inspection's kinds (RMS→z, z→RMS, /G) and says what
    they mean below it, as `rmsnorm inspect` does."""
    from rmsnorm.lab.report.sections import model

    def layer(name, kind, **extra):
        stats = {"q50": 0.1, "q95": 0.2}
        return {
            "name": name,
            "kind": kind,
            "mu_over_sigma": stats,
            "outliers": {},
            "predicted_cosine": {"mean": 0.99},
            "swap_max_abs_diff": 0.01,
            "swap_rel_diff": 0.01,
            **extra,
        }

    layers = [
        layer("ln", "layernorm"),
        layer("mixer.norm", "rmsnorm", gated_calls=1, gate="gate_then_norm", groups=2),
        layer("attn.norm", "rmsnorm", gated_calls=1, gate="norm_then_gate", groups=1),
    ]
    j = {"model": {"model": "m", "norm_layers": 3, "inputs": "ids", "layers": layers}}
    page = Page("t")
    model.words(page, j, {"model_layers": Path("m.png")})
    md = page.markdown(Path("."))
    assert "| LN |" in md and "| z→RMS/2 |" in md and "| RMS→z |" in md
    assert "statistics and swap per group" in md and "swap LN(x)·act(z)" in md


def test_figure_alt_text_keeps_its_brackets_inside(tmp_path):
    """A caption with brackets (E[μ²]) must not end the Markdown image's alt text early."""
    png = tmp_path / "f.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n")
    page = Page("t")
    page.figure(png, "share of E[μ²] per layer")
    md = page.markdown(tmp_path)
    assert "![share of E\\[μ²\\] per layer](f.png)" in md


# --------------------------------------------------------------------------------------------------
# The report's text (lab/report/sections/): the verdicts in words follow the seed spreads, the
# i.i.d. comparison sets median against median, and a conclusion the numbers do not support is not
# written.


def verdict(ratios) -> dict:
    return centering_verdict(ratios).to_dict()


def test_verdict_words_follow_the_interval():
    as_c = verdict([0.95, 1.0, 1.05, 0.98, 1.02, 1.01, 0.97, 1.03])
    assert as_c["verdict"] == "as centered"
    text = verdict_sentence(as_c, "the stream")
    assert text.startswith("the stream is as centered as") and "within ±25% of 1" in text
    less = verdict([1.5, 1.6, 1.55, 1.45, 1.52, 1.48])
    assert "is less centered than" in verdict_sentence(less) and "above 1" in verdict_sentence(less)
    more = verdict([0.5, 0.52, 0.49, 0.51])
    assert "is more centered than" in verdict_sentence(more)
    wide = verdict([0.6, 1.6, 1.0])
    text = verdict_sentence(wide, more="more training seeds")
    assert text.startswith("we cannot tell") and "more training seeds would tell" in text
    one = verdict([1.0])
    assert "one seed has no spread" in verdict_sentence(one)


def simulation_json(ratios, d: int = 256) -> dict:
    """The pieces of report.json that centering_vs_iid reads."""
    ref = iid_reference(d)
    v = verdict(ratios)
    return {
        "simulation": {
            "d": d,
            "iid_gaussian": ref.to_dict(),
            "iid_sqrt_2_over_pi_d": (2 / (3.141592653589793 * d)) ** 0.5,
            "verdict": v,
            "seed0": {
                "seed": 0,
                "median_mu_over_sigma": ratios[0] * ref.median,
                "q05_mu_over_sigma": 0.0038,
                "q95_mu_over_sigma": 0.114,
                "mean_mu_over_sigma": 0.0471,
            },
            "median_ratio_min": min(ratios),
            "median_ratio_max": max(ratios),
            "seed_sd_pct": 100 * v["seed_sd"],
            "seed_verdict_as_centered": len(ratios) - 1,
            "tokens_per_layer": 1024,
            "token_test_tolerance_pct": 11.0,
            "token_test_flagged": 3,
        }
    }


def test_centering_paragraph_compares_like_with_like():
    ratios = [0.96, 1.1, 0.87, 1.05, 1.0, 0.93, 1.14, 1.02]
    j = simulation_json(ratios)
    text = centering_vs_iid(j)
    ref = iid_reference(256)
    assert f"a median of {ref.median:.4f}" in text and f"a mean of {ref.mean:.4f}" in text
    assert f"{ref.q05:.4f}–{ref.q95:.3f}" in text
    assert f"ranges from {min(ratios):.3f} to {max(ratios):.3f}" in text
    assert "as centered as i.i.d. Gaussian rows" in text
    assert "would call 3 of the 8 seeds" in text


@pytest.mark.parametrize(
    "ratios, words",
    [
        ([1.5, 1.6, 1.55, 1.45, 1.52, 1.48], "less centered than"),
        ([0.5, 0.52, 0.49, 0.51], "more centered than"),
        ([0.6, 1.6, 1.0], "we cannot tell"),
    ],
)
def test_centering_paragraph_states_what_the_seeds_support(ratios, words):
    text = centering_vs_iid(simulation_json(ratios))
    assert words in text and "within ±25% of 1" not in text


# --------------------------------------------------------------------------------------------------
# The report's run (lab/report/run.py, with build_report writing through render.py): every promised
# file from the tiny configuration, a self-contained HTML page whose Markdown twin links only files
# that exist, every number of report.md present in report.json, and the options.

FIGURES = (
    "sigma_mu_plane",
    "mean_histograms",
    "ratio_by_layer",
    "decomposition",
    "cosine_by_layer",
    "divergence_curve",
    "blind_spot",
    "timing",
    "sweep",
    "trained_mu_sigma",
    "swap",
    "model_layers",
    "recovery",
)
# A small recovery.json (`rmsnorm recover --quick`) for the section that reads one.
RECOVERY = Path(__file__).parent / "data" / "recovery_small.json"


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    """The quick report with a model, built once for the tests below (~15 s)."""
    import os

    out = tmp_path_factory.mktemp("report")
    cwd = os.getcwd()
    os.chdir(out)  # a relative --out, as `make report` passes
    try:
        cfg = ReportConfig.quick(model="builtin-rms", recovery=str(RECOVERY))
        summary = build_report(cfg, Path("rep"))
    finally:
        os.chdir(cwd)
    return out / "rep", summary


def test_quick_report_writes_everything(quick_report):
    out, summary = quick_report
    for name in FIGURES:
        path = out / "figures" / f"{name}.png"
        assert path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(FIGURES)
    # self-contained: no external assets or links to local files
    assert not re.search(r'(src|href)="(?!data:)', html)
    md = (out / "report.md").read_text()
    assert "## 3. The identity" in md and "## The answer" in md
    # the recovery (read from a stored recovery.json) follows the pretrained models
    assert "## 2. What a short fine-tune recovers" in md and "Not run" not in md.split("## 2.")[1]
    # the pretrained models' section leads, and says --quick skipped it
    assert "## 1. Real pretrained transformers" in md and "Not run (--quick)" in md
    links = re.findall(r"!\[(?:\\.|[^\]\\])*\]\(([^)]+)\)", md)
    assert len(links) == len(FIGURES)
    for link in links:  # every image the Markdown page shows exists beside it
        assert link.startswith("figures/") and (out / link).is_file(), link
    assert set(summary["files"]) >= set(FIGURES) | {"report.md", "report.html", "report.json"}
    for name, rel in summary["files"].items():  # every file the JSON lists exists
        assert (out / rel).is_file(), name
    # nothing half-written is left beside the files
    assert not [p for p in out.rglob(".*") if p.is_file()]


def test_a_new_section_is_a_module_and_one_line(tmp_path, monkeypatch):
    """docs/architecture.md's recipe walked: a section with the three callables, appended to the
    list, lands in report.json (its data), figures/ (its figure) and the page (its words), with no
    other edit; render walks the list in its order."""
    from types import SimpleNamespace

    from rmsnorm.lab.report import render, sections
    from rmsnorm.lab.report.run import Provenance

    def figures(r, out):
        png = out / "new_figure.png"
        png.write_bytes(b"\x89PNG\r\n\x1a\n")
        return {"new_figure": png}

    def words(page, j, figs):
        page.h2("A new section")
        page.p(f"It states {j['new_section']['value']:.2f}.")
        page.figure(figs["new_figure"], "the new section's figure")

    new = SimpleNamespace(
        data=lambda r: {"new_section": {"value": r.value}}, figures=figures, words=words
    )
    monkeypatch.setattr(sections, "SECTIONS", [new])
    r = SimpleNamespace(
        config=SimpleNamespace(mode="quick"),
        provenance=Provenance.now(),
        seconds={"runs": 0.0},
        value=0.25,
    )
    summary = render.write_report(r, tmp_path / "rep")
    assert summary["new_section"] == {"value": 0.25}
    assert summary["files"]["new_figure"] == "figures/new_figure.png"
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## 1. A new section" in md and "It states 0.25." in md
    assert (
        json.loads((tmp_path / "rep" / "report.json").read_text())["new_section"]["value"] == 0.25
    )


def test_every_section_has_the_three_callables():
    from rmsnorm.lab.report import sections

    assert len(set(map(id, sections.SECTIONS))) == len(sections.SECTIONS) == 15
    for section in sections.SECTIONS:
        assert all(callable(getattr(section, f, None)) for f in ("data", "figures", "words"))
    assert sections.common not in sections.SECTIONS  # helpers, not sections
    assert sections.real_figures not in sections.SECTIONS


def test_report_json_holds_the_measurements(quick_report):
    out, _ = quick_report
    data = json.loads((out / "report.json").read_text())
    assert data["identity"]["max_rel_error"] < 1e-12
    sim = data["simulation"]
    assert sim["seed0"]["max_cosine_pred_vs_measured"] < 1e-9
    assert sim["n_seeds"] == 3 and len(sim["seeds"]["ratios"]) == 3
    assert sim["verdict"]["verdict"] in (
        "as centered",
        "more centered",
        "less centered",
        "cannot tell",
    )
    assert data["model"]["norm_layers"] == 25 and data["model"]["layers"][0]["outliers"]
    # the training: both kinds, the LayerNorm loss has no gradient along 𝟙, the RMSNorm loss has
    per = data["training"]["per_norm"]
    assert set(per) == {"layernorm", "rmsnorm"}
    assert per["layernorm"]["grad_ones_share_trained"]["max"] < 1e-20
    assert per["rmsnorm"]["grad_ones_share_trained"]["min"] > 1e-8
    # the swap: exact to rounding, naive not
    assert data["swap"]["exact_max_abs"] < 1e-12
    assert data["swap"]["naive_all"]["kl_mean"]["min"] > 1e-12
    # the planted mean: invisible to LayerNorm, seen by RMSNorm
    planted = data["planted"]["per_norm"]
    assert planted["layernorm"]["beyond_shift_max"] < 1e-12
    assert planted["rmsnorm"]["beyond_shift_last"]["min"] > 1e-3
    assert {r["impl"] for r in data["timing"]["results"]} == {
        "rmsnorm.rms_norm",
        "rmsnorm.layer_norm",
        "torch F.rms_norm",
        "torch F.layer_norm",
    }
    assert data["mode"] == "quick" and data["cores"] >= 1
    # The i.i.d. reference the report quotes is that of the statistic it is set against: |μ|/σ
    # (population σ, as row_stats computes it) of rows of the simulation's width, by Monte Carlo.
    d = sim["d"]
    iid = sim["iid_gaussian"]
    gen = torch.Generator().manual_seed(0)
    r = row_stats(torch.randn(200_000, d, generator=gen, dtype=torch.float64)).ratio
    assert iid["median"] == pytest.approx(float(r.median()), rel=0.01)
    assert iid["q95"] == pytest.approx(float(torch.quantile(r, 0.95)), rel=0.01)
    assert iid["mean"] == pytest.approx(float(r.mean()), rel=0.01)
    # the verdict's ratio is the geometric mean of the seeds' medians over the i.i.d. median
    ratios = sim["seeds"]["ratios"]
    assert sim["verdict"]["ratio"] == pytest.approx(
        math.exp(sum(map(math.log, ratios)) / len(ratios))
    )
    for ratio, seed in zip(ratios, sim["seeds"]["per_seed"], strict=True):
        assert ratio == pytest.approx(seed["pooled_median_ratio"] / iid["median"])


# ----------------------------------------------------------------------------------------------
# Every number of report.md is in report.json
# ----------------------------------------------------------------------------------------------
_NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>[-−+]?)(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:e[-+]?\d+)?)"
    r"(?P<pct>%?)"
)


def _json_values(obj, numbers: list[float], strings: list[str]) -> None:
    if isinstance(obj, bool):
        return
    if isinstance(obj, (int, float)):
        numbers.append(float(obj))
    elif isinstance(obj, str):
        strings.append(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            strings.append(str(k))
            _json_values(v, numbers, strings)
    elif isinstance(obj, list):
        for v in obj:
            _json_values(v, numbers, strings)


def _prose_numbers(md: str) -> list[tuple[str, float, float]]:
    """(text, value, half a unit of its last printed digit) of every number in the prose and
    tables of ``md``: code blocks and spans, figure links and headings' numbering left out, and
    single-digit integers too (formula constants such as the 2 in 2 − 2σ/RMS). A percentage
    keeps its printed value; the check accepts it as a percent or as a fraction."""
    md = re.sub(r"```.*?```", " ", md, flags=re.S)
    md = re.sub(r"`[^`]*`", " ", md)
    md = re.sub(r"!\[(?:\\.|[^\]\\])*\]\([^)]*\)", " ", md)
    md = re.sub(r"^## \d+\.", "##", md, flags=re.M)
    md = re.sub(r"[⁰¹²³⁴⁵⁶⁷⁸⁹₀₁₂₃₄₅₆₇₈₉]", " ", md)  # exponents and subscripts of formulas
    out = []
    for m in _NUMBER.finditer(md):
        text = m["num"]
        if re.fullmatch(r"\d", text):
            continue
        plain = text.replace(",", "")
        value = float(plain)
        if "e" in plain:
            mant, exp = plain.split("e")
            decimals = len(mant.split(".")[1]) if "." in mant else 0
            half = 0.5 * 10 ** (int(exp) - decimals)
        else:
            decimals = len(plain.split(".")[1]) if "." in plain else 0
            half = 0.5 * 10**-decimals
        if m["sign"] in ("-", "−"):
            value = -value
        out.append((m.group(0), value, half))
    return out


def _in_json(
    value: float, half: float, numbers: list[float], strings: list[str], text: str
) -> bool:
    candidates = [(value, half)]
    if text.endswith("%"):  # a percentage: stored as a percent or as a fraction
        candidates.append((value / 100, half / 100))
    for x, h in candidates:
        tol = h * (1 + 1e-9) + 1e-12 * abs(x)
        if any(abs(v - x) <= tol or abs(abs(v) - abs(x)) <= tol for v in numbers):
            return True
    bare = text.lstrip("+-−").rstrip("%")
    return any(bare in s for s in strings)  # versions, dates, names (blocks.0.norm1, d = 32)


def test_every_number_in_the_page_is_in_the_json(quick_report):
    out, _ = quick_report
    md = (out / "report.md").read_text()
    numbers: list[float] = []
    strings: list[str] = []
    _json_values(json.loads((out / "report.json").read_text()), numbers, strings)
    found = _prose_numbers(md)
    assert len(found) > 200  # the extraction sees the page's numbers
    missing = [t for t, v, h in found if not _in_json(v, h, numbers, strings, t)]
    assert not missing, missing


def test_the_number_check_can_fail():
    """The check above is not vacuous: a number that no JSON value rounds to is reported."""
    numbers = [0.0423, 12.0, 0.25]
    found = dict((t, (v, h)) for t, v, h in _prose_numbers("median 0.0423, 25% and 0.0424, 13"))
    assert _in_json(*found["0.0423"], numbers, [], "0.0423")
    assert _in_json(*found["25%"], numbers, [], "25%")
    assert not _in_json(*found["0.0424"], numbers, [], "0.0424")
    assert not _in_json(*found["13"], numbers, [], "13")


# ----------------------------------------------------------------------------------------------
# Options
# ----------------------------------------------------------------------------------------------
def test_bad_model_fails_before_running(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such directory"):
        build_report(ReportConfig.quick(model=str(tmp_path / "missing")), tmp_path / "out")
    assert not (tmp_path / "out" / "report.html").exists()


def test_options_set_what_runs():
    cfg = ReportConfig.from_options(seeds=5, train_steps=7, train_seeds=4, planted_bias=0.0)
    assert cfg.seeds == 5 and cfg.sweep.seeds == 5
    assert cfg.training.steps == 7 and cfg.training.seeds == 4 and cfg.planted_bias == 0.0
    assert ReportConfig.from_options(train_steps=0).training is None
    assert ReportConfig.from_options(sweep=False).sweep is None
    default, full = ReportConfig(), ReportConfig.from_options(full=True)
    assert default.seeds >= 8 and full.seeds > default.seeds
    assert max(full.sweep.widths) > max(default.sweep.widths)
    assert full.training.steps > default.training.steps and full.training.seeds >= 3
    assert default.training.seeds >= 3 and default.planted_bias == 0.02
    with pytest.raises(ValueError, match="exclude each other"):
        ReportConfig.from_options(quick=True, full=True)
    with pytest.raises(ValueError, match="seeds must be a positive integer"):
        ReportConfig(seeds=0)


# --------------------------------------------------------------------------------------------------
# Progress reporting of long steps (rmsnorm/_progress.py): plain timestamped lines for logs
# and pipes.


def test_log_progress_lines():
    lines = []
    progress = LogProgress(lines.append, interval=0.0)
    with progress.task("work", 4) as advance:
        advance(2)
        advance(2)
    assert [re.sub(r"^\[[\d:]+\] ", "", line) for line in lines[:3]] == [
        "work: started",
        "work: 2/4 (50%), 0 s",
        "work: 4/4 (100%), 0 s",
    ]
    assert lines[3].endswith("s") and "work: done in" in lines[3]
    lines.clear()
    with pytest.raises(RuntimeError), progress.task("fails", 1):
        raise RuntimeError("stop")
    assert len(lines) == 1  # started, never "done"
