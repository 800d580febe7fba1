"""The package's import graph, read from the source: no module imports another that imports it back
(directly or around a circle, imports inside functions, imports under ``if TYPE_CHECKING:`` and
``importlib.import_module`` calls with a constant name included), and no floor imports a higher
one: the core never imports the applications (integrations, convert, the lab, the benchmark) nor
the command, the lab and the benchmark never import each other, and the conversion never imports
the lab."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
# The floor above the core: what the core must not import.
APPLICATIONS = {"integrations", "convert", "lab", "bench"}
COMMAND = {"cli", "__main__"}
# Imports between applications that are refused: the lab and the benchmark never import each
# other; the lab uses the conversion, which never imports the lab (the lab registers its model).
APART = {("lab", "bench"), ("bench", "lab"), ("convert", "lab")}


def _modules(src: Path = SRC) -> dict[str, tuple[Path, bool]]:
    """{dotted name: (file, is a package)} of every module under ``src/rmsnorm``."""
    out = {}
    for path in sorted((src / "rmsnorm").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if package else parts)] = (path, package)
    return out


def _imports(tree: ast.AST):
    """Every import statement, at any depth: inside functions, and under ``if TYPE_CHECKING:`` too
    (a module that needs another's names only for its annotations still depends on it, and a
    circle through such an import is a circle of the design that a refactoring or a run-time use
    of the annotation turns into an import error)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def _dynamic_imports(tree: ast.AST, name: str, package: bool):
    """The modules named by ``importlib.import_module("a.b")`` / ``import_module(".b", __name__)``
    calls with a constant name, at any depth (a name built at run time is not seen)."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        first = node.args[0]
        if called != "import_module" or not isinstance(first, ast.Constant):
            continue
        target = first.value
        if not isinstance(target, str):
            continue
        if target.startswith("."):
            anchor = node.args[1] if len(node.args) > 1 else None
            # import_module(".x", __name__) is relative to the module itself (as a package);
            # (".x", __package__) to its package
            as_package = package or getattr(anchor, "id", None) == "__name__"
            base = name if as_package else name.rpartition(".")[0]
            level = len(target) - len(target.lstrip("."))
            parts = base.split(".")[: len(base.split(".")) - (level - 1)]
            target = ".".join(parts + [target.lstrip(".")])
        yield target


def import_graph(src: Path = SRC, unresolved: list | None = None) -> dict[str, set[str]]:
    """{module: the modules of this package it imports}. ``from X import y`` is an edge to
    ``X.y`` where that is a module, else to ``X``; an edge to one's own enclosing package is left
    out (Python runs it before any of its modules in any case). Relative imports that name no
    module of the package are appended to ``unresolved``."""
    modules = _modules(src)
    unresolved = [] if unresolved is None else unresolved
    graph = {}
    for name, (path, package) in modules.items():
        here = name if package else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        targets = set(_dynamic_imports(tree, name, package))
        for node in _imports(tree):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            base = node.module or ""
            if node.level:
                up = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in modules else base)
                if node.level and sub not in modules and base not in modules:
                    unresolved.append(f"{name}: {'.' * node.level}{node.module or ''}")
        graph[name] = {
            t for t in targets if t in modules and t != name and not name.startswith(t + ".")
        }
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _area(module: str) -> str:
    """The top-level part of ``rmsnorm`` a module belongs to (``rmsnorm.lab.io`` -> ``lab``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def forbidden_edges(graph: dict[str, set[str]]) -> list[str]:
    """'a -> b' for every import that goes up a floor or between applications kept apart."""
    bad = []
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            sa, sb = _area(a), _area(b)
            core = sa not in APPLICATIONS | COMMAND
            if (
                (core and sb in APPLICATIONS | COMMAND)
                or (sa in APPLICATIONS and sb in COMMAND)
                or (sa, sb) in APART
            ):
                bad.append(f"{a} -> {b}")
    return bad


# The core's floors, lowest first, as docs/architecture.md's table lists them: a module imports only
# from its own floor or the ones below. A name ending in "." is a package and all it holds.
FLOORS = (
    (
        "spec",
        {
            "rmsnorm.reference",
            "rmsnorm.testing",
            "rmsnorm._calls",
            "rmsnorm._contract",
            "rmsnorm._validate",
            "rmsnorm._timing",
            "rmsnorm._progress",
            "rmsnorm._files",
            "rmsnorm._cache",
            "rmsnorm._tables",
        },
    ),
    ("kernels", {"rmsnorm.kernels."}),
    ("dispatch", {"rmsnorm._backend", "rmsnorm._launch", "rmsnorm._layout"}),
    ("ops", {"rmsnorm._ops", "rmsnorm._opcall", "rmsnorm._autograd", "rmsnorm._dtensor"}),
    ("API", {"rmsnorm.functional", "rmsnorm.modules", "rmsnorm"}),
)


def _floor(module: str) -> int | None:
    """The index in :data:`FLOORS` of a core module (None for the applications and the command)."""
    for i, (_, members) in enumerate(FLOORS):
        for m in members:
            if module == m or (m.endswith(".") and (module + ".").startswith(m)):
                return i
    return None


def upward_edges(graph: dict[str, set[str]]) -> list[str]:
    """'a -> b' for every import of a core module from a higher floor of the core."""
    bad = []
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            fa, fb = _floor(a), _floor(b)
            if fa is not None and fb is not None and fb > fa:
                bad.append(f"{a} ({FLOORS[fa][0]}) -> {b} ({FLOORS[fb][0]})")
    return bad


def test_every_core_module_has_a_floor_and_imports_none_above_it():
    graph = import_graph()
    core = [m for m in graph if _area(m) not in APPLICATIONS | COMMAND | {"info"}]
    assert [m for m in core if _floor(m) is None] == []
    assert upward_edges(graph) == []


def test_the_floors_are_the_ones_the_architecture_page_lists():
    """docs/architecture.md's floor table names the same files on each floor of the core."""
    text = (SRC.parent / "docs" / "architecture.md").read_text()
    for name, members in FLOORS:
        row = next(line for line in text.splitlines() if line.startswith(f"| {name} |"))
        listed = row.split("|")[2]
        named = set()
        for token in listed.replace("`", " ").replace(",", " ").split():
            if token.endswith(".py"):
                named.add("rmsnorm." + token[:-3].replace("/", "."))
            elif token.endswith("/"):
                named.add("rmsnorm." + token.rstrip("/").replace("/", "."))
        expected = {m.rstrip(".") for m in members if m != "rmsnorm"}
        if name == "kernels":  # its two packages are listed
            expected = {"rmsnorm.kernels.cpu", "rmsnorm.kernels.triton"}
        assert named == expected, name


def test_no_import_circles():
    unresolved = []
    assert cycles(import_graph(unresolved=unresolved)) == []
    assert unresolved == []  # a relative import past the package or to a module that is gone


def test_no_import_goes_up_a_floor_and_the_lab_never_imports_the_benchmark():
    assert forbidden_edges(import_graph()) == []


def _write_tree(root: Path, files: dict[str, str]) -> None:
    """A planted source tree: each ``files`` path under ``root`` with its text."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_checks_see_circles_and_forbidden_edges(tmp_path):
    """The checks on a planted package: a circle through an import inside a function, one through
    ``importlib.import_module`` calls (absolute and relative), one through an import under
    ``TYPE_CHECKING``, the lab importing the benchmark, the core importing the lab."""
    files = {
        "rmsnorm/__init__.py": "",
        "rmsnorm/core.py": "def f():\n    from .lab import x\n",
        "rmsnorm/bench/__init__.py": "",
        "rmsnorm/bench/a.py": "from . import b\n",
        "rmsnorm/bench/b.py": "def g():\n    from .a import y\n",
        "rmsnorm/bench/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from .d import z\n",
        "rmsnorm/bench/d.py": "from .c import w\n",
        "rmsnorm/lab/__init__.py": "from ..bench.a import q\n",
        "rmsnorm/kern/__init__.py": "import importlib\n"
        "def load():\n    return importlib.import_module('.impl', __name__)\n",
        "rmsnorm/kern/impl.py": "from .. import disp\n",
        "rmsnorm/disp.py": "from importlib import import_module\n"
        "def pick():\n    return import_module('rmsnorm.kern')\n",
    }
    _write_tree(tmp_path, files)
    graph = import_graph(tmp_path)
    assert cycles(graph) == [
        ["rmsnorm.bench.a", "rmsnorm.bench.b"],
        ["rmsnorm.bench.c", "rmsnorm.bench.d"],
        ["rmsnorm.disp", "rmsnorm.kern", "rmsnorm.kern.impl"],
    ]
    assert forbidden_edges(graph) == [
        "rmsnorm.core -> rmsnorm.lab",
        "rmsnorm.lab -> rmsnorm.bench.a",
    ]


def test_a_circle_through_a_type_checking_import_is_caught(tmp_path):
    """A report's run importing its sections, one of which names the run's results class in its
    annotations only (``if TYPE_CHECKING:``, spelled ``typing.TYPE_CHECKING`` here): a circle of
    three modules through a package's ``__init__``."""
    files = {
        "rmsnorm/__init__.py": "",
        "rmsnorm/report/__init__.py": "",
        "rmsnorm/report/run.py": "from . import sections\n",
        "rmsnorm/report/sections/__init__.py": "from . import divergence\n",
        "rmsnorm/report/sections/divergence.py": "import typing\n"
        "if typing.TYPE_CHECKING:\n    from ..run import ReportResults\n",
    }
    _write_tree(tmp_path, files)
    assert cycles(import_graph(tmp_path)) == [
        [
            "rmsnorm.report.run",
            "rmsnorm.report.sections",
            "rmsnorm.report.sections.divergence",
        ]
    ]


@pytest.mark.parametrize("module", ["rmsnorm._timing", "rmsnorm._progress"])
def test_the_shared_timing_and_progress_modules_stand_alone(module):
    """What the benchmark, the lab and the command all use imports none of them."""
    assert {_area(m) for m in import_graph()[module]} <= {"_validate"}
