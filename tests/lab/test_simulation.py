"""The simulation (lab/simulation/run.py): shapes, the centered default, planted-mean detection,
the short training run and argument checks."""

import pytest
import torch

from rmsnorm.lab.simulation import SimulationConfig, simulate

TINY = dict(n_layers=2, d_model=32, n_heads=2, seq_len=16, batch=4)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_shapes_and_consistency():
    res = simulate(SimulationConfig(**TINY))
    assert res.layer_names == ["embedding", "block 1", "block 2"]
    assert res.init.mean.shape == (3, 64) and res.trained is None
    torch.testing.assert_close(
        res.init.rms.square(), res.init.std.square() + res.init.mean.square()
    )
    # predicted σ/RMS equals the cosine measured between the two outputs
    torch.testing.assert_close(res.init.cosine, res.init.measured_cosine, rtol=0, atol=1e-9)
    per_layer = res.to_dict()["stages"]["init"]["per_layer"]
    assert len(per_layer) == 3 and per_layer[0]["identity"]["max_rel_error"] < 1e-12


def test_default_is_centered_and_planted_mean_is_detected():
    base = simulate(SimulationConfig(**TINY))
    planted = simulate(SimulationConfig(**TINY, planted_mean=0.1))
    # the offset moves every token's mean by exactly the planted constant at the embedding
    torch.testing.assert_close(planted.init.mean[0] - base.init.mean[0],
                               torch.full((64,), 0.1, dtype=torch.float64))  # fmt: skip
    base_ratio = base.init.ratio.median()
    planted_ratio = planted.init.ratio.median()
    assert base_ratio < 0.5 < 2.0 < planted_ratio
    assert base.init.cosine.mean() > 0.95 > 0.6 > planted.init.cosine.mean()
    # pre-LN: the offset rides the residual stream through every block
    assert (planted.init.mean.mean(dim=1) > 0.05).all()


def test_inputs_and_training(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    res = simulate(SimulationConfig(**TINY, text=str(text), train_steps=3, train_batch=2))
    assert res.config.resolved_inputs == "text" and res.trained is not None
    assert set(res.val_loss) == {"init", "trained"} and len(res.train_history["train_loss"]) == 3
    assert not torch.equal(res.init.mean, res.trained.mean)
    gauss = simulate(
        SimulationConfig(**TINY, inputs="gaussian", norm="rmsnorm", norm_position="post")
    )
    assert gauss.init.mean.shape == (3, 64)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_layers=-1), "n_layers must be a positive integer"),
        (dict(d_model=30, n_heads=4), r"d_model \(30\) must be divisible by n_heads \(4\)"),
        (dict(norm="batchnorm"), "norm must be one of"),
        (dict(inputs="images"), "inputs must be one of"),
        (dict(planted_mean=float("nan")), "planted_mean must be a finite number"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SimulationConfig(**kwargs)


def test_missing_text_file():
    with pytest.raises(FileNotFoundError, match="text: no such file"):
        SimulationConfig(text="/nonexistent/corpus.txt")
