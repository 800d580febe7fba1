"""The lab package as a whole (lab/__init__.py): importing it, or any of its experiments, pulls in
none of the extras."""

import subprocess
import sys

import rmsnorm
import rmsnorm.lab

# --------------------------------------------------------------------------------------------------
# The lab package as a whole (lab/__init__.py): importing it, or any of its experiments, pulls in
# none of the extras (matplotlib, rich, scipy, transformers); each is imported when a command needs
# it.


def test_importing_the_lab_needs_no_extra():
    code = (
        "import sys, rmsnorm.lab, rmsnorm.lab.experiments.simulation, "
        "rmsnorm.lab.experiments.inspection, rmsnorm.lab.experiments.comparison, "
        "rmsnorm.lab.report, rmsnorm.lab.models, rmsnorm.lab.stats, "
        "rmsnorm.lab.experiments, rmsnorm.lab.experiments.simulation.seeds, "
        "rmsnorm.lab.experiments.sweep, rmsnorm.lab.experiments.trained, "
        "rmsnorm.lab.experiments.swap, rmsnorm.lab.experiments.planted, "
        "rmsnorm.lab.stats.outliers, rmsnorm.lab.stats.conventions, "
        "rmsnorm.lab.stats.decomposition; "
        "bad = [m for m in ('matplotlib', 'rich', 'scipy', 'transformers', 'triton') "
        "if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_public_names_resolve():
    for name in rmsnorm.lab.__all__:
        assert getattr(rmsnorm.lab, name) is not None, name
