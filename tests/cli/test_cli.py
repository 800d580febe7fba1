"""The ``rmsnorm`` command as a user meets it: what works without the optional extras (modules are
blocked in a subprocess, nothing is uninstalled), one-line errors instead of tracebacks, device
defaults that fit a CPU-only machine, and a ``compare`` run that logs and keeps finished seeds."""

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import rmsnorm
from rmsnorm.cli import app
from rmsnorm.lab.experiments.comparison import ArgumentError, compare_config

SRC = str(Path(rmsnorm.__file__).resolve().parents[1])
OPTIONAL = ("matplotlib", "transformers", "triton", "numba")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run_cli(args, block=OPTIONAL, env=None, cwd=None):
    """``rmsnorm ARGS`` in a fresh interpreter in which importing any module in ``block`` fails
    as if it were not installed (``sys.modules[name] = None`` also makes ``find_spec`` say so)."""
    code = (
        "import sys\n"
        f"for name in {tuple(block)!r}:\n"
        "    sys.modules[name] = None\n"
        "from rmsnorm.cli import main\n"
        "sys.argv[0] = 'rmsnorm'\n"
        "main()\n"
    )
    full_env = {k: v for k, v in os.environ.items() if k != "RMSNORM_BACKEND"}
    full_env["PYTHONPATH"] = SRC + os.pathsep + os.environ.get("PYTHONPATH", "")
    full_env["COLUMNS"] = "200"  # rich wraps at the terminal's width; keep messages on one line
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=300,
    )
    return proc.returncode, proc.stdout, proc.stderr


def test_help_and_info_need_no_extra(tmp_path):
    rc, out, err = run_cli(["--help"], cwd=tmp_path)
    assert rc == 0, err
    assert "simulate" in out and "info" in out
    rc, out, err = run_cli(["info"], cwd=tmp_path)
    assert rc == 0, err
    assert "rmsnorm info" in out and rmsnorm.__version__ in out
    assert "cpu: reference" in out  # numba blocked: the reference runs CPU tensors
    # the served-calls table: a row per function, path · backend in each dtype's column
    assert "served on cpu" in out and "launch · reference" in out


@pytest.mark.parametrize(
    "args",
    [
        ["simulate", "--out", "sim"],
        ["report", "--quick", "--out", "rep"],
        ["compare", "--preset", "tiny", "--out", "cmp"],
    ],
)
def test_commands_name_the_missing_extra_before_they_start(tmp_path, args):
    rc, out, err = run_cli(args, block=("matplotlib",), cwd=tmp_path)
    assert rc == 1
    assert "needs matplotlib" in err and "pip install 'rmsnorm[lab]'" in err
    assert "Traceback" not in out + err
    assert not any(tmp_path.iterdir())  # nothing computed, nothing written


def test_missing_cli_dependency_is_one_line(tmp_path):
    rc, out, err = run_cli(["info"], block=("typer",), cwd=tmp_path)
    assert rc == 1
    assert "needs typer" in err and "Traceback" not in err


def test_bad_backend_variable_is_one_line(tmp_path):
    rc, out, err = run_cli(["info"], env={"RMSNORM_BACKEND": "bogus"}, cwd=tmp_path)
    assert rc == 1
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "RMSNORM_BACKEND" in lines[0] and "'bogus'" in lines[0]
    rc, out, err = run_cli(["simulate", "--help"], env={"RMSNORM_BACKEND": "bogus"}, cwd=tmp_path)
    assert rc == 0 and "--n-layers" in out, err  # help needs no backend


def test_cpu_backend_without_numba_says_numba_is_missing(tmp_path):
    rc, out, err = run_cli(["info"], block=("numba",), env={"RMSNORM_BACKEND": "cpu"})
    assert rc == 0, err
    assert "numba not installed" in " ".join(out.split())
    code = (
        "import sys; sys.modules['numba'] = None\n"
        "import torch, rmsnorm\n"
        "rmsnorm.rms_norm(torch.randn(2, 8), (8,))\n"
    )
    env = {**os.environ, "RMSNORM_BACKEND": "cpu", "PYTHONPATH": SRC}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode != 0
    assert "RuntimeError: backend 'cpu' needs the numba CPU kernels: numba not installed" in (
        proc.stderr
    )


def test_bench_defaults_to_the_device_torch_has(monkeypatch, tmp_path):
    import rmsnorm.bench as bench

    calls = []

    def fake_run(device, **kw):
        calls.append(device)
        return []

    monkeypatch.setattr(bench, "run", fake_run)
    monkeypatch.setattr(bench, "summary", lambda rows: "")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(app, ["bench", "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    result = CliRunner().invoke(app, ["bench", "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert calls == ["cpu", "cuda"]


def test_bench_refuses_a_device_it_cannot_run_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(app, ["bench", "--device", "cuda", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.strip() == (
        "rmsnorm bench: --device: 'cuda' was asked for but torch sees no GPU"
    )
    result = CliRunner().invoke(app, ["bench", "--budget", "0", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "must be a number > 0" in result.output
    assert not any(tmp_path.iterdir())


def test_compare_batch_and_text_file(monkeypatch, tmp_path):
    """--batch and --text-file, as in every other command, reach the configuration."""
    import rmsnorm.lab.experiments.comparison as compare

    seen = {}

    class Stop(Exception):
        pass

    def fake_config(preset, **kw):
        seen.update(kw)
        raise Stop

    monkeypatch.setattr(compare, "compare_config", fake_config)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("text")
    result = CliRunner().invoke(app, ["compare", "--batch", "5", "--text-file", str(corpus)])
    assert isinstance(result.exception, Stop), result.output
    assert seen["batch_size"] == 5 and seen["text"] == str(corpus)


def test_gpu_preset_is_refused_on_a_cpu_with_the_estimate(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(app, ["compare", "--preset", "gpu", "--out", str(tmp_path)])
    assert result.exit_code == 2
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())
    assert "--preset" in text and "sized for a GPU" in text
    assert re.search(r"at least \d+(\.\d)? h", text), text
    assert not any(tmp_path.iterdir())
    # Asked for explicitly, or short enough, it runs.
    assert compare_config("gpu", device="cpu").device == "cpu"
    short = {"steps": 2, "seeds": 1, "eval_batches": 1, "final_eval_batches": 1}
    assert compare_config("gpu", **short).device == "cpu"
    with pytest.raises(ArgumentError, match="at least"):
        compare_config("gpu")


def test_compare_logs_progress_and_keeps_finished_seeds_when_interrupted(monkeypatch, tmp_path):
    """Not on a terminal: progress as lines. Stopped in the second seed: the first one's results
    are in --out, marked partial."""
    import rmsnorm.lab.experiments.comparison as comparison
    import rmsnorm.lab.experiments.comparison.run as comparison_run

    real = comparison_run.build_models
    seeds_built = []

    def build_then_stop(model_cfg, variants, seed, device="cpu"):
        seeds_built.append(seed)
        if len(seeds_built) == 2:
            raise KeyboardInterrupt
        return real(model_cfg, variants, seed, device)

    monkeypatch.setattr(comparison_run, "build_models", build_then_stop)
    real_config = comparison.compare_config  # timing numbers are not under test: 2 calls, not 25
    monkeypatch.setattr(
        comparison,
        "compare_config",
        lambda *a, **k: replace(real_config(*a, **k), norm_timing_s=0.001),
    )
    args = ["compare", "--preset", "tiny", "--variants", "layernorm", "--seeds", "3"]
    args += ["--steps", "4", "--eval-interval", "2", "--threads", "1", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 130, result.output
    assert "interrupted; the 1 finished seed(s) are in" in result.output
    task = r"\] 3 seeds x 1 variants x 1 rates x 4 steps"
    assert re.search(task + ": started", result.output)
    assert "1 of 3 seeds finished: results so far in" in result.output
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["seeds_completed"] == 1 and results["config"]["seeds"] == 3
    assert len(results["runs"]["layernorm"]) == 1
    assert "Partial results: 1 of 3 seeds" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "loss_curves.png").stat().st_size > 0


def test_argument_error_renders_names_for_the_command_line():
    """Library errors name their argument; a caller spells it its own way without rewriting the
    message (a value that looks like a name, or has braces, is left alone)."""
    from rmsnorm._validate import ArgumentError, divisible, one_of, positive_int

    def flag(name):
        return "--" + name.replace("_", "-")

    with pytest.raises(ArgumentError) as info:
        positive_int("n_layers", -1)
    assert str(info.value) == "n_layers must be a positive integer, got -1"
    assert info.value.render(flag) == "--n-layers must be a positive integer, got -1"
    assert info.value.param == "n_layers" and info.value.detail.startswith("must be")
    with pytest.raises(ArgumentError) as info:
        divisible("d_model", 30, "n_heads", 4)
    assert info.value.render(flag) == "--d-model (30) must be divisible by --n-heads (4)"
    with pytest.raises(ArgumentError) as info:
        one_of("norm", "{seq_len}", ("layernorm",))
    assert info.value.render(flag) == "--norm must be one of 'layernorm', got '{seq_len}'"
    error = ArgumentError("text", "cannot read {a}: n_layers")
    assert str(error) == "text: cannot read {a}: n_layers"
    assert error.render(flag) == "--text: cannot read {a}: n_layers"
    for bad in (True, 1.0, "2", 0):
        with pytest.raises(ArgumentError):
            positive_int("n", bad)


def test_convert_writes_json(monkeypatch, tmp_path):
    """`--json`, as in `inspect`."""
    import rmsnorm.convert as convert

    report = convert.ConversionReport(
        "gpt2", "a", "b", {"float32": 1e-7}, {"original": 0.01}, (2, 32), False, "cpu", 1
    )
    monkeypatch.setattr(convert, "convert_directory", lambda *a, **k: report)
    out = tmp_path / "report.json"
    result = CliRunner().invoke(app, ["convert", "a", "b", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["architecture"] == "gpt2"


@pytest.mark.parametrize("command", [["convert", "a", "b"], ["inspect", "--model", "builtin"]])
def test_an_existing_json_file_is_replaced_only_with_overwrite(monkeypatch, tmp_path, command):
    """Refused before any work (nothing is converted or run), named with the option that allows
    it; with --overwrite the file is replaced."""
    import rmsnorm.convert as convert

    report = convert.ConversionReport(
        "gpt2", "a", "b", {"float32": 1e-7}, {"original": 0.01}, (2, 32), False, "cpu", 1
    )
    monkeypatch.setattr(convert, "convert_directory", lambda *a, **k: report)
    out = tmp_path / "report.json"
    out.write_text("an earlier result\n")
    result = CliRunner().invoke(app, [*command, "--json", str(out)])
    assert result.exit_code != 0 and "--overwrite" in result.output
    assert out.read_text() == "an earlier result\n"
    result = CliRunner().invoke(app, [*command, "--json", str(out), "--overwrite"])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())
