"""What a training comparison runs (lab/comparison/config.py): presets and overrides, the
learning-rate sweep, the checked options, the corpus and the lower bound of the run's time."""

from dataclasses import replace

import pytest

from rmsnorm.lab.comparison import (
    PRESETS,
    ArgumentError,
    compare_config,
    load_corpus,
    parse_lrs,
    parse_variants,
    training_flops,
)
from rmsnorm.reference import partial_size


def tiny(**kw):
    cfg = compare_config("tiny", threads=1, **{"steps": 30, "eval_interval": 10, **kw})
    return replace(cfg, norm_timing_s=0.001)


def test_parse_variants():
    assert parse_variants(" LayerNorm , none") == ("layernorm", "none")
    assert parse_variants(["layernorm", "rmsnorm"]) == ("layernorm", "rmsnorm")
    for bad in ("", "layernorm,layernorm", "layernorm,rms"):
        with pytest.raises(ArgumentError, match="variants"):
            parse_variants(bad)


def test_parse_lrs():
    assert parse_lrs("1e-2, 1e-3,3e-3") == (1e-3, 3e-3, 1e-2)  # ascending
    assert parse_lrs([3e-3]) == (3e-3,)
    for bad in ("", "1e-3,x", "1e-3,1e-3", "0,1e-3", "-1e-3"):
        with pytest.raises(ArgumentError, match="lrs"):
            parse_lrs(bad)


def test_the_presets_designs():
    quick = compare_config("cpu", device="cpu")
    assert quick.lrs == (3e-3,) and quick.seeds == 3 and quick.workers == 1
    assert quick.variants == ("layernorm", "rmsnorm", "prmsnorm")
    full = compare_config("full", device="cpu")
    assert full.variants == ("layernorm", "rmsnorm", "prmsnorm", "none")
    assert full.seeds >= 8 and len(full.lrs) >= 3 and max(full.lrs) / min(full.lrs) >= 10
    assert partial_size(full.model.d_model, full.model.partial) >= 32  # pRMSNorm's k
    assert full.workers == 2 and full.threads == 1  # one thread per worker process
    for cfg in (quick, full):
        assert cfg.train.val_parts == 2 and cfg.train.stop_on_divergence
        assert cfg.train.warmup <= cfg.train.steps // 10
    assert set(PRESETS) == {"cpu", "full", "gpu", "tiny"}


def test_overrides_of_the_design():
    cfg = compare_config("full", device="cpu", seeds=3, lrs="1e-3,1e-2", variants="layernorm")
    assert (cfg.seeds, cfg.lrs, cfg.variants) == (3, (1e-3, 1e-2), ("layernorm",))
    assert compare_config("full", device="cpu", lr=2e-3).lrs == (2e-3,)
    with pytest.raises(ArgumentError, match="not both"):
        compare_config("cpu", lr=1e-3, lrs="1e-3,1e-2")
    with pytest.raises(ArgumentError, match="workers"):
        compare_config("cpu", workers=0)


@pytest.mark.parametrize("content", [None, b"too short"])
def test_unreadable_or_unusable_text_file(tmp_path, content):
    path = tmp_path / "corpus"
    if content is None:
        path.mkdir()  # a folder is not a readable text file
    else:
        path.write_bytes(content)
    with pytest.raises(ArgumentError) as info:
        load_corpus(tiny(seeds=1, text=str(path)))
    assert info.value.param == "text" and str(path) in str(info.value)


def test_training_flops_counts_the_matrix_products():
    cfg = compare_config(
        "tiny", device="cpu", seeds=1, variants="layernorm,rmsnorm", steps=10, lrs="1e-3,1e-2"
    )
    m, t = cfg.model, cfg.train
    d, tokens = m.d_model, t.batch_size * m.seq_len
    weights = m.n_layers * 12 * d * d + m.vocab_size * d  # qkv 3d², proj d², MLP 8d²; head
    forward = tokens * (2 * weights + m.n_layers * 2 * m.seq_len * d)
    batches = (t.steps // t.eval_interval + 1) * t.eval_batches + t.final_eval_batches
    evals = batches * 2  # both halves of the held-out bytes
    assert training_flops(cfg) == 2 * 2 * (3 * t.steps + evals) * forward  # 2 variants × 2 rates
