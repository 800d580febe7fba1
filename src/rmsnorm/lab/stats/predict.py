"""Whether a per-block statistic predicts the cost of centering that block: Spearman's ρ over blocks
with a bootstrap interval and a permutation p-value, the same stratified by model (so that a
difference between models is not read as a relation within them), Holm's correction for trying
several statistics, and the select-on-one-model, test-on-the-others protocol.

Units are blocks, a few per model (6 to 30), so every interval and p-value is a resampling one
over blocks: a BCa bootstrap (Efron 1987) of ρ, whose acceleration comes from the jackknife over
blocks, and a permutation test of the ranks (within each model when stratified), p = (count + 1) /
(permutations + 1) with count the permutations whose |ρ| reaches the observed one. Ties take
average ranks, as :func:`scipy.stats.spearmanr` gives them; a resample whose x or y is constant
has no ρ and is left out of the interval (``resamples_used`` says how many remained: at 6 blocks
fewer than 1 in 7,000 resamples of distinct values are constant, more where values tie). On
bivariate normal blocks the BCa interval held the population ρ_s = (6/π) asin(r/2) in 0.94-0.97
of 400 draws (seed 1; SE ~0.011) at n = 6, 18 and 30 and r = 0, 0.5 and 0.8.
"""

from __future__ import annotations

import math

import numpy as np

from .intervals import _bca_limits

__all__ = ["MIN_POINTS", "holm", "select_then_test", "spearman", "stratified_spearman"]

# Below 4 points the permutation distribution of ρ has at most 3! = 6 values: no two-sided p can
# reach 0.05 and no interval means anything.
MIN_POINTS = 4
_RESAMPLES = 2000
_PERMUTATIONS = 10_000
# |ρ| of a permutation counts as reaching the observed one within this: the same ranks summed in
# another order differ by a few ulps, and the identity permutation must count
_TIE = 1e-12
# permuted ranks are formed in chunks of at most this many values (8 MB of float64)
_CHUNK = 1_000_000


def _pairs(x, y, name: str = "x, y") -> tuple[np.ndarray, np.ndarray, int]:
    """x and y as float64 with the pairs holding a NaN or inf left out, and how many were."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(
            f"{name} must be 1-D sequences of the same length, got shapes {x.shape} and {y.shape}"
        )
    keep = np.isfinite(x) & np.isfinite(y)
    return x[keep], y[keep], int((~keep).sum())


def _unusable(x: np.ndarray, y: np.ndarray) -> str | None:
    if x.size < MIN_POINTS:
        return f"{x.size} finite points, fewer than {MIN_POINTS}"
    if np.ptp(x) == 0:
        return "x is constant"
    if np.ptp(y) == 0:
        return "y is constant"
    return None


def _rho_rows(rx: np.ndarray, ry: np.ndarray) -> np.ndarray:
    """Pearson's r of each row pair of ``rx``, ``ry`` (..., n), which for ranks is Spearman's ρ;
    NaN where a row is constant."""
    a = rx - rx.mean(-1, keepdims=True)
    b = ry - ry.mean(-1, keepdims=True)
    den = np.sqrt(np.einsum("...i,...i->...", a, a) * np.einsum("...i,...i->...", b, b))
    num = np.einsum("...i,...i->...", a, b)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


def _rho(rx: np.ndarray, ry: np.ndarray) -> float:
    """ρ from the ranks by the same arithmetic as the resamples' (:func:`scipy.stats.spearmanr`
    can differ in the last bit), so that a perfect ρ of 1 and its resamples' agree exactly."""
    return float(_rho_rows(rx, ry))


def _boot_rho(x: np.ndarray, y: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(resamples,) ρ of resamples of the (x, y) points drawn with replacement, ranked afresh
    (average ranks for the repeated points); NaN for a constant resample."""
    from scipy.stats import rankdata

    idx = rng.integers(0, x.size, size=(resamples, x.size))
    return _rho_rows(rankdata(x[idx], axis=1), rankdata(y[idx], axis=1))


def _loo_ranks(v: np.ndarray, r: np.ndarray) -> np.ndarray:
    """(n, n − 1) average ranks of ``v`` with each point left out in turn, from its ranks ``r``:
    leaving out v_i lowers the rank of every larger value by 1 and of every equal one by 1/2."""
    n = v.size
    keep = ~np.eye(n, dtype=bool)
    drop = (v[:, None] < v[None, :]) + 0.5 * ((v[:, None] == v[None, :]) & keep)
    return (r[None, :] - drop)[keep].reshape(n, n - 1)


def _jack_rho(x: np.ndarray, y: np.ndarray, rx: np.ndarray, ry: np.ndarray) -> np.ndarray:
    """(n,) ρ with each point left out in turn (``rx``, ``ry``: the ranks of all of x and y);
    NaN where what is left is constant."""
    return _rho_rows(_loo_ranks(x, rx), _loo_ranks(y, ry))


def _accel(jack: np.ndarray) -> float:
    """The BCa acceleration from jackknife values; 0 (the bias-corrected interval) where one is
    NaN or they are all equal."""
    if not np.isfinite(jack).all():
        return 0.0
    d = jack.mean() - jack
    s2 = float(np.square(d).sum())
    return float((d**3).sum()) / (6 * s2**1.5) if s2 > 0 else 0.0


def _perm_rho(rx: np.ndarray, ry: np.ndarray, permutations: int, rng) -> np.ndarray:
    """(permutations,) ρ of ``rx`` against random permutations of ``ry`` (ranks, n each)."""
    a = rx - rx.mean()
    b = ry - ry.mean()
    scale = math.sqrt(float(a @ a) * float(b @ b))
    out = np.empty(permutations)
    rows = max(1, _CHUNK // rx.size)
    for start in range(0, permutations, rows):
        block = rng.permuted(np.tile(b, (min(rows, permutations - start), 1)), axis=1)
        out[start : start + rows] = block @ a / scale
    return out


def _p_two_sided(null: np.ndarray, observed: float) -> float:
    count = int((np.abs(null) >= abs(observed) - _TIE).sum())
    return (count + 1) / (null.size + 1)


def _interval(
    boot: np.ndarray, estimate: float, accel: float, confidence: float
) -> tuple[float | None, float | None, int]:
    boot = boot[np.isfinite(boot)]
    if boot.size == 0:
        return None, None, 0
    lo, hi = _bca_limits(boot[None, :], np.array([estimate]), np.array([accel]), confidence)
    return float(lo[0]), float(hi[0]), int(boot.size)


def _check_counts(resamples: int, permutations: int, confidence: float) -> None:
    for name, value in (("resamples", resamples), ("permutations", permutations)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")


def spearman(
    x,
    y,
    *,
    resamples: int = _RESAMPLES,
    permutations: int = _PERMUTATIONS,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict:
    """Spearman's ρ of ``y`` on ``x`` (one point per unit; pairs with a NaN or inf left out):
    ``{"rho", "lo", "hi" (BCa bootstrap interval over units, ``resamples`` resamples), "p"
    (two-sided permutation p-value), "n", "dropped" (pairs left out), "resamples_used", "reason"
    (None, or why rho, lo, hi and p are None: fewer than 4 points, a constant x or y)}``.
    Deterministic given ``seed``; the permutations do not depend on ``resamples``."""
    from scipy.stats import rankdata

    _check_counts(resamples, permutations, confidence)
    x, y, dropped = _pairs(x, y)
    out = {"rho": None, "lo": None, "hi": None, "p": None, "n": int(x.size), "dropped": dropped}
    out.update(resamples_used=0, reason=_unusable(x, y))
    if out["reason"] is not None:
        return out
    perm_ss, boot_ss = np.random.SeedSequence(seed).spawn(2)
    rx, ry = rankdata(x), rankdata(y)
    rho = _rho(rx, ry)
    null = _perm_rho(rx, ry, permutations, np.random.default_rng(perm_ss))
    boot = _boot_rho(x, y, resamples, np.random.default_rng(boot_ss))
    lo, hi, used = _interval(boot, rho, _accel(_jack_rho(x, y, rx, ry)), confidence)
    out.update(rho=rho, lo=lo, hi=hi, p=_p_two_sided(null, rho), resamples_used=used)
    return out


def stratified_spearman(
    groups: dict,
    *,
    resamples: int = _RESAMPLES,
    permutations: int = _PERMUTATIONS,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict:
    """Spearman's ρ within each group of ``groups`` ({name: (x, y)}, e.g. one group per model),
    combined as the n-weighted mean of the within-group ρ: the question "does x order y within a
    model", with no credit for one model having both larger x and larger y than another.
    ``{"rho", "lo", "hi" (BCa interval from a bootstrap that resamples within each group), "p"
    (two-sided; y permuted within each group), "n" (points in the groups used), "weights": "n",
    "groups": {name: {"rho", "n", "weight", "reason"}}, "naive_pooled_rho" (spearmanr over the
    used groups' points put together, for contrast), "resamples_used", "reason"}``. A group with
    fewer than 4 points or a constant x or y is skipped (weight 0, its reason given); rho, lo,
    hi and p are None, with a reason, when every group is."""
    from scipy.stats import rankdata, spearmanr

    _check_counts(resamples, permutations, confidence)
    if not isinstance(groups, dict) or not groups:
        raise ValueError(f"groups must be a non-empty dict {{name: (x, y)}}, got {groups!r}")
    used, table = {}, {}
    for name, pair in groups.items():
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"groups[{name!r}] must be a pair (x, y), got {type(pair).__name__}")
        x, y, _ = _pairs(*pair, name=f"groups[{name!r}]")
        reason = _unusable(x, y)
        table[name] = {"rho": None, "n": int(x.size), "weight": 0.0, "reason": reason}
        if reason is None:
            used[name] = (x, y)
            table[name]["rho"] = _rho(rankdata(x), rankdata(y))
    n = sum(x.size for x, _ in used.values())
    out = {"rho": None, "lo": None, "hi": None, "p": None, "n": int(n), "weights": "n"}
    out.update(groups=table, naive_pooled_rho=None, resamples_used=0, reason=None)
    if not used:
        out["reason"] = "no group has 4 or more points with x and y not constant"
        return out
    # independent streams per group, so that a group's draws do not depend on the others
    perm_ss, boot_ss = np.random.SeedSequence(seed).spawn(2)
    perm_rngs = [np.random.default_rng(s) for s in perm_ss.spawn(len(used))]
    boot_rngs = [np.random.default_rng(s) for s in boot_ss.spawn(len(used))]
    rho, null, boot, jack = 0.0, np.zeros(permutations), np.zeros(resamples), []
    for (name, (x, y)), prng, brng in zip(used.items(), perm_rngs, boot_rngs, strict=True):
        w = x.size / n
        table[name]["weight"] = w
        rho_g = table[name]["rho"]
        rho += w * rho_g
        rx, ry = rankdata(x), rankdata(y)
        null += w * _perm_rho(rx, ry, permutations, prng)
        boot += w * _boot_rho(x, y, resamples, brng)  # NaN where this group's resample is constant
        jack.append(w * (_jack_rho(x, y, rx, ry) - rho_g))  # the change leaving one point out makes
    jack_values = rho + np.concatenate(jack)
    lo, hi, used_resamples = _interval(boot, rho, _accel(jack_values), confidence)
    pooled = spearmanr(
        np.concatenate([x for x, _ in used.values()]), np.concatenate([y for _, y in used.values()])
    )
    out.update(rho=rho, lo=lo, hi=hi, p=_p_two_sided(null, rho))
    out.update(naive_pooled_rho=float(pooled.statistic), resamples_used=used_resamples)
    return out


def holm(pvalues: dict) -> dict:
    """Holm–Bonferroni adjusted p-values of ``pvalues`` ({name: p}, each in [0, 1]), in the same
    order: the i-th smallest p times (m − i + 1), made non-decreasing, at most 1. Rejecting where
    the adjusted p ≤ α controls the chance of any false rejection among the m at α."""
    for name, p in pvalues.items():
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ValueError(f"pvalues[{name!r}] must be a number in [0, 1], got {p!r}")
    m = len(pvalues)
    order = sorted(pvalues, key=lambda k: pvalues[k])  # stable: equal p keep their order
    adjusted, running = {}, 0.0
    for i, name in enumerate(order):
        running = max(running, min(1.0, (m - i) * float(pvalues[name])))
        adjusted[name] = running
    return {name: adjusted[name] for name in pvalues}


def select_then_test(
    per_model: dict,
    *,
    select_on: str,
    resamples: int = _RESAMPLES,
    permutations: int = _PERMUTATIONS,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict:
    """Choose the statistic with the largest |ρ| on model ``select_on`` and test that one alone on
    every other model, as if it had been named before they were measured. ``per_model``:
    {model: {statistic: (x, y)}}. Returns ``{"select_on", "selected" (None, with a reason, when no
    statistic has a ρ there), "selection" (its :func:`spearman` on ``select_on``: a p that
    ignores the choice), "tests": {model: spearman of the selected statistic + "sign_agrees" (its
    ρ has the selection's sign; None without a ρ)}, "confirm" (:func:`stratified_spearman` of it
    over the other models together; None with no other model), "all": {model: {statistic:
    spearman + "p_holm"}} (Holm over the statistics with a p on that model: the correction for
    having tried them all), "reason"}``. Every ρ uses the same ``seed``, so a statistic's result
    does not depend on which others are listed."""
    if not isinstance(per_model, dict) or select_on not in per_model:
        models = tuple(per_model) if isinstance(per_model, dict) else per_model
        raise ValueError(f"select_on must be one of the models {models!r}, got {select_on!r}")
    kw = dict(resamples=resamples, permutations=permutations, confidence=confidence, seed=seed)
    every = {}
    for model, stats in per_model.items():
        if not isinstance(stats, dict) or not stats:
            raise ValueError(f"per_model[{model!r}] must be a non-empty dict {{statistic: (x, y)}}")
        every[model] = {s: spearman(*pair, **kw) for s, pair in stats.items()}
        tested = {s: r["p"] for s, r in every[model].items() if r["p"] is not None}
        adjusted = holm(tested)
        for s, r in every[model].items():
            r["p_holm"] = adjusted.get(s)
    candidates = {s: r["rho"] for s, r in every[select_on].items() if r["rho"] is not None}
    out = {"select_on": select_on, "selected": None, "selection": None, "tests": {}}
    out.update(confirm=None, all=every, reason=None)
    if not candidates:
        out["reason"] = f"no statistic has a rho on {select_on!r}"
        return out
    chosen = max(candidates, key=lambda s: abs(candidates[s]))  # the first listed on a tie
    sign = np.sign(candidates[chosen])
    out.update(selected=chosen, selection=every[select_on][chosen])
    held_out = {}
    for model, stats in per_model.items():
        if model == select_on:
            continue
        if chosen not in stats:
            r = {k: None for k in ("rho", "lo", "hi", "p", "n", "dropped")}
            r.update(resamples_used=0, reason=f"{chosen!r} was not measured on {model!r}")
            out["tests"][model] = r | {"sign_agrees": None}
            continue
        r = {k: v for k, v in every[model][chosen].items() if k != "p_holm"}
        r["sign_agrees"] = None if r["rho"] is None else bool(np.sign(r["rho"]) == sign)
        out["tests"][model] = r
        held_out[model] = stats[chosen]
    if held_out:
        out["confirm"] = stratified_spearman(held_out, **kw)
    return out
