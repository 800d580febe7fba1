"""What every figure of the lab shares: matplotlib with the non-interactive Agg backend, imported
only when a figure is drawn (matplotlib is the ``lab`` extra), and one way to save a figure."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DPI", "pyplot", "save_figure"]

DPI = 110


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (files only, no window)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path) -> Path:
    """Write ``fig`` as a PNG at :data:`DPI` (creating the folder), close it, return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    pyplot().close(fig)
    return path
