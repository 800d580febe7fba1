"""μ split into its token-shared and per-token parts and who wrote the shared part
(lab/decomposition.py, through the simulation), the activations of the transformer, and the mean
planted inside a block (lab/planted.py)."""

import numpy as np
import pytest
import torch

from rmsnorm.lab.decomposition import capture_writes, shared_share
from rmsnorm.lab.planted import planted_in_block
from rmsnorm.lab.simulation import SimulationConfig, simulate
from rmsnorm.lab.transformer import Transformer, TransformerConfig

TINY = dict(n_layers=3, d_model=32, n_heads=2, seq_len=16, batch=4)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_shared_share_against_numpy():
    rng = np.random.default_rng(0)
    mu = rng.normal(0.3, 1.0, 500)
    bar, sq, share = shared_share(torch.tensor(mu))
    assert bar == pytest.approx(mu.mean()) and sq == pytest.approx((mu**2).mean())
    # E[μ²] = m̄² + var(μ) exactly (population variance)
    assert sq == pytest.approx(bar**2 + mu.var())
    assert share == pytest.approx(mu.mean() ** 2 / (mu**2).mean())
    assert shared_share(torch.zeros(4)) == (0.0, 0.0, 0.0)


def test_the_writers_parts_sum_to_the_shared_offset():
    res = simulate(SimulationConfig(**TINY))
    dec = res.init.decomposition
    for i in range(TINY["n_layers"] + 1):
        parts = dec.from_embedding[i] + dec.from_attention[i] + dec.from_mlp[i]
        assert parts == pytest.approx(dec.shared[i], abs=1e-9)
        assert dec.shared[i] == pytest.approx(float(res.init.mean[i].mean()))
        assert dec.share[i] == pytest.approx(shared_share(res.init.mean[i])[2])
    assert dec.from_attention[0] == 0 and dec.from_mlp[0] == 0
    assert len(dec.activation_mean) == TINY["n_layers"]
    assert all(a > 0 for a in dec.activation_mean)  # GELU's mean over tokens is positive


def test_the_mlp_shared_write_is_w2_times_the_activation_mean():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(n_layers=1, d_model=32, n_heads=2, seq_len=16)).eval()
    with torch.no_grad():
        model.blocks[0].mlp.proj.bias.normal_(0, 0.01)
    tokens = torch.randint(0, 256, (4, 16))
    seen = {}
    model.blocks[0].mlp.register_forward_hook(lambda m, a, out: seen.update(out=out))
    with torch.no_grad(), capture_writes(model) as rec:
        model(tokens)
    # the coordinate mean of the MLP's mean write over tokens, from its actual output
    assert rec.mlp_shared_write[0] == pytest.approx(float(seen["out"].double().mean()), abs=1e-7)
    assert rec.mlp[0] == pytest.approx(float(seen["out"].double().mean()), abs=1e-9)


def test_centering_the_activation_leaves_the_mlps_no_shared_write():
    res = simulate(SimulationConfig(**TINY, center_activation=True))
    dec = res.init.decomposition
    assert max(abs(v) for v in dec.from_mlp) < 1e-8  # the biases start at 0
    plain = simulate(SimulationConfig(**TINY))
    assert max(abs(v) for v in plain.init.decomposition.from_mlp) > 1e-6


def test_post_norm_has_no_additive_split_and_measures_what_its_norms_read():
    res = simulate(SimulationConfig(**TINY, norm_position="post"))
    assert res.init.decomposition.from_mlp is None
    # the rows measured after each block are the second norm's input, not its centered output
    assert float(res.init.ratio[1:].median()) > 1e-6


@pytest.mark.parametrize("activation", ["gelu", "relu", "swiglu"])
def test_activations(activation):
    cfg = TransformerConfig(n_layers=1, d_model=32, n_heads=2, seq_len=8, activation=activation)
    model = Transformer(cfg)
    hidden = cfg.mlp_ratio * cfg.d_model
    assert model.blocks[0].mlp.fc.out_features == (2 if activation == "swiglu" else 1) * hidden
    assert model.blocks[0].mlp.proj.in_features == hidden
    assert model(torch.randint(0, 256, (2, 8))).shape == (2, 8, 256)


def test_bad_activation():
    with pytest.raises(ValueError, match="activation must be one of"):
        TransformerConfig(activation="tanh")
    with pytest.raises(ValueError, match="planted_bias must be a finite number"):
        SimulationConfig(planted_bias=float("inf"))


def test_planted_bias_is_block_ones_mlp_bias():
    res = simulate(SimulationConfig(**TINY, planted_bias=0.05))
    base = simulate(SimulationConfig(**TINY))
    # from block 1 on the MLPs' part of the shared offset carries the bias
    assert res.init.decomposition.from_mlp[1] - base.init.decomposition.from_mlp[1] == (
        pytest.approx(0.05, rel=1e-4)
    )


def test_a_mean_planted_inside_a_block_is_seen_by_rmsnorm_only():
    cfg = TransformerConfig(n_layers=3, d_model=32, n_heads=2, seq_len=16)
    out = planted_in_block(0.05, seeds=2, base=cfg, batch=2)
    ln = [r for r in out["runs"] if r["norm"] == "layernorm"]
    rms = [r for r in out["runs"] if r["norm"] == "rmsnorm"]
    assert len(ln) == len(rms) == 2
    for r in ln:  # LN(x + c𝟙) = LN(x): the stream stays h + c𝟙, the logits do not move
        assert max(r["beyond_shift"]) < 1e-12 and r["max_abs_logit_diff"] < 1e-12
    for r in rms:
        assert r["beyond_shift"][1] < 1e-12  # block 1 itself: the plant only
        assert r["beyond_shift"][-1] > 1e-3 and r["kl_mean"] > 0
    with pytest.raises(ValueError, match="bias must be a finite nonzero number"):
        planted_in_block(0.0)
