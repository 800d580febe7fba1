"""The benchmark harness without a GPU: bytes model, rows, writers, and a dry run of the GPU mode's
whole loop on CPU tensors at tiny shapes."""

from __future__ import annotations

import csv

import pytest
import torch

from rmsnorm import bench


def test_bytes_model():
    m, n = 4, 1024
    assert bench.bytes_moved("rms_norm", "forward", m, n, 2) == 2 * m * n * 2
    assert bench.bytes_moved("rms_norm", "backward", m, n, 2) == 3 * m * n * 2
    assert bench.bytes_moved("layer_norm", "forward_backward", m, n, 4) == 5 * m * n * 4
    assert bench.bytes_moved("add_rms_norm", "forward", m, n, 2) == 4 * m * n * 2
    assert bench.bytes_moved("add_rms_norm", "backward", m, n, 2) == 4 * m * n * 2
    assert bench.bytes_moved("copy", "forward", m, n, 2) == 2 * m * n * 2
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
    rows = [bench.make_row(meta, "copy", "forward", "torch", torch.bfloat16, 1, 2**20, "eager",
                           0.001, 2000.0)]  # fmt: skip
    for n in (1024, 4096, 16384):
        for prov, ms in (("rmsnorm", 0.5), ("torch", 1.0)):
            rows.append(bench.make_row(meta, "rms_norm", "backward", prov, torch.bfloat16,
                                       2**22 // n, n, "eager", ms, 4000.0))  # fmt: skip
    rows.append(bench.make_row(meta, "rms_norm", "forward", "rmsnorm", torch.bfloat16, 1, 4096,
                               "cuda_graph", 0.002, 100.0))  # fmt: skip
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
        "device", "device_name", "torch", "triton", "commit", "timestamp", "op", "mode",
        "provider", "dtype", "M", "N", "variant", "ms", "gbps", "copy_gbps", "pct_copy", "bytes",
    )  # fmt: skip

    bench.write_markdown(rows, tmp_path / "b.md")
    md = (tmp_path / "b.md").read_text()
    assert "Test GPU" in md and "commit abc" in md and "## rms_norm" in md
    assert "**" in md and "µs" in md  # a best cell; the M = 1 row in microseconds

    pytest.importorskip("matplotlib")
    assert bench.write_plot(rows, tmp_path / "b.png")
    assert (tmp_path / "b.png").stat().st_size > 0

    text = bench.summary(rows)
    assert "rms_norm" in text and "torch" in text


def test_cpu_mode_dry_run(tmp_path):
    """The CPU mode's plan, providers, interleaved timing and writers, at tiny shapes."""
    from rmsnorm.bench import cpu

    logs = []
    rows = cpu.run(quick=True, dry_run=True, log=logs.append)
    got = {(r.op, r.mode, r.provider) for r in rows}
    for mode in ("forward", "backward", "forward_backward"):
        assert ("rms_norm", mode, "rmsnorm") in got and ("rms_norm", mode, "torch") in got
        assert ("layer_norm", mode, "rmsnorm") in got and ("layer_norm", mode, "torch") in got
    assert ("rms_norm", "forward", "hf_llama_eager") in got
    assert ("add_rms_norm", "backward", "torch_add") in got
    assert {r.device for r in rows} == {"cpu"} and "cores" in rows[0].device_name
    assert not [line for line in logs if "failed" in line]
    bench.write_csv(rows, tmp_path / "cpu_bench.csv")
    bench.write_markdown(rows, tmp_path / "cpu_bench.md")
    assert "## rms_norm" in (tmp_path / "cpu_bench.md").read_text()


def test_gpu_mode_dry_run(tmp_path):
    """The GPU mode's plan, providers, modes, decode timing and writers, on CPU tensors."""
    from rmsnorm.bench import gpu

    logs = []
    rows = gpu.run(quick=True, dry_run=True, log=logs.append)
    ops = {(r.op, r.mode, r.provider, r.variant) for r in rows}
    assert ("rms_norm", "backward", "rmsnorm", "eager") in ops
    assert ("rms_norm", "forward", "hf_llama_eager", "cuda_graph") in ops
    assert ("add_rms_norm", "backward", "torch_add", "eager") in ops
    assert ("layer_norm", "forward", "torch", "eager") in ops
    assert all(r.ms > 0 and r.bytes > 0 for r in rows)
    bench.write_markdown(rows, tmp_path / "dry.md")
    assert "## add_rms_norm" in (tmp_path / "dry.md").read_text()


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
        default = _config._gpu_config(kind, n, 2, sms)
        assert any(c == default for k, m, _, c in variants if (k, m) == (kind, n))
