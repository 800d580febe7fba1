"""The report's sections, one module each, and :data:`SECTIONS`, the list of them in the page's
order. Every section module has the same three callables:

- ``data(r) -> dict``: its part of ``report.json``, top-level keys to their values, read from the
  run's :class:`~rmsnorm.lab.report.run.ReportResults` ``r`` (``{}`` when it has none, as for a
  stage the configuration skipped);
- ``figures(r, out) -> dict[str, Path]``: its figures drawn into the folder ``out``, by name (the
  names its words look up; ``{}`` when it has none);
- ``words(page, j, figures)``: its words on the :class:`~rmsnorm.lab.page.Page`, written from
  ``j``, the report's JSON form (the numbers are inserted from there, never typed in), and
  ``figures``, every figure of the report by name. A section the run skipped has no key in ``j``,
  and its words return without writing.

:mod:`.render` iterates :data:`SECTIONS` for ``report.json``, the figures and the page, so a new
section is a module with these three callables and one line in the list. :mod:`.common` holds what
the sections' words share and :mod:`.real_figures` the pretrained-models section's figures; neither
is a section."""

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

# The page's order.
SECTIONS = [
    answer,
    real_models,
    recovery,
    identity,
    simulation,
    decomposition,
    sweep,
    divergence,
    training,
    swap,
    outliers,
    planted,
    model,
    speed,
    reproduce,
]

__all__ = [
    "SECTIONS",
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
