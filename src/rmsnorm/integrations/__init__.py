"""Integrations with the wider ecosystem: :func:`norm_kind` (is this module a norm layer?),
:func:`replace_norms` for plain PyTorch models, and the submodules ``hf`` (Hugging Face models) and
``distributed`` (sequence-parallel helpers). Nothing here imports transformers."""

from __future__ import annotations

from torch import nn

from ..modules import GatedRMSNorm, LayerNorm, RMSNorm

__all__ = ["norm_kind", "replace_norms", "restore_norms"]

# Our subclasses' extra attributes, at the values that compute exactly what torch's modules do:
# the constructor's keyword options at their defaults, but for bias (a parameter, registered as
# None) and group_size (a class attribute, None).
_RMS_EXTRAS = {
    name: value
    for name, value in RMSNorm.__init__.__kwdefaults__.items()
    if name not in ("bias", "group_size")
}
# replace_norms swaps exactly torch's two classes (a subclass may override forward), so it looks
# classes up here rather than asking norm_kind, which also answers for subclasses.
_SWAPS = {nn.RMSNorm: RMSNorm, nn.LayerNorm: LayerNorm}
_BACK = {RMSNorm: nn.RMSNorm, LayerNorm: nn.LayerNorm}
_MARK = "_rmsnorm_replaced"


def norm_kind(module: nn.Module) -> str | None:
    """Whether ``module`` is a normalization layer, and of which kind: the one answer to that
    question across the library.

    Recognised: ``torch.nn.RMSNorm`` / ``torch.nn.LayerNorm`` and their subclasses (this library's
    modules among them), this library's :class:`~rmsnorm.GatedRMSNorm` (an RMSNorm, gated), and
    every class :func:`rmsnorm.integrations.hf.convention_of` recognises
    (registered, listed, or whose forward is one of the known normalization forwards; decided once
    per class, without importing transformers). The kind belongs to the class: a module that
    :func:`~rmsnorm.integrations.hf.patch` leaves alone for its own attributes (e.g. a 2-D weight)
    still counts.

    Args:
        module (torch.nn.Module): any module.

    Returns:
        str or None: ``"rms"`` (RMSNorm), ``"layer"`` (LayerNorm) or ``None`` (not a recognised
        norm layer).

    Example::

        >>> from rmsnorm.integrations import norm_kind
        >>> nn = torch.nn
        >>> [norm_kind(m) for m in (nn.LayerNorm(8), rmsnorm.RMSNorm(8), nn.Linear(2, 2))]
        ['layer', 'rms', None]
    """
    if isinstance(module, (nn.RMSNorm, GatedRMSNorm)):
        return "rms"
    if isinstance(module, nn.LayerNorm):
        return "layer"
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    from . import hf  # ~6 ms on its first import; it never imports transformers

    try:
        return hf.convention_of(type(module)).kind
    except ValueError:  # not recognised (the message says why; here only the answer matters)
        return None


def replace_norms(model: nn.Module) -> list[str]:
    """Make every ``torch.nn.RMSNorm`` / ``torch.nn.LayerNorm`` in ``model`` run this library's op.

    In place and drop-in: each such module (exactly those classes, not subclasses, which may
    override ``forward``) becomes an instance of :class:`rmsnorm.RMSNorm` /
    :class:`rmsnorm.LayerNorm` with torch's semantics (``casting_mode="gemma"``, no offset, no
    bias), keeping the same module object, Parameter objects, hooks and ``state_dict`` (the way
    ``torch.nn.utils.parametrize`` swaps a module's class). Returns the names of the modules
    replaced; :func:`restore_norms` undoes it.

    Args:
        model (torch.nn.Module): the model, changed in place.

    Returns:
        list[str]: the names (as ``model.named_modules()`` gives them) of the modules replaced.

    Example::

        >>> from rmsnorm.integrations import replace_norms
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.RMSNorm(8))
        >>> x = torch.randn(4, 8)
        >>> before = model(x)
        >>> replace_norms(model)
        ['1']
        >>> type(model[1]) is rmsnorm.RMSNorm, isinstance(model[1], torch.nn.RMSNorm)
        (True, True)
        >>> torch.allclose(model(x), before, atol=1e-6)
        True
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    replaced = []
    for name, module in model.named_modules():
        new_cls = _SWAPS.get(type(module))
        if new_cls is None:
            continue
        if new_cls is RMSNorm:
            for key, value in _RMS_EXTRAS.items():
                setattr(module, key, value)
            module.register_parameter("bias", None)  # None parameters stay out of state_dict
        module.__class__ = new_cls
        object.__setattr__(module, _MARK, True)
        replaced.append(name)
    return replaced


def restore_norms(model: nn.Module) -> list[str]:
    """Undo :func:`replace_norms`: the modules it changed become torch's classes again (modules
    that were this library's to begin with are left alone). Returns the names restored.

    Args:
        model (torch.nn.Module): the model, changed in place.

    Returns:
        list[str]: the names of the modules restored.

    Example::

        >>> from rmsnorm.integrations import replace_norms, restore_norms
        >>> model = torch.nn.Sequential(torch.nn.LayerNorm(8), rmsnorm.RMSNorm(8))
        >>> replace_norms(model)
        ['0']
        >>> restore_norms(model)  # the RMSNorm was this library's from the start: it stays
        ['0']
        >>> type(model[0]) is torch.nn.LayerNorm, type(model[1]) is rmsnorm.RMSNorm
        (True, True)
    """
    restored = []
    for name, module in model.named_modules():
        if not module.__dict__.get(_MARK, False) or type(module) not in _BACK:
            continue
        if type(module) is RMSNorm:
            for key in _RMS_EXTRAS:
                delattr(module, key)
            del module._parameters["bias"]
        module.__class__ = _BACK[type(module)]
        del module.__dict__[_MARK]
        restored.append(name)
    return restored
