"""The report's text (lab/report/prose.py): the verdicts in words follow the seed spreads, the
i.i.d. comparison sets median against median, and a conclusion the numbers do not support is not
written."""

import pytest

from rmsnorm.lab.iid import iid_reference
from rmsnorm.lab.report.prose import centering_vs_iid, verdict_sentence
from rmsnorm.lab.seeds import centering_verdict


def verdict(ratios) -> dict:
    return centering_verdict(ratios).to_dict()


def test_verdict_words_follow_the_interval():
    as_c = verdict([0.95, 1.0, 1.05, 0.98, 1.02, 1.01, 0.97, 1.03])
    assert as_c["verdict"] == "as centered"
    text = verdict_sentence(as_c, "the stream")
    assert text.startswith("the stream is as centered as") and "within ±25% of 1" in text
    less = verdict([1.5, 1.6, 1.55, 1.45, 1.52, 1.48])
    assert "is less centered than" in verdict_sentence(less) and "above 1" in verdict_sentence(less)
    more = verdict([0.5, 0.52, 0.49, 0.51])
    assert "is more centered than" in verdict_sentence(more)
    wide = verdict([0.6, 1.6, 1.0])
    text = verdict_sentence(wide, more="more training seeds")
    assert text.startswith("we cannot tell") and "more training seeds would tell" in text
    one = verdict([1.0])
    assert "one seed has no spread" in verdict_sentence(one)


def simulation_json(ratios, d: int = 256) -> dict:
    """The pieces of report.json that centering_vs_iid reads."""
    ref = iid_reference(d)
    v = verdict(ratios)
    return {
        "simulation": {
            "d": d,
            "iid_gaussian": ref.to_dict(),
            "iid_sqrt_2_over_pi_d": (2 / (3.141592653589793 * d)) ** 0.5,
            "verdict": v,
            "seed0": {
                "seed": 0,
                "median_mu_over_sigma": ratios[0] * ref.median,
                "q05_mu_over_sigma": 0.0038,
                "q95_mu_over_sigma": 0.114,
                "mean_mu_over_sigma": 0.0471,
            },
            "median_ratio_min": min(ratios),
            "median_ratio_max": max(ratios),
            "seed_sd_pct": 100 * v["seed_sd"],
            "seed_verdict_as_centered": len(ratios) - 1,
            "tokens_per_layer": 1024,
            "token_test_tolerance_pct": 11.0,
            "token_test_flagged": 3,
        }
    }


def test_centering_paragraph_compares_like_with_like():
    ratios = [0.96, 1.1, 0.87, 1.05, 1.0, 0.93, 1.14, 1.02]
    j = simulation_json(ratios)
    text = centering_vs_iid(j)
    ref = iid_reference(256)
    assert f"a median of {ref.median:.4f}" in text and f"a mean of {ref.mean:.4f}" in text
    assert f"{ref.q05:.4f}–{ref.q95:.3f}" in text
    assert f"ranges from {min(ratios):.3f} to {max(ratios):.3f}" in text
    assert "as centered as i.i.d. Gaussian rows" in text
    assert "would call 3 of the 8 seeds" in text


@pytest.mark.parametrize(
    "ratios, words",
    [([1.5, 1.6, 1.55, 1.45, 1.52, 1.48], "less centered than"),
     ([0.5, 0.52, 0.49, 0.51], "more centered than"),
     ([0.6, 1.6, 1.0], "we cannot tell")],
)  # fmt: skip
def test_centering_paragraph_states_what_the_seeds_support(ratios, words):
    text = centering_vs_iid(simulation_json(ratios))
    assert words in text and "within ±25% of 1" not in text
