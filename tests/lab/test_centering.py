"""The centering end to end on tiny random models: the centered RMSNorm is LayerNorm without a bias
in the model's own weight convention, the costs against an independent computation, and the
encoder's naive swap and centered writers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tiny_hf
from rmsnorm.lab.experiments import centering, sites
from rmsnorm.lab.experiments.inspection import RunnableModel
from tiny_hf import WordTokenizer

tf = pytest.importorskip("transformers")
pytest.importorskip("scipy")


@pytest.fixture(scope="module")
def source():
    from rmsnorm.lab.models.text import stdlib_docstrings

    return stdlib_docstrings()


@pytest.fixture(scope="module")
def gemma():
    model = tiny_hf.gemma3(tf, vocab_size=300)
    with torch.no_grad():  # γ away from 0, so that Gemma's 1 + γ matters
        for s in sites.find_sites(model):
            s.module.weight.normal_(0.0, 0.5)
    return RunnableModel("tiny-gemma3", model, 300, 64, WordTokenizer(300), "hf")


def test_centered_rmsnorm_is_layernorm_in_the_models_convention(gemma):
    norm = gemma.model.model.layers[0].post_attention_layernorm
    (site,) = [s for s in sites.find_sites(gemma.model) if s.module is norm]
    x = torch.randn(3, 5, 64) + 2.0
    expected = torch.nn.functional.layer_norm(x, (64,), 1 + norm.weight, None, norm.eps)
    with centering.centered([site]):
        got = norm(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(norm(x - x.mean(-1, keepdim=True)), got)  # hooks removed


def test_variants_and_costs(gemma, source):
    found = sites.find_sites(gemma.model)
    variants = centering.variants_of(found, layers=[1])
    assert set(variants) == {
        "all",
        "kind:pre-norm",
        "kind:post-sublayer",
        "kind:qk-norm",
        "kind:final",
        "block:1",
    }
    assert len(variants["all"]) == 13 and len(variants["block:1"]) == 6
    chosen = centering.standard_variants(found, [1]) + centering.mechanism_variants(found)
    out = centering.causal_swap_study(
        gemma, source, sequences=3, seq_len=16, variants=chosen, channels=_channels(found)
    )
    v = out["variants"]
    assert set(v) == {c.name for c in chosen}
    for name, r in v.items():
        assert all(len(r[k]) == 3 for k in centering.COSTS), name
        assert all(x >= 0 for x in r["kl"]) and all(0 <= x <= 1 for x in r["top1"])
    assert min(v["all"]["kl"]) > 0
    assert v["block:1"]["first_block"] == 1 and v["kind:final"]["first_block"] == 2
    ce = np.mean(out["reference"]["ce"])
    assert ce == pytest.approx(np.log(300), rel=0.2)  # a random model


def _channels(found):
    """Planted massive channels: two per site, clipped at 0.5."""
    return {s.name: centering.Channels([1, 3], 0.5) for s in found}


def test_starting_from_a_recorded_block_changes_nothing(gemma, source, monkeypatch):
    """A variant that starts at block k from the reference's recorded output of block k − 1 gives
    the costs, to the bit, of running every block."""
    found = sites.find_sites(gemma.model)
    chosen = [v for v in centering.standard_variants(found) if v.name in ("block:1", "kind:final")]
    fast = centering.causal_swap_study(gemma, source, sequences=2, seq_len=16, variants=chosen)
    monkeypatch.setattr(centering._Blocks, "first_block", lambda self, v: 0)
    slow = centering.causal_swap_study(gemma, source, sequences=2, seq_len=16, variants=chosen)
    assert fast["variants"]["block:1"]["first_block"] == 1
    for name in ("block:1", "kind:final"):
        for k in centering.COSTS:
            assert fast["variants"][name][k] == slow["variants"][name][k], (name, k)


def test_head_at_every_kth_position(gemma, source):
    """With the head at position 0 and every 2nd after it, the first position's KL is the same as
    with every position, and each sequence's mean stays within the spread of its positions."""
    found = sites.find_sites(gemma.model)
    chosen = [v for v in centering.standard_variants(found) if v.name == "all"]
    every = centering.causal_swap_study(gemma, source, sequences=2, seq_len=16, variants=chosen)
    half = centering.causal_swap_study(
        gemma, source, sequences=2, seq_len=16, variants=chosen, head_stride=2
    )
    assert half["head_positions"] == list(range(0, 16, 2))
    a, b = every["variants"]["all"], half["variants"]["all"]
    np.testing.assert_allclose(a["kl_first"], b["kl_first"], rtol=1e-6)
    np.testing.assert_allclose(a["kl"], b["kl"], rtol=0.5)
    with pytest.raises(ValueError, match="head_stride must be a positive integer"):
        centering.head_positions(16, 0)


@pytest.mark.parametrize("transform", centering.TRANSFORMS)
@pytest.mark.parametrize("positions", centering.POSITIONS)
def test_transforms_against_numpy(transform, positions):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 3, 8, generator=gen, dtype=torch.float64) + 0.3
    x[..., 2] *= 40.0  # a massive channel
    ch = centering.Channels([2], 5.0)
    got = centering._apply(x, transform, positions, ch).numpy()
    a = x.numpy()
    o = np.ones(8, bool)
    o[2] = False
    if transform == "center":
        new = a - a.mean(-1, keepdims=True)
    elif transform == "center_ordinary_mean":
        new = a - a[..., o].mean(-1, keepdims=True)
    elif transform == "center_ordinary_only":
        new = a - a.mean(-1, keepdims=True) * o
    else:
        new = a.copy()
        new[..., 2] = np.clip(a[..., 2], -5.0, 5.0)
        if transform == "clip_center":
            new = new - new.mean(-1, keepdims=True)
    if positions == "first":
        new[:, 1:] = a[:, 1:]
    elif positions == "rest":
        new[:, :1] = a[:, :1]
    np.testing.assert_allclose(got, new, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="transform must be one of"):
        centering.Variant("x", (), "nope")


def test_token_costs_match_numpy():
    gen = torch.Generator().manual_seed(0)
    ref, new = torch.randn(2, 4, 7, generator=gen), torch.randn(2, 4, 7, generator=gen)
    targets = torch.randint(0, 7, (2, 4), generator=gen)
    targets[:, -1] = -1  # the last position has no next token
    c = centering._token_costs(ref, new, targets)
    p = np.exp(ref.numpy().astype(float))
    p /= p.sum(-1, keepdims=True)
    q = np.exp(new.numpy().astype(float))
    q /= q.sum(-1, keepdims=True)
    # float32 throughout (see _token_costs): within 1e-6 of float64 here
    np.testing.assert_allclose(c["kl"].numpy(), (p * np.log(p / q)).sum(-1), rtol=0, atol=1e-6)
    t = targets.numpy()[:, :-1]
    pick = lambda a: np.take_along_axis(a[:, :-1], t[..., None], -1)[..., 0]  # noqa: E731
    np.testing.assert_allclose(c["dce"][:, :-1].numpy(), np.log(pick(p) / pick(q)), rtol=1e-5)
    np.testing.assert_allclose(c["ce"][:, :-1].numpy(), -np.log(pick(p)), rtol=1e-5)
    assert torch.isnan(c["dce"][:, -1]).all()
    assert (c["top1"].numpy() == (ref.argmax(-1) == new.argmax(-1)).numpy()).all()


def test_per_sequence_means_weight_the_sampled_positions():
    """Each sequence's KL is the first position's plus the sampled others' mean, weighted as the
    1 and T − 1 positions they stand for; with every position it is the plain mean."""
    kl = torch.tensor([[4.0, 1.0, 2.0, 3.0]])
    costs = {"kl": kl, "dce": kl.clone(), "top1": torch.ones_like(kl), "ce": kl.clone()}
    every = centering._per_sequence(costs, torch.arange(4), 4)
    assert every["kl"] == [pytest.approx(2.5)]
    assert every["delta_ce"] == [pytest.approx((4 + 1 + 2) / 3)]  # position 3 has no target
    sampled = centering._per_sequence(
        {k: v[:, :2] for k, v in costs.items()}, torch.tensor([0, 2]), 8
    )
    assert sampled["kl"] == [pytest.approx(4 / 8 + 7 / 8 * 1.0)]
    assert sampled["kl_first"] == [4.0] and sampled["kl_rest"] == [1.0]


def test_encoder_naive_swap_and_centered_writers(source):
    model = tiny_hf.bert(tf, vocab_size=200, seed=0)
    loaded = RunnableModel("tiny-bert", model, 200, 512, WordTokenizer(200, frame=True), "hf")
    loaded.encoder = True
    out = centering.encoder_swap_study(loaded, source, count=50)
    v = out["variants"]
    assert out["sentences"] == 50
    assert {"naive:all", "naive:kind:embedding", "naive:kind:post-ln", "naive:block:0"} <= set(v)
    assert len(v["naive:all"]["one_minus_cosine"]) == 50
    assert v["naive:all"]["cosine_mean"] < 1
    # centering the writers leaves every LayerNorm's output as it was (to rounding)...
    alone = v["centered-writers:all"]["writers_alone"]
    assert alone["one_minus_cosine_mean"] < 1e-10
    # ...and, with every γ = 1 and β = 0 (the initialization), makes the swap exact: each norm's
    # output is then centered, so the residual that the next norm reads is too
    assert v["centered-writers:all"]["one_minus_cosine_mean"] < 1e-10
    # with trained-like γ and β the previous norm's output γ·x̂ + β has a mean that depends on the
    # token: the centered writers no longer make the swap exact
    with torch.no_grad():
        for s in sites.find_sites(model):
            s.module.weight.normal_(1.0, 0.3)
            s.module.bias.normal_(0.0, 0.3)
    out = centering.encoder_swap_study(loaded, source, count=50)["variants"]
    assert out["centered-writers:all"]["writers_alone"]["one_minus_cosine_mean"] < 1e-10
    assert out["centered-writers:all"]["one_minus_cosine_mean"] > 1e-6
    with pytest.raises(ValueError, match="not an encoder"):
        loaded.encoder = False
        centering.encoder_swap_study(loaded, source)
