"""The machine facts of ``rmsnorm.info``, each found in one place: the source commit (honouring
``RMSNORM_COMMIT``), the CPU model, versions, the load, the one-line machine description."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import rmsnorm
from rmsnorm import info

PACKAGE = Path(rmsnorm.__file__).resolve().parent


def test_commit_from_the_environment_wins(monkeypatch):
    monkeypatch.setenv("RMSNORM_COMMIT", "abc123 ")
    assert info.source_commit() == "abc123"
    assert info.source_commit(short=True) == "abc123"


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_commit_of_this_checkout(monkeypatch):
    monkeypatch.delenv("RMSNORM_COMMIT", raising=False)
    root = PACKAGE.parents[1]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True)
    if head.returncode != 0 or not (root / ".git").exists():
        pytest.skip("not running from a git checkout")
    commit = info.source_commit()
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", commit)
    assert commit.startswith(head.stdout.strip())
    assert info.source_commit(short=True) == commit[:12] + commit[40:]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_no_commit_for_a_copy_inside_another_repository(tmp_path):
    """A package installed into a virtual environment inside some project is not that project's
    code: its commit is not reported as the package's."""
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    installed = tmp_path / "venv" / "site-packages" / "rmsnorm"
    installed.mkdir(parents=True)
    (installed / "__init__.py").write_text("")
    env = ["-c", "user.name=t", "-c", "user.email=t@t.invalid"]
    subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
    subprocess.run(["git", *env, "commit", "-qm", "x"], cwd=tmp_path, check=True)
    assert info._git_commit(installed) is None
    checkout = tmp_path / "src" / "rmsnorm"  # the layout of this project's own checkout
    checkout.mkdir(parents=True)
    assert re.fullmatch(r"[0-9a-f]{40}", info._git_commit(checkout))
    assert info._git_commit(tmp_path.parent) is None  # not a checkout at all


def test_comparison_records_the_environment_commit(monkeypatch):
    from rmsnorm.lab.experiments.comparison import machine_info

    monkeypatch.setenv("RMSNORM_COMMIT", "f00dfeed")
    assert machine_info("cpu")["commit"] == "f00dfeed"


def test_cpu_and_machine_description():
    model = info.cpu_model()
    assert model and model == model.strip()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        lines = cpuinfo.read_text().splitlines()
        names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
        if names:
            assert model == names[0]
    text = info.machine_description()
    assert text.startswith(f"{model}, {info.cpu_cores()} logical cores")
    # the vector unit: hosts of one model name with and without AVX-512 time differently
    unit = info.cpu_vector_unit()
    assert unit == torch.backends.cpu.get_cpu_capability() and f", {unit}," in text
    assert f"{torch.get_num_threads()} torch thread" in text
    assert ("GPU" in text) == torch.cuda.is_available()


def test_the_cpu_kernels_vector_width_is_reported_as_compiled():
    from rmsnorm import _backend

    said = info.environment()["cpu kernel vectors"]
    if not _backend.cpu_kernels_available():
        assert said is None
        return
    from rmsnorm.kernels.cpu import runtime

    fwd, bwd = runtime.VECTOR_BITS, runtime.VECTOR_BITS_BWD
    assert runtime.VECTOR_WHY in said
    if fwd is None:
        assert said.startswith("LLVM's choice")
    elif fwd == bwd:
        assert said.startswith(f"{fwd}-bit (")
    else:
        assert said.startswith(f"forward {fwd}-bit, backward {bwd}-bit (")


def test_the_cpu_kernels_stores_are_reported_as_chosen():
    from rmsnorm import _backend

    said = info.environment()["cpu kernel stores"]
    if not _backend.cpu_kernels_available():
        assert said is None
        return
    from rmsnorm.kernels.cpu import runtime

    assert said == runtime.STREAM_WHY
    if runtime.STREAM_BYTES is None:
        assert said.startswith("ordinary stores (")
    else:
        assert said.startswith("non-temporal stores from ")


def test_the_cpu_kernels_threading_is_reported_with_torchs_thread_count():
    from rmsnorm import _backend

    if not _backend.cpu_kernels_available():
        assert info.environment()["cpu kernel threading"] is None
        return
    from rmsnorm.kernels.cpu import launchers, pool, runtime

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = info.environment()["cpu kernel threading"]
        torch.set_num_threads(1)
        one = info.cpu_kernel_threading()
    finally:
        torch.set_num_threads(before)
    assert "2 threads (torch.get_num_threads())" in two
    assert f"2^{pool.POOL_FROM.bit_length() - 1}" in two and "helper pool" in two
    assert f"below 2^{launchers.PARALLEL_MIN.bit_length() - 1} the calling thread" in two
    assert ("OpenMP team" in two) == bool(pool.USE_OPENMP and pool._gomp)
    assert one.startswith("the calling thread alone (1 thread")
    if runtime.STREAM_BYTES is not None:
        assert f"streaming stores from {runtime.STREAM_BYTES >> 20} MiB" in one
    else:
        assert "ordinary stores" in one


def test_versions_and_load():
    assert info.package_version("torch") is not None
    assert info.package_version("surely-not-an-installed-distribution") is None
    load = info.load_average()
    assert load is None or (len(load) == 3 and all(v >= 0 for v in load))
    assert info.describe_backend("cpu")


def test_benchmark_rows_carry_the_same_facts(monkeypatch):
    from rmsnorm.bench import machine

    monkeypatch.setenv("RMSNORM_COMMIT", "f00dfeed")
    meta = machine("cpu")
    assert meta["commit"] == "f00dfeed" and meta["device_name"] == info.cpu_model()
    assert meta["triton"] == (info.package_version("triton") or "none")


def test_served_calls_name_the_path_backend_and_a_hand_off_to_the_reference():
    from rmsnorm import _backend

    served = info.served_calls((torch.float32, torch.float64))
    backend = _backend.describe("cpu")
    assert served["float32"]["rms_norm"] == f"launch path, {backend} backend"
    assert set(served["float64"]) == {"rms_norm", "add_rms_norm", "gated_rms_norm", "layer_norm"}
    if backend == "cpu":  # the CPU kernels compute in float32: float64 goes to the reference
        for op, text in served["float64"].items():
            assert text.startswith("launch path, cpu backend → reference: a float64 tensor"), op
        assert not any("→ reference" in text for text in served["float32"].values())
    assert not rmsnorm._calls.recording  # the probe leaves recording as it found it
