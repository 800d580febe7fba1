"""What a training comparison writes, into an output folder that is never silently reused:
``results.json`` (every run, step by step, and the summary), the figures ``loss_curves.png`` and
``lr_sweep.png`` (:mod:`.plots`) and ``summary.md`` (:mod:`.markdown`); and reading
``results.json`` back."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ...io import atomic_path, jsonable
from .config import ArgumentError
from .markdown import render_markdown
from .plots import plot_losses, plot_sweep

OUTPUT_FILES = {
    "json": "results.json",
    "png": "loss_curves.png",
    "sweep_png": "lr_sweep.png",
    "md": "summary.md",
}


def output_dir(out_dir: str | os.PathLike, overwrite: bool = True) -> Path:
    """``out_dir``, created if needed; an :class:`ArgumentError` naming ``out`` if it cannot be,
    or, unless ``overwrite``, if it already holds one of :data:`OUTPUT_FILES` (the CLI calls it
    before training, so a bad --out fails at once)."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArgumentError("out", f"cannot create the output folder {str(out)!r}: {exc}") from exc
    if not overwrite:
        present = [name for name in OUTPUT_FILES.values() if (out / name).exists()]
        if present:
            raise ArgumentError(
                "out",
                f"{str(out)!r} already holds {', '.join(present)} from an earlier run; choose "
                "another folder, or pass --overwrite to replace them",
            )
    return out


def _atomic_write(path: Path, write) -> None:
    """``write(tmp)`` into a temporary file beside ``path``, then rename it over ``path``: a
    reader never sees half a file, and an interrupted write leaves the old one."""
    with atomic_path(path) as tmp:
        write(tmp)


_NUMBER_ARRAY = re.compile(r"\[\s*(?:(?:-?[\d.eE+-]+|null),\s*)*(?:-?[\d.eE+-]+|null)\s*\]")


def _compact_arrays(text: str) -> str:
    """Indented JSON with every array of plain numbers on one line (the per-step logs would
    otherwise take a line per number)."""
    return _NUMBER_ARRAY.sub(lambda m: "[" + " ".join(m.group(0)[1:-1].split()) + "]", text)


def load_results(path: str | os.PathLike) -> dict:
    """An earlier run's ``results.json`` with its summary and warnings computed afresh from the
    runs it holds (the training is not repeated): the figures and the summary of this version of
    the library for a run trained by any ``rmsnorm.compare/2`` version."""
    import json

    from .run import busy_machine_warnings
    from .summary import summarize

    path = Path(path)
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ArgumentError("from_results", f"cannot read {str(path)!r}: {exc}") from exc
    if not isinstance(results, dict) or results.get("schema") != "rmsnorm.compare/2":
        raise ArgumentError(
            "from_results",
            f"{str(path)!r} is not the results.json of an `rmsnorm compare` run of this version "
            "(schema rmsnorm.compare/2)",
        )
    from .... import __version__, info

    results["warnings"] = busy_machine_warnings(results)
    results["summary"] = summarize(results)
    results["summarized_with"] = {"rmsnorm": __version__, "commit": info.source_commit()}
    return results


def write_outputs(results: dict, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write :data:`OUTPUT_FILES` into ``out_dir`` (created if needed), each atomically; returns
    their paths. The single-rate figure is skipped (one rate: no sweep to draw)."""
    import json

    out = output_dir(out_dir)
    paths = {kind: out / name for kind, name in OUTPUT_FILES.items()}
    # A diverged run has NaN or infinite losses; strict JSON has neither, so they become null.
    text = _compact_arrays(json.dumps(jsonable(results), indent=1, allow_nan=False)) + "\n"
    _atomic_write(paths["json"], lambda p: p.write_text(text))
    _atomic_write(paths["png"], lambda p: plot_losses(results, p))
    if len(results["summary"]["lrs"]) > 1:
        _atomic_write(paths["sweep_png"], lambda p: plot_sweep(results, p))
    else:
        del paths["sweep_png"]
    md = render_markdown(results)
    _atomic_write(paths["md"], lambda p: p.write_text(md))
    return paths
