"""Tests of the training comparison (``rmsnorm compare``): files written, learning, variants that
differ only in the norm, bit-for-bit reruns, and errors that name the bad option."""

import json
from dataclasses import replace

import pytest
import torch
from typer.testing import CliRunner

from rmsnorm.cli import app
from rmsnorm.lab.compare import (
    OUTPUT_FILES,
    ArgumentError,
    build_models,
    compare_config,
    fingerprint,
    norm_parameter_names,
    parse_variants,
    reproduce_command,
    run_comparison,
    shared_parameters,
    summarize,
)
from rmsnorm.lab.transformer import TransformerConfig

ALL = "layernorm,rmsnorm,prmsnorm,none"
# The tiny preset shortened further: enough steps for the loss to fall well below ln 256 ≈ 5.55.
TINY = dict(steps=30, eval_interval=10)


def tiny(**kw):
    # One thread: under `pytest -n 2` two workers share two cores, and torch's two threads per
    # worker would stall waiting for each other.
    cfg = compare_config("tiny", threads=1, **{**TINY, **kw})
    return replace(cfg, norm_timing_s=0.001)  # timing numbers are not under test


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """One run through the CLI with every variant and two seeds."""
    out = tmp_path_factory.mktemp("compare")
    args = ["compare", "--preset", "tiny", "--variants", ALL, "--seeds", "2", "--threads", "1"]
    args += ["--out", str(out)]
    args += ["--steps", str(TINY["steps"]), "--eval-interval", str(TINY["eval_interval"])]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return out, json.loads((out / OUTPUT_FILES["json"]).read_text()), result.output


def test_cli_writes_every_promised_file(cli_run):
    out, results, output = cli_run
    assert (out / "loss_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "summary.md").read_text()
    for text in ("LayerNorm", "RMSNorm", "pRMSNorm", "no norm", "nats/byte", "Rule:", "commit"):
        assert text in md
    assert "within the seed spread" in md or "outside the seed spread" in md
    for key in ("config", "machine", "corpus", "runs", "norm_timing", "summary", "wall_time_s"):
        assert key in results
    assert set(results["runs"]) == set(ALL.split(","))
    for seed_runs in results["runs"].values():
        assert [r["seed"] for r in seed_runs] == [0, 1]
        for r in seed_runs:
            assert len(r["train_loss"]) == len(r["step_time_s"]) == len(r["tokens_per_s"]) == 30
            assert r["val_steps"] == [10, 20, 30]
    for key in ("cpu", "cpu_cores", "torch", "commit", "backend"):
        assert key in results["machine"]
    cases = results["norm_timing"]["cases"]
    assert {"layernorm", "rmsnorm", "prmsnorm", "torch_layer_norm", "torch_rms_norm"} <= set(cases)
    assert "none" not in cases
    # one sample per case every steps // 4 steps of each seed: 2 seeds × steps 0, 7, 14, 21, 28
    assert all(len(c["per_call_s"]) == 10 for c in cases.values())
    assert results["norm_timing"]["seconds_per_sample"] > 0
    assert "LayerNorm" in output and "wrote" in output
    # both torch norms beside ours in the norm-only table, timed by the shared loop
    assert "| torch F.layer_norm |" in md and "| torch F.rms_norm |" in md
    assert "blocked_autorange" in md


def test_losses_decrease(cli_run):
    _, results, _ = cli_run
    for variant, seed_runs in results["runs"].items():
        for r in seed_runs:
            first, last = r["train_loss"][0], sum(r["train_loss"][-5:]) / 5
            assert last < first - 0.5, (variant, first, last)
            assert r["val_loss"][-1] < r["val_loss"][0], variant


def test_runs_share_initialization_and_differ_only_in_norm_parameters(cli_run):
    _, results, _ = cli_run
    runs = results["runs"]
    for i in range(2):
        assert len({runs[v][i]["shared_init_sha256"] for v in runs}) == 1
        shared = {v: runs[v][i]["parameters"] - runs[v][i]["norm_parameters"] for v in runs}
        assert len(set(shared.values())) == 1
    assert runs["layernorm"][0]["shared_init_sha256"] != runs["layernorm"][1]["shared_init_sha256"]


def test_variants_differ_only_in_the_norm():
    cfg = TransformerConfig(n_layers=2, d_model=24, n_heads=2, seq_len=8)
    models = build_models(cfg, ["layernorm", "rmsnorm", "prmsnorm", "none"], seed=3)
    template = shared_parameters(models["none"])
    assert norm_parameter_names(models["none"]) == set()
    n_norms = 2 * cfg.n_layers + 1  # two per block and the final one (pre-norm)
    expected_norm_params = {
        "layernorm": 2 * cfg.d_model * n_norms,  # γ and β
        "rmsnorm": cfg.d_model * n_norms,  # γ
        "prmsnorm": cfg.d_model * n_norms,
        "none": 0,
    }
    total_none = sum(p.numel() for p in models["none"].parameters())
    for variant, model in models.items():
        shared = shared_parameters(model)
        assert shared.keys() == template.keys()
        for name, p in shared.items():
            assert torch.equal(p, template[name]), (variant, name)
        total = sum(p.numel() for p in model.parameters())
        assert model.norm_parameter_count() == expected_norm_params[variant]
        assert total - total_none == expected_norm_params[variant]
        assert fingerprint(shared) == fingerprint(template)
        # the norms start at their own init: γ = 1, β = 0
        for name, p in model.named_parameters():
            if name in norm_parameter_names(model):
                assert torch.all(p == (1.0 if name.endswith("weight") else 0.0)), name


def test_rerun_with_same_seed_reproduces_losses_exactly():
    cfg = tiny(seeds=1, steps=12, variants="layernorm,rmsnorm")
    before = torch.get_rng_state()
    a, b = run_comparison(cfg), run_comparison(cfg)
    assert torch.equal(torch.get_rng_state(), before)  # the caller's generator is untouched
    for v in cfg.variants:
        assert a["runs"][v][0]["train_loss"] == b["runs"][v][0]["train_loss"]
        assert a["runs"][v][0]["val_loss"] == b["runs"][v][0]["val_loss"]
    c = run_comparison(replace(cfg, seed=1))
    assert c["runs"]["layernorm"][0]["train_loss"] != a["runs"]["layernorm"][0]["train_loss"]


def test_text_file_corpus(tmp_path):
    path = tmp_path / "story.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 100)
    results = run_comparison(tiny(seeds=1, steps=10, variants="layernorm", text=str(path)))
    assert results["corpus"]["name"] == "story.txt"
    assert results["corpus"]["train_bytes"] + results["corpus"]["val_bytes"] == 4500


@pytest.mark.parametrize(
    "args, option, message",
    [
        (["--variants", "layernorm,batchnorm"], "--variants", "unknown variant 'batchnorm'"),
        (["--variants", "rmsnorm,prmsnorm"], "--variants", "must include 'layernorm'"),
        (["--steps", "0"], "--steps", "positive integer"),
        (["--seeds", "0"], "--seeds", "positive integer"),
        (["--threads", "0"], "--threads", "positive integer"),
        (["--text", "/nonexistent/corpus.txt"], "--text", "not found"),
        (["--preset", "huge"], "--preset", "cpu, gpu, tiny"),
        (["--d-model", "30", "--n-heads", "4"], "--n-heads", "divisible"),
    ],
)
def test_bad_arguments_name_the_option(tmp_path, args, option, message):
    result = CliRunner().invoke(app, ["compare", "--out", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    flat = " ".join(result.output.replace("│", " ").split())  # rich wraps the error box
    assert option in flat and message in flat, flat
    assert not (tmp_path / "results.json").exists()


@pytest.mark.parametrize("content", [None, b"too short"])
def test_unreadable_or_unusable_text_file(tmp_path, content):
    path = tmp_path / "corpus"
    if content is None:
        path.mkdir()  # a folder is not a readable text file
    else:
        path.write_bytes(content)
    with pytest.raises(ArgumentError) as info:
        run_comparison(tiny(seeds=1, text=str(path)))
    assert info.value.param == "text" and str(path) in str(info.value)


def test_parse_variants():
    assert parse_variants(" LayerNorm , none") == ("layernorm", "none")
    assert parse_variants(["layernorm", "rmsnorm"]) == ("layernorm", "rmsnorm")
    for bad in ("", "layernorm,layernorm", "layernorm,rms"):
        with pytest.raises(ArgumentError, match="variants"):
            parse_variants(bad)


def test_reproduce_command_names_only_what_differs_from_the_preset():
    cfg = tiny(seeds=2, variants="layernorm,none").to_dict()
    assert reproduce_command(cfg) == (
        "rmsnorm compare --preset tiny --variants layernorm,none --seeds 2 --threads 1 "
        "--steps 30 --out DIR"
    )
    assert reproduce_command(compare_config("cpu").to_dict()) == "rmsnorm compare --out DIR"


def _fake_results(finals: dict[str, list[float]]) -> dict:
    runs = {
        v: [
            {"val_loss": [f], "train_loss": [f], "step_time_s": [0.1] * 5, "tokens_per_step": 64}
            | {"parameters": 10, "norm_parameters": 1}
            for f in values
        ]
        for v, values in finals.items()
    }
    cases = {v: {"per_call_s": [1e-3]} for v in finals if v != "none"}
    return {"runs": runs, "norm_timing": {"cases": cases}, "norm_layers_per_model": 3}


def test_spread_rule():
    summary = summarize(
        _fake_results(
            {
                "layernorm": [2.00, 2.02, 2.04],  # std 0.02 -> threshold 0.04
                "rmsnorm": [2.04, 2.06, 2.08],  # Δ = +0.04: within
                "prmsnorm": [2.10, 2.12, 2.14],  # Δ = +0.10: outside
            }
        )
    )["variants"]
    assert summary["layernorm"]["within_spread"] is None
    assert summary["rmsnorm"]["within_spread"] is True
    assert summary["prmsnorm"]["within_spread"] is False
    assert summary["rmsnorm"]["delta_vs_layernorm_per_seed"] == pytest.approx([0.04] * 3)
    one_seed = summarize(_fake_results({"layernorm": [2.0], "rmsnorm": [2.1]}))["variants"]
    assert one_seed["rmsnorm"]["within_spread"] is None  # no spread with one seed


def test_busy_machine_warning():
    from rmsnorm.lab.compare import _load_warnings

    def fake(load, threads):
        machine = {"device": "cpu", "torch_threads": threads, "cpu_cores": 2}
        return {"machine": machine, "load_average": {"start": [load, 0, 0], "end": None}}

    assert _load_warnings(fake(0.3, 2)) == []
    assert _load_warnings(fake(5.0, 1)) == []  # one thread has no peer to wait for
    (warning,) = _load_warnings(fake(5.0, 2))
    assert "--threads 1" in warning and "5.0" in warning
