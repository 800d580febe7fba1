"""The ``rmsnorm`` command (its code: :mod:`rmsnorm.cli.experiments`)."""

from .experiments import app, main

__all__ = ["app", "main"]
