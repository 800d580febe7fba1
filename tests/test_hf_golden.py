"""The golden list: how ``rmsnorm.integrations.hf`` decides every normalization class of one
transformers version, one line per class, kept in ``tests/golden/``. A change to the recognition
shows here class by class (which classes it patches or refuses now, and why); a new transformers
version gets its own list.

Write the list of the installed version (after checking the difference it reports)::

    RMSNORM_WRITE_GOLDEN=1 .venv/bin/python -m pytest tests/test_hf_golden.py
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
from pathlib import Path

import pytest

from rmsnorm.integrations import hf

transformers = pytest.importorskip("transformers")

GOLDEN = Path(__file__).parent / "golden"
WRITE = os.environ.get("RMSNORM_WRITE_GOLDEN") == "1"


def describe(conv: hf.Convention) -> str:
    """A convention in one line: its kind, then every field that differs from the default."""
    defaults = hf.Convention("rms", "eps")
    parts = [conv.kind]
    for f in dataclasses.fields(conv):
        value = getattr(conv, f.name)
        if f.name == "kind" or (f.name != "eps_attr" and value == getattr(defaults, f.name)):
            continue
        parts.append(f"{f.name}={value!r}")
    return " ".join(parts)


def decisions() -> tuple[list[str], set[str]]:
    """``model.Class: decision`` for every class of the installed transformers' modeling files
    that is named like a norm or that :func:`hf.patch` would patch, sorted, and the modeling files
    that cannot be imported here (a missing optional dependency), each listed as one line too."""
    lines, missing = [], set()
    for name in hf._modeling_module_names():
        model = name.split(".")[2]
        prefix = model if name.endswith(f"modeling_{model}") else name.split(".", 2)[2]
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            lines.append(f"{prefix}: not importable here ({type(exc).__name__})")
            missing.add(model)
            continue
        for cls in hf._module_classes(module):
            decision = hf._decide(cls)
            patched = isinstance(decision, hf.Convention)
            if not patched and "norm" not in cls.__name__.lower():
                continue
            what = f"patched {describe(decision)}" if patched else f"refused: {decision}"
            lines.append(f"{prefix}.{cls.__name__}: {what}")
    return sorted(lines), missing


def _model(line: str) -> str:
    return line.split(":", 1)[0].split(".", 1)[0]


def golden_path() -> Path:
    return GOLDEN / f"hf_classes-transformers-{transformers.__version__}.txt"


def test_every_class_is_decided_as_the_golden_list_says():
    path = golden_path()
    current, missing = decisions()
    if WRITE:
        GOLDEN.mkdir(exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("\n".join(current) + "\n")
        tmp.replace(path)  # atomic: a failed write leaves the old list
    if not path.exists():
        pytest.skip(
            f"no golden list for transformers {transformers.__version__} in {GOLDEN}; write one "
            "with RMSNORM_WRITE_GOLDEN=1 (see this module's docstring)"
        )
    # A model whose modeling file cannot be imported (here or where the list was written: an
    # optional dependency) is compared on neither side.
    golden = path.read_text().splitlines()
    missing |= {_model(line) for line in golden if "not importable here" in line}
    golden = [line for line in golden if _model(line) not in missing]
    current = [line for line in current if _model(line) not in missing]
    if current != golden:
        diff = "\n".join(difflib.unified_diff(golden, current, "golden", "now", lineterm="", n=0))
        pytest.fail(
            f"the decisions differ from {path.name} (if intended, rewrite it with "
            f"RMSNORM_WRITE_GOLDEN=1):\n{diff}"
        )
