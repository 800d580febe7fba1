"""Progress reporting for long steps (the lab's and the benchmark's): library functions take a
``progress`` object and call ``progress.task(description, total)``; the CLI passes a rich one, tests
pass nothing."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["LogProgress", "NullProgress", "RichProgress"]


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


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class LogProgress:
    """Plain lines for logs and pipes, where a redrawn bar shows nothing: one when a task starts,
    then at most one every ``interval`` seconds while it advances, and one when it ends.
    ``write`` takes each line (default: stderr, flushed at once)."""

    def __init__(self, write: Callable[[str], None] | None = None, interval: float = 10.0):
        self._write = write or _to_stderr
        self.interval = interval

    def __enter__(self) -> LogProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def _line(self, text: str) -> None:
        self._write(f"[{time.strftime('%H:%M:%S')}] {text}")

    @contextmanager
    def task(self, description: str, total: int | None = None) -> Iterator[Callable[..., None]]:
        start = last = time.monotonic()
        done = 0
        self._line(f"{description}: started")

        def advance(n: int = 1) -> None:
            nonlocal done, last
            done += n
            now = time.monotonic()
            if now - last >= self.interval:
                last = now
                of = f"/{total} ({done / total:.0%})" if total else ""
                self._line(f"{description}: {done}{of}, {now - start:.0f} s")

        yield advance
        self._line(f"{description}: done in {time.monotonic() - start:.1f} s")


def ensure(progress) -> NullProgress | RichProgress:
    return NullProgress() if progress is None else progress
