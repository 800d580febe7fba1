"""What the launcher tests of every backend share: the backends and their devices, a pairwise
generator for option tables, inputs in each row and parameter layout, and the check of all five
launchers on one set of inputs against the spec (three ways: backend, eager spec, float64 spec)."""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import pytest
import torch

from rmsnorm import _backend
from rmsnorm import reference as R
from rmsnorm.testing import check_launcher

EPS = 1e-5
HAS_CUDA = torch.cuda.is_available()


# ----------------------------------------------------------------------------------------------
# Backends
# ----------------------------------------------------------------------------------------------
def _available() -> list[str]:
    names = ["reference"]
    if _backend.cpu_kernels_available():
        names.append("cpu")
    if _backend.triton_installed() and importlib.util.find_spec("rmsnorm.kernels.triton"):
        names.append("triton")  # interpreted on CPU tensors: keep shapes small
    return names


# The backends this machine runs, for tests that go through the public API.
AVAILABLE = _available()
# Every backend, for tests that skip (saying why) where one is not installed.
ALL = ("reference", "cpu", "triton")


@dataclass(frozen=True)
class Target:
    """A backend under test: its launchers, the device of its tensors, and whether it rounds
    element-wise exactly as the spec does (the same statistics in give the same bits out)."""

    name: str
    mod: ModuleType
    device: str
    bitwise: bool


def target(name: str) -> Target:
    """The backend ``name``, or a skip where it cannot run here."""
    if name == "reference":
        return Target(name, R, "cpu", True)
    if name == "cpu":
        if not _backend.cpu_kernels_available():
            pytest.skip("numba is not installed")
        return Target(name, _backend._load("cpu"), "cpu", True)
    pytest.importorskip("triton")
    return Target(name, _backend._load("triton"), "cuda" if HAS_CUDA else "cpu", False)


# ----------------------------------------------------------------------------------------------
# Pairwise option tables
# ----------------------------------------------------------------------------------------------
def _pairs(case: dict) -> set:
    return {((a, repr(case[a])), (b, repr(case[b]))) for a, b in itertools.combinations(case, 2)}


def pairwise(factors: dict[str, tuple], valid: Callable[[dict], bool] = lambda c: True):
    """A small covering array: every pair of values of any two factors that ``valid`` allows
    appears in at least one case, in ~the product of the two largest factors' sizes rather than
    the product of all (20 cases instead of ~10^6).

    ``valid`` sees partial cases (a dict of some factors) and says False only where the values
    it sees already conflict. Built in parameter order (IPOG): every pair of the two largest
    factors, then each further factor added to the cases so far (the value covering the most new
    pairs), with cases added or completed for the pairs still missing. Deterministic, so test ids
    are stable.
    """
    names = sorted(factors, key=lambda n: -len(factors[n]))
    a, b = names[0], names[1]
    cases = [{a: va, b: vb} for va in factors[a] for vb in factors[b] if valid({a: va, b: vb})]
    for i, f in enumerate(names[2:], 2):
        prev = names[:i]
        # the missing pairs (earlier factor, its value's index, index of f's value)
        todo = {
            (p, ip, iv)
            for p in prev
            for ip, vp in enumerate(factors[p])
            for iv, v in enumerate(factors[f])
            if valid({p: vp, f: v})
        }

        def covered(case, iv, prev=prev):
            return {(p, factors[p].index(case[p]), iv) for p in prev if p in case}

        for case in cases:  # each case so far takes the value of f covering the most new pairs
            options = [iv for iv, v in enumerate(factors[f]) if valid({**case, f: v})]
            if options:
                iv = max(options, key=lambda iv: len(covered(case, iv) & todo))
                case[f] = factors[f][iv]
                todo -= covered(case, iv)
        for p, ip, iv in sorted(todo, key=lambda t: (names.index(t[0]), t[1], t[2])):
            if (p, ip, iv) not in todo:
                continue
            vp, v = factors[p][ip], factors[f][iv]
            for case in cases:  # a case still free in p or f, else a new one
                free = (p not in case or f not in case) and case.get(p, vp) == vp
                if free and case.get(f, v) == v and valid({**case, p: vp, f: v}):
                    break
            else:
                case = {}
                cases.append(case)
            case[p], case[f] = vp, v
            todo -= covered(case, iv)
    for case in cases:  # factors no pair needed: any allowed value
        for n in names:
            if n not in case:
                options = [v for v in factors[n] if valid({**case, n: v})]
                if not options:
                    raise ValueError(f"no value of {n!r} is allowed with {case}")
                case[n] = options[0]
    return [{n: case[n] for n in factors} for case in cases]


def uncovered(factors: dict[str, tuple], cases: list[dict], valid=lambda c: True) -> list:
    """The allowed pairs of values that no case holds, and the cases ``valid`` refuses."""
    seen = set().union(*(_pairs(c) for c in cases))
    missing = [c for c in cases if not valid(c)]
    for a, b in itertools.combinations(list(factors), 2):
        for va, vb in itertools.product(factors[a], factors[b]):
            if valid({a: va, b: vb}) and ((a, repr(va)), (b, repr(vb))) not in seen:
                missing.append((a, va, b, vb))
    return missing


def case_id(case: dict) -> str:
    def short(v):
        return "x".join(map(str, v)) if isinstance(v, tuple) else str(v).replace("torch.", "")

    return "-".join(short(v) for v in case.values())


# ----------------------------------------------------------------------------------------------
# Inputs in a layout
# ----------------------------------------------------------------------------------------------
def randn(*shape, dtype=torch.float32, device="cpu", scale=1.0, shift=0.0) -> torch.Tensor:
    return (torch.randn(*shape) * scale + shift).to(dtype).to(device)


def relayout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """The same (M, N) values as t, laid out as ``"contiguous"``, ``"strided"`` (a column slice of
    wider rows), ``"every_other_row"`` or ``"broadcast"`` (t's first row, stride 0), with NaN
    wherever a read that ignored the layout would land."""
    m, n = t.shape
    if layout == "strided":
        buf = torch.full((m, n + 7), float("nan"), dtype=t.dtype, device=t.device)
        buf[:, 3 : 3 + n] = t
        return buf[:, 3 : 3 + n]
    if layout == "every_other_row":
        buf = torch.full((2 * m, n), float("nan"), dtype=t.dtype, device=t.device)
        buf[::2] = t
        return buf[::2]
    if layout == "broadcast":
        return t[:1].expand(m, n)
    assert layout == "contiguous", layout
    return t


def param_layout(t: torch.Tensor | None, layout: str) -> torch.Tensor | None:
    """The same (N,) values as t, laid out ``"contiguous"``, ``"strided"`` (every other element),
    ``"expanded"`` (t's first value, stride 0) or at a storage ``"offset"``, with NaN wherever a
    unit-stride read from the view's first element would land."""
    if t is None or layout == "contiguous":
        return t
    if layout == "strided":
        return torch.stack([t, torch.full_like(t, float("nan"))], dim=1).reshape(-1)[::2]
    if layout == "expanded":
        return t[:1].expand(t.shape[0])
    assert layout == "offset", layout
    nan = torch.full((3,), float("nan"), dtype=t.dtype, device=t.device)
    return torch.cat([nan, t])[3:]


def bitwise_equal(a, b) -> bool:
    """The tensors of a and b hold the same bits, pairwise."""
    pairs = zip(a, b, strict=True)
    return all(torch.equal(u.view(torch.uint8), v.view(torch.uint8)) for u, v in pairs)


def triton_layouts(n: int) -> dict:
    """Triton configs that force each kernel layout on rows of n ≤ 64 elements: ``"single"`` (one
    tile holds a row), ``"loop"`` (a row walked in 16-column blocks) and ``"split"`` (a row split
    over ⌈n/16⌉ cooperating programs), two rows a tile, few programs (a persistent loop)."""
    from rmsnorm.kernels.triton import Config

    split = -(-n // 16)
    return {
        "single": Config(2, 64, 4, programs=2),
        "loop": Config(2, 16, 4, loop=True, programs=3),
        "split": Config(2, 16, 4, split=split, programs=2 * split),
    }


# ----------------------------------------------------------------------------------------------
# Every launcher on one set of inputs
# ----------------------------------------------------------------------------------------------
def check_all_ops(mod, x, w, b, *, eps_mode="mean_square", k=None, res=None, label=""):
    """rms_norm (or add_rms_norm, given ``res``) and layer_norm, forward and backward, of backend
    ``mod`` on x (M, N) against the spec. Each backward starts from the float64 spec's statistics
    (rounded to the compute dtype), so that only its own error is measured."""
    m, n = x.shape
    opts = R.RMSOptions(EPS, eps_mode, "gemma", 0.0, n if k is None else k)
    if res is None:
        _, eager, exact = check_launcher(mod, "rms_norm_fwd", x, w, b, opts, label=label)
        xin, dres = x, None
    else:
        _, eager, exact = check_launcher(mod, "add_rms_norm_fwd", x, res, w, b, opts, label=label)
        xin, dres = eager[1], randn(m, n, dtype=res.dtype, device=x.device)
    dy = randn(m, n, dtype=eager[0].dtype, device=x.device)
    rstd = exact[-1].to(eager[-1].dtype)
    bwd = (dy, xin, w, b, rstd, dres, opts, x.dtype, True)
    check_launcher(mod, "rms_norm_bwd", *bwd, label=label)

    _, eager, exact = check_launcher(mod, "layer_norm_fwd", x, w, b, EPS, label=label)
    mean, rstd = exact[1].to(eager[1].dtype), exact[2].to(eager[2].dtype)
    dy = randn(m, n, dtype=x.dtype, device=x.device)
    check_launcher(mod, "layer_norm_bwd", dy, x, w, b, mean, rstd, True, label=label)
