"""The recovery fine-tune (lab/experiments/recovery.py) on tiny random models, its report section
(lab/report/sections/recovery.py) from a stored small recovery.json, and `rmsnorm recover`'s
checks before any work."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import tiny_hf
from rmsnorm._validate import ArgumentError
from rmsnorm.lab.experiments import centering, recovery, sites
from rmsnorm.lab.experiments.inspection import RunnableModel
from rmsnorm.lab.page import Page
from rmsnorm.lab.report.sections import recovery as section
from rmsnorm.lab.report.sections.common import fmt
from tiny_hf import WordTokenizer

tf = pytest.importorskip("transformers")
pytest.importorskip("scipy")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

STORED = Path(__file__).parent / "data" / "recovery_small.json"
# A few steps on tiny models: every check below in seconds.
TINY = recovery.RecoveryConfig(
    models=("tiny-bert", "tiny-llama"),
    seeds=2,
    encoder_steps=4,
    encoder_batch=8,
    encoder_lr=1e-3,
    encoder_train_sentences=32,
    causal_steps=4,
    causal_batch=2,
    causal_lr=1e-3,
    causal_train_windows=8,
    train_seq_len=16,
    checkpoints=2,
    sentences=16,
    cost_sequences=4,
    cost_seq_len=16,
    head_stride=4,
)


@pytest.fixture(scope="module")
def source():
    from rmsnorm.lab.models.text import stdlib_docstrings

    return stdlib_docstrings()


@pytest.fixture(scope="module")
def bert():
    model = tiny_hf.bert(tf, vocab_size=200, seed=0)
    with torch.no_grad():  # trained-like γ, β: the naive swap then costs something
        for s in sites.find_sites(model):
            s.module.weight.normal_(1.0, 0.3)
            s.module.bias.normal_(0.0, 0.3)
    loaded = RunnableModel("tiny-bert", model, 200, 512, WordTokenizer(200, frame=True), "hf")
    loaded.encoder = True
    loaded.provenance = {"source": "tiny-bert"}
    return loaded


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tiny_hf.llama_config(tf, vocab_size=128)).eval()
    loaded = RunnableModel("tiny-llama", model, 128, 2048, WordTokenizer(128), "hf")
    loaded.provenance = {"source": "tiny-llama"}
    return loaded


# ----------------------------------------------------------------------------------------------
# The configuration
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seeds", 1),  # no interval over one seed
        ("encoder_steps", 0),
        ("causal_batch", 2.5),
        ("encoder_lr", -1e-5),
        ("causal_lr", float("nan")),
        ("trainable", "biases"),
        ("checkpoints", 9),  # more than the 4 steps
        ("cost_seq_len", 3),
        ("threads", 0),
    ],
)
def test_config_errors_name_the_argument(field, value):
    with pytest.raises(ArgumentError) as err:
        replace(TINY, **{field: value})
    assert err.value.param == field and field in str(err.value)


def test_checkpoints_are_evenly_spaced_and_end_at_the_last_step():
    assert recovery.checkpoint_steps(30, 2) == [0, 15, 30]
    assert recovery.checkpoint_steps(8, 3) == [0, 3, 5, 8]
    assert recovery.checkpoint_steps(1, 1) == [0, 1]


# ----------------------------------------------------------------------------------------------
# The runs
def test_step_0_is_the_real_model_studys_unrecovered_cost(bert, llama, source):
    data = recovery.EncoderData(bert, source, TINY)
    run = recovery.recover_encoder(bert, data, TINY, "swapped", 0)
    study = centering.encoder_swap_study(bert, source, count=TINY.sentences, only=("naive:all",))
    assert (
        run["evals"]["0"]["one_minus_cosine"] == study["variants"]["naive:all"]["one_minus_cosine"]
    )
    assert min(run["evals"]["0"]["one_minus_cosine"]) > 1e-4  # a cost to recover

    cdata = recovery.CausalData(llama, source, TINY)
    crun = recovery.recover_causal(llama, cdata, TINY, "swapped", 0)
    found = sites.find_sites(llama.model)
    everything = [v for v in centering.standard_variants(found) if v.name == "all"]
    cstudy = centering.causal_swap_study(
        llama,
        source,
        sequences=TINY.cost_sequences,
        seq_len=TINY.cost_seq_len,
        variants=everything,
        head_stride=TINY.head_stride,
    )["variants"]["all"]
    for metric in ("kl", "delta_ce"):
        torch.testing.assert_close(
            torch.tensor(crun["evals"]["0"][metric]),
            torch.tensor(cstudy[metric]),
            rtol=1e-6,
            atol=1e-9,
        )
    assert min(crun["evals"]["0"]["kl"]) > 0


def test_control_at_lr_0_stays_the_original(bert, llama, source):
    cfg = replace(TINY, encoder_lr=0.0, causal_lr=0.0)
    data = recovery.EncoderData(bert, source, cfg)
    run = recovery.recover_encoder(bert, data, cfg, "control", 0)
    for ev in run["evals"].values():
        assert max(abs(v) for v in ev["one_minus_cosine"]) < 1e-12
    cdata = recovery.CausalData(llama, source, cfg)
    crun = recovery.recover_causal(llama, cdata, cfg, "control", 0)
    assert set(crun["evals"]) == {"0", "2", "4"}
    for ev in crun["evals"].values():
        assert ev["kl"] == [0.0] * cfg.cost_sequences
        assert max(abs(v) for v in ev["delta_ce"]) == 0.0
    # the swapped model at lr 0 keeps its step-0 cost at every checkpoint
    swapped = recovery.recover_causal(llama, cdata, cfg, "swapped", 0)
    assert swapped["evals"]["4"] == swapped["evals"]["0"]


def test_fine_tuning_lowers_the_cost(bert, source):
    cfg = replace(TINY, encoder_steps=12, checkpoints=1)
    data = recovery.EncoderData(bert, source, cfg)
    run = recovery.recover_encoder(bert, data, cfg, "swapped", 0)
    start = sum(run["evals"]["0"]["one_minus_cosine"])
    end = sum(run["evals"]["12"]["one_minus_cosine"])
    assert end < 0.7 * start
    assert run["train_loss"][-1] < run["train_loss"][0]
    # the original model is left as it was
    again = recovery.recover_encoder(bert, data, replace(cfg, encoder_steps=1), "swapped", 0)
    assert again["evals"]["0"] == run["evals"]["0"]


def test_a_seed_gives_the_same_run_bit_for_bit(llama, source):
    data = recovery.CausalData(llama, source, TINY)
    a = recovery.recover_causal(llama, data, TINY, "swapped", 3)
    b = recovery.recover_causal(llama, data, TINY, "swapped", 3)
    other = recovery.recover_causal(llama, data, TINY, "swapped", 4)
    assert a["train_loss"] == b["train_loss"] and a["evals"] == b["evals"]
    assert other["train_loss"] != a["train_loss"]  # another data order


def test_norms_only_trains_the_norms(llama, source):
    cfg = replace(TINY, trainable="norms")
    data = recovery.CausalData(llama, source, cfg)
    run = recovery.recover_causal(llama, data, cfg, "swapped", 0)
    norms = [s for s in sites.find_sites(llama.model) if s.norm == "rmsnorm"]
    assert run["parameters_trained"] == sum(s.module.weight.numel() for s in norms)


def test_run_recovery_summarizes_every_model(bert, llama, source):
    out = recovery.run_recovery(
        TINY, sources=source, models={"tiny-bert": bert, "tiny-llama": llama}
    )
    json.dumps(out, allow_nan=True)  # JSON-able
    enc, dec = out["models"]
    assert enc["metrics"] == ["one_minus_cosine"] and dec["metrics"] == ["kl", "delta_ce"]
    s = enc["summary"]["swapped"]["one_minus_cosine"]
    assert s["start_equal_over_seeds"] and [c["step"] for c in s["curve"]] == [0, 2, 4]
    assert s["final"]["n"] == TINY.seeds and s["final_sequences"]["n"] == TINY.sentences
    frac = 1 - s["final"]["value"] / s["start"]
    assert s["recovered_fraction"]["value"] == pytest.approx(frac)
    assert dec["summary"]["control"]["kl"]["start"] == 0.0
    assert len(dec["runs"]["control"]) == TINY.seeds and dec["lr"] == TINY.causal_lr
    assert torch.get_num_threads() == 1  # the caller's threads are restored


# ----------------------------------------------------------------------------------------------
# The section, from a stored small recovery.json (`rmsnorm recover --quick`)
@pytest.fixture(scope="module")
def stored():
    return json.loads(STORED.read_text())


def test_section_words_state_the_stored_numbers(stored, tmp_path):
    j = {"recovery": section.numbers(stored)}
    files = section.figures(SimpleNamespace(recovery=stored), tmp_path)
    assert files["recovery"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = Page("t")
    section.words(page, j, files)
    md = page.markdown(tmp_path)
    assert "What a short fine-tune recovers" in md
    for m in j["recovery"]["models"]:
        s = m["summary"]["swapped"][m["metrics"][0]]
        assert fmt(s["start"], ".3g") in md
        assert fmt(s["final"]["value"], ".3g") in md
        assert f"{fmt(100 * s['recovered_fraction']['value'], '.0f')}% recovered" in md
        assert f"n = {s['final']['n']} seeds" in md
    assert "+0.067" in md and "arXiv:2507.02559" in md  # beside the published costs
    cells = section.verdict_cells(j)
    assert set(cells) == {"minilm-l6", "smollm2-135m"}
    from rmsnorm.lab.report.sections.answer import recovered_cells

    assert recovered_cells(j) == cells


def test_section_says_when_it_did_not_run():
    page = Page("t")
    section.words(page, {"recovery": {"skipped": "no file"}}, {})
    assert "Not run (no file)" in page.markdown(Path("."))
    from rmsnorm.lab.report.sections.answer import recovered_cells

    assert recovered_cells({"recovery": {"skipped": "no file"}}) == {}


def test_report_config_checks_the_recovery_file(tmp_path, stored):
    from rmsnorm.lab.report import ReportConfig
    from rmsnorm.lab.report.run import read_recovery

    with pytest.raises(ArgumentError, match="recovery"):
        ReportConfig.quick(recovery=str(tmp_path / "none.json"))
    other = tmp_path / "other.json"
    other.write_text('{"a": 1}')
    with pytest.raises(ValueError, match="not a recovery.json"):
        read_recovery(other)
    assert read_recovery(STORED)["models"][0]["model"] == "minilm-l6"
    assert ReportConfig.full().recovery_run == recovery.RecoveryConfig()
    cfg = ReportConfig.from_options(full=True, recovery=str(STORED))
    assert cfg.recovery == str(STORED) and cfg.recovery_run is None


# ----------------------------------------------------------------------------------------------
# The command
def test_recover_checks_its_output_before_any_work(tmp_path, monkeypatch, stored):
    from typer.testing import CliRunner

    from rmsnorm.cli import app

    def no_work(*a, **k):
        raise AssertionError("ran before the checks")

    monkeypatch.setattr(recovery, "run_recovery", no_work)
    (tmp_path / "recovery.json").write_text("{}")
    result = CliRunner().invoke(app, ["recover", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--overwrite" in result.output
    a_file = tmp_path / "recovery.json"
    result = CliRunner().invoke(app, ["recover", "--out", str(a_file), "--overwrite"])
    assert result.exit_code == 2 and "not a directory" in result.output
    result = CliRunner().invoke(app, ["recover", "--out", str(tmp_path / "n"), "--seeds", "1"])
    assert result.exit_code == 2 and "--seeds" in result.output
    result = CliRunner().invoke(app, ["recover", "--out", str(tmp_path / "n"), "--trainable", "x"])
    assert result.exit_code == 2 and "--trainable" in result.output
    assert not (tmp_path / "n").exists()
    # with --overwrite the files are replaced
    monkeypatch.setattr(recovery, "run_recovery", lambda cfg, progress=None: stored)
    result = CliRunner().invoke(app, ["recover", "--out", str(tmp_path), "--overwrite"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "recovery.json").read_text()) == stored
    assert (tmp_path / "recovery.png").is_file()
    assert "| model | metric |" in (tmp_path / "recovery.md").read_text()
