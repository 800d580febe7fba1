"""Which modules of any PyTorch model are norm layers, and of which kind: LayerNorm or RMSNorm.

Which modules count as norm layers (:func:`norm_kind`):
1. What :func:`rmsnorm.integrations.norm_kind` recognises, of the kind it says: ``torch.nn``'s
   LayerNorm and RMSNorm and their subclasses (this library's modules among them), and the
   Hugging Face classes recognised by their code (``LlamaRMSNorm``, ``T5LayerNorm``, the gated
   ``Qwen3NextRMSNormGated``, ``MambaRMSNormGated`` ...), and this library's ``GatedRMSNorm``.
2. Any other module whose class name contains ``LayerNorm``, ``RMSNorm``, ``Layer_Norm`` or
   ``RMS_Norm`` (any case: ``GemmaRMSNorm``, ``FusedRMSNorm`` ...), that has no child modules and
   whose parameters are all 1-D of one length (γ, β). Its kind is decided by a probe, not by its
   name: the module is run on two random rows and on the same rows plus 3; LayerNorm is invariant
   to adding a constant to a row, RMSNorm is not (so a ``T5LayerNorm``-like class, which does not
   subtract the mean, is found to be an RMSNorm). When the probe cannot run (width unknown, an
   error, an all-zero output) the name decides: ``rms`` in it means RMSNorm.
"""

from __future__ import annotations

import math
import re

import torch
from torch import nn

from ... import integrations

__all__ = ["norm_kind", "find_norm_layers", "norm_width", "norm_dims", "module_eps"]

_KINDS = {"layer": "layernorm", "rms": "rmsnorm"}  # integrations.norm_kind's words -> the lab's
_NAME_RULE = re.compile(r"(layer|rms)_?norm", re.IGNORECASE)
_PROBE_SHIFT = 3.0
_EPS_ATTRS = ("eps", "variance_epsilon", "epsilon")


def norm_width(module: nn.Module) -> int | None:
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


def norm_dims(module: nn.Module) -> int:
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
    docstring. The lab's one test of a norm layer, in the lab's words for the two kinds (the norm
    names of its models, ``TransformerConfig.norm``); it asks
    :func:`rmsnorm.integrations.norm_kind` first, whose ``"layer"`` / ``"rms"`` it translates here
    and nowhere else."""
    recognised = integrations.norm_kind(module)
    if recognised is not None:
        return _KINDS[recognised]
    name = type(module).__name__
    if not _NAME_RULE.search(name) or next(module.children(), None) is not None:
        return None
    params = list(module.parameters(recurse=False))
    if any(p.dim() != 1 for p in params) or len({p.numel() for p in params}) > 1:
        return None
    width = norm_width(module)
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
