"""The statistics and verdicts of a training comparison (lab/comparison/summary.py and
paired.py): paired differences with their interval and rank tests against scipy, the power
arithmetic, the learning-rate choice that never sees the reported seed or bytes, stability, the
flattening criterion, and verdicts written from the interval alone."""

import math

import pytest
from scipy import stats

from rmsnorm.lab.comparison import (
    choose_rates,
    minimal_detectable_effect,
    paired,
    power,
    seeds_needed,
    stability,
    summarize,
)
from rmsnorm.lab.comparison.summary import failed, final_loss, flattening


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
    return {"seed": seed, "lr": lr, "val_loss_select": [select], "val_loss": [report],
            "diverged_at": diverged}  # fmt: skip


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
            {"seed": i, "lr": lr, "val_steps": [10], "val_loss": [f], "val_loss_select": [f],
             "diverged_at": None if f is not None else 3, "train_loss": [5.0] * 10,
             "grad_norm": [1.0] * 10, "step_time_s": [0.1] * 10, "tokens_per_step": 64,
             "parameters": 10, "norm_parameters": 1}
            for lr, values in by_lr.items()
            for i, f in enumerate(values)
        ]  # fmt: skip
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
        "rmsnorm": {1e-3: [x + 0.3 for x in ln], 3e-3: [x + 0.02 + 0.002 * (i % 2)
                                                        for i, x in enumerate(ln)]},
        # differences of both signs, large spread: within a bound, not detected
        "prmsnorm": {1e-3: [x + 0.5 for x in ln], 3e-3: [x + (0.05 if i % 2 else -0.04)
                                                         for i, x in enumerate(ln)]},
        # diverged at LayerNorm's rate; fine at its own (lower) rate
        "none": {1e-3: [x + 0.01 for x in ln], 3e-3: [None] * 8},
    }  # fmt: skip
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
