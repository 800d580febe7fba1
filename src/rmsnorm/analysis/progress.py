"""Progress reporting for the long lab steps: library functions take a ``progress`` object and call
``progress.task(description, total)``; the CLI passes a rich one, tests pass nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["NullProgress", "RichProgress"]


class NullProgress:
    """Reports nothing."""

    @contextmanager
    def task(self, description: str, total: int | None = None) -> Iterator[Callable[..., None]]:
        yield lambda n=1: None


class RichProgress:
    """Rich progress bars, one per task, kept on screen after they finish. Use as a context
    manager around the work (rich is imported here, not at package import)."""

    def __init__(self, console=None) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self._progress = Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )

    def __enter__(self) -> RichProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(*exc)

    @contextmanager
    def task(self, description: str, total: int | None = None) -> Iterator[Callable[..., None]]:
        task_id = self._progress.add_task(description, total=total if total else 1)
        yield lambda n=1: self._progress.advance(task_id, n)
        self._progress.update(task_id, completed=total if total else 1)


def ensure(progress) -> NullProgress | RichProgress:
    return NullProgress() if progress is None else progress
