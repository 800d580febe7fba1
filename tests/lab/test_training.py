"""Training in the lab (lab/models/train.py, transformer.py, trained.py, swap.py, sweep.py): the one
training loop and its model, networks trained with either norm, the swap's cost on them and the
architecture sweep, at tiny sizes."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rmsnorm.lab.experiments.simulation import SimulationConfig
from rmsnorm.lab.experiments.swap import logit_cost, naive_swap, norm_slots, swap_costs
from rmsnorm.lab.experiments.sweep import SweepConfig, run_sweep
from rmsnorm.lab.experiments.trained import TrainStudyConfig, measure_state, run_training_study
from rmsnorm.lab.models.corpus import Corpus
from rmsnorm.lab.models.train import TrainConfig, Trainer, evaluate, train, val_parts
from rmsnorm.lab.models.transformer import Transformer, TransformerConfig
from rmsnorm.modules import RMSNorm

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# --------------------------------------------------------------------------------------------------
# The one training loop (lab/models/train.py) and the model it trains (lab/models/transformer.py):
# what a run records per step and per evaluation, the disjoint held-out parts, stopping at a
# non-finite loss, and the MLP activations.


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    yield


def corpus(n: int = 6000) -> Corpus:
    data = torch.tensor(list(b"the quick brown fox jumps over the lazy dog. " * 200)[:n])
    n_val = n // 5
    return Corpus("fox", data[:-n_val], data[-n_val:], ["fox"])


def model(norm: str = "layernorm", **kw) -> Transformer:
    torch.manual_seed(0)
    cfg = dict(n_layers=2, d_model=32, n_heads=2, seq_len=16, norm=norm) | kw
    return Transformer(TransformerConfig(**cfg))


def test_history_per_step_and_per_evaluation():
    cfg = TrainConfig(steps=12, batch_size=4, lr=3e-3, warmup=3, eval_interval=5, eval_batches=2)
    hist = train(model(), corpus(), cfg)
    for name in ("train_loss", "step_time_s", "grad_norm", "lr"):
        assert len(getattr(hist, name)) == 12, name
    assert hist.lr == [cfg.lr_at(s) for s in range(12)]
    assert hist.lr[0] == pytest.approx(1e-3) and max(hist.lr) == pytest.approx(3e-3)
    assert all(g > 0 and math.isfinite(g) for g in hist.grad_norm)
    assert hist.val_steps == [5, 10, 12]
    assert hist.val_loss_parts == [hist.val_loss]  # one part: the whole held-out split
    assert hist.diverged_at is None


def test_grad_norm_is_the_norm_before_clipping():
    """With clipping at 1e-3 every update is clipped, yet the trace holds the unclipped norm: the
    same first-step value as a run without clipping (same init, same first batch)."""
    runs = {}
    for clip in (1e-3, 0.0):
        cfg = TrainConfig(steps=1, batch_size=4, warmup=1, grad_clip=clip, eval_interval=1)
        runs[clip] = train(model(), corpus(), cfg).grad_norm[0]
    assert runs[1e-3] == pytest.approx(runs[0.0], rel=1e-6) and runs[0.0] > 1e-3


def test_one_part_scores_exactly_as_before():
    """val_parts=1 keeps the validation numbers of the loop before parts existed."""
    m, c = model(), corpus()
    cfg = TrainConfig(steps=4, batch_size=4, warmup=1, eval_interval=4, eval_batches=2, seed=3)
    hist = train(m, c, cfg)
    assert hist.val_loss[-1] == evaluate(m, c, 2, 4, seed=3)


def test_val_parts_are_disjoint_and_scored_apart():
    c = corpus()
    parts = val_parts(c, 2, seq_len=16)
    assert [p.val.numel() for p in parts] == [c.val.numel() // 2] * 2
    assert torch.equal(torch.cat([p.val for p in parts]), c.val[: 2 * (c.val.numel() // 2)])
    assert all(p.train is c.train for p in parts)
    cfg = TrainConfig(steps=6, batch_size=4, warmup=1, eval_interval=3, eval_batches=2)
    m = model()
    hist = train(m, c, TrainConfig(**{**cfg.__dict__, "val_parts": 2}))
    assert len(hist.val_loss_parts) == 2 and all(len(v) == 2 for v in hist.val_loss_parts)
    a, b = (p[-1] for p in hist.val_loss_parts)
    assert a != b and hist.val_loss[-1] == pytest.approx((a + b) / 2)
    assert a == evaluate(m, parts[0], 2, 4, seed=0)
    with pytest.raises(ValueError, match="seq_len"):
        val_parts(c, 200, seq_len=16)


def test_stop_on_divergence():
    """A learning rate of 1e6 without clipping blows the loss up within a few steps: the run
    stops there, says at which step, and refuses another step."""
    cfg = TrainConfig(steps=50, batch_size=4, lr=1e6, warmup=1, grad_clip=0.0)
    cfg.stop_on_divergence = True
    trainer = Trainer(model("none"), corpus(), cfg)
    while not trainer.done:
        trainer.step()
    hist = trainer.history
    assert hist.diverged_at is not None and hist.diverged_at < 49
    assert len(hist.train_loss) == hist.diverged_at + 1
    # stopped at the first step whose loss or gradient norm is not finite
    assert not (math.isfinite(hist.train_loss[-1]) and math.isfinite(hist.grad_norm[-1]))
    assert all(map(math.isfinite, hist.train_loss[:-1] + hist.grad_norm[:-1]))
    with pytest.raises(RuntimeError, match="diverged"):
        trainer.step()


def test_min_lr_ratio_sets_the_floor_of_the_cosine():
    cfg = TrainConfig(steps=101, lr=1.0, warmup=1, min_lr_ratio=0.0)
    assert cfg.lr_at(0) == 1.0 and cfg.lr_at(51) == pytest.approx(0.5)
    assert cfg.lr_at(101) == pytest.approx(0.0, abs=1e-12)
    assert TrainConfig(steps=101, lr=1.0, warmup=1).lr_at(101) == pytest.approx(0.1)  # default


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="val_parts"):
        TrainConfig(val_parts=0)
    with pytest.raises(ValueError, match="warmup"):
        TrainConfig(warmup=-1)
    with pytest.raises(ValueError, match="min_lr_ratio"):
        TrainConfig(min_lr_ratio=1.5)
    with pytest.raises(ValueError, match="activation"):
        TransformerConfig(activation="tanh")


@pytest.mark.parametrize("activation", ["gelu", "relu", "swiglu"])
def test_activations_train(activation):
    m = model(activation=activation)
    hidden = 4 * 32  # mlp_ratio · d_model
    assert m.blocks[0].mlp.fc.out_features == (2 * hidden if activation == "swiglu" else hidden)
    assert m.blocks[0].mlp.proj.in_features == hidden
    cfg = TrainConfig(steps=30, batch_size=8, lr=3e-3, warmup=3, eval_interval=30)
    hist = train(m, corpus(), cfg)
    assert sum(hist.train_loss[-5:]) / 5 < hist.train_loss[0] - 0.5


def test_default_activation_is_gelu():
    """The default model is unchanged: its MLP is GELU's."""
    m = model()
    x = torch.randn(2, 3, 32)
    mlp = m.blocks[0].mlp
    assert torch.equal(mlp(x), mlp.proj(torch.nn.functional.gelu(mlp.fc(x))))


def test_window_losses_average_to_the_validation_loss():
    m, c = model(), corpus()
    windows: list[float] = []
    loss = evaluate(m, c, 3, 4, seed=1, windows=windows)
    assert len(windows) == 12
    assert sum(windows) / 12 == pytest.approx(loss, rel=1e-6)
    cfg = TrainConfig(steps=4, batch_size=4, warmup=1, eval_interval=2, eval_batches=3)
    hist = train(m, c, TrainConfig(**{**cfg.__dict__, "val_parts": 2}))
    assert [len(w) for w in hist.val_windows] == [12, 12]  # the last evaluation's
    for part, windows in zip(hist.val_loss_parts, hist.val_windows, strict=True):
        assert sum(windows) / 12 == pytest.approx(part[-1], rel=1e-6)


def test_a_larger_final_evaluation_keeps_the_curve_on_the_same_windows():
    """final_eval_batches scores more windows once, after the last step; the curve's last point
    is still on the eval_batches windows of every earlier point, which are the final set's first
    windows (one window generator)."""
    c = corpus()
    base = dict(steps=4, batch_size=4, warmup=1, eval_interval=2, eval_batches=2, val_parts=2)
    plain = train(model(), c, TrainConfig(**base))
    more = train(model(), c, TrainConfig(**base, final_eval_batches=5))
    assert more.val_loss_parts == plain.val_loss_parts  # the curve is unchanged
    assert plain.final_val_loss_parts == []
    assert [len(w) for w in more.val_windows] == [20, 20]
    for i in range(2):
        assert more.val_windows[i][:8] == pytest.approx(plain.val_windows[i], rel=1e-6)
        assert more.final_val_loss_parts[i] == pytest.approx(
            sum(more.val_windows[i]) / 20, rel=1e-6
        )
    with pytest.raises(ValueError, match="final_eval_batches"):
        TrainConfig(final_eval_batches=0)


# --------------------------------------------------------------------------------------------------
# Trained networks of both kinds (lab/experiments/trained.py), the swap's cost on them
# (lab/experiments/swap.py) and the architecture sweep (lab/experiments/sweep.py), at tiny sizes.

TINY = dict(n_layers=2, d_model=32, n_heads=2, seq_len=16)


@pytest.fixture(scope="module")
def study():
    cfg = TrainStudyConfig(**TINY, steps=4, train_batch=2, eval_batch=4, seeds=2)
    return run_training_study(cfg)


def test_both_kinds_train_from_the_same_weights(study):
    assert [(r.norm, r.seed) for r in study.runs] == [
        ("layernorm", 0),
        ("rmsnorm", 0),
        ("layernorm", 1),
        ("rmsnorm", 1),
    ]
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


def test_train_study_models_share_the_config_shape_and_differ_by_norm():
    cfg = TrainStudyConfig(n_layers=2, d_model=32, n_heads=2, seq_len=16)
    ln, rms = cfg.model_config("layernorm"), cfg.model_config("rmsnorm")
    assert (ln.norm, rms.norm) == ("layernorm", "rmsnorm")
    assert {k: v for k, v in ln.to_dict().items() if k != "norm"} == {
        k: v for k, v in rms.to_dict().items() if k != "norm"
    }
    assert (ln.n_layers, ln.d_model, ln.n_heads, ln.seq_len) == (2, 32, 2, 16)


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
    assert costs["norms"] == [
        "blocks.0.norm1",
        "blocks.0.norm2",
        "blocks.1.norm1",
        "blocks.1.norm2",
        "norm_f",
    ]
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
