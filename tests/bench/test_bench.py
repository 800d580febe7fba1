"""The benchmark harness without a GPU: bytes model, rows, writers, and a dry run of the GPU mode's
whole loop on CPU tensors at tiny shapes."""

from __future__ import annotations

import csv

import pytest
import torch

from rmsnorm import bench, info


def test_bytes_model():
    m, n = 4, 1024
    assert bench.bytes_moved("rms_norm", "forward", m, n, 2) == 2 * m * n * 2
    assert bench.bytes_moved("rms_norm", "backward", m, n, 2) == 3 * m * n * 2
    assert bench.bytes_moved("layer_norm", "forward_backward", m, n, 4) == 5 * m * n * 4
    assert bench.bytes_moved("add_rms_norm", "forward", m, n, 2) == 4 * m * n * 2
    assert bench.bytes_moved("add_rms_norm", "backward", m, n, 2) == 4 * m * n * 2
    assert bench.bytes_moved("copy", "forward", m, n, 2) == 2 * m * n * 2
    # gated: x, z in, y out; x, z, dy in, dx, dz out
    for op in ("gated_rms_norm", "gated_rms_norm_grouped"):
        assert bench.bytes_moved(op, "forward", m, n, 2) == 3 * m * n * 2
        assert bench.bytes_moved(op, "forward_backward", m, n, 4) == 8 * m * n * 4
    with pytest.raises(ValueError):
        bench.bytes_moved("copy", "backward", m, n, 2)


def _meta():
    return {
        "device": "cuda",
        "device_name": "Test GPU",
        "torch": "2.x",
        "triton": "3.x",
        "commit": "abc",
        "timestamp": "now",
    }


def test_make_row_and_writers(tmp_path):
    meta = _meta()

    def row(op, mode, provider, m, n, variant, ms, copy_gbps):
        return bench.make_row(
            meta, op, mode, provider, torch.bfloat16, m, n, variant, ms, copy_gbps
        )

    rows = [row("copy", "forward", "torch", 1, 2**20, "eager", 0.001, 2000.0)]
    for n in (1024, 4096, 16384):
        for prov, ms in (("rmsnorm", 0.5), ("torch", 1.0)):
            rows.append(row("rms_norm", "backward", prov, 2**22 // n, n, "eager", ms, 4000.0))
    rows.append(row("rms_norm", "forward", "rmsnorm", 1, 4096, "cuda_graph", 0.002, 100.0))
    r = rows[1]
    assert r.bytes == 3 * 4096 * 1024 * 2
    assert r.gbps == pytest.approx(r.bytes / 0.5e-3 / 1e9)
    assert r.pct_copy == pytest.approx(100 * r.gbps / 4000.0)
    assert r.dtype == "bfloat16"

    bench.write_csv(rows, tmp_path / "b.csv")
    with open(tmp_path / "b.csv") as f:
        read = list(csv.DictReader(f))
    assert tuple(read[0]) == bench.COLUMNS
    assert len(read) == len(rows)
    assert bench.COLUMNS == (
        "device",
        "device_name",
        "torch",
        "triton",
        "commit",
        "timestamp",
        "op",
        "mode",
        "provider",
        "dtype",
        "M",
        "N",
        "variant",
        "ms",
        "gbps",
        "copy_gbps",
        "pct_copy",
        "bytes",
    )

    bench.write_markdown(rows, tmp_path / "b.md")
    md = (tmp_path / "b.md").read_text()
    assert "Test GPU" in md and "commit abc" in md and "## rms_norm" in md
    assert "**" in md and "µs" in md  # a best cell; the M = 1 row in microseconds

    pytest.importorskip("matplotlib")
    assert bench.write_plot(rows, tmp_path / "b.png")
    assert (tmp_path / "b.png").stat().st_size > 0

    text = bench.summary(rows)
    assert "rms_norm" in text and "torch" in text


def test_writers_are_atomic_and_a_run_keeps_an_earlier_ones_files(tmp_path, monkeypatch):
    """Every file is written under a temporary name and renamed (a failure leaves the old file
    and no stray one); a run whose files exist in --out stops before timing anything unless
    asked to overwrite, through the function and the command alike."""
    from typer.testing import CliRunner

    from rmsnorm.cli import app

    row = ("rms_norm", "forward", "rmsnorm", torch.float32, 8, 1024, "eager", 0.01, 100.0)
    rows = [bench.make_row(_meta(), *row)]
    (tmp_path / "cpu_bench.md").write_text("earlier run\n")
    monkeypatch.setattr(bench, "measure", lambda *a, **k: pytest.fail("timed before the check"))
    with pytest.raises(FileExistsError, match="cpu_bench.md .*--overwrite"):
        bench.run(device="cpu", out=tmp_path)
    args = ["bench", "--device", "cpu", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0 and "--overwrite" in result.output
    assert (tmp_path / "cpu_bench.md").read_text() == "earlier run\n"

    monkeypatch.setattr(bench, "measure", lambda *a, **k: rows)
    assert bench.run(device="cpu", out=tmp_path, overwrite=True, log=lambda m: None) == rows
    assert "rms_norm" in (tmp_path / "cpu_bench.md").read_text()

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(bench.rows.csv, "DictWriter", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        bench.write_csv(rows, tmp_path / "cpu_bench.csv")
    assert "rms_norm" in (tmp_path / "cpu_bench.csv").read_text()  # the old file, whole
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no stray file


def test_cpu_mode_dry_run(tmp_path):
    """The one run loop with the CPU configuration: plan, providers, interleaved timing and
    writers, at tiny shapes."""
    from rmsnorm.bench import measure

    logs = []
    rows = measure("cpu", dry_run=True, log=logs.append)
    got = {(r.op, r.mode, r.provider) for r in rows}
    for mode in ("forward", "backward", "forward_backward"):
        assert ("rms_norm", mode, "rmsnorm") in got and ("rms_norm", mode, "torch") in got
        assert ("layer_norm", mode, "rmsnorm") in got and ("layer_norm", mode, "torch") in got
    assert ("rms_norm", "forward", "hf_llama_eager") in got
    assert ("add_rms_norm", "backward", "torch_add") in got
    for op, hf in (
        ("gated_rms_norm", "hf_qwen3_next_eager"),
        ("gated_rms_norm_grouped", "hf_mamba2_eager"),
    ):
        for mode in ("forward", "backward", "forward_backward"):
            assert {(op, mode, "rmsnorm"), (op, mode, hf)} <= got
    assert {r.device for r in rows} == {"cpu"} and "cores" in rows[0].device_name
    assert info.cpu_vector_unit() in rows[0].device_name  # AVX2 and AVX-512 hosts time apart
    assert {r.variant for r in rows} == {"eager"}  # no CUDA graphs on a CPU
    assert not [line for line in logs if "failed" in line]
    bench.write_csv(rows, tmp_path / "cpu_bench.csv")
    bench.write_markdown(rows, tmp_path / "cpu_bench.md")
    assert "## rms_norm" in (tmp_path / "cpu_bench.md").read_text()


def test_a_run_of_some_ops_only():
    """``ops`` keeps the plan's items of those ops (the copy ceiling is always timed); an unknown
    op is named."""
    import pytest

    from rmsnorm.bench import measure

    rows = measure("cpu", dry_run=True, log=lambda s: None, ops=["gated_rms_norm"])
    assert {r.op for r in rows} == {"gated_rms_norm", "copy"}
    with pytest.raises(ValueError, match="ops"):
        measure("cpu", dry_run=True, log=lambda s: None, ops=["gated"])


def test_gpu_mode_dry_run(tmp_path):
    """The one run loop with the GPU configuration (decode timing with CUDA graphs, the GPU plan),
    on CPU tensors."""
    from rmsnorm.bench import measure

    logs = []
    rows = measure("cuda", dry_run=True, log=logs.append)
    ops = {(r.op, r.mode, r.provider, r.variant) for r in rows}
    assert ("rms_norm", "backward", "rmsnorm", "eager") in ops
    assert ("rms_norm", "forward", "hf_llama_eager", "cuda_graph") in ops
    assert ("add_rms_norm", "backward", "torch_add", "eager") in ops
    assert ("layer_norm", "forward", "torch", "eager") in ops
    assert ("gated_rms_norm", "backward", "hf_qwen3_next_eager", "eager") in ops
    assert ("gated_rms_norm", "forward", "rmsnorm", "cuda_graph") in ops
    assert ("gated_rms_norm_grouped", "forward", "hf_mamba2_eager", "eager") in ops
    assert all(r.ms > 0 and r.bytes > 0 for r in rows)
    assert any("liger: not available" in line for line in logs)
    bench.write_markdown(rows, tmp_path / "dry.md")
    assert "## add_rms_norm" in (tmp_path / "dry.md").read_text()


def test_run_loop_budget_skips_and_failures_are_logged(monkeypatch):
    """Past the budget the remaining items are skipped with a line each; a provider that fails on
    an item is dropped from it with a line, the others still timed."""
    from rmsnorm.bench import cpu, harness, providers

    setup = cpu.setup(dry_run=True)
    logs = []
    setup.budget_s = 0.0
    rows = harness.run(setup, variants=False, log=logs.append)
    assert {r.op for r in rows} == {"copy"}
    assert len([line for line in logs if line.startswith("skipped ")]) == len(setup.plan)

    def broken(*tensors):
        raise RuntimeError("no kernel for this shape")

    setup = cpu.setup(dry_run=True)
    setup.plan, setup.strict = setup.plan[:1], False
    logs.clear()
    real = providers.providers_for
    monkeypatch.setattr(
        providers,
        "providers_for",
        lambda op, liger, compile: {**real(op, liger, compile), "bad": broken},
    )
    rows = harness.run(setup, variants=False, log=logs.append)
    assert "bad" not in {r.provider for r in rows} and "rmsnorm" in {r.provider for r in rows}
    assert any("bad" in line and "no kernel for this shape" in line for line in logs)


def test_run_loop_gives_the_variants_the_runs_budget():
    """The layout sweep's deadline follows the budget of the run (--budget), not the device's
    default."""
    from rmsnorm.bench import cpu, harness

    setup = cpu.setup(dry_run=True)
    setup.plan, setup.budget_s = [], 7.0
    seen = []
    setup.variants = lambda meta, timer, start, budget_s, log: seen.append(budget_s) or []
    harness.run(setup, variants=True, log=lambda line: None)
    assert seen == [7.0]
    logs = []
    harness.run(cpu.setup(dry_run=True), variants=True, log=logs.append)
    assert "variants: this device has one kernel layout; nothing to add" in logs


def test_bench_device_errors_name_the_option(monkeypatch):
    from rmsnorm._validate import ArgumentError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.resolve_device("auto") == "cpu"
    with pytest.raises(ArgumentError, match="device: 'cuda' was asked for") as info:
        bench.run(device="cuda")
    assert info.value.param == "device"
    with pytest.raises(ArgumentError, match="device must be one of"):
        bench.resolve_device("tpu")


def test_variant_configs_include_the_defaults():
    """The layout sweep: valid configs, each (kind, N) group holding the default config, and no
    split grid larger than the SM count."""
    pytest.importorskip("triton")
    from rmsnorm.bench.variants import variant_configs
    from rmsnorm.kernels.triton import _config

    sms = 132
    variants = variant_configs(sms)
    for _kind, n, _label, cfg in variants:
        assert cfg.split * cfg.block_n >= n or cfg.loop
        assert cfg.split == 1 or cfg.programs <= sms
    for kind, n in {(k, n) for k, n, _, _ in variants}:
        default = _config.gpu_config(kind, n, 2, sms)
        assert any(c == default for k, m, _, c in variants if (k, m) == (kind, n))


# ----------------------------------------------------------------------------------------------
# The one timing loop (rmsnorm._timing)
# ----------------------------------------------------------------------------------------------
def test_per_call_s_times_at_the_process_thread_count():
    """torch.utils.benchmark's Timer runs at 1 thread unless told otherwise; the loop must time
    calls at the thread count the process (and a user) runs with."""
    from rmsnorm._timing import per_call_s

    seen = []
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert per_call_s(lambda: seen.append(torch.get_num_threads()), min_run_time=0.001) > 0
    finally:
        torch.set_num_threads(before)
    assert seen and set(seen) == {2}


def test_interleaved_rotates_the_order_and_drops_failures():
    from rmsnorm._timing import interleaved

    order = []
    fns = {k: (lambda k=k: order.append(k)) for k in "abc"}

    def broken():
        raise RuntimeError("no kernel for this shape")

    errors = []
    samples = interleaved(
        {**fns, "x": broken},
        rounds=3,
        min_run_time=0.0005,
        warmup=1,
        start=1,
        on_error=lambda key, exc: errors.append((key, str(exc))),
    )
    assert set(samples) == {"a", "b", "c"} and all(len(v) == 3 for v in samples.values())
    assert all(t > 0 for v in samples.values() for t in v)
    assert errors == [("x", "no kernel for this shape")]
    runs = [order[0]]  # one run of equal letters in `order` per warm-up call or sample
    for k in order[1:]:
        if k != runs[-1]:
            runs.append(k)
    assert runs[:3] == ["a", "b", "c"]  # the warm-up calls, in the given order
    assert runs[3::3] == ["b", "c", "a"]  # the first of each round: from `start`, then rotating
    with pytest.raises(RuntimeError, match="no kernel"):
        interleaved({"x": broken}, rounds=1)
    with pytest.raises(ValueError, match="rounds"):
        interleaved(fns, rounds=0)


# ----------------------------------------------------------------------------------------------
# The latency mode
# ----------------------------------------------------------------------------------------------
def _lat_rows(device="cpu"):
    """Synthetic rows of one small and one large cell, both torch norms and every path of ours."""
    meta = {**_meta(), "device": device}
    rows = []

    def add(op, prov, m, n, us, mode="forward", variant="eager"):
        rows.append(
            bench.make_row(meta, op, mode, prov, torch.float32, m, n, variant, us * 1e-3, 0.0)
        )

    for m, n in ((1, 768), (128, 768)):  # 768 and 98304 elements: either side of 2^16
        add("rms_norm", "torch", m, n, 10.0)
        add("layer_norm", "torch", m, n, 4.0)
        add("rms_norm", "rmsnorm", m, n, 7.0)  # small: 0.7× rms but 1.75× ln; large: 1.75× min
        add("rms_norm", "rmsnorm_module", m, n, 9.0)  # small: 2.25× ln; large: 2.25× min
        add("rms_norm", "hf_patched", m, n, 3.0)  # met everywhere
        add("layer_norm", "rmsnorm", m, n, 6.0)  # 1.5× ln: met small, not met large
        add("add_rms_norm", "torch_add", m, n, 12.0)
        add("add_rms_norm", "rmsnorm", m, n, 12.5)  # not met
    add("generate", "hf_eager", 1, 64, 1000.0)
    add("generate", "hf_patched", 1, 64, 990.0)
    return rows


def test_latency_judge_applies_the_targets():
    from rmsnorm.bench.latency import judge

    met = {(v.op, v.provider, v.M): v.met for v in judge(_lat_rows())}
    assert met == {
        ("rms_norm", "rmsnorm", 1): True,
        ("rms_norm", "rmsnorm", 128): False,
        ("rms_norm", "rmsnorm_module", 1): False,
        ("rms_norm", "rmsnorm_module", 128): False,
        ("rms_norm", "hf_patched", 1): True,
        ("rms_norm", "hf_patched", 128): True,
        ("layer_norm", "rmsnorm", 1): True,
        ("layer_norm", "rmsnorm", 128): False,
        ("add_rms_norm", "rmsnorm", 1): False,
        ("add_rms_norm", "rmsnorm", 128): False,
        ("generate", "hf_patched", 1): True,
    }
    key = ("rms_norm", "rmsnorm", 1)
    small = next(v for v in judge(_lat_rows()) if (v.op, v.provider, v.M) == key)
    assert [(what, limit) for what, _, limit in small.checks] == [
        ("÷ F.rms_norm", 1.0),
        ("÷ F.layer_norm", 2.0),
    ]
    assert small.checks[1][1] == pytest.approx(1.75)


def test_latency_judge_on_cuda_adds_liger_and_the_per_call_limits():
    from rmsnorm.bench.latency import judge

    meta = {**_meta(), "device": "cuda"}

    def row(prov, us, variant="eager", mode="forward", op="rms_norm"):
        return bench.make_row(
            meta, op, mode, prov, torch.bfloat16, 1, 4096, variant, us * 1e-3, 0.0
        )

    rows = [
        row("torch", 30.0),
        row("liger", 15.0),
        row("rmsnorm", 12.0),
        row("layer_norm_unused", 1.0, op="layer_norm"),
        row("torch", 3.0, "cuda_graph"),
        row("rmsnorm", 2.5, "cuda_graph"),
        row("torch", 5.0, "cuda_graph", op="layer_norm"),
    ]
    v = {x.variant: x for x in judge(rows)}
    assert [c[0] for c in v["eager"].checks] == ["÷ F.rms_norm", "÷ Liger", "µs per call"]
    assert v["eager"].met  # 12 µs: under F.rms_norm, Liger and 20 µs
    assert [c[0] for c in v["cuda_graph"].checks][-1] == "µs per call"
    assert not v["cuda_graph"].met  # 2.5 µs per replayed call > 2 µs


def test_latency_writers_on_synthetic_rows(tmp_path):
    from rmsnorm.bench import latency

    rows = _lat_rows()
    latency.write_markdown(rows, tmp_path / "l.md")
    md = (tmp_path / "l.md").read_text()
    assert "**5 of 11 met.**" in md
    for op in ("rms_norm", "layer_norm", "add_rms_norm"):
        assert f"## {op}, forward under no_grad" in md
    assert "## Greedy generate(), per token" in md
    # the rms_norm table: both torch norms beside ours, our time, both ratios and the verdict
    line = next(
        x for x in md.splitlines() if x.startswith("| float32 | 1 | 768 | ≤ 2× F.layer_norm")
    )
    assert "| 10 µs | 4 µs |" in line and "7 µs · 0.7× / 1.75× · met" in line
    assert "9 µs · 0.9× / 2.25× · **not met**" in line
    pytest.importorskip("matplotlib")
    assert latency.write_plot(rows, tmp_path / "l.png")
    assert (tmp_path / "l.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "rmsnorm.RMSNorm" in latency.summary(rows)


def test_latency_quick_run_through_the_cli(tmp_path, one_torch_thread):
    """`rmsnorm bench --latency --quick`: every provider of every cell and pass, the copy and
    generate() rows, in the long-form schema; a readable table and a plot. Structure only."""
    pytest.importorskip("transformers")
    from typer.testing import CliRunner

    from rmsnorm.bench import latency
    from rmsnorm.cli import app

    args = ["bench", "--device", "cpu", "--latency", "--quick", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "failed" not in result.output and "skipped" not in result.output
    with open(tmp_path / "cpu_latency.csv") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == bench.COLUMNS
    rows = bench.read_csv(tmp_path / "cpu_latency.csv")
    assert {r.device for r in rows} == {"cpu"} and "numba" in rows[0].device_name
    assert all(r.commit and r.torch == torch.__version__ and r.ms > 0 for r in rows)
    cells = {(r.M, r.N, r.dtype) for r in rows if r.op != "generate"}
    assert cells == {(m, 768, dt) for m in (1, 128) for dt in ("float32", "bfloat16")}
    want = {
        ("rms_norm", p)
        for p in (
            "rmsnorm",
            "rmsnorm_module",
            "hf_patched",
            "torch",
            "hf_llama_eager",
            "torch_nn_rmsnorm",
        )
    }
    want |= {
        ("layer_norm", "rmsnorm"),
        ("layer_norm", "torch"),
        ("add_rms_norm", "rmsnorm"),
        ("add_rms_norm", "torch_add"),
    }
    for cell in cells:
        for mode in ("forward", "forward_backward"):
            got = {
                (r.op, r.provider)
                for r in rows
                if (r.M, r.N, r.dtype) == cell and r.mode == mode and r.op != "copy"
            }
            assert got == want, (cell, mode)
        assert [r.op for r in rows if (r.M, r.N, r.dtype) == cell].count("copy") == 1
    assert {(r.op, r.provider, r.N) for r in rows if r.op == "generate"} == {
        ("generate", "hf_eager", 64),
        ("generate", "hf_patched", 64),
    }
    leaf = {(r.M, r.N, r.dtype) for r in rows if r.mode == "forward_backward_leaf"}
    assert leaf == {(1, 768, dt) for dt in ("float32", "bfloat16")}  # below 2^16 elements only
    verdicts = latency.judge(rows)
    assert len(verdicts) == (4 * 2 + 2) * 5 + 1  # (cells × passes + leaf cells) × paths, generate
    md = (tmp_path / "cpu_latency.md").read_text()
    assert "commit" in md and "## Targets" in md and "## Greedy generate(), per token" in md
    assert "Load average" in md
    assert md.count(" met") >= len(verdicts)  # "met" or "not met" in every judged cell
    for op in ("rms_norm", "layer_norm", "add_rms_norm"):
        for title in ("forward under no_grad", "forward + backward", "forward + .backward() into"):
            assert f"## {op}, {title}" in md
    assert (tmp_path / "cpu_latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_latency_mode_runs_on_the_one_harness():
    """The latency grid is a plan of the harness: its cells and generate() items, skipped past
    the budget with a line each, as the throughput mode's items are."""
    from rmsnorm.bench import harness, latency

    setup = latency.setup("cpu", quick=True, budget_s=1e-9)
    assert {item.kind for item in setup.plan} <= {"cell", "generate"}
    assert setup.title == "latency (cpu)" and setup.copy_numel is None
    logs = []
    assert harness.run(setup, log=logs.append) == []
    skipped = [line for line in logs if line.startswith("skipped ")]
    assert len(skipped) == len(setup.plan)
    assert skipped[0] == "skipped (1, 768) float32: time budget 0 s spent"


# ----------------------------------------------------------------------------------------------
# benchmarks/probes/cpu_vector_width.py: the child's report and the script's refusals (no timing
# checked)
# ----------------------------------------------------------------------------------------------
def _vector_width_script(*args: str, env_src: str | None = None):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": env_src or str(root / "src")}
    return subprocess.run(
        [sys.executable, str(root / "benchmarks" / "probes" / "cpu_vector_width.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_vector_width_child_reports_every_kernel_of_each_case():
    import json

    from rmsnorm import _backend

    if not _backend.cpu_kernels_available():
        pytest.skip("the CPU kernels are not available")
    done = _vector_width_script("--child", "--cases", "float32:4x64")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    kernels = {k.split(" | ")[0] for k in out}
    assert {"RMSNorm forward", "RMSNorm backward", "LayerNorm forward", "LayerNorm backward"} <= (
        kernels
    )
    assert "F.layer_norm forward (same in both)" in kernels  # the drift check, timed in each
    assert all(k.endswith("| float32 4 × 64") and v > 0 for k, v in out.items()) and len(out) == 7


def test_vector_width_script_refuses_bad_cases_and_an_existing_out(tmp_path):
    done = _vector_width_script("--child", "--cases", "float32:4by64")
    assert done.returncode != 0 and "is not dtype:MxN" in done.stderr
    done = _vector_width_script("--child", "--cases", "int8:4x64")
    assert done.returncode != 0 and "needs a float32, bfloat16 or float16 dtype" in done.stderr
    out = tmp_path / "vw.md"
    out.write_text("kept")
    src = str(tmp_path)  # any directory with an rmsnorm package passes the --before check
    (tmp_path / "rmsnorm").mkdir()
    done = _vector_width_script("--before", src, "--out", str(out))
    assert done.returncode != 0 and "--overwrite" in done.stderr and out.read_text() == "kept"
    done = _vector_width_script("--before", str(tmp_path / "nowhere"))
    assert done.returncode != 0 and "--before must be the src directory" in done.stderr
    done = _vector_width_script("--widths", "512,1024")
    assert done.returncode != 0 and "--widths must be two of 256 and 512" in done.stderr
    done = _vector_width_script("--widths", "256,512", "--threads", "0")
    assert done.returncode != 0 and "--threads must be a positive integer" in done.stderr


def test_a_provider_in_the_table_is_timed_by_both_modes(monkeypatch):
    """docs/architecture.md's recipe: a provider listed once in ``providers.providers_for`` is
    timed by the throughput mode and by the latency mode, every pass, with no other change."""
    from rmsnorm.bench import cpu, harness, latency, providers

    real = providers.providers_for

    def extra(x, w):  # a peer of rms_norm, taking the op's tensors (providers.OP_ARGS)
        return x * w

    def with_extra(op, liger, compile=True):
        table = real(op, liger, compile)
        return {**table, "extra": extra} if op == "rms_norm" else table

    monkeypatch.setattr(providers, "providers_for", with_extra)
    setup = cpu.setup(dry_run=True)
    setup.plan = [item for item in setup.plan if item.op == "rms_norm"][:1]
    rows = harness.run(setup, variants=False, log=lambda line: None)
    assert {r.mode for r in rows if r.provider == "extra"} == set(setup.plan[0].modes)
    meta = latency._device_meta("cpu", quick=True)
    gen = torch.Generator().manual_seed(0)
    rows = latency._cell(meta, "cpu", 1, 64, torch.float32, None, gen, True, lambda line: None)
    assert {r.mode for r in rows if (r.op, r.provider) == ("rms_norm", "extra")} == set(
        latency.PASSES
    )
