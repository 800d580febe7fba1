"""The report says one number once: one median in the lab (the mean of the two middle values for
an even count) behind every share it prints, section pointers that follow the page's numbering,
and "seed 001" defined where the page first uses it."""

import math

import pytest
import torch

from rmsnorm.lab.experiments.simulation import SimulationConfig
from rmsnorm.lab.experiments.simulation.seeds import replicate
from rmsnorm.lab.experiments.sweep import SweepCell
from rmsnorm.lab.report import Page, sections
from rmsnorm.lab.report.sections.common import chapter
from rmsnorm.lab.stats import median
from rmsnorm.lab.stats.rows import spread

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_one_median_for_every_kind_of_input():
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert median(torch.tensor([4.0, 1.0, 3.0, 2.0])) == 2.5
    assert median([1.0, None, math.nan, 3.0]) == 2.0
    assert median([5.0, 1.0, 3.0]) == 3.0
    assert math.isnan(median([]))


@pytest.fixture(scope="module")
def four_seeds():
    cfg = SimulationConfig(n_layers=2, d_model=32, n_heads=2, seq_len=16, batch=4)
    return replicate(cfg, 4)


def test_the_token_shared_share_is_one_number(four_seeds):
    """The sweep's default cell, the simulation table and the decomposition section print the
    same median of the same seeds' last-layer shares."""
    study = four_seeds
    shares = [s.shared_share[-1] for s in study.summaries]
    assert len(set(shares)) == 4
    expected = sorted(shares)[1:3]
    expected = (expected[0] + expected[1]) / 2
    cell = SweepCell("default", "default", study.config, study).to_dict()
    assert cell["last_layer_shared_share_median"] == pytest.approx(expected, rel=1e-12)
    assert study.band("shared_share")["median"][-1] == pytest.approx(expected, rel=1e-12)
    assert spread(shares)["median"] == pytest.approx(expected, rel=1e-12)
    rows = sections.simulation.numbers(study)["layers"]
    assert rows[-1]["shared_share_median"] == pytest.approx(expected, rel=1e-12)


def test_section_pointers_follow_the_numbering():
    page = Page("t")
    page.h2("first")
    page.h2("the simulation", key="simulation")
    assert page.ref("simulation") == "section 2"
    with pytest.raises(KeyError):
        page.ref("divergence")


def test_seed_001_is_defined_where_first_used():
    page = Page("t")
    first, second = chapter(page), chapter(page)
    assert first.startswith("Seed 001") and "not one of the random seeds" in first
    assert second == "The chapter"


def test_the_quick_report_points_to_the_right_sections(tmp_path):
    """In the page's words: the sweep's verdict is the simulation section's, the swap's cosine the
    divergence section's, and seed 001 is defined at its first use."""
    import re

    from rmsnorm.lab.report import ReportConfig, build_report

    build_report(ReportConfig.quick(real=None), tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    numbers = {title: n for n, title in re.findall(r"^## (\d+)\. (.*)$", md, flags=re.M)}
    sim = next(n for t, n in numbers.items() if t.startswith("The chapter's experiment"))
    div = next(n for t, n in numbers.items() if t.startswith("The divergence curve"))
    assert f"the seed-calibrated one of section {sim} " in md
    assert f"what each norm reads (section {div})" in md
    first = md.lower().index("seed 001")
    assert "not one of the random seeds" in md[first : first + 200]
