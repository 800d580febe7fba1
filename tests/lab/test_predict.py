"""Does a per-block statistic predict the cost (lab/stats/predict.py): Spearman's ρ with its
interval and permutation p on planted relations and on independent data, the stratified test
against a between-model offset, Holm's correction by hand, and select-then-test."""

import numpy as np
import pytest

from rmsnorm.lab.stats.predict import holm, select_then_test, spearman, stratified_spearman

scipy_stats = pytest.importorskip("scipy.stats")


def monotone(n, seed, noise=0.3):
    """x uniform, y an increasing function of x plus noise: ρ ≈ 0.9 at noise 0.3."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, n)
    return x, np.exp(2 * x) + noise * rng.standard_normal(n)


def independent(n, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n), rng.lognormal(0, 1, n)


# --------------------------------------------------------------------------------------------------
# spearman


def test_rho_is_scipys_ties_included():
    x = np.array([1.0, 2.0, 2.0, 3.0, 5.0, 5.0, 5.0, 8.0])  # tied x get average ranks
    y = np.array([0.1, 0.4, 0.2, 0.3, 0.9, 0.5, 0.5, 0.7])
    assert spearman(x, y)["rho"] == pytest.approx(scipy_stats.spearmanr(x, y).statistic, abs=1e-14)


def test_the_jackknife_ranks_are_the_ranks_of_what_is_left():
    # the interval's acceleration re-ranks each leave-one-out sample by subtraction
    from scipy.stats import rankdata

    from rmsnorm.lab.stats.predict import _loo_ranks

    v = np.array([3.0, 1.0, 3.0, 2.0, 3.0, 0.5])
    want = np.array([rankdata(np.delete(v, i)) for i in range(v.size)])
    np.testing.assert_array_equal(_loo_ranks(v, rankdata(v)), want)


def test_a_monotone_relation_is_found():
    r = spearman(*monotone(30, seed=0))
    assert r["rho"] > 0.8
    assert r["p"] < 0.001
    assert 0 < r["lo"] <= r["rho"] <= r["hi"] <= 1
    assert (r["n"], r["dropped"], r["resamples_used"], r["reason"]) == (30, 0, 2000, None)


def test_the_smallest_p_is_one_over_permutations_plus_one():
    x = np.arange(12.0)
    r = spearman(x, x**3, permutations=999)
    assert r["rho"] == r["lo"] == r["hi"] == 1.0
    assert r["p"] == pytest.approx(1 / 1000)


def test_p_is_close_to_the_exact_permutation_p():
    # n = 7: the exact two-sided p over all 5,040 permutations, against 20,000 random ones
    x, y = monotone(7, seed=4, noise=1.5)
    import itertools

    from scipy.stats import rankdata

    rx, ry = rankdata(x), rankdata(y)
    rho = scipy_stats.spearmanr(x, y).statistic
    null = [np.corrcoef(rx, ry[list(p)])[0, 1] for p in itertools.permutations(range(7))]
    exact = np.mean(np.abs(null) >= abs(rho) - 1e-12)
    got = spearman(x, y, permutations=20_000)["p"]
    assert abs(got - exact) < 4 * np.sqrt(exact * (1 - exact) / 20_000) + 1e-4


def test_independent_data_are_rarely_significant():
    # 200 null draws at the 18 blocks of one model: p < 0.05 in ~5% of them (binomial SD 1.5%)
    ps = np.array(
        [
            spearman(*independent(18, s), resamples=1, permutations=499, seed=s)["p"]
            for s in range(200)
        ]
    )
    assert (ps >= 0.05).mean() >= 0.90
    # and p is not stuck near 1: about half of a uniform p lies below 0.5
    assert 0.35 < (ps < 0.5).mean() < 0.65


def test_non_finite_pairs_are_left_out():
    x, y = monotone(10, seed=1)
    x[2], y[5] = np.nan, np.inf
    r = spearman(x, y)
    assert (r["n"], r["dropped"]) == (8, 2)
    keep = np.isfinite(x) & np.isfinite(y)
    assert r["rho"] == pytest.approx(scipy_stats.spearmanr(x[keep], y[keep]).statistic)


@pytest.mark.parametrize(
    ("x", "y", "reason"),
    [
        ([1.0, 2.0, 3.0], [3.0, 1.0, 2.0], "3 finite points, fewer than 4"),
        ([1.0, 1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 4.0, 5.0], "x is constant"),
        ([1.0, 2.0, 3.0, 4.0, 5.0], [2.0] * 5, "y is constant"),
    ],
)
def test_too_few_or_constant_gives_none_with_a_reason(x, y, reason):
    r = spearman(x, y)
    assert r["reason"] == reason
    assert r["rho"] is r["lo"] is r["hi"] is r["p"] is None


def test_deterministic_given_the_seed_and_permutations_apart_from_resamples():
    x, y = monotone(15, seed=2, noise=2.0)
    assert spearman(x, y, seed=3) == spearman(x, y, seed=3)
    assert spearman(x, y, seed=3)["p"] == spearman(x, y, seed=3, resamples=100)["p"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"x": [1.0, 2.0], "y": [1.0]}, "same length"),
        ({"x": [1.0, 2.0], "y": [1.0, 2.0], "permutations": 0}, "permutations must be"),
        ({"x": [1.0, 2.0], "y": [1.0, 2.0], "confidence": 1.0}, "confidence must be"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        spearman(**kwargs)


# --------------------------------------------------------------------------------------------------
# stratified_spearman


def offset_groups(seed):
    """Two models whose blocks have no relation within either, but the second has both larger
    statistics (+3) and larger costs (+5) than the first: 30 and 18 blocks."""
    rng = np.random.default_rng(seed)
    return {
        "a": (rng.uniform(0, 1, 30), rng.normal(0, 1, 30)),
        "b": (rng.uniform(0, 1, 18) + 3, rng.normal(0, 1, 18) + 5),
    }


def test_a_between_model_offset_is_not_a_relation():
    groups = offset_groups(seed=0)
    pooled = scipy_stats.spearmanr(
        np.concatenate([g[0] for g in groups.values()]),
        np.concatenate([g[1] for g in groups.values()]),
    )
    assert pooled.statistic > 0.6 and pooled.pvalue < 1e-5  # the naive pooled test is fooled
    r = stratified_spearman(groups)
    assert r["naive_pooled_rho"] == pytest.approx(pooled.statistic)
    assert abs(r["rho"]) < 0.2
    assert r["p"] > 0.05
    assert r["lo"] < 0 < r["hi"]


def test_the_statistic_is_the_n_weighted_mean_of_within_group_rho():
    groups = {"a": monotone(30, seed=1), "b": monotone(18, seed=2, noise=3.0)}
    r = stratified_spearman(groups)
    within = {k: scipy_stats.spearmanr(*v).statistic for k, v in groups.items()}
    assert r["rho"] == pytest.approx((30 * within["a"] + 18 * within["b"]) / 48)
    assert r["groups"]["a"]["rho"] == pytest.approx(within["a"])
    assert (r["groups"]["a"]["weight"], r["groups"]["b"]["weight"]) == (30 / 48, 18 / 48)
    assert (r["n"], r["weights"]) == (48, "n")
    assert r["p"] < 0.001 and 0 < r["lo"] < r["rho"] < r["hi"]


def test_a_relation_within_models_survives_their_different_scales():
    # the third model's cost is on another scale entirely (x1000, shifted): within-model ranks
    # do not see it
    x3, y3 = monotone(6, seed=3, noise=0.1)
    groups = {"a": monotone(30, seed=1), "b": monotone(18, seed=2), "c": (x3, 1000 * y3 - 5000)}
    r = stratified_spearman(groups)
    assert r["rho"] > 0.7 and r["p"] < 0.001 and r["lo"] > 0


def test_stratified_null_is_rarely_significant():
    # independent within each model, offsets between them: p < 0.05 in ~5% of 100 draws
    ps = [
        stratified_spearman(offset_groups(s), resamples=1, permutations=499, seed=s)["p"]
        for s in range(100)
    ]
    assert np.mean(np.array(ps) >= 0.05) >= 0.90


def test_a_constant_group_is_skipped_with_its_reason():
    groups = {"a": monotone(30, seed=1), "flat": ([1.0, 2.0, 3.0, 4.0, 5.0], [0.5] * 5)}
    r = stratified_spearman(groups)
    assert r["groups"]["flat"] == {"rho": None, "n": 5, "weight": 0.0, "reason": "y is constant"}
    assert r["rho"] == pytest.approx(spearman(*groups["a"])["rho"])
    assert r["n"] == 30


def test_no_usable_group_gives_none_with_a_reason():
    r = stratified_spearman({"a": ([1.0, 2.0], [2.0, 1.0])})
    assert r["rho"] is r["p"] is None and "no group" in r["reason"]


@pytest.mark.parametrize(
    ("groups", "match"), [({}, "non-empty dict"), ({"a": [1.0, 2.0, 3.0]}, r"groups\['a'\]")]
)
def test_stratified_bad_arguments_are_named(groups, match):
    with pytest.raises(ValueError, match=match):
        stratified_spearman(groups)


# --------------------------------------------------------------------------------------------------
# holm


def test_holm_by_hand():
    # sorted: d 0.005, a 0.01, c 0.03, b 0.04, e 0.5 (m = 5)
    # ×5, ×4, ×3, ×2, ×1 → 0.025, 0.04, 0.09, 0.08, 0.5; made non-decreasing → b 0.09
    got = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005, "e": 0.5})
    assert list(got) == ["a", "b", "c", "d", "e"]
    assert got == pytest.approx({"a": 0.04, "b": 0.09, "c": 0.09, "d": 0.025, "e": 0.5})


def test_holm_caps_at_one_and_keeps_a_single_p():
    assert holm({"a": 0.6, "b": 0.7}) == {"a": 1.0, "b": 1.0}
    assert holm({"only": 0.03}) == {"only": 0.03}
    assert holm({}) == {}


@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan"), None])
def test_holm_rejects_what_is_not_a_p(bad):
    with pytest.raises(ValueError, match=r"pvalues\['b'\] must be a number in \[0, 1\]"):
        holm({"a": 0.1, "b": bad})


# --------------------------------------------------------------------------------------------------
# select_then_test


def nine_statistics(n, seed, planted="kurtosis"):
    """Nine per-block statistics; the cost follows ``planted`` (monotone, noisy), the other eight
    are independent of it."""
    rng = np.random.default_rng(seed)
    cost = rng.lognormal(0, 1, n)
    stats = {f"s{i}": (rng.standard_normal(n), cost) for i in range(8)}
    stats[planted] = (np.log(cost) + 0.4 * rng.standard_normal(n), cost)
    return stats


def test_select_then_test_picks_the_planted_statistic_and_confirms_it():
    per_model = {"m30": nine_statistics(30, 0), "m18": nine_statistics(18, 1)}
    x6, y6 = monotone(6, seed=5, noise=0.05)
    per_model["m6"] = {"kurtosis": (x6, 1e3 * y6), "s0": (x6[::-1].copy(), y6)}
    r = select_then_test(per_model, select_on="m30", permutations=2000)
    assert r["selected"] == "kurtosis" and r["select_on"] == "m30" and r["reason"] is None
    assert r["selection"]["rho"] > 0.8
    for model in ("m18", "m6"):
        t = r["tests"][model]
        assert t["rho"] > 0.7 and t["p"] < 0.05 and t["sign_agrees"] is True, (model, t)
    assert r["confirm"]["p"] < 0.001 and set(r["confirm"]["groups"]) == {"m18", "m6"}
    # six blocks in perfect order: every resample is in order too, so the interval is [1, 1] and
    # the permutation p (at best 2/720 exactly) carries the uncertainty
    assert r["tests"]["m6"]["lo"] == r["tests"]["m6"]["hi"] == 1.0
    # Holm over the nine statistics on m30: the planted one stays significant
    assert r["all"]["m30"]["kurtosis"]["p_holm"] < 0.01
    holm_m30 = holm({s: v["p"] for s, v in r["all"]["m30"].items()})
    assert {s: v["p_holm"] for s, v in r["all"]["m30"].items()} == holm_m30


def test_a_statistic_picked_from_noise_does_not_confirm():
    # nothing relates to the cost anywhere, 60 times over: the best of nine on one model has a
    # naive p < 0.05 in 1 − 0.95⁹ ≈ 37% of draws, its Holm p in ≤ 5%, and tested alone on the
    # other model it is significant in ~5% (binomial SD ~6% at 60 draws)
    naive, corrected, confirmed = [], [], []
    for seed in range(60):
        rng = np.random.default_rng(seed)
        per_model = {
            m: {f"s{i}": (rng.standard_normal(n), rng.lognormal(0, 1, n)) for i in range(9)}
            for m, n in (("a", 30), ("b", 18))
        }
        r = select_then_test(per_model, select_on="a", resamples=1, permutations=499, seed=seed)
        chosen = r["selected"]
        assert r["all"]["a"][chosen]["p_holm"] >= r["selection"]["p"]
        naive.append(r["selection"]["p"] < 0.05)
        corrected.append(r["all"]["a"][chosen]["p_holm"] < 0.05)
        confirmed.append(r["tests"]["b"]["p"] < 0.05)
    assert np.mean(naive) > 0.2
    assert np.mean(corrected) <= 0.12
    assert np.mean(confirmed) <= 0.12


def test_select_then_test_reports_a_missing_statistic():
    per_model = {"a": nine_statistics(20, 0), "b": {"other": monotone(10, 0)}}
    r = select_then_test(per_model, select_on="a", permutations=500)
    assert r["tests"]["b"]["rho"] is None and "not measured" in r["tests"]["b"]["reason"]
    assert r["tests"]["b"]["sign_agrees"] is None and r["confirm"] is None


def test_select_on_must_be_a_model():
    with pytest.raises(ValueError, match="select_on must be one of the models"):
        select_then_test({"a": nine_statistics(10, 0)}, select_on="b")
