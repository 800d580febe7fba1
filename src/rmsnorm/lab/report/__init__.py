"""The project's main job (``rmsnorm report``): run the centering lab end to end (the simulated
transformer at initialization, a planted-mean contrast, a short training run, optionally a real
model, and a timing) and write the figures, ``report.json``, ``report.md`` and a self-contained
``report.html``. :mod:`.run` runs it into one :class:`ReportResults`; :mod:`.prose` (the text),
:mod:`.render` (figures and files) and :mod:`.page` (Markdown and HTML) render that object;
:mod:`.timing` is its speed measurement."""

from .page import Page
from .render import write_report
from .run import (
    IIDComparison,
    Provenance,
    ReportConfig,
    ReportResults,
    StageHeadline,
    build_report,
    run_report,
)

__all__ = [
    "ReportConfig",
    "ReportResults",
    "StageHeadline",
    "IIDComparison",
    "Provenance",
    "run_report",
    "build_report",
    "write_report",
    "Page",
]
