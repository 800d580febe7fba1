"""Trained networks of both kinds (lab/trained.py), the swap's cost on them (lab/swap.py) and the
architecture sweep (lab/sweep.py), at tiny sizes."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rmsnorm.lab.simulation import SimulationConfig
from rmsnorm.lab.swap import logit_cost, naive_swap, norm_slots, swap_costs
from rmsnorm.lab.sweep import SweepConfig, run_sweep
from rmsnorm.lab.trained import TrainStudyConfig, measure_state, run_training_study
from rmsnorm.lab.transformer import Transformer, TransformerConfig
from rmsnorm.modules import RMSNorm

TINY = dict(n_layers=2, d_model=32, n_heads=2, seq_len=16)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def study():
    cfg = TrainStudyConfig(**TINY, steps=4, train_batch=2, eval_batch=4, seeds=2)
    return run_training_study(cfg)


def test_both_kinds_train_from_the_same_weights(study):
    assert [(r.norm, r.seed) for r in study.runs] == [
        ("layernorm", 0), ("rmsnorm", 0), ("layernorm", 1), ("rmsnorm", 1)
    ]  # fmt: skip
    for r in study.runs:
        assert r.steps == 4 and len(r.train_loss) == 4 and r.val_loss["trained"] > 0
    # same seed: the same initial weights, so the same stream at the embedding at init
    ln0, rms0 = study.runs[0], study.runs[1]
    assert ln0.init["median_sigma"][0] == rms0.init["median_sigma"][0]
    assert ln0.init["median_abs_mu"][0] == rms0.init["median_abs_mu"][0]
    assert study.to_dict()["config"]["warmup"] == 1


def test_the_loss_never_pulls_on_a_layernorm_streams_mean(study):
    """In a pre-LN LayerNorm network every path from the stream to the loss passes a LayerNorm:
    ∂L/∂residual has no component along 𝟙 (rounding in float64). An RMSNorm network's does."""
    for r in study.of("layernorm"):
        assert max(r.init["grad_ones_share"] + r.trained["grad_ones_share"]) < 1e-25
    for r in study.of("rmsnorm"):
        assert min(r.trained["grad_ones_share"]) > 1e-6


def test_measure_state_against_a_hand_computation():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(**TINY, norm="rmsnorm"))
    tokens = torch.randint(0, 256, (3, 16))
    targets = torch.randint(0, 256, (3, 16))
    out = measure_state(model, tokens, targets)
    m = model.double()
    logits, res = m(tokens, return_residuals=True)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    grads = torch.autograd.grad(loss, res)
    assert out["loss"] == pytest.approx(float(loss.detach()))
    for i, (h, g) in enumerate(zip(res, grads, strict=True)):
        rows = h.detach().reshape(-1, 32).numpy()
        mu, sigma = rows.mean(axis=1), rows.std(axis=1)
        assert out["median_abs_mu"][i] == pytest.approx(np.median(np.abs(mu)))
        assert out["median_sigma"][i] == pytest.approx(np.median(sigma))
        assert out["median_ratio"][i] == pytest.approx(np.median(np.abs(mu) / sigma))
        gg = g.reshape(-1, 32).numpy()
        share = (gg.sum(axis=1) ** 2).sum() / 32 / (gg**2).sum()
        assert out["grad_ones_share"][i] == pytest.approx(share)


def test_train_study_config_checks():
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        TrainStudyConfig(steps=0)
    with pytest.raises(ValueError, match="must include 'layernorm'"):
        TrainStudyConfig(norms=("rmsnorm",))


# ----------------------------------------------------------------------------------------------
# The swap
# ----------------------------------------------------------------------------------------------
def test_the_exact_swap_is_exact_and_the_naive_one_is_not(study):
    tokens, targets = study.eval_tokens, study.eval_targets
    costs = swap_costs(study.of("layernorm")[0].model, tokens, targets)
    assert costs["norms"] == ["blocks.0.norm1", "blocks.0.norm2", "blocks.1.norm1",
                              "blocks.1.norm2", "norm_f"]  # fmt: skip
    for cost in [costs["exact"]["all"], *costs["exact"]["one"].values()]:
        assert cost["max_abs_logit_diff"] < 1e-12 and abs(cost["delta_loss"]) < 1e-12
        assert cost["kl_mean"] < 1e-14
    assert costs["naive"]["all"]["kl_mean"] > 1e-12
    assert costs["naive"]["all"]["max_abs_logit_diff"] > 1e-8


def test_logit_cost_by_hand():
    ref = torch.tensor([[[1.0, 2.0, 0.5], [0.0, 0.0, 1.0]]])
    new = torch.tensor([[[1.5, 2.0, 0.0], [0.0, 0.2, 1.0]]])
    targets = torch.tensor([[1, 2]])
    cost = logit_cost(ref, new, targets)
    p = ref.double().softmax(-1).numpy()[0]
    q = new.double().softmax(-1).numpy()[0]
    kl = (p * (np.log(p) - np.log(q))).sum(axis=1)
    assert cost["kl_mean"] == pytest.approx(kl.mean()) and cost["kl_max"] == pytest.approx(kl.max())
    ce = lambda z: -np.log(z[[0, 1], [1, 2]]).mean()  # noqa: E731
    assert cost["delta_loss"] == pytest.approx(ce(q) - ce(p))
    assert cost["max_abs_logit_diff"] == pytest.approx(0.5)


def test_naive_swap_replaces_what_it_is_asked_to():
    model = Transformer(TransformerConfig(**TINY))
    one = naive_swap(model, "blocks.1.norm2")
    kinds = {name: type(getattr(parent, attr)) for name, parent, attr in norm_slots(one)}
    assert kinds["blocks.1.norm2"] is RMSNorm and kinds["blocks.0.norm1"] is not RMSNorm
    swapped = naive_swap(model).blocks[0].norm1
    assert isinstance(swapped, RMSNorm) and swapped.weight is not model.blocks[0].norm1.weight
    with pytest.raises(ValueError, match="has no LayerNorm"):
        zeros = torch.zeros(1, 4, dtype=torch.long)
        swap_costs(Transformer(TransformerConfig(**TINY, norm="rmsnorm")), zeros, zeros)


# ----------------------------------------------------------------------------------------------
# The sweep
# ----------------------------------------------------------------------------------------------
def test_sweep_changes_one_thing_at_a_time():
    base = SimulationConfig(n_layers=2, d_model=32, n_heads=2, seq_len=8)
    cfg = SweepConfig(seeds=2, widths=(16, 32), depths=(1, 2), batch=2)
    res = run_sweep(base, cfg)
    assert [c.group for c in res.cells].count("activation") == 4
    by = {(c.group, c.label): c for c in res.cells}
    assert by[("width", "d = 16")].config.d_model == 16
    assert by[("placement", "post-LN")].config.norm_position == "post"
    assert by[("activation", "GELU, token mean removed")].config.center_activation
    # the default configuration sits in every group and runs once
    assert by[("activation", "GELU")].study is by[("width", "d = 32")].study
    assert by[("depth", "2 layers")].study is by[("placement", "pre-LN")].study
    data = res.to_dict()
    assert len(data["cells"]) == len(res.cells) and data["seeds"] == [0, 1]
    cell = data["cells"][0]
    assert cell["pooled_median_geomean"] == pytest.approx(
        math.exp(np.mean(np.log(cell["pooled_median"])))
    )


def test_sweep_config_checks():
    with pytest.raises(ValueError, match="unknown"):
        SweepConfig(placements=("sideways",))
    with pytest.raises(ValueError, match="seeds must be an integer >= 2"):
        SweepConfig(seeds=1)
    with pytest.raises(ValueError, match="widths must be positive integers"):
        SweepConfig(widths=(0,))
