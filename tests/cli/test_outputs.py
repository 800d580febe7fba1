"""Output paths: checked before any work (a file where a folder is wanted, a folder that cannot be
written, an earlier run's files without --overwrite), the report replaced whole or not at all, a
Ctrl-C that ends the run with exit code 130 and one line, and files made with the user's umask."""

import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rmsnorm import _files
from rmsnorm.cli import app
from rmsnorm.lab import page as page_mod
from rmsnorm.lab.report import render


@pytest.fixture
def runner():
    return CliRunner()


def _no_work(monkeypatch):
    """Any stage of a report that starts fails the test: the checks must come first."""

    def boom(*a, **k):
        raise AssertionError("the run started before its output was checked")

    monkeypatch.setattr(render, "run_report", boom)


def _read_only(monkeypatch, folder: Path):
    """``folder`` unwritable as os.access sees it (the tests may run as root, whom a chmod does not
    stop)."""
    real = os.access
    folder = folder.absolute()

    def access(path, mode, *a, **k):
        if Path(path).absolute() == folder and mode & os.W_OK:
            return False
        return real(path, mode, *a, **k)

    monkeypatch.setattr(_files.os, "access", access)


def _old_report(folder: Path) -> dict[str, bytes]:
    (folder / "figures").mkdir(parents=True)
    files = {"report.md": b"old md", "report.html": b"old html", "figures/old.png": b"old png"}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def _unchanged(folder: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        assert (folder / name).read_bytes() == data, name


def test_report_without_report_json_is_not_replaced(runner, tmp_path, monkeypatch):
    _no_work(monkeypatch)
    old = _old_report(tmp_path / "rep")
    result = runner.invoke(app, ["report", "--quick", "--out", str(tmp_path / "rep")])
    assert result.exit_code == 2, result.output
    assert "--overwrite" in result.output and "report.md" in result.output
    _unchanged(tmp_path / "rep", old)


def test_report_out_a_file_fails_before_any_work(runner, tmp_path, monkeypatch):
    _no_work(monkeypatch)
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    result = runner.invoke(app, ["report", "--quick", "--out", str(target)])
    assert result.exit_code == 2 and "--out" in result.output and "is a file" in result.output
    assert target.read_text() == "mine"


def test_report_read_only_folder_fails_before_any_work(runner, tmp_path, monkeypatch):
    _no_work(monkeypatch)
    _read_only(monkeypatch, tmp_path)
    result = runner.invoke(app, ["report", "--quick", "--out", str(tmp_path / "new")])
    assert result.exit_code == 2, result.output
    assert "--out" in result.output and "no write permission" in result.output


def test_report_overwrite_refuses_a_folder_of_other_files(runner, tmp_path, monkeypatch):
    _no_work(monkeypatch)
    (tmp_path / "thesis.tex").write_text("mine")
    result = runner.invoke(app, ["report", "--quick", "--overwrite", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "thesis.tex" in result.output
    assert (tmp_path / "thesis.tex").read_text() == "mine"


class _Results:
    """What write_report needs of a run, standing in for one."""

    def __init__(self):
        self.seconds = {"runs": 0.0}
        self.provenance = self

    def finish(self):
        pass


def _fake_pages(monkeypatch, figures=("new",), interrupt=False):
    def write_figures(r, fig_dir, progress=None):
        fig_dir.mkdir(parents=True, exist_ok=True)
        out = {}
        for name in figures:
            (fig_dir / f"{name}.png").write_bytes(b"new png")
            out[name] = fig_dir / f"{name}.png"
        if interrupt:
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(render, "write_figures", write_figures)
    monkeypatch.setattr(render, "report_json", lambda r: {"seconds": {}})
    monkeypatch.setattr(render, "report_page", lambda j, f: page_mod.Page("new"))


def test_overwrite_leaves_no_stale_figure(tmp_path, monkeypatch):
    _old_report(tmp_path / "rep")
    _fake_pages(monkeypatch)
    summary = render.write_report(_Results(), tmp_path / "rep")
    assert sorted(p.name for p in (tmp_path / "rep" / "figures").iterdir()) == ["new.png"]
    assert (tmp_path / "rep" / "report.md").read_text().startswith("# new")
    assert summary["files"]["new"] == "figures/new.png"
    assert [p.name for p in tmp_path.iterdir()] == ["rep"]  # no temporary folder left


def test_interrupt_between_figures_and_pages_keeps_the_old_report(runner, tmp_path, monkeypatch):
    old = _old_report(tmp_path / "rep")
    monkeypatch.setattr(render, "run_report", lambda cfg, progress=None: _Results())
    _fake_pages(monkeypatch, interrupt=True)
    result = runner.invoke(
        app, ["report", "--quick", "--overwrite", "--out", str(tmp_path / "rep")]
    )
    assert result.exit_code == 130, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if "interrupted" in line]
    assert len(lines) == 1 and "as it was" in lines[0]
    _unchanged(tmp_path / "rep", old)
    assert not (tmp_path / "rep" / "figures" / "new.png").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["rep"]


def test_simulate_out_a_file(runner, tmp_path):
    target = tmp_path / "f"
    target.write_text("mine")
    result = runner.invoke(app, ["simulate", "--out", str(target), "--seeds", "1"])
    assert result.exit_code == 2 and "--out" in result.output and "is a file" in result.output
    assert target.read_text() == "mine"


def test_inspect_json_on_a_read_only_folder(runner, tmp_path, monkeypatch):
    _read_only(monkeypatch, tmp_path)
    result = runner.invoke(
        app, ["inspect", "--model", "builtin", "--text", "hi", "--json", str(tmp_path / "x.json")]
    )
    assert result.exit_code == 2, result.output
    assert "--json" in result.output and "no write permission" in result.output


def test_inspect_json_a_folder(runner, tmp_path):
    result = runner.invoke(app, ["inspect", "--text", "hi", "--json", str(tmp_path)])
    assert result.exit_code == 2 and "--json" in result.output and "is a folder" in result.output


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_files_get_the_umask_permissions(tmp_path, umask_022):
    path = _files.write_text("x", tmp_path / "a.txt")
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    with _files.atomic_dir(tmp_path / "d") as tmp:
        (tmp / "f").write_text("y")
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o755


def test_files_under_a_strict_umask(tmp_path):
    old = os.umask(0o077)
    try:
        path = _files.write_text("x", tmp_path / "a.txt")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
