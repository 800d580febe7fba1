"""The lab's cache: said once when first written, kept under its cap (least recently used first,
never the joined weight files), listed and cleared by ``rmsnorm cache``, shown by ``rmsnorm info``;
``rmsnorm weights install`` prepares the GGUF models unless told not to."""

from __future__ import annotations

import os
import time

import pytest
from typer.testing import CliRunner

from rmsnorm import _cache as cache
from rmsnorm.cli import app


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RMSNORM_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RMSNORM_CACHE_MAX_GB", raising=False)
    monkeypatch.setattr(cache, "_announced", False)


def _entry(kind: str, name: str, size: int, age: float):
    folder = cache.cache_dir() / cache.KINDS[kind]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if kind == "stages":
        path.write_bytes(bytes(size))
    else:
        path.mkdir()
        (path / "model.safetensors").write_bytes(bytes(size))
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def test_the_first_write_is_announced_once(capsys):
    path = _entry("stages", "a.json", 1500, 0)
    cache.wrote(path)
    err = capsys.readouterr().err
    assert str(cache.cache_dir()) in err and "1.5 kB" in err and "rmsnorm cache clear" in err
    cache.wrote(_entry("stages", "b.json", 10, 0))
    assert capsys.readouterr().err == ""


def test_the_cap_removes_the_least_recently_used(monkeypatch, capsys):
    old = _entry("dequantized", "old", 4000, 300)
    weights = _entry("weights", "joined", 4000, 400)
    mid = _entry("stages", "mid.json", 4000, 200)
    new = _entry("dequantized", "new", 4000, 0)
    monkeypatch.setenv("RMSNORM_CACHE_MAX_GB", str(13_000 / 1e9))
    cache.wrote(new)
    assert not old.exists() and mid.exists() and new.exists() and weights.exists()
    err = capsys.readouterr().err
    assert "removed the least recently used dequantized entry old" in err
    assert "RMSNORM_CACHE_MAX_GB" in err


def test_a_bad_cap_names_the_variable(monkeypatch):
    monkeypatch.setenv("RMSNORM_CACHE_MAX_GB", "lots")
    with pytest.raises(ValueError, match="RMSNORM_CACHE_MAX_GB must be a number"):
        cache.max_bytes()
    monkeypatch.setenv("RMSNORM_CACHE_MAX_GB", "0")
    assert cache.max_bytes() == float("inf")


def test_cache_list_shows_entries_and_total():
    _entry("dequantized", "abc-tf5", 2_000_000, 10)
    _entry("stages", "m-stats.json", 1000, 5)
    result = CliRunner().invoke(app, ["cache", "list"])
    assert result.exit_code == 0, result.output
    assert "abc-tf5" in result.output and "2.0 MB" in result.output
    assert "m-stats.json" in result.output and "in 2 entries" in result.output


def test_cache_clear_needs_yes_off_a_terminal():
    path = _entry("dequantized", "abc", 100, 0)
    result = CliRunner().invoke(app, ["cache", "clear"])
    assert result.exit_code == 2 and "--yes" in result.output and path.exists()


def test_cache_clear_keeps_the_weights_unless_named():
    deq = _entry("dequantized", "abc", 100, 0)
    stage = _entry("stages", "s.json", 100, 0)
    weights = _entry("weights", "joined", 100, 0)
    result = CliRunner().invoke(app, ["cache", "clear", "--yes", "--only", "stages"])
    assert result.exit_code == 0 and not stage.exists() and deq.exists()
    result = CliRunner().invoke(app, ["cache", "clear", "--yes"])
    assert result.exit_code == 0 and "removed 1 entries" in result.output
    assert not deq.exists() and weights.exists()
    result = CliRunner().invoke(app, ["cache", "clear", "--yes", "--only", "weights"])
    assert result.exit_code == 0 and not weights.exists()
    bad = CliRunner().invoke(app, ["cache", "clear", "--yes", "--only", "models"])
    assert bad.exit_code == 2 and "--only must be" in bad.output


def test_info_has_a_cache_line():
    from rmsnorm import info

    _entry("stages", "s.json", 3000, 0)
    line = info.environment()["lab cache"]
    assert str(cache.cache_dir()) in line and "3.0 kB" in line


def test_weights_install_prepares_the_gguf_models(monkeypatch):
    pytest.importorskip("transformers")
    from rmsnorm.lab.models import pretrained, weights

    prepared = []
    monkeypatch.setattr(weights, "install", lambda names, force, log: [])
    monkeypatch.setattr(pretrained, "is_prepared", lambda name: False)
    monkeypatch.setattr(pretrained, "prepare", lambda name, progress=None: prepared.append(name))
    result = CliRunner().invoke(app, ["weights", "install"])
    assert result.exit_code == 0, result.output
    assert prepared == ["smollm2-135m", "gemma3-270m"]
    prepared.clear()
    result = CliRunner().invoke(app, ["weights", "install", "--no-prepare"])
    assert result.exit_code == 0 and prepared == []


def test_a_dequantized_copy_is_announced(monkeypatch, capsys):
    """The real writer of the cache (pretrained's dequantized copy) says where it wrote."""
    pytest.importorskip("transformers")
    import safetensors.torch

    from rmsnorm.lab.models import pretrained

    class _Config:
        def save_pretrained(self, folder):
            (folder / "config.json").write_text("{}")

    class _Model:
        config = _Config()

    def save_model(model, path, metadata=None):
        with open(path, "wb") as f:
            f.write(b"x")

    monkeypatch.setattr(safetensors.torch, "save_model", save_model)
    folder = cache.cache_dir() / "dequantized" / "key"
    pretrained._write_cached(folder, _Model(), None)
    assert (folder / "manifest.json").is_file() and (folder / "model.safetensors").is_file()
    assert "caching under" in capsys.readouterr().err
