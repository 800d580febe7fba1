"""The ``rmsnorm`` command. Each command parses its options, calls a library function and prints
what it returns; the lab's tables and lines are drawn in :mod:`rmsnorm.lab.present`.

``root`` is the app and registers the commands, one module per family: ``library`` (info, warmup,
bench, convert), ``store`` (the ``weights`` and ``cache`` groups), ``experiments`` (simulate,
inspect, report, recover) and ``compare``; ``_shared`` is the error path, the option types and the
checks they share."""

try:
    import typer  # noqa: F401
    from rich.console import Console  # noqa: F401
except ImportError as exc:  # dependencies of the package: only a broken install lacks them
    raise SystemExit(
        f"the rmsnorm command needs {exc.name}, a dependency of rmsnorm that is not installed: "
        "pip install --force-reinstall rmsnorm"
    ) from exc

from .root import app, main

__all__ = ["app", "main"]
