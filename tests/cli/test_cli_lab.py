"""The lab's commands (``rmsnorm simulate / inspect / report / compare``) at tiny sizes through
typer's CliRunner: every promised file, and clear errors that name the bad option."""

import json
import re

import pytest
from typer.testing import CliRunner

from rmsnorm.cli import app

TINY = ["--n-layers", "2", "--d-model", "32", "--n-heads", "2", "--seq-len", "16", "--batch", "4"]
TINY_COMPARE = ["--preset", "tiny", "--seeds", "1", "--steps", "4", "--eval-interval", "2"]
TINY_COMPARE += ["--variants", "layernorm", "--threads", "1"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def runner():
    return CliRunner()


def plain(result) -> str:
    """Output without rich's colour codes and box-drawing line breaks."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", result.output)
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def test_simulate_writes_files(runner, tmp_path):
    result = runner.invoke(
        app, ["simulate", "--out", str(tmp_path), *TINY, "--planted-mean", "0.1"]
    )
    assert result.exit_code == 0, result.output
    for name in ("mean_histograms.png", "ratio_by_layer.png", "cosine_by_layer.png"):
        assert (tmp_path / name).stat().st_size > 0
    data = json.loads((tmp_path / "simulation.json").read_text())
    assert data["config"]["planted_mean"] == 0.1 and data["config"]["n_layers"] == 2


def test_simulate_over_seeds_gives_a_verdict(runner, tmp_path):
    options = ["--seeds", "3", "--activation", "relu", "--planted-bias", "0.05"]
    result = runner.invoke(app, ["simulate", "--out", str(tmp_path), *TINY, *options])
    assert result.exit_code == 0, result.output
    text = plain(result)
    assert "median over 3 seeds" in text and "init, all layers:" in text and "interval" in text
    assert re.search(r"(as centered|more centered|less centered|cannot tell)", text)
    assert "the MLPs wrote" in text and "shared" in text
    for name in ("ratio_by_layer_seeds.png", "decomposition.png", "seeds.json"):
        assert (tmp_path / name).stat().st_size > 0
    seeds = json.loads((tmp_path / "seeds.json").read_text())
    assert seeds["seeds"] == [0, 1, 2] and seeds["verdict"]["n"] == 3
    cfg = json.loads((tmp_path / "simulation.json").read_text())["config"]
    assert cfg["activation"] == "relu" and cfg["planted_bias"] == 0.05
    assert not cfg["center_activation"]


def test_simulate_one_seed_says_it_cannot_tell(runner, tmp_path):
    result = runner.invoke(
        app, ["simulate", "--out", str(tmp_path), *TINY, "--center-activation", "--seeds", "1"]
    )
    assert result.exit_code == 0, result.output
    assert "one seed has no spread" in plain(result)
    assert not (tmp_path / "seeds.json").exists()
    cfg = json.loads((tmp_path / "simulation.json").read_text())["config"]
    assert cfg["center_activation"]


def test_inspect_writes_json(runner, tmp_path):
    out = tmp_path / "inspect.json"
    result = runner.invoke(
        app, ["inspect", "--model", "builtin", "--text", "hello", "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["norm_layers"] == 25 and "UTF-8 bytes" in data["inputs"]
    assert data["layers"][0]["outliers"]["dominant_channels"]
    assert "norm_f" in result.output and "LN" in result.output
    assert "channels" in result.output and "dominant" in result.output
    quiet = runner.invoke(app, ["inspect", "--model", "builtin", "--text", "hi", "--no-channels"])
    assert quiet.exit_code == 0 and "dominant" not in quiet.output


def test_report_quick_writes_files(runner, tmp_path):
    options = ["--quick", "--train-steps", "0", "--planted-bias", "0", "--no-sweep", "--seeds", "4"]
    result = runner.invoke(app, ["report", *options, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for name in ("report.md", "report.html", "report.json", "figures/sigma_mu_plane.png"):
        assert (tmp_path / name).stat().st_size > 0
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["simulation"]["n_seeds"] == 4 and data["mode"] == "quick"
    assert not {"training", "swap", "planted", "sweep"} & set(data)
    assert "at initialization: median |μ|/σ ÷ i.i.d. median" in plain(result)
    # a second run into the same folder stops before any work unless asked to overwrite
    before = (tmp_path / "report.json").read_bytes()
    again = runner.invoke(app, ["report", "--quick", "--out", str(tmp_path)])
    assert again.exit_code != 0 and "--overwrite" in plain(again)
    assert (tmp_path / "report.json").read_bytes() == before


def test_simulate_keeps_an_earlier_run_unless_asked(runner, tmp_path):
    (tmp_path / "simulation.json").write_text("{}\n")
    result = runner.invoke(app, ["simulate", "--out", str(tmp_path), "--seeds", "1"])
    assert result.exit_code != 0 and "--overwrite" in plain(result)
    assert (tmp_path / "simulation.json").read_text() == "{}\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["simulate", "--n-layers", "-1"], "--n-layers"),
        (
            ["simulate", "--d-model", "30", "--n-heads", "4"],
            "--d-model (30) must be divisible by --n-heads (4)",
        ),
        (["simulate", "--text-file", "/nonexistent/t.txt"], "--text-file"),
        (["simulate", "--position", "sideways"], "--position must be one of 'pre', 'post'"),
        (["simulate", "--norm", "batchnorm"], "norm must be one of"),
        (["inspect", "--model", "/nonexistent/model"], "no such directory"),
        (["report", "--model", "/nonexistent/model", "--quick"], "no such directory"),
        (["report", "--train-steps", "-3"], "--train-steps"),
        (["report", "--seeds", "0"], "--seeds"),
        (["report", "--quick", "--full"], "--quick and --full exclude each other"),
        (["simulate", "--seeds", "0"], "--seeds"),
        (["simulate", "--activation", "tanh"], "--activation must be one of"),
    ],
)
def test_bad_arguments(runner, tmp_path, args, message):
    result = runner.invoke(app, [*args, "--out", str(tmp_path)] if args[0] != "inspect" else args)
    assert result.exit_code != 0
    assert message in plain(result)


def test_simulate_spells_model_options_as_compare_does(runner, tmp_path):
    """--n-layers / --d-model / --n-heads, as in `compare`."""
    help_text = plain(runner.invoke(app, ["simulate", "--help"]))
    assert "--n-layers" in help_text and "--d-model" in help_text and "--n-heads" in help_text
    args = [
        "--n-layers",
        "2",
        "--d-model",
        "32",
        "--n-heads",
        "2",
        "--seq-len",
        "16",
        "--batch",
        "4",
    ]
    result = runner.invoke(app, ["simulate", "--out", str(tmp_path), *args])
    assert result.exit_code == 0, result.output
    cfg = json.loads((tmp_path / "simulation.json").read_text())["config"]
    assert (cfg["n_layers"], cfg["d_model"], cfg["n_heads"]) == (2, 32, 2)


def test_library_errors_are_one_line_with_the_options_names(runner, tmp_path):
    """An argument the library refuses comes back as one line naming this command's option (the
    library's norm_position is --position here), exit code 2, no traceback."""
    result = runner.invoke(app, ["simulate", "--position", "sideways", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "rmsnorm simulate: --position must be one of 'pre', 'post', got 'sideways'"
    ]


def test_compare_writes_its_files_and_a_table(comparison_run):
    out, _, output = comparison_run
    assert "LayerNorm" in output and "wrote" in output
    for name in ("results.json", "loss_curves.png", "lr_sweep.png", "summary.md"):
        assert (out / name).stat().st_size > 0


def test_compare_keeps_an_earlier_run_unless_told(runner, tmp_path):
    (tmp_path / "results.json").write_text("{}")
    args = ["compare", "--out", str(tmp_path), *TINY_COMPARE]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "--overwrite" in result.output
    assert (tmp_path / "results.json").read_text() == "{}"
    result = runner.invoke(app, [*args, "--overwrite"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "results.json").read_text())["seeds_completed"] == 1


@pytest.mark.parametrize(
    "args, option, message",
    [
        (["--variants", "layernorm,batchnorm"], "--variants", "unknown variant 'batchnorm'"),
        (["--variants", "rmsnorm,prmsnorm"], "--variants", "must include 'layernorm'"),
        (["--steps", "0"], "--steps", "positive integer"),
        (["--seeds", "0"], "--seeds", "positive integer"),
        (["--threads", "0"], "--threads", "positive integer"),
        (["--text-file", "/nonexistent/corpus.txt"], "--text-file", "not found"),
        (["--preset", "huge"], "--preset", "cpu, full, gpu, tiny"),
        (["--lrs", "1e-3,fast"], "--lrs", "not a number"),
        (["--lr", "1e-3", "--lrs", "1e-3,1e-2"], "--lr", "not both"),
        (["--full", "--preset", "tiny"], "--full", "--preset full"),
        (["--workers", "0"], "--workers", "positive integer"),
        (["--d-model", "30", "--n-heads", "4"], "--n-heads", "divisible"),
    ],
)
def test_compare_bad_arguments_name_the_option(runner, tmp_path, args, option, message):
    result = runner.invoke(app, ["compare", "--out", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    flat = " ".join(result.output.replace("│", " ").split())  # rich wraps the error box
    assert option in flat and message in flat, flat
    assert not (tmp_path / "results.json").exists()


def test_compare_from_results_rewrites_the_summary_without_training(
    comparison_run, runner, tmp_path
):
    """--from-results: the summary and figures of an earlier run from its results.json alone; the
    same numbers as the run wrote (its summary is computed afresh from the runs in the JSON)."""
    out, _, _ = comparison_run
    again = tmp_path / "again"
    result = runner.invoke(
        app, ["compare", "--from-results", str(out / "results.json"), "--out", str(again)]
    )
    assert result.exit_code == 0, result.output
    assert (again / "summary.md").read_text() == (out / "summary.md").read_text()
    assert (again / "lr_sweep.png").stat().st_size > 0
    bad = runner.invoke(app, ["compare", "--from-results", str(out / "summary.md"), "--out", "x"])
    assert bad.exit_code == 2 and "--from-results" in bad.output
