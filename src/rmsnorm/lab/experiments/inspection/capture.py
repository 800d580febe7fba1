"""Measure, with forward hooks on the norm layers of any PyTorch model
(:mod:`~rmsnorm.lab.models.norm_layers` finds them and says their kind), the centering of what
they normalize and what swapping each for the other kind would change.

What is measured, per call, is the rows the layer actually normalizes, v (docs/lab.md):
- plain norms: the input x, one row per token; grouped RMSNorm (``group_size`` g < N: this
  library's ``group_size``, the HF classes' ``group_size`` / ``n_groups``): each group of g
  consecutive elements is a row of its own, so μ, σ, |μ|/σ, μ²/RMS² and the cosine are per group;
- gated RMSNorm, norm then gate (y = n(x)·act(z): Qwen3-Next, Kimi-Linear, Falcon-H1 by default):
  v = x; gate then norm (y = n(x·act(z)): the Mamba2 family): v = x·act(z), computed as
  ``gated_rms_norm`` does (in the compute dtype); an optional gate not passed (``None``): v = x;
- the residual form (``AddRMSNorm``): v = x + residual, the second output.
Per layer also the per-channel outliers of v's whole rows (:mod:`~rmsnorm.lab.stats.outliers`):
max|vᵢ|/RMS, excess kurtosis, the top channels' share of Σv² and which channels those are, which
|μ|/σ cannot see.

The swap measured for each layer, y against y_swap over its output:
- a LayerNorm against RMSNorm with the same γ, β, ε (computed from its ``weight``, ``bias`` and
  ``eps``/``variance_epsilon`` attributes, assuming y = γ·x̂ + β);
- an RMSNorm against the centering LayerNorm it would be: v centered per group (v − μ_g) goes
  through the same normalization. Without a gate, or gating after the norm, that is the module
  itself called on the centered x with its other arguments (the same gate), which is exactly
  LayerNorm with its own γ, ε and conventions (offset, casting) whatever its class. Gating before
  the norm, the centered x·act(z) goes through this library's ``gated_rms_norm`` / ``rms_norm``
  with the module's γ, ε, groups and conventions (its gate already applied). The residual form:
  ``rms_norm`` of the centered x + residual with the module's options.
A layer whose inputs the capture cannot read records ``swap_error`` (why) and no number: a class
recognised only by its name that is called with further tensor inputs (a gate? a residual?), or a
gated class whose activation this library does not compute when it gates before the norm.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from ....functional import rms_norm
from ....integrations import hf
from ....integrations.hf.conventions import ACT2FN_NAMES
from ....integrations.hf.conventions import group_size as hf_group_size
from ....modules import AddRMSNorm, GatedRMSNorm, RMSNorm
from ...models.norm_layers import find_norm_layers, module_eps, norm_dims, norm_width
from ...stats.outliers import OutlierAccumulator
from ...stats.rows import row_stats, summarize

__all__ = ["NormLayerRecord", "NormCapture"]


# ----------------------------------------------------------------------------------------------
# How a norm layer reads its inputs: which rows it normalizes, in groups of how many, gated how.
# ----------------------------------------------------------------------------------------------
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": nn.functional.silu,
    "sigmoid": torch.sigmoid,
}
NORM_THEN_GATE, GATE_THEN_NORM = "norm_then_gate", "gate_then_norm"
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class _Unreadable(Exception):
    """The capture cannot tell what this call normalizes (the message says why)."""


@dataclass(frozen=True)
class _Form:
    """What the capture knows of a norm layer's forward. ``source``: ``"module"`` (torch's
    LayerNorm / RMSNorm and their subclasses, this library's with their ``group_size``),
    ``"gated"`` (this library's GatedRMSNorm), ``"residual"`` (AddRMSNorm), ``"hf"`` (a class
    with a :class:`~rmsnorm.integrations.hf.Convention`, ``conv``) or ``"name"`` (recognised by
    its name only)."""

    kind: str
    source: str
    conv: hf.Convention | None = None


def _form(module: nn.Module, kind: str) -> _Form:
    if isinstance(module, GatedRMSNorm):
        return _Form(kind, "gated")
    if isinstance(module, AddRMSNorm):
        return _Form(kind, "residual")
    if isinstance(module, (nn.RMSNorm, nn.LayerNorm)):
        return _Form(kind, "module")
    try:
        return _Form(kind, "hf", hf.convention_of(type(module)))
    except ValueError:  # not a recognised class: found by the name rule
        return _Form(kind, "name")


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _gating(module: nn.Module, form: _Form) -> tuple[str, str] | None:
    """(order, activation) of a gated layer, None for one without a gate input. The activation is
    ``"silu"`` / ``"sigmoid"``, or the class's own name for one this library does not compute."""
    if form.source == "gated":
        order = NORM_THEN_GATE if module.norm_before_gate else GATE_THEN_NORM
        return order, module.activation
    conv = form.conv
    if form.source != "hf" or conv is None or conv.gate is None:
        return None
    before = conv.norm_before_gate
    if conv.norm_before_gate_attr is not None:
        before = getattr(module, conv.norm_before_gate_attr, None)
        if not isinstance(before, bool):
            raise _Unreadable(
                f"its {conv.norm_before_gate_attr} is {before!r}, not True or False: the order "
                "of gate and norm is unknown"
            )
    activation = conv.activation
    if conv.activation_attr is not None:
        name = getattr(module, conv.activation_attr, None)
        activation = ACT2FN_NAMES.get(name, repr(name))
    return (NORM_THEN_GATE if before else GATE_THEN_NORM), activation


def _group_size(module: nn.Module, form: _Form, n: int) -> int:
    """g, the elements per group of a row of n (n for one group)."""
    if form.kind == "layernorm" or form.source == "name":
        g = None
    elif form.source == "hf":
        try:
            g = hf_group_size(module, form.conv, n)
        except (AttributeError, TypeError, ValueError, ZeroDivisionError) as exc:
            raise _Unreadable(f"its groups cannot be read: {exc}") from exc
    else:
        g = getattr(module, "group_size", None)
    if g is None:
        return n
    if isinstance(g, bool) or not isinstance(g, int) or g <= 0 or n % g:
        raise _Unreadable(f"its group size {g!r} does not divide the {n} normalized elements")
    return g


def _gate_product(x: torch.Tensor, gate: torch.Tensor, activation: str, casting: str):
    """u = x·act(z) as the gated norms compute it: in the compute dtype, the gate read in it;
    ``casting_mode="none"`` rounds act(z) and the product to the input dtype."""
    cd = _compute_dtype(x.dtype)
    a = _ACTIVATIONS[activation](gate.to(cd))
    if casting == "none":
        return (x.to(cd) * a.to(x.dtype).to(cd)).to(x.dtype).to(cd)
    return x.to(cd) * a


def _centered(v: torch.Tensor, nd: int, g: int) -> torch.Tensor:
    """v − μ per group of g over the trailing nd dims (flattened), in the compute dtype."""
    vf = v.to(_compute_dtype(v.dtype))
    lead = v.shape[: v.dim() - nd]
    n = math.prod(v.shape[v.dim() - nd :])
    if g == n:
        dims = tuple(range(v.dim() - nd, v.dim()))
        return vf - vf.mean(dim=dims, keepdim=True)
    groups = vf.reshape(*lead, n // g, g)
    return (groups - groups.mean(dim=-1, keepdim=True)).reshape(v.shape)


@dataclass
class _Call:
    """One call of a norm layer: its arguments, read through its forward's signature."""

    args: tuple
    kwargs: dict
    names: list[str]  # the forward's positional parameters, in order

    def get(self, i: int, *aliases: str) -> object:
        """The i-th positional argument, passed by position or by name (or one of ``aliases``)."""
        if i < len(self.args):
            return self.args[i]
        for key in [*self.names[i : i + 1], *aliases]:
            if key in self.kwargs:
                return self.kwargs[key]
        return None

    def _input_key(self) -> str | None:
        if self.names and self.names[0] in self.kwargs:
            return self.names[0]
        return next(iter(self.kwargs), None)

    def input(self) -> object:
        if self.args:
            return self.args[0]
        key = self._input_key()
        return None if key is None else self.kwargs[key]

    def with_input(self, x: torch.Tensor) -> tuple[tuple, dict]:
        """The same call with the input replaced by ``x``."""
        if self.args:
            return (x, *self.args[1:]), self.kwargs
        return self.args, {**self.kwargs, self._input_key(): x}

    def other_tensors(self) -> list[str]:
        """Where tensors other than the input were passed: positions and keywords."""
        found = [f"argument {i}" for i, a in enumerate(self.args[1:], 1) if _is_tensor(a)]
        first = None if self.args else self._input_key()
        found += [f"{k}=" for k, a in self.kwargs.items() if k != first and _is_tensor(a)]
        return found


def _is_tensor(value: object) -> bool:
    return isinstance(value, torch.Tensor) or (
        isinstance(value, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in value)
    )


def _positional_names(module: nn.Module) -> list[str]:
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):  # a forward without a signature: positions only
        return []
    return [p.name for p in params if p.kind in _POSITIONAL]


@dataclass
class _Read:
    """What one call normalizes: the rows v (the input's shape), the group size, and the gating
    this call applied (None: no gate entered it)."""

    v: torch.Tensor
    g: int
    gated: str | None


def _read(module: nn.Module, form: _Form, call: _Call, x: torch.Tensor, output, nd: int) -> _Read:
    n = math.prod(x.shape[x.dim() - nd :])
    if form.source == "name":
        extra = call.other_tensors()
        if extra:
            raise _Unreadable(
                f"{type(module).__name__} is recognised by its name only and was called with "
                f"further tensor inputs ({', '.join(extra)}) whose role (a gate? a residual?) "
                "the capture does not know; declare how it computes with "
                "rmsnorm.integrations.hf.register to measure it"
            )
        return _Read(x, n, None)
    g = _group_size(module, form, n)
    if form.source == "residual":
        if not (isinstance(output, (tuple, list)) and len(output) == 2):
            raise _Unreadable("the residual form did not return (out, residual_out)")
        return _Read(output[1], g, None)
    gating = _gating(module, form)
    gate = call.get(1, "gate") if gating is not None else None
    if gate is None:  # ungated, or an optional gate not passed (a required one fails first)
        return _Read(x, g, None)
    if not isinstance(gate, torch.Tensor) or gate.shape != x.shape:
        raise _Unreadable(f"its gate is not a tensor of the input's shape {tuple(x.shape)}")
    order, activation = gating
    if order == NORM_THEN_GATE:
        return _Read(x, g, order)
    if activation not in _ACTIVATIONS:
        raise _Unreadable(
            f"it gates before the norm with the activation {activation}, which this library "
            f"does not compute ({', '.join(_ACTIVATIONS)}): what it normalizes, x·act(gate), "
            "is unknown here"
        )
    casting = module.casting_mode if form.source == "gated" else form.conv.casting_mode
    return _Read(_gate_product(x, gate, activation, casting), g, order)


def _rms_library_call(module: nn.Module, form: _Form, v: torch.Tensor, n: int, g: int):
    """The module's RMSNorm, without a gate, of v, through this library's functions with the
    module's own γ, β, ε, groups and conventions (AddRMSNorm's normalization of x + residual, the
    gated classes' normalization of x·act(z))."""
    # This library's modules: their own forward (the class's, not the instance's hooked call),
    # which without a gate is the plain, grouped RMSNorm with all their options.
    if form.source == "gated":
        return GatedRMSNorm.forward(module, v)
    if form.source == "residual":
        return RMSNorm.forward(module, v)
    conv = form.conv  # a gated HF class: its patched forward's call, gate=None
    eps = conv.eps_of(module)
    return rms_norm(
        v,
        n,
        module.weight,
        eps,
        casting_mode=conv.casting_mode,
        offset=conv.offset,
        group_size=None if g == n else g,
    )


@dataclass
class NormLayerRecord:
    """What one norm layer saw over all its calls: per-row statistics of what it normalizes (one
    row per token, or per group of a token with groups), and the output difference if it were
    swapped for the other kind."""

    name: str
    cls: str
    kind: str
    width: int | None
    eps: float | None
    calls: int = 0
    ratio: list[torch.Tensor] = field(default_factory=list)  # |μ|/σ per row, float64
    share: list[torch.Tensor] = field(default_factory=list)  # μ²/RMS² per row
    cosine: list[torch.Tensor] = field(default_factory=list)  # predicted σ/RMS per row
    identity_rel_error: float = 0.0
    swap_max_abs: float = 0.0
    swap_sq: float = 0.0  # Σ (y − y_swap)²
    out_sq: float = 0.0  # Σ y²
    swap_error: str | None = None
    outliers: OutlierAccumulator = field(default_factory=OutlierAccumulator)
    tokens: int = 0  # tokens whose rows are kept in ratio / share / cosine
    group_size: int | None = None  # g of the last call (width for one group)
    gate: str | None = None  # NORM_THEN_GATE / GATE_THEN_NORM for a layer with a gate input
    activation: str | None = None
    gated_calls: int = 0  # calls in which a gate entered (an optional gate may be None)
    residual: bool = False  # the residual form: it normalizes x + residual
    unread_calls: int = 0  # calls the capture could not read (swap_error says why)

    @property
    def swap_to(self) -> str:
        return "rmsnorm" if self.kind == "layernorm" else "layernorm"

    @property
    def groups(self) -> int | None:
        if self.width is None or not self.group_size:
            return None
        return self.width // self.group_size

    def normalizes(self) -> str:
        """What the statistics are of, in words."""
        read = self.calls - self.unread_calls
        if self.residual:
            what = "x + residual"
        elif self.gate == GATE_THEN_NORM and self.gated_calls:
            what = f"x·{self.activation}(gate)"
            if self.gated_calls < read:
                what += f" ({self.gated_calls} calls), x ({read - self.gated_calls} ungated calls)"
        else:
            what = "x"
        if self.groups and self.groups > 1:
            what += f", per group of {self.group_size}"
        return what

    def summary(self) -> dict:
        ratio = torch.cat(self.ratio) if self.ratio else torch.empty(0, dtype=torch.float64)
        share = torch.cat(self.share) if self.share else torch.empty(0, dtype=torch.float64)
        cos = torch.cat(self.cosine) if self.cosine else torch.empty(0, dtype=torch.float64)
        rel = math.sqrt(self.swap_sq / self.out_sq) if self.out_sq > 0 else math.nan
        return {
            "name": self.name,
            "class": self.cls,
            "kind": self.kind,
            "width": self.width,
            "eps": self.eps,
            "group_size": self.group_size,
            "groups": self.groups,
            "gate": self.gate,
            "activation": self.activation,
            "normalizes": self.normalizes(),
            "calls": self.calls,
            "gated_calls": self.gated_calls,
            "tokens": self.tokens,
            "rows": int(ratio.numel()),
            "mu_over_sigma": summarize(ratio),
            "mean_energy_share": summarize(share),
            "predicted_cosine": summarize(cos),
            "identity_max_rel_error": self.identity_rel_error,
            "swap_to": self.swap_to,
            "swap_max_abs_diff": self.swap_max_abs if self.swap_error is None else math.nan,
            "swap_rel_diff": rel if self.swap_error is None else math.nan,
            "swap_error": self.swap_error,
            "outliers": self.outliers.summary(),
        }


class NormCapture:
    """Context manager: forward hooks on every norm layer of ``model`` that record per-row μ, σ,
    RMS of what the layer normalizes and the output difference of the swap (see the module
    docstring). Leaving the context removes the hooks."""

    def __init__(self, model: nn.Module, max_tokens_per_layer: int | None = None) -> None:
        self.model = model
        self.max_tokens = max_tokens_per_layer
        self.layers = find_norm_layers(model)
        self.records: dict[str, NormLayerRecord] = {}
        self._forms: dict[str, _Form] = {}
        self._names: dict[str, list[str]] = {}
        for name, m, kind in self.layers:
            form = _form(m, kind)
            rec = NormLayerRecord(
                name,
                type(m).__name__,
                kind,
                norm_width(m),
                module_eps(m),
                outliers=OutlierAccumulator(max_rows=max_tokens_per_layer),
                residual=form.source == "residual",
            )
            try:
                gating = _gating(m, form)
            except _Unreadable:  # said again, per call
                gating = None
            if gating is not None:
                rec.gate, rec.activation = gating
            self.records[name] = rec
            self._forms[name] = form
            self._names[name] = _positional_names(m)
        self._handles: list = []
        self._busy = False  # the RMSNorm swap re-enters the module; its hooks must not record it

    def __enter__(self) -> NormCapture:
        for name, module, _ in self.layers:
            self._handles.append(module.register_forward_hook(self._hook(name), with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _hook(self, name: str):
        def hook(module, args, kwargs, output):
            if self._busy:
                return
            call = _Call(tuple(args), dict(kwargs), self._names[name])
            x = call.input()
            y = output[0] if isinstance(output, (tuple, list)) else output
            if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
                return
            self._busy = True
            try:
                with torch.no_grad():
                    self._record(name, module, call, x.detach(), output, y.detach())
            finally:
                self._busy = False

        return hook

    def _record(self, name: str, module: nn.Module, call: _Call, x, output, y) -> None:
        rec, form = self.records[name], self._forms[name]
        nd = norm_dims(module)
        d = math.prod(x.shape[x.dim() - nd :])
        rec.calls += 1
        try:
            read = _read(module, form, call, x, output, nd)
            gating = _gating(module, form)
        except _Unreadable as exc:
            rec.unread_calls += 1
            rec.swap_error = f"{type(module).__name__}: {exc}"
            return
        if gating is not None:
            rec.gate, rec.activation = gating
        rec.group_size = read.g
        rec.gated_calls += read.gated is not None
        v = read.v.detach()
        rows = v.reshape(-1, read.g)
        s = row_stats(rows)
        tokens = rows.shape[0] * read.g // d
        keep = tokens
        if self.max_tokens is not None:
            keep = max(0, min(tokens, self.max_tokens - rec.tokens))
        rec.tokens += keep
        kept = slice(0, keep * (d // read.g))
        rec.ratio.append(s.ratio[kept])
        rec.share.append(s.mean_energy_share[kept])
        rec.cosine.append(s.cosine[kept])
        rec.outliers.add(v.reshape(-1, d))
        lhs = s.rms.square()
        err = (lhs - s.std.square() - s.mean.square()).abs() / lhs.clamp_min(1e-300)
        rec.identity_rel_error = max(rec.identity_rel_error, float(err.max()))
        if rec.unread_calls:  # a swap over only some of the calls would be a wrong number
            return
        try:
            swapped = self._swap(rec, form, module, call, x, read, nd)
        except Exception as exc:  # an exotic class: report why, keep the statistics
            rec.swap_error = f"{type(exc).__name__}: {exc}"
            return
        yf = y.to(torch.float64).reshape(-1, d)
        diff = yf - swapped.to(torch.float64).reshape(-1, d)
        rec.swap_max_abs = max(rec.swap_max_abs, float(diff.abs().max()))
        rec.swap_sq += float(diff.square().sum())
        rec.out_sq += float(yf.square().sum())

    @staticmethod
    def _swap(
        rec: NormLayerRecord,
        form: _Form,
        module: nn.Module,
        call: _Call,
        x: torch.Tensor,
        read: _Read,
        nd: int,
    ) -> torch.Tensor:
        if rec.kind == "rmsnorm":
            centered = _centered(read.v, nd, read.g).to(x.dtype)
            if form.source == "residual" or read.gated == GATE_THEN_NORM:
                # the LayerNorm of x + residual / of x·act(z): this library's RMSNorm of it
                # centered, with the module's options (x·act(z) is not the module's input)
                d = math.prod(x.shape[x.dim() - nd :])
                return _rms_library_call(module, form, centered, d, read.g)
            # the module itself, on centered rows and with the same gate, is LayerNorm (then the
            # gate) with its own γ, ε and conventions
            args, kwargs = call.with_input(centered)
            out = module(*args, **kwargs)
            return out[0] if isinstance(out, (tuple, list)) else out
        weight = getattr(module, "weight", None)
        bias = getattr(module, "bias", None)
        eps = rec.eps if rec.eps is not None else 1e-5
        dims = tuple(range(x.dim() - nd, x.dim()))
        cd = torch.float64 if x.dtype == torch.float64 else torch.float32
        xf = x.to(cd)
        y = xf * torch.rsqrt(xf.square().mean(dim=dims, keepdim=True) + eps)
        shape = x.shape[x.dim() - nd :]
        if isinstance(weight, torch.Tensor):
            y = y * weight.to(cd).reshape(shape)
        if isinstance(bias, torch.Tensor):
            y = y + bias.to(cd).reshape(shape)
        return y

    def summary(self) -> list[dict]:
        return [self.records[name].summary() for name, _, _ in self.layers]
