"""The centering end to end on tiny random models: the centered RMSNorm is LayerNorm without a bias
in the model's own weight convention, the costs against an independent computation, and the
encoder's naive swap and centered writers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tiny_hf
from rmsnorm.lab.experiments import centering, sites
from rmsnorm.lab.inspection import RunnableModel

tf = pytest.importorskip("transformers")
pytest.importorskip("scipy")


class WordTokenizer:
    """Words to ids by a stable hash (ids 3..vocab-1); pads with 0; [CLS]=1 … [SEP]=2 when asked."""

    def __init__(self, vocab: int, frame: bool = False) -> None:
        self.vocab, self.frame = vocab, frame

    def _ids(self, s: str, specials: bool) -> list[int]:
        ids = [3 + sum(map(ord, w)) % (self.vocab - 3) for w in s.split()]
        return [1, *ids, 2] if specials and self.frame else ids

    def __call__(self, s, add_special_tokens=True, padding=False, truncation=False, **kw):
        if isinstance(s, str):
            return {"input_ids": self._ids(s, add_special_tokens)}
        rows = [self._ids(x, add_special_tokens) for x in s]
        n = max(map(len, rows))
        ids = torch.tensor([r + [0] * (n - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (n - len(r)) for r in rows])
        return {"input_ids": ids, "attention_mask": mask}

    def convert_ids_to_tokens(self, i: int) -> str:
        return str(i)


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
        "layer:1",
    }
    assert len(variants["all"]) == 13 and len(variants["layer:1"]) == 6
    out = centering.causal_swap_study(gemma, source, sequences=3, seq_len=16, layers=[1])
    v = out["variants"]
    for name in variants:
        assert v[name]["kl"]["lo"] <= v[name]["kl"]["value"] <= v[name]["kl"]["hi"]
        assert 0 <= v[name]["top1"]["value"] <= 1
    assert v["all"]["kl"]["value"] > 0
    assert out["loss"]["value"] == pytest.approx(np.log(300), rel=0.2)  # a random model


def test_token_costs_match_numpy():
    gen = torch.Generator().manual_seed(0)
    ref, new = torch.randn(2, 4, 7, generator=gen), torch.randn(2, 4, 7, generator=gen)
    ids = torch.randint(0, 7, (2, 4), generator=gen)
    c = centering._token_costs(ref, new, ids)
    p = np.exp(ref.numpy().astype(float))
    p /= p.sum(-1, keepdims=True)
    q = np.exp(new.numpy().astype(float))
    q /= q.sum(-1, keepdims=True)
    # the KL's sum is float32 (see _token_costs): 1e-7 of |Δ log-normalizer|, here ~1
    np.testing.assert_allclose(c["kl"].numpy(), (p * np.log(p / q)).sum(-1), rtol=0, atol=1e-6)
    t = ids.numpy()[:, 1:]
    pick = lambda a: np.take_along_axis(a[:, :-1], t[..., None], -1)[..., 0]  # noqa: E731
    np.testing.assert_allclose(c["dce"][:, :-1].numpy(), np.log(pick(p) / pick(q)), rtol=1e-6)
    np.testing.assert_allclose(c["ce"][:, :-1].numpy(), -np.log(pick(p)), rtol=1e-6)
    assert torch.isnan(c["dce"][:, -1]).all()
    assert (c["top1"].numpy() == (ref.argmax(-1) == new.argmax(-1)).numpy()).all()


def test_encoder_naive_swap_and_centered_writers(source):
    model = tiny_hf.bert(tf, vocab_size=200, seed=0)
    loaded = RunnableModel("tiny-bert", model, 200, 512, WordTokenizer(200, frame=True), "hf")
    loaded.encoder = True
    out = centering.encoder_swap_study(loaded, source, count=50)
    v = out["variants"]
    assert out["sentences"] == 50
    assert {"naive:all", "naive:kind:embedding", "naive:kind:post-ln", "naive:layer:0"} <= set(v)
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


def test_quantization_effect_on_an_encoder(source):
    """Rounding the weights through Q4_1 moves the statistics and the swap's cost a little, and
    says by how much."""
    pytest.importorskip("gguf")
    from rmsnorm.lab.experiments import realmodels
    from rmsnorm.lab.experiments.sites import site_study

    model = tiny_hf.bert(tf, vocab_size=200, seed=1)
    loaded = RunnableModel("tiny-bert", model, 200, 512, WordTokenizer(200, frame=True), "hf")
    loaded.encoder = True
    rc = realmodels.RealConfig(sequences=3, seq_len=16, sentences=50)
    stats = site_study(loaded, source, sequences=3, seq_len=16)
    swap = centering.encoder_swap_study(loaded, source, count=50)
    q = realmodels.quantization_effect(loaded, source, rc, stats, swap)
    n_weights = sum(
        m.weight.numel()
        for m in model.modules()
        if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))
    )
    assert q["parameters_rounded"] == n_weights  # every width here is a multiple of 32
    assert 0 < q["ratio_median_rel_change"]["median"] <= q["ratio_median_rel_change"]["max"]
    c = q["naive_all_one_minus_cosine"]
    assert c["original"] == swap["variants"]["naive:all"]["one_minus_cosine_mean"]
    assert c["quantized"] != c["original"]
