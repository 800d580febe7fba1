"""Find the LayerNorm / RMSNorm layers of any PyTorch model and measure, with forward hooks, the
centering of their inputs and what swapping each for the other kind would change.

Which modules count as norm layers (:func:`norm_kind`):
1. What :func:`rmsnorm.integrations.norm_kind` recognises, of the kind it says: ``torch.nn``'s
   LayerNorm and RMSNorm and their subclasses (this library's modules among them), and the
   Hugging Face classes recognised by their code (``LlamaRMSNorm``, ``T5LayerNorm`` ...).
2. Any other module whose class name contains ``LayerNorm``, ``RMSNorm``, ``Layer_Norm`` or
   ``RMS_Norm`` (any case: ``LlamaRMSNorm``, ``GemmaRMSNorm``, ``Qwen2RMSNorm``, ``T5LayerNorm``,
   ``FusedRMSNorm`` ...), that has no child modules and whose parameters are all 1-D of one length
   (γ, β). Its kind is decided by a probe, not by its name: the module is run on two random rows and
   on the same rows plus 3; LayerNorm is invariant to adding a constant to a row, RMSNorm is not
   (so ``T5LayerNorm``, which does not subtract the mean, is found to be an RMSNorm). When the
   probe cannot run (width unknown, an error, an all-zero output) the name decides: ``rms`` in it
   means RMSNorm.

Per layer also the input's per-channel outliers (:mod:`~rmsnorm.lab.outliers`): max|xᵢ|/RMS,
excess kurtosis, the top channels' share of Σx² and which channels those are, which |μ|/σ cannot
see.

The swap measured for each layer: a LayerNorm's output against RMSNorm with the same γ, β, ε
(computed from its ``weight``, ``bias`` and ``eps``/``variance_epsilon`` attributes, assuming
y = γ·x̂ + β); an RMSNorm's output against the same module applied to the centered input, which is
exactly LayerNorm with that module's γ, ε and conventions (offset, casting) whatever its class.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import torch
from torch import nn

from .. import integrations
from .outliers import OutlierAccumulator
from .stats import row_stats, summarize

__all__ = ["norm_kind", "find_norm_layers", "NormLayerRecord", "NormCapture"]

_KINDS = {"layer": "layernorm", "rms": "rmsnorm"}  # integrations.norm_kind's words -> the lab's
_NAME_RULE = re.compile(r"(layer|rms)_?norm", re.IGNORECASE)
_PROBE_SHIFT = 3.0
_EPS_ATTRS = ("eps", "variance_epsilon", "epsilon")


def _width(module: nn.Module) -> int | None:
    """Number of normalized elements per row, from the parameters or the usual attributes."""
    shape = getattr(module, "normalized_shape", None)
    if shape is not None:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return math.prod(shape)
    params = list(module.parameters(recurse=False))
    if params:
        return params[0].numel()
    for attr in ("hidden_size", "dim", "d_model"):
        value = getattr(module, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _norm_dims(module: nn.Module) -> int:
    """How many trailing dims the module normalizes over (1 unless it says otherwise)."""
    shape = getattr(module, "normalized_shape", None)
    if shape is None or isinstance(shape, int):
        return 1
    return max(1, len(tuple(shape)))


def module_eps(module: nn.Module) -> float | None:
    for attr in _EPS_ATTRS:
        value = getattr(module, attr, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _probe_kind(module: nn.Module, width: int) -> str | None:
    """``layernorm`` if the module's output ignores a constant added to each row, ``rmsnorm`` if
    not, None if the probe is inconclusive."""
    param = next(module.parameters(recurse=False), None)
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    device = param.device if param is not None else torch.device("cpu")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, width, generator=gen).to(device=device, dtype=dtype)
    try:
        with torch.no_grad():
            y0 = module(x)
            y1 = module(x + _PROBE_SHIFT)
    except Exception:
        return None
    if not isinstance(y0, torch.Tensor) or y0.shape != x.shape:
        return None
    y0, y1 = y0.float(), y1.float()
    scale = y0.abs().max()
    if not torch.isfinite(scale) or scale == 0:
        return None
    # LN: equal up to rounding of the input dtype (bf16 ≈ 1e-2); RMSNorm: changes by O(1)
    return "layernorm" if (y0 - y1).abs().max() <= 0.05 * scale else "rmsnorm"


def norm_kind(module: nn.Module) -> str | None:
    """``"layernorm"``, ``"rmsnorm"`` or None (not a norm layer), by the rule in the module
    docstring."""
    recognised = integrations.norm_kind(module)
    if recognised is not None:
        return _KINDS[recognised]
    name = type(module).__name__
    if not _NAME_RULE.search(name) or next(module.children(), None) is not None:
        return None
    params = list(module.parameters(recurse=False))
    if any(p.dim() != 1 for p in params) or len({p.numel() for p in params}) > 1:
        return None
    width = _width(module)
    kind = _probe_kind(module, width) if width else None
    if kind is None:
        kind = "rmsnorm" if "rms" in name.lower() else "layernorm"
    return kind


def find_norm_layers(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """(qualified name, module, kind) of every norm layer in ``model``, in registration order."""
    found = []
    for name, module in model.named_modules():
        kind = norm_kind(module)
        if kind is not None:
            found.append((name or type(module).__name__, module, kind))
    return found


@dataclass
class NormLayerRecord:
    """What one norm layer saw over all its calls: per-token statistics of its input, and the
    output difference if it were swapped for the other kind."""

    name: str
    cls: str
    kind: str
    width: int | None
    eps: float | None
    calls: int = 0
    ratio: list[torch.Tensor] = field(default_factory=list)  # |μ|/σ per token, float64
    share: list[torch.Tensor] = field(default_factory=list)  # μ²/RMS² per token
    cosine: list[torch.Tensor] = field(default_factory=list)  # predicted σ/RMS per token
    identity_rel_error: float = 0.0
    swap_max_abs: float = 0.0
    swap_sq: float = 0.0  # Σ (y − y_swap)²
    out_sq: float = 0.0  # Σ y²
    swap_error: str | None = None
    outliers: OutlierAccumulator = field(default_factory=OutlierAccumulator)

    @property
    def swap_to(self) -> str:
        return "rmsnorm" if self.kind == "layernorm" else "layernorm"

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
            "calls": self.calls,
            "tokens": int(ratio.numel()),
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
    """Context manager: forward hooks on every norm layer of ``model`` that record per-token μ, σ,
    RMS of the layer's input and the output difference of the swap (see the module docstring).
    Leaving the context removes the hooks."""

    def __init__(self, model: nn.Module, max_tokens_per_layer: int | None = None) -> None:
        self.model = model
        self.max_tokens = max_tokens_per_layer
        self.layers = find_norm_layers(model)
        self.records = {
            name: NormLayerRecord(
                name,
                type(m).__name__,
                kind,
                _width(m),
                module_eps(m),
                outliers=OutlierAccumulator(max_rows=max_tokens_per_layer),
            )
            for name, m, kind in self.layers
        }
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
            x = args[0] if args else next(iter(kwargs.values()), None)
            y = output[0] if isinstance(output, (tuple, list)) else output
            if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
                return
            self._busy = True
            try:
                with torch.no_grad():
                    self._record(self.records[name], module, x.detach(), y.detach())
            finally:
                self._busy = False

        return hook

    def _record(self, rec: NormLayerRecord, module: nn.Module, x: torch.Tensor, y: torch.Tensor):
        nd = _norm_dims(module)
        d = math.prod(x.shape[x.dim() - nd :])
        rows = x.reshape(-1, d)
        s = row_stats(rows)
        rec.calls += 1
        keep = slice(None)
        if self.max_tokens is not None:
            have = sum(t.numel() for t in rec.ratio)
            keep = slice(0, max(0, self.max_tokens - have))
        rec.ratio.append(s.ratio[keep])
        rec.share.append(s.mean_energy_share[keep])
        rec.cosine.append(s.cosine[keep])
        rec.outliers.add(rows)
        lhs = s.rms.square()
        err = (lhs - s.std.square() - s.mean.square()).abs() / lhs.clamp_min(1e-300)
        rec.identity_rel_error = max(rec.identity_rel_error, float(err.max()))
        try:
            swapped = self._swap(rec, module, x, nd)
        except Exception as exc:  # an exotic class: report why, keep the statistics
            rec.swap_error = f"{type(exc).__name__}: {exc}"
            return
        yf = y.to(torch.float64).reshape(-1, d)
        diff = yf - swapped.to(torch.float64).reshape(-1, d)
        rec.swap_max_abs = max(rec.swap_max_abs, float(diff.abs().max()))
        rec.swap_sq += float(diff.square().sum())
        rec.out_sq += float(yf.square().sum())

    @staticmethod
    def _swap(rec: NormLayerRecord, module: nn.Module, x: torch.Tensor, nd: int) -> torch.Tensor:
        dims = tuple(range(x.dim() - nd, x.dim()))
        if rec.kind == "rmsnorm":
            # the module itself on centered rows is LayerNorm with its own γ, ε and conventions
            centered = x.float() - x.float().mean(dim=dims, keepdim=True)
            return module(centered.to(x.dtype))
        weight = getattr(module, "weight", None)
        bias = getattr(module, "bias", None)
        eps = rec.eps if rec.eps is not None else 1e-5
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
