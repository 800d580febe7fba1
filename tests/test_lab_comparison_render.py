"""What a training comparison writes (lab/comparison/render.py): the figure, the Markdown
summary and the command that reproduces a run."""

from dataclasses import replace

from rmsnorm.lab.comparison import compare_config, reproduce_command


def test_files_and_summary(comparison_run):
    out, _, _ = comparison_run
    assert (out / "loss_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "summary.md").read_text()
    for text in ("LayerNorm", "RMSNorm", "pRMSNorm", "no norm", "nats/byte", "Rule:", "commit"):
        assert text in md
    assert "within the seed spread" in md or "outside the seed spread" in md
    # both torch norms beside ours in the norm-only table, timed by the shared loop
    assert "| torch F.layer_norm |" in md and "| torch F.rms_norm |" in md
    assert "blocked_autorange" in md


def test_reproduce_command_names_only_what_differs_from_the_preset():
    cfg = compare_config("tiny", threads=1, steps=30, eval_interval=10, seeds=2)
    cfg = replace(cfg, variants=("layernorm", "none")).to_dict()
    assert reproduce_command(cfg) == (
        "rmsnorm compare --preset tiny --variants layernorm,none --seeds 2 --threads 1 "
        "--steps 30 --out DIR"
    )
    assert reproduce_command(compare_config("cpu").to_dict()) == "rmsnorm compare --out DIR"
