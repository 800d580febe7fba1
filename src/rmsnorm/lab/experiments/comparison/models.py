"""Models that differ only in the norm: one per variant, with bit-identical shared parameters
(checked by a SHA-256 fingerprint), so that a comparison measures the normalization alone."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace

import torch

from ...models.norm_layers import norm_kind
from ...models.transformer import Transformer, TransformerConfig


def norm_parameter_names(model: torch.nn.Module) -> set[str]:
    """Names of the parameters owned by normalization layers (as
    :func:`~rmsnorm.lab.models.norm_layers.norm_kind` recognises them)."""
    return {
        f"{mod_name}.{p_name}" if mod_name else p_name
        for mod_name, mod in model.named_modules()
        if norm_kind(mod) is not None
        for p_name, _ in mod.named_parameters(recurse=False)
    }


def shared_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """Every parameter that is not a norm's, by name: what all variants have in common."""
    norm = norm_parameter_names(model)
    return {n: p for n, p in model.named_parameters() if n not in norm}


def fingerprint(params: dict[str, torch.Tensor]) -> str:
    """SHA-256 of the parameters' bytes in name order: equal fingerprints, equal tensors."""
    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(params[name].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def build_models(
    model_cfg: TransformerConfig, variants: Sequence[str], seed: int, device: str = "cpu"
) -> dict[str, Transformer]:
    """One model per variant whose shared parameters are bit-identical: a norm-free template is
    built from ``seed`` and its parameters are copied by name into every variant; the norms keep
    their own init (γ = 1, β = 0)."""
    torch.manual_seed(seed)
    template = shared_parameters(Transformer(replace(model_cfg, norm="none")))
    models = {}
    for variant in variants:
        torch.manual_seed(seed)
        model = Transformer(replace(model_cfg, norm=variant))
        shared = shared_parameters(model)
        if shared.keys() != template.keys():
            raise RuntimeError(
                f"variant {variant!r} does not share the template's parameters: "
                f"{sorted(shared.keys() ^ template.keys())}"
            )
        with torch.no_grad():
            for name, p in shared.items():
                p.copy_(template[name])
        models[variant] = model.to(device)
    return models
