"""The probe scripts of benchmarks/probes/: the index lists exactly the scripts there, with result
files and citing docs that exist, and every script imports and answers --help (no timing run)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBES = ROOT / "benchmarks" / "probes"
RESULTS = ROOT / "benchmarks" / "results"


def _index() -> dict[str, tuple[list[str], list[str]]]:
    """probe → (its result files, the docs that cite it), from the README's table."""
    rows = {}
    for line in (PROBES / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        probe = cells[0].strip("`")
        results = re.findall(r"`([^`$]+)`", cells[2])
        docs = re.findall(r"`([^`]+)`", cells[3])
        rows[probe] = (results, docs)
    return rows


INDEX = _index()


def test_the_index_lists_exactly_the_probes_present():
    present = sorted(p.name for p in PROBES.glob("*.py"))
    assert sorted(INDEX) == present


@pytest.mark.parametrize("probe", sorted(INDEX))
def test_the_index_names_files_that_exist(probe):
    results, docs = INDEX[probe]
    for name in results:
        assert (RESULTS / name).is_file(), f"{probe}: no benchmarks/results/{name}"
    stem = probe.removesuffix(".py")
    for doc in docs:
        text = (ROOT / doc).read_text()
        # the doc cites the probe by its path, or one of its result files
        cited = f"benchmarks/probes/{probe}" in text or any(Path(r).name in text for r in results)
        assert cited or stem in text, f"{doc} does not cite {probe}"


@pytest.mark.parametrize("probe", sorted(INDEX))
def test_each_probe_imports_and_answers_help(probe, monkeypatch):
    path = PROBES / probe
    spec = importlib.util.spec_from_file_location(f"_probe_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not as __main__: nothing runs
    assert module.__doc__ and f"benchmarks/probes/{probe}" in module.__doc__  # its usage line
    monkeypatch.setattr(sys, "argv", [str(path), "--help"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        module.main()
    assert exit_.value.code == 0
    assert out.getvalue().startswith("usage:")
