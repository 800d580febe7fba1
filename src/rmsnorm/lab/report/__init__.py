"""The project's main job (``rmsnorm report``): run the centering lab end to end (the simulated
transformer at initialization over seeds, where its mean comes from, an architecture sweep,
LayerNorm and RMSNorm models trained over seeds, the swap's cost, outliers, a mean planted inside
a block, optionally a real model, and a timing) and write the figures, ``report.json``,
``report.md`` and a self-contained ``report.html``. :mod:`.run` runs it into one
:class:`ReportResults`, one stage per experiment; :mod:`.sections` holds each section's part of
``report.json``, its figures and its words side by side, one module per section, and their list in
the page's order; :mod:`.render` walks that list for ``report.json``, the figures and the page,
and writes the files (and :func:`build_report`: run then write); :mod:`.timing` is its speed
measurement. The page is written with the lab's document model, :class:`~rmsnorm.lab.page.Page`
(Markdown and HTML), which ``rmsnorm compare``'s ``summary.md`` uses too."""

from ..page import Page
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
