"""The golden list: how ``rmsnorm.integrations.hf`` decides every normalization class of one
transformers version, one line per class, kept in ``tests/integrations/golden/``. A change to the
recognition shows here class by class (which classes it patches or refuses now, and why); so does a
new transformers version, compared with the list of the nearest older one until it has its own. The
counts README.md and docs/integrations.md quote are checked against the list of the version they
name.

Write the list of the installed version (after checking the difference it reports)::

    RMSNORM_WRITE_GOLDEN=1 .venv/bin/python -m pytest tests/integrations/test_hf_golden.py
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
import re
import warnings
from pathlib import Path

import pytest
from packaging.version import InvalidVersion, Version

from rmsnorm.integrations import hf
from rmsnorm.integrations.hf import behaviour, discovery, known_forwards, recognition, registry
from rmsnorm.integrations.hf.recognition import UNKNOWN_FORWARD

GOLDEN = Path(__file__).parent / "golden"
WRITE = os.environ.get("RMSNORM_WRITE_GOLDEN") == "1"
ROOT = Path(__file__).resolve().parents[2]
# Where the list of a transformers version that has none yet is written (make test-latest sets it).
ARTIFACTS = Path(os.environ.get("RMSNORM_GOLDEN_OUT") or ROOT / "build" / "golden")


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
            if registry.recognised_by(cls) == "behaviour":
                like = " by behaviour"
            what = f"patched{like}: {describe(decision)}" if patched else f"refused: {decision}"
            lines.append(f"{prefix}.{cls.__name__}: {what}")
    return sorted(lines), missing


def _model(line: str) -> str:
    return line.split(":", 1)[0].split(".", 1)[0]


def golden_list(version: str, folder: Path = GOLDEN) -> Path | None:
    """The list to compare transformers ``version`` with: its own, else the nearest older
    version's (so that a new release shows what it changes); None where ``folder`` has neither
    (an older transformers lacks models that every list has, which would say nothing)."""
    lists = {}
    for path in folder.glob("hf_classes-transformers-*.txt"):
        try:
            lists[Version(path.stem.removeprefix("hf_classes-transformers-"))] = path
        except InvalidVersion:
            continue
    older = [v for v in lists if v <= Version(version)]
    return lists[max(older)] if older else None


# How a class's decision can move, in the order the failure lists them.
_MOVES = (
    "refused now, patched before",
    "patched now, refused before",
    "patched otherwise (another convention, or like another known forward)",
    "refused for another reason",
    "new",
    "gone",
)


def moved(golden: list[str], current: list[str]) -> dict[str, list[str]]:
    """The classes whose line differs between two lists (``model.Class: decision``), by how
    they moved (one of ``_MOVES``)."""
    before = dict(line.split(": ", 1) for line in golden)
    now = dict(line.split(": ", 1) for line in current)
    moves: dict[str, list[str]] = {how: [] for how in _MOVES}
    for name in sorted(before.keys() | now.keys()):
        was, is_ = before.get(name), now.get(name)
        if was == is_:
            continue
        if was is None or is_ is None:
            how = "new" if was is None else "gone"
        else:
            how = {
                (True, False): _MOVES[0],
                (False, True): _MOVES[1],
                (True, True): _MOVES[2],
                (False, False): _MOVES[3],
            }[(was.startswith("patched"), is_.startswith("patched"))]
        moves[how].append(name)
    return {how: names for how, names in moves.items() if names}


def compare(path: Path, version: str, current: list[str], missing: set[str]) -> str | None:
    """Why the decisions ``current`` of transformers ``version`` fail against the golden list at
    ``path`` (its own or another version's): the classes that moved, by how, and the lines that
    differ; None when they agree. A model whose modeling file cannot be imported (``missing``
    here, or where the list was written: an optional dependency) is compared on neither side."""
    golden = path.read_text().splitlines()
    missing = missing | {_model(line) for line in golden if "not importable here" in line}
    golden = [line for line in golden if _model(line) not in missing]
    current = [line for line in current if _model(line) not in missing]
    if current == golden:
        return None
    moves = moved(golden, current)
    count = sum(len(names) for names in moves.values())
    if path.name == f"hf_classes-transformers-{version}.txt":
        head = f"transformers {version} decides {count} classes otherwise than {path.name}:"
    else:
        head = (
            f"no golden list for transformers {version} yet; against {path.name}, {count} "
            "classes are decided otherwise:"
        )
    lines = [head, *(f"- {how} ({len(names)}): {', '.join(names)}" for how, names in moves.items())]
    lines.append(
        "If each change is intended, write the list of the installed version with "
        "RMSNORM_WRITE_GOLDEN=1 .venv/bin/python -m pytest tests/integrations/test_hf_golden.py."
    )
    lines.append("The lines that differ (-: the list, +: now):")
    lines += difflib.unified_diff(golden, current, "list", "now", lineterm="", n=0)
    return "\n".join(lines)


def write_list(folder: Path, version: str, lines: list[str]) -> Path:
    """Write the golden list of transformers ``version`` into ``folder``, atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"hf_classes-transformers-{version}.txt"
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)  # a failed write leaves the old list
    return path


def regressions(golden: list[str], current: list[str]) -> list[str]:
    """The classes a release broke, against the list of an older version: patched before and now
    refused where the probe cannot tell (a class computing as before that this library no longer
    recognises). A class refused because it now computes otherwise, a new class and a class gone
    are what a release may bring: reported, not failed."""
    before = dict(line.split(": ", 1) for line in golden)
    now = dict(line.split(": ", 1) for line in current)
    return sorted(
        name
        for name, was in before.items()
        if was.startswith("patched")
        and name in now
        and now[name].startswith("refused")
        and (behaviour.UNDECIDED in now[name] or now[name] == f"refused: {UNKNOWN_FORWARD}")
    )


def test_every_class_is_decided_as_the_golden_list_says():
    """Against the installed version's own list: every class as the list says. Against an older
    version's list (a release newer than the lists): fails only on :func:`regressions`, and writes
    the new version's list as an artifact (RMSNORM_GOLDEN_OUT, else build/golden/) to review
    and commit."""
    transformers = pytest.importorskip("transformers")
    version = transformers.__version__
    current, missing = decisions()
    if WRITE:
        write_list(GOLDEN, version, current)
    path = golden_list(version)
    if path is None:
        pytest.skip(
            f"no golden list in {GOLDEN} for transformers {version} or an older version; write "
            "one with RMSNORM_WRITE_GOLDEN=1 (see this module's docstring)"
        )
    message = compare(path, version, current, missing)
    if message is None:
        return
    if path.name == f"hf_classes-transformers-{version}.txt":
        pytest.fail(message)
    artifact = write_list(ARTIFACTS, version, current)
    golden = [line for line in path.read_text().splitlines() if _model(line) not in missing]
    broken = regressions(golden, current)
    if broken:
        pytest.fail(
            f"transformers {version} breaks {len(broken)} classes patched before: "
            f"{', '.join(broken)}\n{message}\nIts list: {artifact}"
        )
    warnings.warn(f"{message}\nIts list is written to {artifact}", stacklevel=1)


def test_a_version_without_a_list_is_compared_with_the_nearest_older_one(tmp_path):
    for version in ("4.57.1", "5.2.0", "5.24.0"):
        (tmp_path / f"hf_classes-transformers-{version}.txt").write_text("")
    (tmp_path / "hf_classes-transformers-notes.txt").write_text("")  # not a version: ignored

    def chosen(version: str) -> str:
        return golden_list(version, tmp_path).stem.removeprefix("hf_classes-transformers-")

    assert chosen("5.24.0") == "5.24.0"
    assert chosen("5.25.0.dev0") == chosen("6.0") == "5.24.0"
    assert chosen("5.10.1") == "5.2.0"  # by version, not by string ("5.10" > "5.2")
    assert golden_list("4.50.0", tmp_path) is None  # older than every list
    assert golden_list("5.24.0", tmp_path / "empty") is None


def test_the_failure_names_the_classes_that_moved(tmp_path):
    """What a release that changes the decisions shows: the 5.24 list with one class of each kind
    of move, compared as transformers 5.99 (which has no list of its own)."""
    path = tmp_path / f"hf_classes-transformers-{DOCS_VERSION}.txt"
    path.write_text((GOLDEN / path.name).read_text())
    lines = dict(line.split(": ", 1) for line in path.read_text().splitlines())
    llama, olmo2 = lines["llama.LlamaRMSNorm"], lines["olmo2.Olmo2RMSNorm"]
    none = lines["autoformer.AutoformerLayernorm"]
    assert llama.startswith("patched") and none.startswith("refused")
    lines.update(
        {
            "llama.LlamaRMSNorm": none,  # refused now
            "autoformer.AutoformerLayernorm": llama,  # patched now
            "gemma.GemmaRMSNorm": olmo2,  # another convention
            "axk2.AXK2GatedRMSNorm": none,  # another reason
            "zzz.ZzzRMSNorm": llama,  # a new model
        }
    )
    del lines["cohere.CohereLayerNorm"]  # a model removed
    current = sorted(f"{name}: {what}" for name, what in lines.items())

    assert golden_list("5.99.0", tmp_path) == path
    message = compare(path, "5.99.0", current, set())
    assert message is not None
    assert message.startswith(
        f"no golden list for transformers 5.99.0 yet; against {path.name}, 6 classes are "
        "decided otherwise:\n"
    ), message
    for line in [
        "- refused now, patched before (1): llama.LlamaRMSNorm",
        "- patched now, refused before (1): autoformer.AutoformerLayernorm",
        "- patched otherwise (another convention, or like another known forward) (1): "
        "gemma.GemmaRMSNorm",
        "- refused for another reason (1): axk2.AXK2GatedRMSNorm",
        "- new (1): zzz.ZzzRMSNorm",
        "- gone (1): cohere.CohereLayerNorm",
        f"-llama.LlamaRMSNorm: {llama}",
        f"+llama.LlamaRMSNorm: {none}",
        f"+zzz.ZzzRMSNorm: {llama}",
    ]:
        assert f"\n{line}\n" in f"{message}\n", line
    assert "RMSNORM_WRITE_GOLDEN=1" in message
    assert "olmo2.Olmo2RMSNorm:" not in message  # unchanged classes are not named
    # Against its own list the same decisions pass; a model not importable is compared nowhere.
    own = tmp_path / "hf_classes-transformers-5.99.0.txt"
    own.write_text("\n".join(current) + "\n")
    assert compare(own, "5.99.0", current, set()) is None
    assert (
        compare(path, "5.99.0", current, {"llama", "autoformer", "gemma", "axk2", "zzz", "cohere"})
        is None
    )


# ------------------------------------------------------------------------------------------------
# The counts README.md and docs/integrations.md quote are the golden list's (of the version they
# name), and its table's per-forward counts are those of the classes that match each forward.
# ------------------------------------------------------------------------------------------------
DOCS_VERSION = "5.25.0"

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
        if head == "patched by behaviour":
            origin = "behaviour"
        origins[origin] = origins.get(origin, 0) + 1
    gated = sum("Gated" in name.rsplit(".", 1)[-1] for name, _ in patched)
    return dict(
        patched=len(patched),
        refused=len(refused),
        total=len(rows),
        kinds=kinds,
        origins=origins,
        gated=gated,
    )


def _text(path: Path) -> str:
    return " ".join(path.read_text().split())  # whitespace-insensitive (line breaks)


def test_the_docs_quote_the_golden_counts():
    path = GOLDEN / f"hf_classes-transformers-{DOCS_VERSION}.txt"
    s = summary(path.read_text().splitlines())
    k = s["kinds"]
    assert sum(k.values()) == s["refused"], k  # every refusal is of a kind the docs name
    readme = _text(ROOT / "README.md")
    for phrase in [
        f"`hf.patch` patches {s['patched']} of the {s['total']} norm classes of transformers 5.25",
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
        f"Refused, each with its reason ({s['refused']} in transformers 5.25)",
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
    assert rows == len(by_class)  # every known forward has its row (one per class it is from)
