"""The report's sections, one module each, in the page's order: :mod:`.answer`,
:mod:`.real_models` (with :mod:`.real_figures`), :mod:`.recovery`, :mod:`.identity`,
:mod:`.simulation`, :mod:`.decomposition`, :mod:`.sweep`, :mod:`.divergence`, :mod:`.training`,
:mod:`.swap`, :mod:`.outliers`, :mod:`.planted`, :mod:`.model`, :mod:`.speed`, :mod:`.reproduce`.
Each holds the section's part of ``report.json`` (``numbers``), its figure and its words
(``words(page, j, figures)``, written from the numbers in ``j``, the report's JSON form, never
typed in), so the words stand next to the numbers they speak about; :mod:`.common` is what they
share."""

from . import (
    answer,
    common,
    decomposition,
    divergence,
    identity,
    model,
    outliers,
    planted,
    real_figures,
    real_models,
    recovery,
    reproduce,
    simulation,
    speed,
    swap,
    sweep,
    training,
)

__all__ = [
    "answer",
    "common",
    "decomposition",
    "divergence",
    "identity",
    "model",
    "outliers",
    "planted",
    "real_figures",
    "real_models",
    "recovery",
    "reproduce",
    "simulation",
    "speed",
    "swap",
    "sweep",
    "training",
]
