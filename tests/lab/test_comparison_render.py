"""What a training comparison writes (lab/comparison/render.py): the figures, the Markdown
summary, the command that reproduces a run, and an output folder that is not silently reused."""

import json
from dataclasses import replace

import pytest

from rmsnorm.lab.comparison import ArgumentError, compare_config, output_dir, reproduce_command


def test_files_and_summary(comparison_run):
    out, results, _ = comparison_run
    for name in ("loss_curves.png", "lr_sweep.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "summary.md").read_text()
    for text in ("LayerNorm", "RMSNorm", "pRMSNorm", "no norm", "nats/byte", "commit",
                 "## Answer", "95% CI", "Wilcoxon", "MDE", "## Stability",
                 "## Has the validation loss flattened?", "## Every rate", "leave one seed out",
                 "k = 2 of 32", "not the paper's regime"):  # fmt: skip
        assert text in md, text
    assert "within the seed spread" not in md  # the unpaired rule is gone
    # both torch norms beside ours in the norm-only table, timed by the shared loop
    assert "| torch F.layer_norm |" in md and "| torch F.rms_norm |" in md
    assert "blocked_autorange" in md
    # one verdict per variant and setting, each written from a paired interval
    for variant in ("rmsnorm", "prmsnorm", "none"):
        verdicts = results["summary"]["variants"][variant]["verdicts"]
        assert verdicts["shared"] and verdicts["shared"] in md
    # strict JSON: no NaN or Infinity, and the per-step logs each on one line
    text = (out / "results.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    json.loads(text)
    assert len(text.splitlines()) < 2000


def test_reproduce_command_names_only_what_differs_from_the_preset():
    cfg = compare_config("tiny", threads=1, steps=30, eval_interval=10, seeds=2, lrs="1e-3,1e-2")
    cfg = replace(cfg, variants=("layernorm", "none")).to_dict()
    assert reproduce_command(cfg) == (
        "rmsnorm compare --preset tiny --variants layernorm,none --seeds 2 --lrs 0.001,0.01 "
        "--threads 1 --steps 30 --out DIR"
    )
    assert reproduce_command(compare_config("cpu").to_dict()) == "rmsnorm compare --out DIR"
    assert reproduce_command(compare_config("full").to_dict()) == "rmsnorm compare --full --out DIR"
    one = compare_config("full", lr=2e-3, batch_size=4).to_dict()
    assert reproduce_command(one) == "rmsnorm compare --full --lr 0.002 --batch 4 --out DIR"


def test_an_earlier_run_is_not_overwritten_without_asking(tmp_path):
    (tmp_path / "summary.md").write_text("an earlier run")
    with pytest.raises(ArgumentError, match="--overwrite") as info:
        output_dir(tmp_path, overwrite=False)
    assert info.value.param == "out"
    assert output_dir(tmp_path, overwrite=True) == tmp_path
    assert output_dir(tmp_path / "new", overwrite=False).is_dir()
