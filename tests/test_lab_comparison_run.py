"""The run of a training comparison (lab/comparison/run.py): every variant learns, runs share
their initialization, a rerun is bit for bit the same, any text file trains, a busy machine is
warned about."""

from dataclasses import replace

import torch

from rmsnorm.lab.comparison import busy_machine_warnings, compare_config, run_comparison


def tiny(**kw):
    # One thread: under `pytest -n 2` two workers share two cores, and torch's two threads per
    # worker would stall waiting for each other.
    cfg = compare_config("tiny", threads=1, **{"steps": 30, "eval_interval": 10, **kw})
    return replace(cfg, norm_timing_s=0.001)  # timing numbers are not under test


def test_results_hold_every_run_and_timing(comparison_run):
    _, results, _ = comparison_run
    for key in ("config", "machine", "corpus", "runs", "norm_timing", "summary", "wall_time_s"):
        assert key in results
    assert set(results["runs"]) == {"layernorm", "rmsnorm", "prmsnorm", "none"}
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


def test_losses_decrease(comparison_run):
    _, results, _ = comparison_run
    for variant, seed_runs in results["runs"].items():
        for r in seed_runs:
            first, last = r["train_loss"][0], sum(r["train_loss"][-5:]) / 5
            assert last < first - 0.5, (variant, first, last)
            assert r["val_loss"][-1] < r["val_loss"][0], variant


def test_runs_share_initialization_and_differ_only_in_norm_parameters(comparison_run):
    _, results, _ = comparison_run
    runs = results["runs"]
    for i in range(2):
        assert len({runs[v][i]["shared_init_sha256"] for v in runs}) == 1
        shared = {v: runs[v][i]["parameters"] - runs[v][i]["norm_parameters"] for v in runs}
        assert len(set(shared.values())) == 1
    assert runs["layernorm"][0]["shared_init_sha256"] != runs["layernorm"][1]["shared_init_sha256"]


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


def test_busy_machine_warning():
    def fake(load, threads):
        machine = {"device": "cpu", "torch_threads": threads, "cpu_cores": 2}
        return {"machine": machine, "load_average": {"start": [load, 0, 0], "end": None}}

    assert busy_machine_warnings(fake(0.3, 2)) == []
    assert busy_machine_warnings(fake(5.0, 1)) == []  # one thread has no peer to wait for
    (warning,) = busy_machine_warnings(fake(5.0, 2))
    assert "--threads 1" in warning and "5.0" in warning
