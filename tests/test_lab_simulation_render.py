"""The simulation's figures and files (lab/simulation/render.py)."""

import json

import pytest

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
