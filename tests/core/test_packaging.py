"""The package as a user gets it: an sdist built from this checkout, a wheel built from that sdist,
installed into a fresh virtual environment and run there. Skipped only where nothing can be built
(no setuptools >= 77.0.3, no venv, no pip); no network is used."""

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NEEDS_SETUPTOOLS = (77, 0, 3)  # PEP 639 license metadata, as pyproject.toml's build-system says
# Never part of a build; a checkout may hold GBs of them (.venv, results of runs).
BUILD_OUTPUTS = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"
)


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _copy_checkout(dest: Path) -> None:
    """The files a commit of this checkout would hold (tracked, or new and not ignored), or, outside
    a git checkout (an unpacked sdist), everything but build outputs."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        shutil.copytree(ROOT, dest, ignore=BUILD_OUTPUTS)
        return
    names = list(filter(None, listed.decode().split("\0")))
    if not names:  # inside another project's checkout, which does not list these files
        shutil.copytree(ROOT, dest, ignore=BUILD_OUTPUTS)
        return
    for name in names:
        src = ROOT / name
        if src.is_file():  # a tracked file deleted in the work tree is not part of the next commit
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def _run(args, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, **kw)
    assert proc.returncode == 0, f"{args}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def _build(backend_call: str, source: Path, out: Path) -> tuple[Path, str]:
    """Call setuptools' PEP 517 backend in ``source`` as a frontend does without isolation."""
    code = (
        "import sys\n"
        "from setuptools import build_meta\n"
        f"print(build_meta.{backend_call}(sys.argv[1]))\n"
    )
    proc = _run([sys.executable, "-c", code, str(out)], cwd=source)
    return out / proc.stdout.strip().splitlines()[-1], proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    try:
        import setuptools
    except ImportError:
        pytest.skip("setuptools is not installed: nothing can build the package here")
    if _version_tuple(setuptools.__version__) < NEEDS_SETUPTOOLS:
        pytest.skip(f"setuptools {setuptools.__version__} predates PEP 639 license metadata")
    tmp = tmp_path_factory.mktemp("package")
    checkout, dist = tmp / "checkout", tmp / "dist"
    dist.mkdir()
    _copy_checkout(checkout)
    sdist, sdist_log = _build("build_sdist", checkout, dist)
    with tarfile.open(sdist) as tar:
        # the "data" filter (3.10.12+) refuses links and paths outside the target
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(tmp / "unpacked", **kw)
    (unpacked,) = (tmp / "unpacked").iterdir()
    wheel, wheel_log = _build("build_wheel", unpacked, dist)
    return {"sdist": sdist, "wheel": wheel, "log": sdist_log + wheel_log, "tmp": tmp}


def test_sdist_carries_what_its_tests_and_docs_need(built):
    with tarfile.open(built["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    expected = {"LICENSE", "README.md", "pyproject.toml", "MANIFEST.in", "src/rmsnorm/py.typed"}
    expected |= {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py")}
    expected |= {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.txt")}
    expected |= {str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")}
    assert "tests/conftest.py" in expected
    assert expected <= names, sorted(expected - names)


def test_wheel_holds_every_module_the_license_and_py_typed(built):
    with zipfile.ZipFile(built["wheel"]) as whl:
        names = set(whl.namelist())
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(whl.read(metadata).decode())
    modules = {str(p.relative_to(ROOT / "src")) for p in (ROOT / "src" / "rmsnorm").rglob("*.py")}
    assert modules <= names, sorted(modules - names)
    assert "rmsnorm/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert meta["License-Expression"] == "Apache-2.0"
    requires = meta.get_all("Requires-Dist")
    for dist in ("torch", "numpy", "typer", "rich"):  # the CLI's own needs are not an extra
        assert any(r.startswith(dist) and "extra ==" not in r for r in requires), dist
    assert any(r.startswith("matplotlib") and 'extra == "lab"' in r for r in requires)
    # the table form of `license` made every build warn that it stops working in 2027
    assert "License :: " not in built["log"] and "project.license" not in built["log"]


def test_wheel_installs_and_runs_in_a_fresh_venv(built):
    """A fresh venv reuses the already-installed torch & co. (no network): this interpreter's
    site-packages are appended to its path by a .pth file, after its own, so the installed wheel
    is what `import rmsnorm` finds; those directories' own .pth files (an editable install of this
    checkout) are not run."""
    venv = built["tmp"] / "venv"
    try:
        import venv as _venv  # noqa: F401
    except ImportError:
        pytest.skip("the venv module is missing: no fresh environment can be made")
    _run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)])
    bindir = "Scripts" if os.name == "nt" else "bin"
    python = venv / bindir / ("python.exe" if os.name == "nt" else "python")
    purelib = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
        ).stdout.strip()
    )
    outer = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (purelib / "_outer_site_packages.pth").write_text("\n".join(sorted(outer)) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RMSNORM_BACKEND")}
    pip = subprocess.run(
        [str(python), "-m", "pip", "--version"], capture_output=True, env=env, timeout=120
    )
    if pip.returncode != 0:
        pytest.skip("pip is not importable: nothing can install the wheel")
    _run(
        [str(python), "-m", "pip", "install", "--no-index", "--no-deps", "--force-reinstall"]
        + ["--disable-pip-version-check", "-q", str(built["wheel"])],
        env=env,
    )
    check = (
        "import importlib.metadata as md, pathlib, sys, torch, rmsnorm\n"
        "assert pathlib.Path(rmsnorm.__file__).is_relative_to(sys.prefix), rmsnorm.__file__\n"
        "assert md.version('rmsnorm') == rmsnorm.__version__\n"
        "assert 'triton' not in sys.modules and 'transformers' not in sys.modules\n"
        "x = torch.randn(4, 64)\n"
        "with rmsnorm.use_backend('reference'):\n"
        "    y = rmsnorm.rms_norm(x, (64,), torch.ones(64), 1e-6)\n"
        "ref = torch.nn.functional.rms_norm(x, (64,), torch.ones(64), 1e-6)\n"
        "torch.testing.assert_close(y, ref)\n"
        "print('ok', rmsnorm.__version__)\n"
    )
    out = _run([str(python), "-c", check], env=env, cwd=built["tmp"]).stdout
    assert out.startswith("ok ")
    script = venv / bindir / ("rmsnorm.exe" if os.name == "nt" else "rmsnorm")
    info = _run([str(script), "info"], env={**env, "COLUMNS": "200"}, cwd=built["tmp"]).stdout
    assert "rmsnorm info" in info and out.split()[1] in info
