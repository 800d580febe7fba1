"""The project's main job (``rmsnorm report``): run the centering lab end to end (the simulated
transformer at initialization over seeds, where its mean comes from, an architecture sweep,
LayerNorm and RMSNorm models trained over seeds, the swap's cost, outliers, a mean planted inside
a block, optionally a real model, and a timing) and write the figures, ``report.json``,
``report.md`` and a self-contained ``report.html``. :mod:`.run` runs it into one
:class:`ReportResults`; :mod:`.sections` holds each section's part of ``report.json``, its figure
and its words side by side, one module per section; :mod:`.render` draws the figures, assembles
the page and writes the files (and :func:`build_report`: run then write); :mod:`.page` is the
document model (Markdown and HTML); :mod:`.timing` is its speed measurement."""

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
