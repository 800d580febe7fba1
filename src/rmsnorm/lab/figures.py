"""What every figure of the lab shares: matplotlib with the non-interactive Agg backend, imported
only when a figure is drawn (matplotlib is the ``lab`` extra), and one way to save a figure."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DPI", "pyplot", "save_figure", "legend_below", "layer_ticks"]

DPI = 110
TITLE_SIZE = 11  # a figure's title; panel titles are 10


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (files only, no window)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path, title: str | None = None) -> Path:
    """Write ``fig`` as a PNG at :data:`DPI` (creating the folder, atomically), close it, return
    the path; ``title``, where given, is the figure's title in the lab's title size."""
    from .io import atomic_path

    path = Path(path)
    if title is not None:
        fig.suptitle(title, fontsize=TITLE_SIZE)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=DPI, format="png")
    finally:
        pyplot().close(fig)
    return path


def legend_below(fig, ax, ncol: int = 2, fontsize: float = 7.5, handles=None) -> None:
    """The legend in its own strip under the axes, so that it covers no data."""
    h, labels = (
        (handles, [x.get_label() for x in handles]) if handles else (ax.get_legend_handles_labels())
    )
    fig.legend(h, labels, loc="outside lower center", ncol=ncol, fontsize=fontsize, frameon=False)


def layer_ticks(ax, names: list[str], short: bool = False) -> None:
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(["emb"] + [n.split()[-1] for n in names[1:]], fontsize=8)
    ax.set_xlabel(
        "stream after (emb: embedding; n: block n)"
        if short
        else "residual stream after layer (emb = embedding, then block number)"
    )
