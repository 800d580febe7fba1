"""The report's text (lab/report/prose.py): the i.i.d. comparison states the conclusion its
numbers support, setting median against median, band against band and mean against mean."""

from types import SimpleNamespace

import pytest

from rmsnorm.lab.iid import iid_reference
from rmsnorm.lab.report import IIDComparison, StageHeadline
from rmsnorm.lab.report.prose import centering_vs_iid


def paragraph(median: float, d: int = 256) -> str:
    head = StageHeadline(median, 0.0038, 0.114, 0.0471, 0.999, 0.99, [median], 0.0, d, 1024)
    return centering_vs_iid(SimpleNamespace(headline=head, vs_iid=IIDComparison.of(head)))


def test_at_the_iid_level():
    text = paragraph(0.0405)
    ref = iid_reference(256)
    assert f"a median of {ref.median:.4f}" in text and "a median of 0.0405" in text
    assert f"{ref.q05:.4f}–{ref.q95:.3f}" in text and "0.0038–0.114" in text
    assert f"a mean of {ref.mean:.4f}" in text and "a mean of 0.0471" in text
    assert "0.96× the i.i.d. median, within the ±11%" in text
    assert "as centered as rows of i.i.d. Gaussian entries" in text
    # the statement this replaces: a median set against the i.i.d. mean, read as "more centered"
    assert "more centered" not in text


@pytest.mark.parametrize("median, words", [(0.030, "more centered"), (0.060, "less centered")])
def test_outside_the_sampling_spread(median, words):
    text = paragraph(median)
    assert f"{words} than i.i.d. Gaussian rows" in text and "as centered as" not in text
