"""The simulation's figures and files (lab/simulation/render.py)."""

import json

import pytest
import torch

from rmsnorm.lab.simulation import SimulationConfig, simulate, write_simulation

TINY = dict(n_layers=2, d_model=32, n_heads=2, seq_len=16, batch=4)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_write_simulation(tmp_path):
    res = simulate(SimulationConfig(**TINY, raw_tokens=5))
    files = write_simulation(res, tmp_path)
    for name in ("mean_histograms", "ratio_by_layer", "cosine_by_layer", "json"):
        assert files[name].is_file() and files[name].stat().st_size > 0
    data = json.loads(files["json"].read_text())
    assert len(data["stages"]["init"]["raw"]["mu"][0]) == 5
    assert data["tokens_per_layer"] == 64


def test_ratio_figure_draws_the_iid_reference_of_the_statistic_it_shows():
    """The grey lines of ratio_by_layer are the median and the 5% / 95% points of |μ|/σ, as
    row_stats computes it, for rows of d i.i.d. Gaussian entries at the simulation's d: checked
    against Monte Carlo, not against the formula that drew them."""
    pytest.importorskip("matplotlib")
    from rmsnorm.lab.simulation.render import IID_LABEL, ratio_by_layer_figure
    from rmsnorm.lab.stats import row_stats

    res = simulate(SimulationConfig(**TINY))
    fig = ratio_by_layer_figure(res)
    ax = fig.axes[0]
    assert ax.get_title() and ax.get_xlabel() and "|μ| / σ" in ax.get_ylabel()
    drawn = sorted(
        line.get_ydata()[0]
        for line in ax.get_lines()
        if line.get_color() == "gray" and len(set(line.get_ydata())) == 1
    )
    # the legend sits below the axes (on the figure), where it covers no data
    assert ax.get_legend() is None and len(fig.legends) == 1
    assert len(drawn) == 3 and any(IID_LABEL in t.get_text() for t in fig.legends[0].texts)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(200_000, TINY["d_model"], generator=gen, dtype=torch.float64)
    r = row_stats(x).ratio
    expected = [float(torch.quantile(r, q)) for q in (0.05, 0.5, 0.95)]
    assert drawn == pytest.approx(expected, rel=0.01)
    # the mean of i.i.d. rows (≈ √(2/(πd))) is not what is drawn against the medians
    assert abs(drawn[1] - float(r.mean())) > 0.1 * drawn[1]


def test_simulation_json_carries_the_decomposition(tmp_path):
    res = simulate(SimulationConfig(**TINY))
    data = json.loads(write_simulation(res, tmp_path)["json"].read_text())
    dec = data["stages"]["init"]["decomposition"]
    assert len(dec["shared"]) == len(dec["share"]) == 3 and len(dec["from_mlp"]) == 3
    assert data["config"]["activation"] == "gelu"


def test_seed_study_files(tmp_path):
    pytest.importorskip("matplotlib")
    from rmsnorm.lab.seeds import replicate
    from rmsnorm.lab.simulation import write_seed_study

    files = write_seed_study(replicate(SimulationConfig(**TINY), 3), tmp_path)
    assert {"ratio_by_layer_seeds", "decomposition", "seeds_json"} == set(files)
    assert json.loads(files["seeds_json"].read_text())["verdict"]["n"] == 3
