"""What a training comparison runs (lab/comparison/config.py): presets and overrides, the
checked options, the corpus and the lower bound of the run's time."""

from dataclasses import replace

import pytest

from rmsnorm.lab.comparison import (
    ArgumentError,
    compare_config,
    load_corpus,
    parse_variants,
    training_flops,
)


def tiny(**kw):
    cfg = compare_config("tiny", threads=1, **{"steps": 30, "eval_interval": 10, **kw})
    return replace(cfg, norm_timing_s=0.001)


def test_parse_variants():
    assert parse_variants(" LayerNorm , none") == ("layernorm", "none")
    assert parse_variants(["layernorm", "rmsnorm"]) == ("layernorm", "rmsnorm")
    for bad in ("", "layernorm,layernorm", "layernorm,rms"):
        with pytest.raises(ArgumentError, match="variants"):
            parse_variants(bad)


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
    cfg = compare_config("tiny", device="cpu", seeds=1, variants="layernorm", steps=10)
    m, t = cfg.model, cfg.train
    d, tokens = m.d_model, t.batch_size * m.seq_len
    weights = m.n_layers * 12 * d * d + m.vocab_size * d  # qkv 3d², proj d², MLP 8d²; head
    forward = tokens * (2 * weights + m.n_layers * 2 * m.seq_len * d)
    evals = (t.steps // t.eval_interval + 1) * t.eval_batches
    assert training_flops(cfg) == (3 * t.steps + evals) * forward
