"""The statistics and verdicts of a training comparison (lab/comparison/summary.py): the
seed-spread rule and the paired per-seed differences."""

import pytest

from rmsnorm.lab.comparison import summarize


def _fake_results(finals: dict[str, list[float]]) -> dict:
    runs = {
        v: [
            {"val_loss": [f], "train_loss": [f], "step_time_s": [0.1] * 5, "tokens_per_step": 64}
            | {"parameters": 10, "norm_parameters": 1}
            for f in values
        ]
        for v, values in finals.items()
    }
    cases = {v: {"per_call_s": [1e-3]} for v in finals if v != "none"}
    return {"runs": runs, "norm_timing": {"cases": cases}, "norm_layers_per_model": 3}


def test_spread_rule():
    summary = summarize(
        _fake_results(
            {
                "layernorm": [2.00, 2.02, 2.04],  # std 0.02 -> threshold 0.04
                "rmsnorm": [2.04, 2.06, 2.08],  # Δ = +0.04: within
                "prmsnorm": [2.10, 2.12, 2.14],  # Δ = +0.10: outside
            }
        )
    )["variants"]
    assert summary["layernorm"]["within_spread"] is None
    assert summary["rmsnorm"]["within_spread"] is True
    assert summary["prmsnorm"]["within_spread"] is False
    assert summary["rmsnorm"]["delta_vs_layernorm_per_seed"] == pytest.approx([0.04] * 3)
    assert "within the seed spread" in summary["rmsnorm"]["verdict"]
    assert "outside the seed spread" in summary["prmsnorm"]["verdict"]
    one_seed = summarize(_fake_results({"layernorm": [2.0], "rmsnorm": [2.1]}))["variants"]
    assert one_seed["rmsnorm"]["within_spread"] is None  # no spread with one seed
