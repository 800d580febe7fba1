"""Recognition by code: a class is recognised when its ``forward`` (and every method of its own that
the forward reaches through ``self``) is one of the known forwards, compared as syntax trees up to
local names, annotations, docstrings, comments and layout, and reads the same globals."""

from __future__ import annotations

import ast
import builtins
import functools
import inspect
import sys
import textwrap
import types

import torch
import torch.nn.functional
from torch import nn

from .conventions import ACT2FN_NAMES, NAMED_CONVENTIONS, Convention
from .known_forwards import KNOWN_FORWARDS, KNOWN_REFUSALS

__all__ = ["recognise", "known_origin", "UNKNOWN_FORWARD"]

# The refusal of a one-input forward that is none of the known ones: the classes the behaviour
# probe (:mod:`.behaviour`) then runs, where they are named like a norm.
UNKNOWN_FORWARD = (
    "its forward is none of the known normalization forwards (hf._KNOWN_FORWARDS; if it "
    "computes one of the conventions, declare it with hf.register)"
)


def recognise(cls: type) -> Convention | str:
    """The convention of the known forward that ``cls``'s forward is (as code), or why it is none
    (a short reason; a known refusal's own reason). Not cached: :func:`.registry.decide` caches
    the decision per class."""
    return _match(cls)[0]


def known_origin(cls: type) -> str | None:
    """The class (``"model.Class"``, as in :data:`.known_forwards.KNOWN_FORWARDS`) whose known
    forward (or known refusal) ``cls``'s code is, or None."""
    return _match(cls)[1]


def _match(cls: type) -> tuple[Convention | str, str | None]:
    """(:func:`recognise`'s decision, the origin of the known forward it matched or None)."""
    forward = inspect.getattr_static(cls, "forward", None)
    if forward is nn.Module.forward:
        return "it has no forward", None
    if forward is nn.LayerNorm.forward:  # a subclass that keeps torch's forward
        return NAMED_CONVENTIONS["layer_norm"], None
    if not isinstance(forward, types.FunctionType):
        return f"its forward is a {type(forward).__name__}, not a plain function", None
    code = forward.__code__
    inputs = list(code.co_varnames[1 : code.co_argcount + code.co_kwonlyargcount])
    if code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS):
        inputs.append("*args/**kwargs")
    # one input, or two (a gated norm's x and z); *args/**kwargs only alone, as one input
    if len(inputs) != 1 and (len(inputs) != 2 or inputs[-1] == "*args/**kwargs"):
        return (
            f"its forward takes {', '.join(inputs) or 'nothing'} besides self; this library's "
            "ops normalize one tensor, or one and its gate (conditioned norms keep their own "
            "forward)"
        ), None
    candidates = _known().get(code.co_names)
    if candidates is not None:
        methods = _source_methods(cls, forward)
        if isinstance(methods, str):
            return methods, None
        for known_methods, conv, origin in candidates:
            if methods == known_methods:
                if isinstance(conv, Convention) and conv.activation_attr is not None:
                    return _act2fn_problem() or conv, origin
                return conv, origin
    if len(inputs) == 2:
        return (
            f"its forward takes {', '.join(inputs)} besides self and is none of the known gated "
            "normalization forwards (hf._KNOWN_FORWARDS; a gated norm that computes one of the "
            "conventions can be declared with hf.register)"
        ), None
    return UNKNOWN_FORWARD, None


# The global names the known forwards use, and what they must be in the candidate's module
# (ACT2FN, transformers' activation table, is looked up only where a candidate reads it: its
# module imported transformers already).
_KNOWN_GLOBALS = {"torch": torch, "nn": nn, "F": torch.nn.functional}


def _expected_global(name: str) -> object:
    if name == "ACT2FN":
        return getattr(sys.modules.get("transformers.activations"), "ACT2FN", None)
    return _KNOWN_GLOBALS.get(name, getattr(builtins, name, None))


_SILU_FORWARD = """
def forward(self, input):
    return nn.functional.silu(input)
"""


def _act2fn_problem() -> str | None:
    """Why transformers' ACT2FN does not map the names of ``ACT2FN_NAMES`` to SiLU / the
    sigmoid (None when it does): torch's modules, or transformers' SiLUActivation when its forward
    is ``nn.functional.silu``, recognised by code as the norms are."""
    table = _expected_global("ACT2FN")
    if table is None:
        return "transformers.activations.ACT2FN is not loaded"
    for name, kind in ACT2FN_NAMES.items():
        try:
            act = type(table[name])
        except Exception as exc:  # a table that changed shape
            return f"ACT2FN[{name!r}] fails: {type(exc).__name__}: {exc}"
        if act in (nn.SiLU, nn.Sigmoid):
            found = "silu" if act is nn.SiLU else "sigmoid"
        else:
            forward = inspect.getattr_static(act, "forward", None)
            methods = (
                _source_methods(act, forward) if isinstance(forward, types.FunctionType) else None
            )
            silu = {"forward": _normalize(_SILU_FORWARD)[0]}
            found = "silu" if methods == silu else None
        if found != kind:
            return f"ACT2FN[{name!r}] is {act.__qualname__}, not the {kind} this library computes"
    return None


class _Normalizer(ast.NodeTransformer):
    """Renames the arguments and locals of one function to a0, a1, ... / v0, v1, ... in order of
    appearance and drops what cannot change the result (annotations, the docstring, the name);
    records the global names it reads and the attributes it reads from the first argument."""

    def __init__(self, fn: ast.FunctionDef) -> None:
        args = fn.args
        params = args.posonlyargs + args.args + args.kwonlyargs
        params += [a for a in (args.vararg, args.kwarg) if a is not None]
        self.names = {a.arg: f"a{i}" for i, a in enumerate(params)}
        self.self_name = params[0].arg if params else None
        stored = {
            n.id
            for n in ast.walk(fn)
            if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)
        }
        for node in ast.walk(fn):
            if isinstance(node, ast.Name) and node.id in stored:
                self.names.setdefault(node.id, f"v{len(self.names)}")
        self.globals: set[str] = set()
        self.self_attrs: set[str] = set()

    def visit_arg(self, node: ast.arg) -> ast.arg:
        return ast.arg(arg=self.names[node.arg])

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if node.id in self.names:
            return ast.Name(id=self.names[node.id], ctx=node.ctx)
        self.globals.add(node.id)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id == self.self_name:
            self.self_attrs.add(node.attr)
        return self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        if node.value is None:
            return ast.Pass()
        return self.generic_visit(ast.Assign(targets=[node.target], value=node.value))


def _normalize(source: str) -> tuple[str, set[str], set[str]]:
    """(canonical dump, global names read, attributes read from self) of the one function in
    ``source``."""
    fn = ast.parse(textwrap.dedent(source)).body[0]
    if not isinstance(fn, ast.FunctionDef):
        raise ValueError("not a function")
    norm = _Normalizer(fn)
    body = fn.body
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(getattr(first.value, "value", None), str):
        body = body[1:]  # the docstring
    args = norm.visit(fn.args)
    body = [norm.visit(stmt) for stmt in body]
    decorators = [norm.visit(d) for d in fn.decorator_list]
    dump = ast.dump(ast.Module([*decorators, args, *body], type_ignores=[]))
    return dump, norm.globals, norm.self_attrs


@functools.cache
def _known() -> dict[tuple[str, ...], list[tuple[dict[str, str], Convention | str, str]]]:
    """The known forwards and known refusals, keyed by their ``co_names`` (a cheap first filter):
    for each, the canonical dumps of its methods by name, its convention (or the reason it is
    refused) and the class it comes from."""
    known: dict = {}
    for origin, conv, source in (*KNOWN_FORWARDS, *KNOWN_REFUSALS):
        source = textwrap.dedent(source)
        module_code = compile(source, f"<known forward of {origin}>", "exec")
        forward_code = next(
            c for c in module_code.co_consts if getattr(c, "co_name", 0) == "forward"
        )
        methods = {node.name: _normalize(ast.unparse(node))[0] for node in ast.parse(source).body}
        known.setdefault(forward_code.co_names, []).append((methods, conv, origin))
    return known


def _source_methods(cls: type, forward: types.FunctionType) -> dict[str, str] | str:
    """The canonical dumps of ``forward`` and of every method of ``cls`` it reaches through self,
    or the reason they cannot be compared."""
    methods: dict[str, str] = {}
    todo = [("forward", forward)]
    while todo:
        name, fn = todo.pop()
        try:
            dump, global_names, attrs = _normalize(inspect.getsource(fn))
        except (OSError, TypeError, SyntaxError, ValueError, IndexError):
            return f"the source of its {name} is not available to compare with the known forwards"
        for g in global_names:
            expected = _expected_global(g)
            actual = fn.__globals__.get(g, getattr(builtins, g, None))
            if expected is None or actual is not expected:
                return f"its {name} reads the global {g!r}, which none of the known forwards use"
        methods[name] = dump
        for attr in sorted(attrs):
            static = inspect.getattr_static(cls, attr, None)
            if isinstance(static, types.FunctionType):
                if attr not in methods and all(attr != t[0] for t in todo):
                    todo.append((attr, static))
            elif static is not None and hasattr(type(static), "__get__"):
                return f"it reads self.{attr} through a {type(static).__name__} of the class"
    return methods
