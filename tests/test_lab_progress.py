"""Progress reporting of long steps (rmsnorm/_progress.py): plain timestamped lines for logs and
pipes."""

import re

import pytest

from rmsnorm._progress import LogProgress


def test_log_progress_lines():
    lines = []
    progress = LogProgress(lines.append, interval=0.0)
    with progress.task("work", 4) as advance:
        advance(2)
        advance(2)
    assert [re.sub(r"^\[[\d:]+\] ", "", line) for line in lines[:3]] == [
        "work: started",
        "work: 2/4 (50%), 0 s",
        "work: 4/4 (100%), 0 s",
    ]
    assert lines[3].endswith("s") and "work: done in" in lines[3]
    lines.clear()
    with pytest.raises(RuntimeError), progress.task("fails", 1):
        raise RuntimeError("stop")
    assert len(lines) == 1  # started, never "done"
