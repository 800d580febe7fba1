"""The lab package as a whole (lab/__init__.py): importing it, or any of its experiments, pulls in
none of the extras; ``rmsnorm.analysis``, its former name, still imports and warns once."""

import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import rmsnorm
import rmsnorm.lab

# --------------------------------------------------------------------------------------------------
# The lab package as a whole (lab/__init__.py): importing it, or any of its experiments, pulls in
# none of the extras (matplotlib, rich, scipy, transformers); each is imported when a command needs
# it.


def test_importing_the_lab_needs_no_extra():
    code = (
        "import sys, rmsnorm.lab, rmsnorm.lab.simulation, rmsnorm.lab.inspection, "
        "rmsnorm.lab.comparison, rmsnorm.lab.report, rmsnorm.lab.seeds, rmsnorm.lab.sweep, "
        "rmsnorm.lab.trained, rmsnorm.lab.swap, rmsnorm.lab.outliers, rmsnorm.lab.planted, "
        "rmsnorm.lab.conventions, rmsnorm.lab.decomposition; "
        "bad = [m for m in ('matplotlib', 'rich', 'scipy', 'transformers', 'triton') "
        "if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_public_names_resolve():
    for name in rmsnorm.lab.__all__:
        assert getattr(rmsnorm.lab, name) is not None, name


# --------------------------------------------------------------------------------------------------
# ``rmsnorm.analysis``, the lab's former name: it still imports, with the same names and
# submodules, warns once that it is deprecated, and nothing in this repository uses it.

ROOT = Path(__file__).resolve().parents[2]


def _forget_the_alias():
    for name in [n for n in sys.modules if n.split(".")[:2] == ["rmsnorm", "analysis"]]:
        del sys.modules[name]
    if "analysis" in vars(rmsnorm):
        delattr(rmsnorm, "analysis")


def test_old_imports_work_and_warn_once():
    _forget_the_alias()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import rmsnorm.analysis.transformer as transformer
        from rmsnorm.analysis.inspection import LoadedModel, load_model
        from rmsnorm.analysis.plots import ratio_by_layer, timing_bars
        from rmsnorm.analysis.simulate import SimulationConfig

        import rmsnorm.analysis
        from rmsnorm.analysis import inspect_model, simulate
        from rmsnorm.lab.report.render import timing_bars as new_timing_bars
    ours = [w for w in caught if "rmsnorm.analysis" in str(w.message)]
    assert len(ours) == 1 and ours[0].category is DeprecationWarning
    assert "rmsnorm.lab" in str(ours[0].message)
    assert ours[0].filename == __file__  # it points at the import to change, not at the alias
    assert transformer.Transformer is rmsnorm.lab.transformer.Transformer
    assert sys.modules["rmsnorm.analysis.transformer"] is transformer
    assert simulate is rmsnorm.lab.simulate and inspect_model is rmsnorm.lab.inspect_model
    assert SimulationConfig is rmsnorm.lab.SimulationConfig
    assert ratio_by_layer is rmsnorm.lab.simulation.ratio_by_layer
    assert timing_bars is new_timing_bars
    # renamed: the old names are the new functions
    assert load_model is rmsnorm.analysis.load_model is rmsnorm.lab.load_runnable_model
    assert LoadedModel is rmsnorm.lab.RunnableModel
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        rmsnorm.analysis.stats.nothing  # noqa: B018
    assert set(rmsnorm.analysis.__all__) == set(rmsnorm.lab.__all__) | {"load_model"}
    for name in rmsnorm.lab.__all__:
        assert getattr(rmsnorm.analysis, name) is getattr(rmsnorm.lab, name), name


IMPORTS = re.compile(
    r"^\s*(from\s+rmsnorm\.analysis\b|import\s+rmsnorm\.analysis\b|from\s+\.+analysis\b)"
    r"|import_module\([\"']rmsnorm\.analysis\b",
    re.M,
)


def test_nothing_here_imports_the_old_name():
    for line in (
        "from rmsnorm.analysis import x",
        "import rmsnorm.analysis.stats as s",
        "    from ..analysis.progress import ensure",
        "import_module('rmsnorm.analysis')",
    ):
        assert IMPORTS.search(line), line
    assert not IMPORTS.search("from rmsnorm.lab import analysis_of_things")
    files = [*ROOT.glob("src/**/*.py"), *ROOT.glob("tests/**/*.py"), *ROOT.glob("benchmarks/*.py")]
    files += [ROOT / "README.md", *ROOT.glob("docs/*.md")]
    skip = {ROOT / "src/rmsnorm/analysis/__init__.py", Path(__file__).resolve()}
    users = [
        str(f.relative_to(ROOT)) for f in files if f not in skip and IMPORTS.search(f.read_text())
    ]
    assert users == []
