"""The exact conversion (Jiang et al., NeurIPS 2023): center every layer that writes into the
residual stream, then replace each LayerNorm by an RMSNorm carrying the same γ and β; one routine
for every architecture of :data:`~rmsnorm.convert.ARCHITECTURES`."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from ..integrations import norm_kind
from ..modules import RMSNorm
from .architectures import HIDDEN_DIM, Architecture, ConversionError, architecture_of

__all__ = [
    "layernorm_to_rmsnorm",
    "recenter_",
    "residual_writers",
    "conversion_record",
    "swap_norms",
]

# Recorded on the converted model (in a Hugging Face model's config): what was done, so a loader
# can rebuild the RMSNorms.
CONVERSION_TAG = {
    "method": "centered residual writers, LayerNorm -> RMSNorm (Jiang et al., NeurIPS 2023)",
    "norm": "rmsnorm.RMSNorm",
    "eps_mode": "mean_square",
    "casting_mode": "gemma",
}


@dataclass
class _Layout:
    """An architecture's table entry resolved on one model: the modules themselves."""

    arch: Architecture
    writers: list[tuple[nn.Module, str, int]]  # (module, parameter name, hidden dim)
    norms: list[tuple[nn.Module, str]]  # (parent, attribute)


def _module_at(root: nn.Module, path: str, arch: Architecture) -> nn.Module:
    module = root
    for part in filter(None, path.split(".")):
        module = getattr(module, part, None)
        if not isinstance(module, nn.Module):
            raise ConversionError(
                f"{type(root).__name__} has no module at {path!r}, where the {arch.name} layout "
                "expects one"
            )
    return module


def _layout(model: nn.Module) -> _Layout:
    """Where ``model``'s stream is written and read, from its table entry."""
    arch = architecture_of(model)
    base = _module_at(model, arch.base, arch)
    layout = _Layout(arch, [], [])

    def add_writer(parent: nn.Module, path: str, kind: str) -> None:
        module = _module_at(parent, path, arch)
        layout.writers += [(module, param, dim) for param, dim in HIDDEN_DIM[kind]]

    def add_norm(parent: nn.Module, path: str) -> None:
        owner, _, attr = path.rpartition(".")
        layout.norms.append((_module_at(parent, owner, arch), attr))

    for path in arch.embeddings:
        add_writer(base, path, "embedding")
    for block in _module_at(base, arch.layers, arch):
        for path, kind in arch.writers:
            add_writer(block, path, kind)
        for path in arch.norms:
            add_norm(block, path)
    add_norm(base, arch.final_norm)
    return layout


def conversion_record(model: nn.Module) -> dict | None:
    """What :func:`layernorm_to_rmsnorm` recorded on ``model`` (None: not converted)."""
    return getattr(model, "rmsnorm_conversion", None) or getattr(
        getattr(model, "config", None), "rmsnorm_conversion", None
    )


def residual_writers(model: nn.Module) -> list[str]:
    """Names of the parameters that write into the residual stream of a supported model (those
    the conversion centers along the hidden dimension)."""
    names = {id(p): n for n, p in model.named_parameters()}  # a tied weight under its first name
    layout = _layout(model)
    return [names[id(p)] for m, a, _ in layout.writers if (p := getattr(m, a)) is not None]


# ----------------------------------------------------------------------------------------------
# The steps
# ----------------------------------------------------------------------------------------------
def _center_(p: torch.Tensor, dim: int) -> None:
    # The mean in float64 so that the centered float32 value is as close to zero-mean as rounding
    # allows (the residual mean is then ~1e-8 of the row's scale).
    pd = p.detach().double()
    p.copy_(pd - pd.mean(dim=dim, keepdim=True))


def _center_writers(layout: _Layout) -> None:
    with torch.no_grad():
        for module, attr, dim in layout.writers:
            p = getattr(module, attr)
            if p is not None:
                _center_(p, dim)


def _tied_to_writers(layout: _Layout, model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """(name, module, attribute) of every other use of a writer's Parameter: a head tied to the
    token embedding, which must keep the uncentered values."""
    slots = {(id(m), a) for m, a, _ in layout.writers}
    shared = {id(p) for m, a, _ in layout.writers if (p := getattr(m, a)) is not None}
    return [
        (f"{name}.{attr}" if name else attr, module, attr)
        for name, module in model.named_modules()
        for attr, p in module.named_parameters(recurse=False)
        if id(p) in shared and (id(module), attr) not in slots
    ]


def _untie(layout: _Layout, model: nn.Module) -> list[str]:
    """Give the other uses of the writers' Parameters their own copy of the uncentered values."""
    tied = _tied_to_writers(layout, model)
    copies: dict[int, nn.Parameter] = {}  # one copy per Parameter, so its other uses still share
    for _, module, attr in tied:
        p = getattr(module, attr)
        if id(p) not in copies:
            copies[id(p)] = nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)
        setattr(module, attr, copies[id(p)])
    if tied and layout.arch.hugging_face:
        config = model.config
        config.tie_word_embeddings = False  # else loading the checkpoint ties them again
        if hasattr(config, "get_text_config"):
            config.get_text_config().tie_word_embeddings = False
        if hasattr(model, "all_tied_weights_keys"):  # transformers >= 5 drops tied keys on saving
            model.all_tied_weights_keys = model.get_expanded_tied_weights_keys(all_submodels=True)
    return [name for name, _, _ in tied]


def _rmsnorm_like(ln: nn.LayerNorm) -> RMSNorm:
    """An RMSNorm (mean_square ε placement, same ε) holding ``ln``'s own γ and β Parameters."""
    if len(ln.normalized_shape) != 1:
        raise ConversionError(
            f"LayerNorm over {list(ln.normalized_shape)}: only norms over the hidden dim convert"
        )
    w = ln.weight
    rms = RMSNorm(
        ln.normalized_shape,
        eps=ln.eps,
        elementwise_affine=ln.elementwise_affine,
        bias=ln.bias is not None,
        eps_mode="mean_square",
        casting_mode="gemma",
        device=w.device if w is not None else None,
        dtype=w.dtype if w is not None else None,
    )
    if ln.elementwise_affine:
        rms.weight = ln.weight
    if ln.bias is not None:
        rms.bias = ln.bias
    rms.train(ln.training)
    return rms


def _check_norms(layout: _Layout, model: nn.Module) -> None:
    """Every norm slot holds a torch LayerNorm, and no LayerNorm sits outside the slots."""
    names = {id(m): n for n, m in model.named_modules()}
    for parent, attr in layout.norms:
        ln = getattr(parent, attr)
        if not isinstance(ln, nn.LayerNorm):
            path = ".".join(filter(None, (names.get(id(parent)), attr)))
            raise ConversionError(
                f"{path} is {type(ln).__name__}, not a torch.nn.LayerNorm: only LayerNorm models "
                "are converted"
            )
    slots = {id(getattr(parent, attr)) for parent, attr in layout.norms}
    stray = [n for n, m in model.named_modules() if norm_kind(m) == "layer" and id(m) not in slots]
    if stray:
        raise ConversionError(
            f"LayerNorms outside the known residual-stream layout: {stray}; the table does not "
            "say what they read, so the conversion would not be known to be exact"
        )


def _check_writers(layout: _Layout) -> None:
    """Each writer's parameter spans the hidden size along the dim its layout names (a wrong
    layout in a table entry would center the wrong axis)."""
    final, attr = layout.norms[-1]
    hidden = getattr(final, attr).normalized_shape[-1]
    for module, name, dim in layout.writers:
        p = getattr(module, name)
        if p is not None and (p.dim() <= dim or p.shape[dim] != hidden):
            raise ConversionError(
                f"{type(module).__name__}.{name} of shape {list(p.shape)} has no dim {dim} of the "
                f"hidden size {hidden}, as the {layout.arch.name} layout says"
            )


def swap_norms(model: nn.Module, record: dict) -> None:
    """Replace the LayerNorms of ``model``'s layout by RMSNorms holding the same Parameters and
    record the conversion as ``record``, leaving every other weight as it is: what a converted
    checkpoint needs after its (already centered) weights are in place."""
    layout = _layout(model)
    _check_norms(layout, model)
    for parent, attr in layout.norms:
        setattr(parent, attr, _rmsnorm_like(getattr(parent, attr)))
    arch = layout.arch
    if arch.hugging_face:
        model.config.rmsnorm_conversion = dict(record)
    else:
        config = getattr(model, arch.config)
        changes = {attr: after for attr, _, after in arch.converted_config}
        # A new config object: the old one may be shared with models that stay LayerNorm models.
        setattr(model, arch.config, dataclasses.replace(config, **changes))
        model.rmsnorm_conversion = dict(record)


def _check_convertible(model: nn.Module) -> _Layout:
    """Raise before copying anything: unknown architecture, a refused configuration, already
    converted, a norm slot that is not a LayerNorm, a LayerNorm outside the layout."""
    layout = _layout(model)
    config = getattr(model, layout.arch.config)
    for attr, required, why in layout.arch.requires:
        value = getattr(config, attr, required)
        if value != required:
            raise ConversionError(
                f"{layout.arch.config}.{attr} is {value!r}, the conversion needs {required!r}: "
                f"{why}"
            )
    if conversion_record(model):
        raise ConversionError("the model is already converted (it records rmsnorm_conversion)")
    _check_norms(layout, model)
    _check_writers(layout)
    return layout


# ----------------------------------------------------------------------------------------------
# The public functions
# ----------------------------------------------------------------------------------------------
def layernorm_to_rmsnorm(model: nn.Module, *, inplace: bool = False) -> nn.Module:
    """The exactly equivalent RMSNorm model of a pre-LN transformer.

    Centers, along the hidden dim, the weights and biases of every layer writing into the residual
    stream (token and position embeddings, attention and MLP output projections), so that the
    stream is zero-mean and LayerNorm(x) = γ ⊙ x/sqrt(mean(x²) + ε) + β; then replaces each
    LayerNorm by :class:`rmsnorm.RMSNorm` (``eps_mode="mean_square"``, same ε, ``bias=True``) with
    the same γ and β. Any other use of a writer's Parameter (a head tied to the token embedding) is
    untied first and keeps the original weights. Where the stream is written and read comes from
    the model's entry in :data:`~rmsnorm.convert.ARCHITECTURES`.

    Inputs given as ready embeddings (``embeddings=`` / ``inputs_embeds=``) bypass the centered
    embedding tables; center them yourself (subtract their mean over the hidden dim).

    Args:
        model: a model of a supported architecture whose norms are ``torch.nn.LayerNorm``.
        inplace: convert ``model`` itself instead of a copy.

    Returns:
        The converted model; it records the conversion (``rmsnorm_conversion``: the method and the
        names of the Parameters it untied), in its config for Hugging Face models.

    Raises:
        ConversionError: the architecture is not in the table, its configuration is refused
            (post-LN), it is converted already, or its norms are not where the table says.

    Example::

        >>> rms_model = layernorm_to_rmsnorm(model)
        >>> verify_conversion(model, torch.float64)  # max |Δ logits| on random tokens
        4.9e-16
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    layout = _check_convertible(model)
    if not inplace:
        model = copy.deepcopy(model)
        layout = _layout(model)
    untied = _untie(layout, model)
    _center_writers(layout)
    swap_norms(model, {**CONVERSION_TAG, "untied": untied})
    return model


def recenter_(model: nn.Module) -> nn.Module:
    """Re-center the residual-stream writers of a converted model in place (call it after each
    optimizer step when fine-tuning, so the RMSNorm model stays exactly its LayerNorm twin)."""
    if not conversion_record(model):
        raise ConversionError(
            "recenter_ expects a model returned by layernorm_to_rmsnorm (an unconverted model "
            "may still tie its head to the embedding, which centering would change)"
        )
    _center_writers(_layout(model))
    return model
