"""The project's main job (``rmsnorm report``): run the centering lab end to end (the simulated
transformer at initialization over seeds, where its mean comes from, an architecture sweep,
LayerNorm and RMSNorm models trained over seeds, the swap's cost, outliers, a mean planted inside
a block, optionally a real model, and a timing) and write the figures, ``report.json``,
``report.md`` and a self-contained ``report.html``. :mod:`.run` runs it into one
:class:`ReportResults`; :mod:`.prose` (the text), :mod:`.render` (figures and files; and
:func:`build_report`, run then write) and
:mod:`.page` (Markdown and HTML) render it; :mod:`.timing` is its speed measurement."""

from .page import Page
from .render import build_report, write_report
from .run import Provenance, ReportConfig, ReportResults, run_report

__all__ = [
    "ReportConfig",
    "ReportResults",
    "Provenance",
    "run_report",
    "build_report",
    "write_report",
    "Page",
]
