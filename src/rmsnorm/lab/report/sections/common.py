"""What every section's code shares, public within the lab: a number in words (:func:`fmt`: '–'
for a missing or non-finite one), a spread's min–max (:func:`range_text`), a capital first
letter (:func:`upper_first`), the words of a verdict on a ratio over seeds
(:func:`verdict_sentence`) and the name of the text the report tests (:func:`chapter`). The spread
of numbers over seeds for ``report.json`` is :func:`rmsnorm.lab.stats.rows.spread`."""

from __future__ import annotations

import math


def fmt(x, spec: str = ".3g") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return format(x, spec)


def range_text(s: dict, spec: str = ".3g", unit: str = "") -> str:
    """'a–b' from a {min, max} dict (one number when they print the same)."""
    lo, hi = fmt(s["min"], spec), fmt(s["max"], spec)
    return f"{lo}{unit}" if lo == hi else f"{lo}–{hi}{unit}"


def upper_first(text: str) -> str:
    """``text`` with its first letter upper-cased (str.capitalize lower-cases the rest)."""
    return text[:1].upper() + text[1:]


def verdict_sentence(
    v: dict,
    what: str = "the stream",
    against: str = "i.i.d. Gaussian rows of its width",
    more: str = "more seeds",
) -> str:
    """The words for a :class:`~rmsnorm.lab.experiments.simulation.seeds.Verdict` (its dict form) on
    a ratio to a reference level: the verdict, then what the interval says; for "cannot tell", what
    would tell."""
    conf = f"{100 * v['confidence']:.0f}%"
    interval = f"{fmt(v['ci_low'], '.2f')}–{fmt(v['ci_high'], '.2f')}"
    margin = f"±{100 * v['margin']:.0f}%"
    if v["n"] < 2:
        return (
            f"one seed has no spread, so we cannot tell whether {what} is as centered as "
            f"{against}; several seeds (`--seeds 8`) would tell"
        )
    where = f"the {conf} interval of the ratio over {v['n']} seeds is {interval}"
    if v["verdict"] == "as centered":
        return f"{what} is as centered as {against} ({where}, within {margin} of 1)"
    if v["verdict"] in ("less centered", "more centered"):
        side = "above" if v["verdict"] == "less centered" else "below"
        return f"{what} is {v['verdict']} than {against} ({where}, all of it {side} 1)"
    return (
        f"we cannot tell whether {what} is as centered as {against} ({where}: it contains 1 but "
        f"is wider than {margin}); {more} would tell (the interval narrows as 1/√seeds)"
    )


def chapter(page) -> str:
    """The report's name for the text it tests, as the subject of a sentence: defined where the
    page first uses it (the lab's notes call that text seed 001, which is no random seed), "The
    chapter" after."""
    if page._keys.get("chapter defined"):
        return "The chapter"
    page._keys["chapter defined"] = True
    return (
        "Seed 001, the chapter this report tests (the lab's name for its source text, not one "
        "of the random seeds),"
    )
