"""The one training loop (lab/train.py) and the model it trains (lab/transformer.py): what a run
records per step and per evaluation, the disjoint held-out parts, stopping at a non-finite loss,
and the MLP activations."""

import math

import pytest
import torch

from rmsnorm.lab.corpus import Corpus
from rmsnorm.lab.train import TrainConfig, Trainer, evaluate, train, val_parts
from rmsnorm.lab.transformer import Transformer, TransformerConfig


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
