"""What replacing LayerNorm by RMSNorm costs a trained pre-LN model end to end, measured on its
next-token predictions: naively (each LayerNorm becomes γ·x/√(mean(x²) + ε) + β with the same γ,
β, ε) and by the exact conversion (:func:`rmsnorm.convert.layernorm_to_rmsnorm`: center every
layer writing into the residual stream, then swap; the same function up to rounding). Both all
norms at once and one norm at a time.

Per variant: KL(original ‖ swapped) of the next-token distributions (mean over tokens, nats), the
change of the cross-entropy loss on the same targets, and max |Δ logits|. Everything in float64,
so that the exact conversion's differences are rounding (~1e-15), not float32 noise.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from ...modules import LayerNorm, RMSNorm

if TYPE_CHECKING:
    from .trained import TrainStudy

__all__ = ["norm_slots", "naive_swap", "logit_cost", "swap_costs", "swap_over_seeds"]

# The swap runs 2 × (norms + 1) float64 forwards per model; 8 of the held-out sequences (512
# tokens) keep it to ~1.5 s per seed.
SWAP_SEQUENCES = 8


def norm_slots(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """(name, parent, attribute) of every LayerNorm or RMSNorm module of ``model`` (torch's or this
    library's), in the order the model registers them (the blocks', then the final norm)."""
    modules = dict(model.named_modules())
    out = []
    for name, module in modules.items():
        if name and isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            parent, _, attr = name.rpartition(".")
            out.append((name, modules[parent], attr))
    return out


def _rms_like(ln: nn.LayerNorm) -> RMSNorm:
    """RMSNorm with ``ln``'s own γ, β (shared Parameters) and ε."""
    rms = RMSNorm(
        ln.normalized_shape,
        eps=ln.eps,
        bias=ln.bias is not None,
        device=ln.weight.device,
        dtype=ln.weight.dtype,
    )
    rms.weight = ln.weight
    if ln.bias is not None:
        rms.bias = ln.bias
    return rms


def _ln_like(rms: nn.Module) -> LayerNorm:
    """LayerNorm with an RMSNorm's γ, β (shared Parameters) and ε (the inverse of the swap)."""
    ln = LayerNorm(
        rms.normalized_shape,
        eps=rms.eps,
        bias=getattr(rms, "bias", None) is not None,
        device=rms.weight.device,
        dtype=rms.weight.dtype,
    )
    ln.weight = rms.weight
    if getattr(rms, "bias", None) is not None:
        ln.bias = rms.bias
    return ln


def naive_swap(model: nn.Module, only: str | None = None) -> nn.Module:
    """A copy of ``model`` with its LayerNorms (or only the one named ``only``) replaced by
    RMSNorms carrying the same γ, β and ε."""
    model = copy.deepcopy(model)
    for name, parent, attr in norm_slots(model):
        if isinstance(getattr(parent, attr), nn.LayerNorm) and only in (None, name):
            setattr(parent, attr, _rms_like(getattr(parent, attr)))
    return model


def _exact_swap(model: nn.Module, only: str | None = None) -> nn.Module:
    """The exact conversion, with every norm except ``only`` turned back into a LayerNorm (the
    centered writers leave LayerNorm's output unchanged, so any subset of swapped norms is
    exact)."""
    from ...convert import layernorm_to_rmsnorm

    converted = layernorm_to_rmsnorm(model)
    if only is not None:
        for name, parent, attr in norm_slots(converted):
            if name != only:
                setattr(parent, attr, _ln_like(getattr(parent, attr)))
    return converted


@torch.no_grad()
def logit_cost(reference: torch.Tensor, swapped: torch.Tensor, targets: torch.Tensor) -> dict:
    """KL(reference ‖ swapped) per token (mean and max, nats), Δ loss (cross-entropy of
    ``swapped`` minus that of ``reference`` on ``targets``) and max |Δ logits|."""
    ref = reference.flatten(0, -2).double()
    new = swapped.flatten(0, -2).double()
    logp, logq = F.log_softmax(ref, -1), F.log_softmax(new, -1)
    kl = (logp.exp() * (logp - logq)).sum(-1).clamp_min(0.0)
    t = targets.flatten()
    return {
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        "delta_loss": float(F.cross_entropy(new, t) - F.cross_entropy(ref, t)),
        "max_abs_logit_diff": float((new - ref).abs().max()),
        "logit_rms": float(ref.square().mean().sqrt()),
    }


@torch.no_grad()
def swap_costs(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> dict:
    """The costs of :mod:`this module <rmsnorm.lab.experiments.swap>` for a pre-LN LayerNorm model
    of the lab (or any model :func:`~rmsnorm.convert.layernorm_to_rmsnorm` supports and that maps
    tokens to logits): ``{"loss": original loss, "naive": {"all": cost, "one": {norm: cost}},
    "exact": …}``."""
    base = copy.deepcopy(model).double().eval()
    ref = base(tokens)
    names = [n for n, p, a in norm_slots(base) if isinstance(getattr(p, a), nn.LayerNorm)]
    if not names:
        raise ValueError(f"{type(model).__name__} has no LayerNorm to swap")
    out: dict = {
        "loss": float(F.cross_entropy(ref.flatten(0, -2), targets.flatten())),
        "norms": names,
    }
    for kind, swap in (("naive", naive_swap), ("exact", _exact_swap)):
        out[kind] = {
            "all": logit_cost(ref, swap(base)(tokens), targets),
            "one": {n: logit_cost(ref, swap(base, n)(tokens), targets) for n in names},
        }
    return out


def swap_over_seeds(study: TrainStudy, sequences: int = SWAP_SEQUENCES) -> dict:
    """:func:`swap_costs` of every trained LayerNorm model of ``study`` on the first ``sequences``
    held-out sequences: ``per_seed`` (each seed's costs, with its ``seed``) and ``tokens`` (the
    shape of the token batch)."""
    tokens = study.eval_tokens[:sequences]
    targets = study.eval_targets[:sequences]
    per_seed = []
    for run in study.of("layernorm"):
        costs = swap_costs(run.model, tokens, targets)
        costs["seed"] = run.seed
        per_seed.append(costs)
    return {"per_seed": per_seed, "tokens": list(tokens.shape)}
