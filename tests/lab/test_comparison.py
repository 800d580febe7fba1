"""The training comparison (lab/experiments/comparison/): what it runs, models that differ only in
the norm, the run itself, its paired statistics and verdicts, and what it writes."""

import json
import math
from dataclasses import replace

import pytest
import torch
from scipy import stats

from rmsnorm.lab.experiments.comparison import (
    PRESETS,
    ArgumentError,
    build_models,
    busy_machine_warnings,
    choose_rates,
    compare_config,
    fingerprint,
    load_corpus,
    minimal_detectable_effect,
    norm_parameter_names,
    output_dir,
    paired,
    parse_lrs,
    parse_variants,
    power,
    reproduce_command,
    run_comparison,
    seeds_needed,
    shared_parameters,
    stability,
    summarize,
    training_flops,
)
from rmsnorm.lab.experiments.comparison.summary import failed, final_loss, flattening
from rmsnorm.lab.models.transformer import TransformerConfig
from rmsnorm.reference import partial_size

# --------------------------------------------------------------------------------------------------
# What a training comparison runs (lab/experiments/comparison/config.py): presets and overrides, the
# learning-rate sweep, the checked options, the corpus and the lower bound of the run's time.


def tiny(**kw):
    # One thread: under `pytest -n 2` two workers share two cores, and torch's two threads per
    # worker would stall waiting for each other.
    cfg = compare_config("tiny", threads=1, **{"steps": 30, "eval_interval": 10, **kw})
    return replace(cfg, norm_timing_s=0.001)  # timing numbers are not under test


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


# --------------------------------------------------------------------------------------------------
# Models that differ only in the norm (lab/experiments/comparison/models.py): bit-identical shared
# parameters, norm parameters at their own init, and the fingerprint that checks it.


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


# --------------------------------------------------------------------------------------------------
# The run of a training comparison (lab/experiments/comparison/run.py): every variant learns at
# every rate, runs of a seed share their initialization, a rerun is bit for bit the same (in worker
# processes too), a diverging run stops and is kept, any text file trains, a busy machine is warned
# about.


def test_results_hold_every_run_and_timing(comparison_run):
    _, results, _ = comparison_run
    for key in ("config", "machine", "corpus", "runs", "norm_timing", "summary", "wall_time_s"):
        assert key in results
    assert set(results["runs"]) == {"layernorm", "rmsnorm", "prmsnorm", "none"}
    assert results["config"]["lrs"] == [3e-3, 1e-2]
    for seed_runs in results["runs"].values():
        assert [(r["lr"], r["seed"]) for r in seed_runs] == [
            (3e-3, 0),
            (3e-3, 1),
            (1e-2, 0),
            (1e-2, 1),
        ]
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
    for key in ("cpu", "cpu_cores", "cpu_vector_unit", "torch", "commit", "backend", "workers"):
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


# --------------------------------------------------------------------------------------------------
# The statistics and verdicts of a training comparison (lab/experiments/comparison/summary.py and
# paired.py): paired differences with their interval and rank tests against scipy, the power
# arithmetic, the learning-rate choice that never sees the reported seed or bytes, stability, the
# flattening criterion, and verdicts written from the interval alone.


def test_paired_matches_scipy():
    a = [2.10, 2.05, 2.31, 2.20, 2.12, 2.08, 2.25, 2.18]
    b = [2.08, 2.06, 2.27, 2.15, 2.12, 2.03, 2.20, 2.16]
    p = paired(a, b)
    d = [x - y for x, y in zip(a, b, strict=True)]
    t = stats.ttest_rel(a, b)
    ci = t.confidence_interval(0.95)
    assert p.n == 8 and p.mean == pytest.approx(sum(d) / 8)
    assert p.ci_low == pytest.approx(ci.low) and p.ci_high == pytest.approx(ci.high)
    assert p.t_p == pytest.approx(t.pvalue)
    nonzero = [x for x in d if x != 0]
    assert p.wilcoxon_p == pytest.approx(stats.wilcoxon(nonzero).pvalue)
    assert (p.worse, p.better, p.ties) == (6, 1, 1)
    assert p.sign_p == pytest.approx(stats.binomtest(6, 7).pvalue)
    assert p.detected is True and p.bound == pytest.approx(max(abs(ci.low), abs(ci.high)))


def test_three_seeds_of_the_old_default_run():
    """The default run's paired RMSNorm − LayerNorm differences: an interval across zero, and a
    sign test that cannot go below p = 0.25 with 3 seeds however the signs fall."""
    p = paired([0.0175, 0.0183, 0.0615], [0.0, 0.0, 0.0])
    assert p.mean == pytest.approx(0.0324, abs=1e-4)
    assert (round(p.ci_low, 3), round(p.ci_high, 3)) == (-0.030, 0.095)
    assert p.t_p == pytest.approx(0.155, abs=1e-3) and p.detected is False
    assert p.sign_p == 0.25


def test_divergence_ranks_as_the_worst_outcome():
    p = paired([2.0, None, math.nan, 2.2], [2.1, 2.0, 2.0, None])
    assert p.diffs[:1] == [pytest.approx(-0.1)] and p.diffs[1:3] == [math.inf, math.inf]
    assert p.diffs[3] == -math.inf
    assert p.mean is None and p.ci_low is None and p.mde is None  # no t with a divergence
    assert (p.worse, p.better) == (2, 2) and p.sign_p == 1.0
    both = paired([None, 2.0, 2.1], [None, 1.9, 2.0])
    assert both.ties == 1 and both.worse == 2  # both diverged: a tie, dropped by the rank tests


def test_power_and_minimal_detectable_effect():
    # The textbook normal approximation, (z_.975 + z_.8)·sd/√n ≈ 2.80·sd/√n, is a little below the
    # exact noncentral-t answer for small n.
    sd, n = 0.02, 8
    mde = minimal_detectable_effect(sd, n)
    assert power(mde, sd, n) == pytest.approx(0.8, abs=1e-9)
    assert 2.80 * sd / math.sqrt(n) < mde < 3.3 * sd / math.sqrt(n)
    assert power(0.0, sd, n) == pytest.approx(0.05, abs=1e-9)  # the test's own level
    need = seeds_needed(mde, sd)
    assert need == n or (need == n - 1 and power(mde, sd, n - 1) >= 0.8)
    assert seeds_needed(0.0, sd) is None
    assert seeds_needed(1e-7, 1.0) is None  # beyond any practical number of seeds
    assert minimal_detectable_effect(sd, 1) is None


def _run(seed, lr, select, report, diverged=None):
    return {
        "seed": seed,
        "lr": lr,
        "val_loss_select": [select],
        "val_loss": [report],
        "diverged_at": diverged,
    }


def test_rate_choice_leaves_the_reported_seed_out():
    """Seed 0 alone favours 0.01 (a lucky selection loss); the other seeds favour 0.003. Seed 0's
    choice comes from seeds 1 and 2, so it gets 0.003 too; a rate where a run diverged loses."""
    by_lr = {
        "0.003": [_run(0, 3e-3, 2.50, 2.5), _run(1, 3e-3, 2.40, 2.4), _run(2, 3e-3, 2.40, 2.4)],
        "0.01": [_run(0, 1e-2, 2.00, 2.0), _run(1, 1e-2, 2.45, 2.4), _run(2, 1e-2, 2.45, 2.4)],
    }
    assert choose_rates(by_lr, [0, 1, 2]) == {0: "0.003", 1: "0.01", 2: "0.01"}
    by_lr["0.01"][2]["diverged_at"] = 5
    assert choose_rates(by_lr, [0, 1, 2]) == {0: "0.003", 1: "0.003", 2: "0.01"}


def test_a_run_that_ends_above_chance_has_failed():
    """Finite but above ln 256 on either half: a model that did not learn counts as diverged."""
    chance = math.log(256)
    ok = {"val_loss": [6.0, 2.1], "val_loss_select": [6.1, 2.2], "diverged_at": None}
    assert not failed(ok, chance) and final_loss(ok, ceiling=chance) == 2.1
    blown = {"val_loss": [3.0, 72.0], "val_loss_select": [3.1, 2.2], "diverged_at": None}
    assert failed(blown, chance) and final_loss(blown, "val_loss_select", chance) == math.inf
    stopped = {"val_loss": [3.0], "val_loss_select": [3.1], "diverged_at": 17}
    assert failed(stopped) and final_loss(stopped) == math.inf


def test_stability_counts_after_warmup():
    run = {
        "train_loss": [5.6, 9.0, 3.0, 7.5, float("nan"), 2.0],
        "grad_norm": [50.0, 9.0, 0.5, 3.0, float("nan"), 0.4],
        "diverged_at": None,
    }
    s = stability(run, warmup=2, vocab_size=256, grad_clip=1.0)
    assert s["steps_after_warmup"] == 4
    assert s["steps_above_chance"] == 2  # 7.5 and NaN; the 9.0 of warm-up is not counted
    assert s["max_train_loss_after_warmup"] == math.inf and s["argmax_step"] == 4
    assert s["max_grad_norm_after_warmup"] == math.inf
    assert s["median_grad_norm_after_warmup"] == pytest.approx(0.5)
    assert s["clipped_fraction"] == pytest.approx(0.5)  # 3.0 and the non-finite one


def test_flattening_criterion():
    runs = [{"val_steps": [50, 80, 100], "val_loss": [2.0, 1.60, 1.59], "diverged_at": None}]
    f = flattening(runs, 100)
    assert f["from_step"] == 80 and f["drop"] == pytest.approx(0.01) and f["flat"] is True
    runs[0]["val_loss"] = [2.0, 1.70, 1.60]
    assert flattening(runs, 100)["flat"] is False
    runs[0]["diverged_at"] = 3
    assert flattening(runs, 100) is None


def _fake_results(finals: dict[str, dict[float, list[float | None]]]) -> dict:
    """results.json with every run's final loss given (None: diverged); selection = report."""
    runs = {}
    for v, by_lr in finals.items():
        runs[v] = [
            {
                "seed": i,
                "lr": lr,
                "val_steps": [10],
                "val_loss": [f],
                "val_loss_select": [f],
                "diverged_at": None if f is not None else 3,
                "train_loss": [5.0] * 10,
                "grad_norm": [1.0] * 10,
                "step_time_s": [0.1] * 10,
                "tokens_per_step": 64,
                "parameters": 10,
                "norm_parameters": 1,
            }
            for lr, values in by_lr.items()
            for i, f in enumerate(values)
        ]
    cases = {v: {"per_call_s": [1e-3]} for v in finals if v != "none"}
    return {
        "config": {
            "model": {"vocab_size": 256, "d_model": 128, "partial": 0.0625},
            "train": {"warmup": 2, "steps": 10, "grad_clip": 1.0},
        },
        "runs": runs,
        "norm_timing": {"cases": cases},
        "norm_layers_per_model": 3,
    }


def test_summary_verdicts_come_from_the_paired_interval():
    ln = [2.00, 2.10, 1.95, 2.05, 2.02, 1.98, 2.07, 2.01]
    finals = {
        "layernorm": {1e-3: [x + 0.3 for x in ln], 3e-3: ln},
        # +0.02 ± 0.002 at LayerNorm's rate: detected; its own best rate is the same
        "rmsnorm": {
            1e-3: [x + 0.3 for x in ln],
            3e-3: [x + 0.02 + 0.002 * (i % 2) for i, x in enumerate(ln)],
        },
        # differences of both signs, large spread: within a bound, not detected
        "prmsnorm": {
            1e-3: [x + 0.5 for x in ln],
            3e-3: [x + (0.05 if i % 2 else -0.04) for i, x in enumerate(ln)],
        },
        # diverged at LayerNorm's rate; fine at its own (lower) rate
        "none": {1e-3: [x + 0.01 for x in ln], 3e-3: [None] * 8},
    }
    summ = summarize(_fake_results(finals))
    assert summ["shared_rates"] == {str(i): "0.003" for i in range(8)}
    v = summ["variants"]
    assert v["prmsnorm"]["rms_elements"] == 8 and v["rmsnorm"]["rms_elements"] == 128
    rms = v["rmsnorm"]["at_shared_rate"]["paired"]
    assert rms["detected"] is True and rms["mean"] == pytest.approx(0.021)
    assert "worse than LayerNorm" in v["rmsnorm"]["verdicts"]["shared"]
    assert v["rmsnorm"]["verdicts"]["own"] is None  # its own rate is LayerNorm's
    pv = v["prmsnorm"]["verdicts"]["shared"]
    assert "within" in pv and "cannot tell" in pv and "seeds" in pv
    assert v["prmsnorm"]["at_shared_rate"]["paired"]["detected"] is False
    none = v["none"]
    assert "in 8 of 8 seeds" in none["verdicts"]["shared"]
    assert none["chosen_rates"] == {str(i): "0.001" for i in range(8)}
    own = none["at_own_rate"]["paired"]
    assert own["mean"] == pytest.approx(0.01) and "own rate" in none["verdicts"]["own"]
    assert none["by_lr"]["0.003"]["diverged"] == 8


# --------------------------------------------------------------------------------------------------
# What a training comparison writes (lab/experiments/comparison/: plots.py, markdown.py,
# render.py): the figures, the Markdown summary, the command that reproduces a run, and an output
# folder that is not silently reused.


def test_files_and_summary(comparison_run):
    out, results, _ = comparison_run
    for name in ("loss_curves.png", "lr_sweep.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "summary.md").read_text()
    for text in (
        "LayerNorm",
        "RMSNorm",
        "pRMSNorm",
        "no norm",
        "nats/byte",
        "commit",
        "## Answer",
        "95% CI",
        "Wilcoxon",
        "MDE",
        "## Stability",
        "## Has the validation loss flattened?",
        "## Every rate",
        "leave one seed out",
        "k = 2 of 32",
        "not the paper's regime",
    ):
        assert text in md, text
    assert "within the seed spread" not in md  # the unpaired rule is gone
    # both torch norms beside ours in the norm-only table, timed by the shared loop
    assert "| torch F.layer_norm |" in md and "| torch F.rms_norm |" in md
    assert "blocked_autorange" in md
    # one verdict per variant and setting, each written from a paired interval
    for variant in ("rmsnorm", "prmsnorm", "none"):
        verdicts = results["summary"]["variants"][variant]["verdicts"]
        assert verdicts["shared"] and verdicts["shared"] in md
    # strict JSON: no NaN or Infinity, and the per-step logs each on one line
    text = (out / "results.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    json.loads(text)
    assert len(text.splitlines()) < 2000


def test_reproduce_command_names_only_what_differs_from_the_preset():
    cfg = compare_config("tiny", threads=1, steps=30, eval_interval=10, seeds=2, lrs="1e-3,1e-2")
    cfg = replace(cfg, variants=("layernorm", "none")).to_dict()
    assert reproduce_command(cfg) == (
        "rmsnorm compare --preset tiny --variants layernorm,none --seeds 2 --lrs 0.001,0.01 "
        "--threads 1 --steps 30 --out DIR"
    )
    assert reproduce_command(compare_config("cpu").to_dict()) == "rmsnorm compare --out DIR"
    assert reproduce_command(compare_config("full").to_dict()) == "rmsnorm compare --full --out DIR"
    one = compare_config("full", lr=2e-3, batch_size=4).to_dict()
    assert reproduce_command(one) == "rmsnorm compare --full --lr 0.002 --batch 4 --out DIR"


def test_an_earlier_run_is_not_overwritten_without_asking(tmp_path):
    (tmp_path / "summary.md").write_text("an earlier run")
    with pytest.raises(ArgumentError, match="--overwrite") as info:
        output_dir(tmp_path, overwrite=False)
    assert info.value.param == "out"
    assert output_dir(tmp_path, overwrite=True) == tmp_path
    assert output_dir(tmp_path / "new", overwrite=False).is_dir()
