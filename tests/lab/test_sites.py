"""Norm sites of pretrained transformers: their kinds on tiny random Gemma 3, Llama and BERT models,
what they normalize, and every per-site statistic against an independent numpy computation on
planted rows (one massive channel on every token, a shared offset, a sink token)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tiny_hf
from rmsnorm.lab.experiments import sites
from rmsnorm.lab.stats import sitestats

# ----------------------------------------------------------------------------------------------
# Planted rows
# ----------------------------------------------------------------------------------------------
S, T, R, W = 6, 10, 2, 64
MASSIVE, SINK = 5, 7


@pytest.fixture(scope="module")
def planted():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(S, T, R, W, generator=gen, dtype=torch.float64)
    x += 0.5  # an offset every token shares
    x[..., MASSIVE] += 60.0  # a massive channel on every token
    x[:, 0, :, SINK] = -400.0  # a sink: the first token, one channel
    return x.float().to(torch.float64)


def _np_rows(x: np.ndarray, keep: np.ndarray | None, ordinary: np.ndarray) -> dict:
    """Per-row quantities over the ``keep`` channels (all when None); the shift's σ is always
    over the ``ordinary`` ones."""
    xs = x if keep is None else x[..., keep]
    mu = xs.mean(-1)
    sigma = xs.std(-1)
    rms = np.sqrt((xs**2).mean(-1))
    z = (xs - mu[..., None]) / sigma[..., None]
    return {
        "ratio": np.abs(mu) / sigma,
        "one_minus_cos": 1 - sigma / rms,
        "angle": np.degrees(np.arccos(mu / rms)),
        "kurtosis": (z**4).mean(-1) - 3,
        "shift": np.abs(x.mean(-1)) / x[..., ordinary].std(-1),
        "mu": mu,
        "sigma": sigma,
        "rms": rms,
    }


def _np_stats(q: dict[str, np.ndarray]) -> dict[str, float]:
    mu = q["mu"]
    shared = (mu.mean(axis=(0, 1)) ** 2).sum() / (mu**2).mean(axis=(0, 1)).sum()
    return {
        "ratio_median": np.median(q["ratio"]),
        "ratio_p95": np.percentile(q["ratio"], 95),
        "ratio_max": q["ratio"].max(),
        "one_minus_cos_mean": q["one_minus_cos"].mean(),
        "angle_median": np.median(q["angle"]),
        "kurtosis_median": np.median(q["kurtosis"]),
        "shift_median": np.median(q["shift"]),
        "mu_abs_mean": np.abs(mu).mean(),
        "sigma_mean": q["sigma"].mean(),
        "rms_mean": q["rms"].mean(),
        "shared_mu_share": shared,
    }


def test_outlier_channels_found_and_described(planted):
    found, threshold = sitestats.outlier_channels(planted)
    a = np.abs(planted.numpy())
    assert threshold == pytest.approx(20 * np.median(a), rel=1e-12)
    assert [o["channel"] for o in found] == [SINK, MASSIVE]  # ordered by largest |x|
    sink, massive = found
    assert sink["max_abs"] == pytest.approx(400.0) and sink["sign"] == -1
    assert sink["top_positions"][0] == 0 and sink["persistence"] == pytest.approx(1 / T)
    assert massive["persistence"] == 1.0 and massive["sign"] == 1
    assert massive["max_abs"] == pytest.approx(a[..., MASSIVE].max())


def test_massive_channels_are_large_on_the_typical_token(planted):
    """The massive rule names the channel large on every token, not the first token's sink (which
    the spike rule names too), by its median |x| over the tokens after the first."""
    found = sitestats.massive_channels(planted)
    assert [o["channel"] for o in found] == [MASSIVE]
    a = np.abs(planted.numpy())
    (m,) = found
    assert m["median_ratio"] == pytest.approx(
        np.median(a[:, 1:, :, MASSIVE]) / np.median(a), rel=1e-12
    )
    assert m["max_abs_first"] == pytest.approx(a[:, 0, :, MASSIVE].max())
    assert m["max_abs_others"] == pytest.approx(a[:, 1:, :, MASSIVE].max()) and m["sign"] == 1
    # a site without one: Gaussian rows, whose channels' medians are the site's
    gauss = torch.randn(6, 10, 2, 64, generator=torch.Generator().manual_seed(0))
    assert sitestats.massive_channels(gauss) == []


def test_shift_under_each_channel_rule(planted):
    """The shift statistic with each rule's channels left out of σ, against numpy."""
    out = sitestats.site_statistics(planted, bootstrap=20)["shift_by_rule"]
    x = planted.numpy()
    removed = {
        "massive": [MASSIVE],
        "massive10": [MASSIVE],
        "spike": [SINK, MASSIVE],
        "top1": [MASSIVE],
    }
    medians = np.median(np.abs(x[:, 1:]).reshape(-1, W), 0)
    removed["top4"] = list(np.argsort(-medians)[:4])
    for rule, channels in removed.items():
        keep = np.ones(W, bool)
        keep[channels] = False
        expected = np.median(np.abs(x.mean(-1)) / x[..., keep].std(-1))
        assert out[rule]["shift_median"] == pytest.approx(expected, rel=1e-9), rule
        assert out[rule]["channels"] == len(channels)


@pytest.mark.parametrize("variant", sitestats.VARIANTS)
def test_statistics_match_numpy(planted, variant):
    out = sitestats.site_statistics(planted, bootstrap=50)
    x = planted.numpy()
    keep = np.ones(W, bool)
    keep[[MASSIVE]] = False
    q = _np_rows(x, keep if "massive" in variant else None, keep)
    if variant.startswith("no_first"):
        q = {k: v[:, 1:] for k, v in q.items()}
    expected = _np_stats(q)
    got = out["variants"][variant]
    for name, value in expected.items():
        assert got[name]["value"] == pytest.approx(value, rel=1e-9, abs=1e-12), name
        assert got[name]["lo"] <= got[name]["hi"]
    assert out["width_ordinary"] == W - 1 and out["iid"]["median"] > 0


def test_planted_effects_show_where_expected(planted):
    out = sitestats.site_statistics(planted, bootstrap=50)
    v = out["variants"]
    assert out["max_abs_first_token"] == 400.0 > out["max_abs_other_tokens"]
    # |μ|/σ's blind spot: the massive channel inflates σ more than μ, so it hides the shared
    # offset (|μ|/σ ≈ 0.5 once the massive channel is removed), while the shift the centering
    # applies, |μ| over all channels against the ordinary channels' σ, shows it (≈ 0.5 + 60/64)
    assert v["all"]["ratio_median"]["value"] < 0.25
    assert v["no_massive"]["ratio_median"]["value"] == pytest.approx(0.5, abs=0.1)
    assert v["all"]["shift_median"]["value"] == pytest.approx(0.5 + 60 / 64, abs=0.15)
    assert v["no_first"]["shared_mu_share"]["value"] > 0.5


def test_bootstrap_resamples_whole_sequences(planted):
    """The interval equals one computed in numpy from the same draws of sequence indices (to the
    float32 rounding the resamples are sorted in)."""
    out = sitestats.site_statistics(planted, bootstrap=40, seed=5)
    draws = torch.randint(0, S, (40, S), generator=torch.Generator().manual_seed(5)).numpy()
    ratio = _np_rows(planted.numpy(), None, np.ones(W, bool))["ratio"]
    boot = np.array([np.median(ratio[d]) for d in draws])
    lo, hi = np.quantile(boot, [0.025, 0.975])
    got = out["variants"]["all"]["ratio_median"]
    assert got["lo"] == pytest.approx(lo, rel=1e-6) and got["hi"] == pytest.approx(hi, rel=1e-6)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match=r"sequences >= 2, tokens >= 2"):
        sitestats.site_statistics(torch.randn(1, 5, 1, 8))


# ----------------------------------------------------------------------------------------------
# Site kinds of tiny random models
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("transformers")


def _kinds(model):
    return {s.name: (s.layer, s.kind) for s in sites.find_sites(model)}


def test_gemma3_sites(tf):
    model = tiny_hf.gemma3(tf)
    kinds = _kinds(model)
    expected = {"model.norm": (None, "final")}
    for i in range(2):
        p = f"model.layers.{i}."
        expected |= {
            p + "input_layernorm": (i, "pre-norm"),
            p + "post_attention_layernorm": (i, "post-sublayer"),
            p + "pre_feedforward_layernorm": (i, "pre-norm"),
            p + "post_feedforward_layernorm": (i, "post-sublayer"),
            p + "self_attn.q_norm": (i, "qk-norm"),
            p + "self_attn.k_norm": (i, "qk-norm"),
        }
    assert kinds == expected
    ids = torch.randint(0, 256, (3, 12))
    inputs = sites.capture_inputs(model, ids, batch=2)
    assert inputs["model.layers.0.self_attn.q_norm"].shape == (3, 12, 2, 32)
    assert inputs["model.layers.1.self_attn.k_norm"].shape == (3, 12, 1, 32)
    assert inputs["model.norm"].shape == (3, 12, 1, 64)
    # what input_layernorm of block 1 normalizes is the residual stream that block 0 returned
    out = model.model(input_ids=ids, output_hidden_states=True)
    torch.testing.assert_close(
        inputs["model.layers.1.input_layernorm"][:, :, 0], out.hidden_states[1]
    )


def test_llama_sites(tf):
    kinds = _kinds(tf.LlamaForCausalLM(tiny_hf.llama_config(tf)))
    assert kinds["model.layers.1.post_attention_layernorm"] == (1, "pre-norm")
    assert kinds["model.layers.0.input_layernorm"] == (0, "pre-norm")
    assert kinds["model.norm"] == (None, "final") and len(kinds) == 5


def test_bert_sites(tf):
    model = tiny_hf.bert(tf)
    kinds = _kinds(model)
    assert kinds == {
        "embeddings.LayerNorm": (None, "embedding"),
        "encoder.layer.0.attention.output.LayerNorm": (0, "post-ln"),
        "encoder.layer.0.output.LayerNorm": (0, "post-ln"),
        "encoder.layer.1.attention.output.LayerNorm": (1, "post-ln"),
        "encoder.layer.1.output.LayerNorm": (1, "post-ln"),
    }
    assert {s.norm for s in sites.find_sites(model)} == {"layernorm"}
    inputs = sites.capture_inputs(model, torch.randint(0, 128, (2, 9)), batch=2)
    assert inputs["encoder.layer.1.output.LayerNorm"].shape == (2, 9, 1, 32)
