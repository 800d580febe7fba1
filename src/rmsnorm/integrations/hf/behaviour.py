"""Recognition by behaviour: a norm class whose forward is none of the known ones (as code) is built
small, run on probes, and compared with each convention this library serves. It is patched only
when its parameters and buffers are exactly those a convention reads, it holds no other state, its
forward has no branch the probes might not reach, and one convention matches it in every probe
within the tolerance rule of :mod:`rmsnorm.testing`.

The probes (each on rows of ``PROBE_WIDTH`` elements: ordinary rows, rows with a large mean, a
zero row, rows of magnitude 1e4 and of magnitude 1e-3):
- the module and the input in float32, bfloat16 and float64 (held to float32's rule: most classes
  upcast with ``.float()`` and so compute a float64 input in float32);
- the module in float32 and the input in bfloat16 (tells the casting conventions apart by the
  output's dtype);
- float32 with the module's ε set to 0.5 (proves which attribute holds ε, and that ε is added
  inside the root);
- the gradients of float32 outputs with respect to the input, the weight and the bias.

The class's output is the implementation under test; the convention's float64 value is the exact
one, and the convention run in the probe's dtype by the reference backend is the eager one: the
class matches when its error is within :func:`rmsnorm.testing.tolerance` of the exact value, with
the reduction over the row's elements counted as the accumulator's rows (a class may sum its
squares in any order). Where several conventions match (they then agree within the rule on every
probe), the one with the smallest errors (summed over the probes, in units of the tolerance) is
taken.

A refusal that says :data:`UNDECIDED` means the probe could not decide (the class cannot be
built small, or its forward branches); any other refusal says what the class does that no
convention does."""

from __future__ import annotations

import ast
import copy
import inspect
import itertools
import textwrap
import types
import warnings
from collections.abc import Callable

import torch
from torch import nn

from ..._backend import use_backend
from ...testing import max_abs_error, tolerance
from .conventions import Convention
from .replacements import forward_for

__all__ = ["probe", "candidates", "PROBE_WIDTH", "UNDECIDED"]

# The row width of the probes: not a power of two, divisible by 2, 3 and 4.
PROBE_WIDTH = 48
# The ε the module is built with (where its constructor takes one) and the one set for the ε probe.
_BUILT_EPS = 1.25e-5
_PROBE_EPS = 0.5
# What every refusal of the probe starts with, and what an undecided one says next.
_UNKNOWN = "its forward is none of the known normalization forwards"
UNDECIDED = "the behaviour probe cannot tell"

# Constructor arguments the probe can fill: the width and ε, under the names transformers uses.
_SIZE_NAMES = frozenset(
    {
        "hidden_size",
        "dim",
        "d_model",
        "normalized_shape",
        "size",
        "n_embd",
        "num_features",
        "embed_dim",
        "features",
        "channels",
        "hidden_dim",
        "d",
        "width",
    }
)
_EPS_NAMES = frozenset(
    {"eps", "epsilon", "variance_epsilon", "layer_norm_eps", "rms_norm_eps", "norm_eps"}
)
_BRANCHES = (ast.If, ast.IfExp, ast.While, ast.Match, ast.Try, ast.comprehension)


def candidates(eps_attr: str, weight: bool, bias: bool) -> list[Convention]:
    """The conventions a module with this ε attribute and these parameters may compute, in order
    of preference: RMSNorm with each casting mode, with and without Gemma's 1 + γ, T5's rule, then
    LayerNorm. Each reads exactly the parameters given."""
    found = []
    for casting, offset in itertools.product(("gemma", "llama", "none"), (0.0, 1.0)):
        if offset and not weight:
            continue
        found.append(Convention("rms", eps_attr, casting, offset=offset, weight=weight, bias=bias))
    if weight and not bias:
        found.append(Convention("rms", eps_attr, "llama", cast_to_weight=True))
    found.append(Convention("layer", eps_attr, weight=weight, bias=bias))
    return found


def probe(cls: type) -> Convention | str:
    """The convention ``cls`` computes, decided by running it (see the module's docstring), or why
    it is not patched: a reason that says :data:`UNDECIDED` where the probe cannot decide."""
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]), torch.device("cpu"):
        warnings.simplefilter("ignore")
        with torch.inference_mode(False), torch.enable_grad(), torch.autocast("cpu", enabled=False):
            result = _probe(cls)
    if isinstance(result, str) and not result.startswith(_UNKNOWN):
        result = f"{_UNKNOWN}, and {result}"
    return result


def _probe(cls: type) -> Convention | str:
    forward = inspect.getattr_static(cls, "forward", None)
    branch = _branch(cls, forward)
    if branch is not None:
        return branch
    module = _build(cls)
    if isinstance(module, str):
        return module
    problem = _state_problem(module)
    if problem is not None:
        return problem
    eps_attr = _eps_attr(module)
    if eps_attr is None:
        return f"{UNDECIDED}: no attribute of a built instance holds its ε"
    params = dict(module.named_parameters())
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in params.items():
            base = 0.5 if name == "weight" else 0.0
            p.copy_(base + 0.3 * torch.randn(p.shape, generator=generator))
    cases = _probes(module, eps_attr, generator)
    results = {}
    for conv in candidates(eps_attr, "weight" in params, "bias" in params):
        ratios, distance = {}, 0.0
        for label, run in cases:
            try:
                ratios[label], d = run(conv)
            except _ClassFails as exc:
                return f"{UNDECIDED}: its forward fails on the {label} probe ({exc})"
            except Exception:  # the convention cannot run this module: not a match
                ratios[label], d = float("inf"), float("inf")
            distance += d
        failed = [label for label, r in ratios.items() if not r <= 1.0]
        results[conv] = (len(failed), distance, sum(ratios.values()), failed, ratios)
    # The closest: fewest probes missed, then the nearest to the class's own outputs in the
    # probes' precision (several conventions may match within the rule; the one the class
    # computes is nearest), then the first in order.
    best = min(results, key=lambda c: results[c][:3])
    n_failed, _, _, failed, ratios = results[best]
    if not n_failed:
        return best
    misses = ", ".join(f"{label} ({_miss(ratios[label])})" for label in failed)
    return (
        "its outputs match none of the conventions this library serves (closest: "
        f"{_describe(best)}, which misses the probes {misses}; declare one with hf.register if "
        "it computes one)"
    )


def _miss(ratio: float) -> str:
    if ratio == float("inf"):
        return "its output's dtype, shape or NaN / inf pattern differs"
    return f"off by {ratio:.3g}× the tolerance"


class _ClassFails(RuntimeError):
    """The class's own forward failed on a probe."""


def _describe(conv: Convention) -> str:
    if conv.kind == "layer":
        return f"LayerNorm(weight={conv.weight}, bias={conv.bias})"
    rule = "t5" if conv.cast_to_weight else conv.casting_mode
    return f"RMSNorm(casting {rule!r}, offset {conv.offset:g}, weight={conv.weight})"


def _build(cls: type) -> nn.Module | str:
    """An instance of ``cls`` of width :data:`PROBE_WIDTH`, built from the constructor arguments
    the probe can fill, or why it cannot be built."""
    try:
        signature = inspect.signature(cls.__init__)
    except (TypeError, ValueError):
        return f"{UNDECIDED}: its constructor's signature cannot be read"
    kwargs: dict[str, object] = {}
    for p in list(signature.parameters.values())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name in _SIZE_NAMES:
            kwargs[p.name] = PROBE_WIDTH
        elif p.name in _EPS_NAMES:
            kwargs[p.name] = _BUILT_EPS
        elif p.default is p.empty:
            return (
                f"{UNDECIDED}: its constructor needs {p.name!r}, which the probe cannot fill "
                "(declare the class with hf.register if it computes one of the conventions)"
            )
    try:
        return cls(**kwargs)
    except Exception as exc:
        return f"{UNDECIDED}: building it small fails ({type(exc).__name__})"


def _state_problem(module: nn.Module) -> str | None:
    """Why ``module`` holds more than a convention reads (submodules, buffers, parameters other
    than a 1-D weight and bias, tensors kept as attributes), or None."""
    children = [name for name, _ in module.named_children()]
    if children:
        return (
            f"it holds submodules ({', '.join(children)}), which no single op of this library runs"
        )
    buffers = [name for name, _ in module.named_buffers()]
    if buffers:
        return f"it holds buffers ({', '.join(buffers)}): state that no convention reads"
    params = dict(module.named_parameters())
    extra = sorted(set(params) - {"weight", "bias"})
    if extra:
        return f"it holds parameters beyond weight and bias ({', '.join(extra)})"
    for name, p in params.items():
        if p.shape != (PROBE_WIDTH,):
            return (
                f"its {name} built for rows of {PROBE_WIDTH} has shape {list(p.shape)}, not "
                f"[{PROBE_WIDTH}]: the conventions apply a 1-D {name} to the last dimension"
            )
    tensors = [k for k, v in vars(module).items() if isinstance(v, torch.Tensor)]
    if tensors:
        return f"it keeps tensors as attributes ({', '.join(tensors)}): state no convention reads"
    return None


def _eps_attr(module: nn.Module) -> str | None:
    """The attribute holding ε: the one holding the ε it was built with, else its only float."""
    floats = {
        k: v for k, v in vars(module).items() if isinstance(v, float) and not k.startswith("_")
    }
    built = [k for k, v in floats.items() if v == _BUILT_EPS]
    if len(built) == 1:
        return built[0]
    return next(iter(floats)) if len(floats) == 1 else None


def _branch(cls: type, forward: object) -> str | None:
    """Why the code ``forward`` runs (with the methods of ``cls`` it reaches through self) cannot
    be probed: a branch, whose other side the probes may not reach, or code that cannot be read;
    None when it has neither."""
    if not isinstance(forward, types.FunctionType):
        return f"{UNDECIDED}: its forward is a {type(forward).__name__}, not a plain function"
    seen, todo = set(), [("forward", forward)]
    while todo:
        name, fn = todo.pop()
        seen.add(name)
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        except (OSError, TypeError, SyntaxError):
            return f"{UNDECIDED}: the source of its {name} is not available"
        node = tree.body[0]
        if not isinstance(node, ast.FunctionDef):
            return f"{UNDECIDED}: its {name} is not a plain function"
        self_name = node.args.args[0].arg if node.args.args else None
        for sub in ast.walk(node):
            if isinstance(sub, _BRANCHES):
                text = ast.unparse(getattr(sub, "test", getattr(sub, "iter", sub)))
                return (
                    f"{UNDECIDED}: its {name} branches ({type(sub).__name__} on `{text[:60]}`), "
                    "and the probes may reach one side only (declare the class with hf.register "
                    "if it computes one of the conventions)"
                )
            if (
                isinstance(sub, ast.Attribute)
                and isinstance(sub.value, ast.Name)
                and sub.value.id == self_name
                and sub.attr not in seen
            ):
                static = inspect.getattr_static(cls, sub.attr, None)
                if isinstance(static, types.FunctionType):
                    todo.append((sub.attr, static))
                elif isinstance(static, property):
                    return f"{UNDECIDED}: it reads self.{sub.attr} through a property"
    return None


def _probes(
    module: nn.Module, eps_attr: str, generator: torch.Generator
) -> list[tuple[str, Callable[[Convention], float]]]:
    """(label, run) for each probe: ``run(conv)`` is the class's worst error over the probe's
    outputs in units of the tolerance, against ``conv``, and its distance from ``conv`` run in the
    probe's precision (both inf where dtype, shape or the NaN / inf pattern differ)."""
    n = PROBE_WIDTH

    def rows(scale: float = 1.0) -> torch.Tensor:
        x = torch.randn(2, 7, n, generator=generator, dtype=torch.float64)
        x[:, 1] += 3.0  # a large mean
        x[:, 2] = 0.0  # a zero row
        x[:, 3] *= 1e4  # large magnitude
        x[:, 4] *= 1e-3  # small magnitude: ε matters
        x[:, 5, 7] = 40.0  # one outlier
        return x * scale

    ordinary, quiet = rows(), rows(0.5)
    forward = type(module).forward
    # The class's own outputs, computed once per probe.
    cases = []
    for label, dtype, x_dtype, eps, x in (
        ("float32", torch.float32, torch.float32, None, ordinary),
        ("bfloat16", torch.bfloat16, torch.bfloat16, None, ordinary),
        ("float64", torch.float64, torch.float64, None, ordinary),
        ("float32 module, bfloat16 input", torch.float32, torch.bfloat16, None, ordinary),
        ("ε = 0.5", torch.float32, torch.float32, _PROBE_EPS, quiet),
    ):
        m = copy.deepcopy(module).to(dtype)
        if eps is not None:
            setattr(m, eps_attr, eps)
        xi = x.to(x_dtype)
        try:
            with torch.no_grad():
                got = forward(m, xi)
        except Exception as exc:
            got = exc
        cases.append((label, _forward_case(m, xi, got)))
    cases.append(("gradient", _gradient_case(module, ordinary.float(), generator)))
    return cases


def _ours(conv: Convention, m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with use_backend("reference"):
        return forward_for(conv)(m, x)


def _error_ratio(
    got: torch.Tensor, exact: torch.Tensor, eager: torch.Tensor, rule: torch.dtype | None = None
) -> tuple[float, float]:
    """(the class's error against ``exact`` in units of the tolerance, its distance from
    ``eager`` relative to the outputs' scale); ``eager`` (the convention in the probe's precision)
    gives the output's dtype and shape and the eager error, ``rule`` the dtype whose rule applies
    (``got``'s by default). Both are inf where dtype, shape or the NaN / inf pattern differ."""
    inf = float("inf")
    if not isinstance(got, torch.Tensor) or got.dtype != eager.dtype or got.shape != eager.shape:
        return inf, inf
    err = max_abs_error(got, exact)
    tol = tolerance(exact, eager, rule or got.dtype, rows=PROBE_WIDTH)
    if err != err:  # NaN: the NaN or inf patterns differ
        return inf, inf
    scale = max(exact[exact.isfinite()].abs().max().item() if exact.isfinite().any() else 0, 1e-30)
    distance = max_abs_error(got, eager.to(got.dtype)) / scale
    return (err / tol if tol > 0 else (0.0 if err == 0 else inf)), distance


def _forward_case(m: nn.Module, x: torch.Tensor, got: object):
    def run(conv: Convention) -> float:
        if isinstance(got, Exception):
            raise _ClassFails(type(got).__name__)
        with torch.no_grad():
            eager = _ours(conv, m, x)
            exact = _ours(conv, copy.deepcopy(m).double(), x.double())
            if x.dtype != torch.float64:
                return _error_ratio(got, exact, eager)
            # Most classes upcast with .float(): they compute a float64 input in float32, which
            # is held to float32's rule (the patched forward computes it in float64).
            low = _ours(conv, copy.deepcopy(m).float(), x.float()).double()
            if not isinstance(got, torch.Tensor) or got.dtype != eager.dtype:
                return float("inf"), float("inf")
            return _error_ratio(got, exact, low, rule=torch.float32)

    return run


def _gradient_case(module: nn.Module, x: torch.Tensor, generator: torch.Generator):
    dy = torch.randn(x.shape, generator=generator, dtype=torch.float64)

    def grads(fn, m: nn.Module, xi: torch.Tensor) -> list[torch.Tensor]:
        m = copy.deepcopy(m)
        xi = xi.detach().requires_grad_(True)
        params = list(m.parameters())
        y = fn(m, xi)
        return list(torch.autograd.grad((y * dy.to(y.dtype)).sum(), [xi, *params]))

    try:
        got = grads(type(module).forward, module, x)
    except Exception as exc:
        got = exc

    def run(conv: Convention) -> float:
        if isinstance(got, Exception):
            raise _ClassFails(type(got).__name__)
        eager = grads(lambda m, xi: _ours(conv, m, xi), module, x)
        exact = grads(lambda m, xi: _ours(conv, m, xi), copy.deepcopy(module).double(), x.double())
        pairs = [_error_ratio(g, e, a) for g, e, a in zip(got, exact, eager, strict=True)]
        return max(r for r, _ in pairs), sum(d for _, d in pairs)

    return run
