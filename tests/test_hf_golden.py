"""The golden list: how ``rmsnorm.integrations.hf`` decides every normalization class of one
transformers version, one line per class, kept in ``tests/golden/``. A change to the recognition
shows here class by class (which classes it patches or refuses now, and why); a new transformers
version gets its own list. The counts README.md and docs/integrations.md quote are checked
against the list of the version they name.

Write the list of the installed version (after checking the difference it reports)::

    RMSNORM_WRITE_GOLDEN=1 .venv/bin/python -m pytest tests/test_hf_golden.py
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
import re
from pathlib import Path

import pytest

from rmsnorm.integrations import hf
from rmsnorm.integrations.hf import discovery, known_forwards, recognition, registry

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
    for name in discovery.modeling_module_names():
        model = name.split(".")[2]
        prefix = model if name.endswith(f"modeling_{model}") else name.split(".", 2)[2]
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            lines.append(f"{prefix}: not importable here ({type(exc).__name__})")
            missing.add(model)
            continue
        for cls in discovery.module_classes(module):
            decision = registry.decide(cls)
            patched = isinstance(decision, hf.Convention)
            if not patched and "norm" not in cls.__name__.lower():
                continue
            origin = recognition.known_origin(cls)
            like = f" like {origin}" if origin and origin != f"{prefix}.{cls.__name__}" else ""
            what = f"patched{like}: {describe(decision)}" if patched else f"refused: {decision}"
            lines.append(f"{prefix}.{cls.__name__}: {what}")
    return sorted(lines), missing


def _model(line: str) -> str:
    return line.split(":", 1)[0].split(".", 1)[0]


def test_every_class_is_decided_as_the_golden_list_says():
    transformers = pytest.importorskip("transformers")
    path = GOLDEN / f"hf_classes-transformers-{transformers.__version__}.txt"
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


# ------------------------------------------------------------------------------------------------
# The counts README.md and docs/integrations.md quote are the golden list's (of the version they
# name), and its table's per-forward counts are those of the classes that match each forward.
# ------------------------------------------------------------------------------------------------
DOCS_VERSION = "5.24.0"
ROOT = Path(__file__).resolve().parents[1]

_REFUSAL_KINDS = {
    "none": "its forward is none of the known normalization forwards",
    "second input": "besides self and is none of the known gated",
    "more inputs": "besides self; this library's ops",
    "container": "it is a container",
    "no forward": "it has no forward",
}


def summary(lines: list[str]) -> dict:
    """Counts of a golden list: patched, refused (and by kind), total, the gated classes
    patched, and the classes matching each known forward (by the "model.Class" it comes from)."""
    rows = [line.partition(": ")[::2] for line in lines if "not importable here" not in line]
    patched = [(name, what) for name, what in rows if what.startswith("patched")]
    refused = [what for _, what in rows if what.startswith("refused: ")]
    kinds = {k: sum(text in r for r in refused) for k, text in _REFUSAL_KINDS.items()}
    origins: dict[str, int] = {}
    for name, what in patched:
        head = what.split(": ", 1)[0]
        origin = head.removeprefix("patched like ") if " like " in head else name
        origins[origin] = origins.get(origin, 0) + 1
    gated = sum("Gated" in name.rsplit(".", 1)[-1] for name, _ in patched)
    return dict(
        patched=len(patched), refused=len(refused), total=len(rows), kinds=kinds,
        origins=origins, gated=gated,
    )  # fmt: skip


def _text(path: Path) -> str:
    return " ".join(path.read_text().split())  # whitespace-insensitive (line breaks)


def test_the_docs_quote_the_golden_counts():
    path = GOLDEN / f"hf_classes-transformers-{DOCS_VERSION}.txt"
    s = summary(path.read_text().splitlines())
    k = s["kinds"]
    assert sum(k.values()) == s["refused"], k  # every refusal is of a kind the docs name
    readme = _text(ROOT / "README.md")
    for phrase in [
        f"`hf.patch` patches {s['patched']} of the {s['total']} norm classes of transformers 5.24",
        f"all {s['gated']} gated RMSNorms",
        f"The {s['refused']} refused",
        f"({k['none']}:",
        f"not a gate ({k['second input']})",
        f"take more inputs ({k['more inputs']})",
        f"have no forward ({k['no forward']})",
    ]:
        assert phrase in readme, phrase
    docs = _text(ROOT / "docs" / "integrations.md")
    for phrase in [
        f'has {s["total"]} classes whose name contains "Norm"; `hf.patch` patches '
        f"{s['patched']} of them and refuses {s['refused']}",
        f"must be one of {len(known_forwards.KNOWN_FORWARDS)} known normalization forwards",
        f"the {s['patched']} matches cost",
        f"Refused, each with its reason ({s['refused']} in transformers 5.24)",
        f"- {k['none']} whose forward is none of the known ones",
        f"- {k['second input']} whose forward takes a second input that is not a gate",
        f"- {k['more inputs']} whose forward takes more inputs",
    ]:
        assert phrase in docs, phrase
    # The table of known forwards: each row's count(s), in the order of its forwards.
    by_class = {origin.split(".")[1]: origin for origin, _, _ in known_forwards.KNOWN_FORWARDS}
    lines = (ROOT / "docs" / "integrations.md").read_text().splitlines()
    start = lines.index(next(line for line in lines if line.startswith("| known forward")))
    rows = 0
    for line in lines[start + 2 :]:
        if not line.startswith("| `"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        names = re.findall(r"`(\w+)`", cells[0])
        counts = re.match(r"\d+(?: \+ \d+)*", cells[-1])
        expected = " + ".join(str(s["origins"].get(by_class[n], 0)) for n in names)
        assert counts is not None and counts.group(0) == expected, (names, cells[-1], expected)
        rows += len(names)
    assert rows == len(known_forwards.KNOWN_FORWARDS)  # every known forward has its row
