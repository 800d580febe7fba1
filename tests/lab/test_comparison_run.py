"""The run of a training comparison (lab/comparison/run.py): every variant learns at every rate,
runs of a seed share their initialization, a rerun is bit for bit the same (in worker processes
too), a diverging run stops and is kept, any text file trains, a busy machine is warned about."""

import math
from dataclasses import replace

import pytest
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
    assert results["config"]["lrs"] == [3e-3, 1e-2]
    for seed_runs in results["runs"].values():
        assert [(r["lr"], r["seed"]) for r in seed_runs] == [
            (3e-3, 0), (3e-3, 1), (1e-2, 0), (1e-2, 1)
        ]  # fmt: skip
        for r in seed_runs:
            if r["diverged_at"] is not None:
                continue
            for name in ("train_loss", "step_time_s", "grad_norm"):
                assert len(r[name]) == 30, name
            assert r["val_steps"] == [10, 20, 30]
            assert len(r["val_loss"]) == len(r["val_loss_select"]) == 3
            assert r["val_loss"] != r["val_loss_select"]  # two disjoint halves of the bytes
            assert len(r["val_windows"]) == 4 * 8  # final_eval_batches × batch (tiny preset)
            assert r["final_val_loss"] == pytest.approx(sum(r["val_windows"]) / 32, rel=1e-5)
            assert r["final_val_loss_select"] is not None
    for key in ("cpu", "cpu_cores", "torch", "commit", "backend", "workers"):
        assert key in results["machine"]
    cases = results["norm_timing"]["cases"]
    assert {"layernorm", "rmsnorm", "prmsnorm", "torch_layer_norm", "torch_rms_norm"} <= set(cases)
    assert "none" not in cases
    # one sample per case every steps // 4 steps of each seed: 2 seeds × steps 0, 7, 14, 21, 28
    assert all(len(c["per_call_s"]) == 10 for c in cases.values())
    assert results["load_average"]["start"] is not None and results["cpu_time_s"] > 0


def test_losses_decrease(comparison_run):
    _, results, _ = comparison_run
    for variant, seed_runs in results["runs"].items():
        for r in seed_runs:
            if variant == "none" and r["diverged_at"] is not None:
                continue
            first, last = r["train_loss"][0], sum(r["train_loss"][-5:]) / 5
            assert last < first - 0.5, (variant, first, last)
            assert r["val_loss"][-1] < r["val_loss"][0], variant


def test_runs_share_initialization_and_differ_only_in_norm_parameters(comparison_run):
    _, results, _ = comparison_run
    runs = results["runs"]
    for seed in (0, 1):
        same_seed = [r for v in runs for r in runs[v] if r["seed"] == seed]
        assert len(same_seed) == 8  # 4 variants × 2 rates, one initialization
        assert len({r["shared_init_sha256"] for r in same_seed}) == 1
        assert len({r["parameters"] - r["norm_parameters"] for r in same_seed}) == 1
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


def test_worker_processes_give_the_same_losses():
    """Seeds trained side by side in two spawned processes: the same numbers as one process."""
    cfg = tiny(seeds=2, steps=8, eval_interval=4, variants="layernorm,rmsnorm", lrs="1e-3,1e-2")
    one, two = run_comparison(cfg), run_comparison(replace(cfg, workers=2))
    assert two["machine"]["workers"] == 2 and two["seeds_completed"] == 2
    for v in cfg.variants:
        for a, b in zip(one["runs"][v], two["runs"][v], strict=True):
            assert (a["seed"], a["lr"]) == (b["seed"], b["lr"])
            assert a["train_loss"] == b["train_loss"] and a["val_loss"] == b["val_loss"]


def test_a_diverging_run_stops_and_is_kept():
    """A peak rate of 1000 blows the loss up within a few steps; the run ends there, marked, and
    the summary still reports it (as diverged) beside the finite runs."""
    cfg = tiny(seeds=2, steps=20, variants="layernorm,none", lrs="1e-3,1e3")
    results = run_comparison(cfg)
    blown = [r for r in results["runs"]["none"] if r["lr"] == 1e3]
    assert all(r["diverged_at"] is not None for r in blown)
    assert all(len(r["train_loss"]) == r["diverged_at"] + 1 for r in blown)
    last = blown[0]
    assert not (math.isfinite(last["train_loss"][-1]) and math.isfinite(last["grad_norm"][-1]))
    by_lr = results["summary"]["variants"]["none"]["by_lr"]
    assert by_lr["1000"]["diverged"] == 2 and by_lr["1000"]["final_val_loss_mean"] is None
    assert by_lr["0.001"]["diverged"] == 0
    # LayerNorm diverged at 1000 too, so the rate chosen for it, and shared, is 0.001
    assert set(results["summary"]["shared_rates"].values()) == {"0.001"}


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
