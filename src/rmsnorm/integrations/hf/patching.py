"""Patching: :func:`patch` / :func:`unpatch` make the norm layers of a built model run this
library's ops (each module's class becomes its patched subclass) and undo it; :func:`patch_classes`
/ :func:`unpatch_classes` swap the forward of whole classes, for models built afterwards."""

from __future__ import annotations

import logging
import warnings
import weakref
from collections.abc import Iterable

from torch import nn

from .conventions import instance_problem
from .registry import decide, qualname, recognised_by
from .replacements import base_of, forward_for, is_replacement, patched_class

__all__ = [
    "patch",
    "unpatch",
    "is_patched",
    "patch_classes",
    "unpatch_classes",
    "looks_like_norm",
    "explain",
]

_log = logging.getLogger("rmsnorm.integrations.hf")

# A module that already had its own instance-level forward (e.g. another library's hook) gets it
# back on unpatch; weak keys so a patched model can still be garbage-collected.
_instance_originals: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# class -> its own forward before patch_classes (_MISSING: it inherited one)
_class_originals: dict[type, object] = {}
_MISSING = object()


def looks_like_norm(module: nn.Module) -> bool:
    """Whether ``module``'s class is named like a norm layer (``Norm`` in its name, not a model,
    layer or block): the layers :func:`patch` warns about when it leaves them alone."""
    name = type(module).__name__
    return "Norm" in name and not name.endswith(("Model", "Layer", "Block"))


def _model_type(model: nn.Module) -> str | None:
    return getattr(getattr(model, "config", None), "model_type", None)


def patch(model: nn.Module) -> list[str]:
    """Make every normalization layer of a recognised class in ``model`` run this library's op.

    A class is recognised by :func:`register`, by :data:`CONVENTIONS` (``torch.nn.LayerNorm``
    only inside GPT-2 / GPT-NeoX models) or when its forward is one of the known normalization
    forwards (see :func:`convention_of`), the gated ones (``forward(hidden_states, gate)``)
    among them. Each such module gets a forward reading the same parameters and attributes with
    the class's convention; nothing else changes (parameters, ``state_dict``,
    hooks, the class name) and no tensor is modified. The patch survives ``copy.deepcopy``,
    pickling and ``torch.save``. Returns the names of the patched modules. Raises ``ValueError``
    when there is none; warns, with the reason, about norm layers it leaves alone. Undo with
    :func:`unpatch`. :func:`explain` reports, class by class, what it does and how each class was
    recognised (by its source or by its behaviour); the logger ``rmsnorm.integrations.hf`` says the
    same of each class patched, at level INFO.

    Args:
        model (torch.nn.Module): a Hugging Face model, or any model holding recognised norm
            layers; changed in place.

    Returns:
        list[str]: the names of the patched modules.

    Example::

        >>> import types
        >>> from rmsnorm.integrations import hf
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
        >>> model.config = types.SimpleNamespace(model_type="gpt2")  # as in a GPT-2 model
        >>> x = torch.randn(4, 8)
        >>> before = model(x)
        >>> hf.patch(model)
        ['1']
        >>> hf.is_patched(model[1]), type(model[1]).__name__
        (True, 'LayerNorm')
        >>> torch.allclose(model(x), before, atol=1e-6)
        True
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    model_type = _model_type(model)
    patched: list[str] = []
    left: dict[str, str] = {}  # class -> why it was left alone
    odd: dict[tuple[str, str], list[str]] = {}  # (class, why) -> modules of a patchable class
    by_class: dict[type, int] = {}  # class -> modules patched now
    for name, module in model.named_modules():
        cls = type(module)
        if base_of(cls) is not None or is_replacement(getattr(cls, "forward", None)):
            patched.append(name)  # patched already (this instance, or its whole class)
            continue
        conv = decide(cls)
        if isinstance(conv, str):
            if looks_like_norm(module):
                left.setdefault(qualname(cls), conv)
            continue
        if conv.model_types and model_type not in conv.model_types:
            left.setdefault(
                qualname(cls),
                f"it is shared by every model and patched only in models of type "
                f"{list(conv.model_types)}; use rmsnorm.integrations.replace_norms for others",
            )
            continue
        problem = instance_problem(module, conv)
        if problem is not None:
            odd.setdefault((qualname(cls), problem), []).append(name)
            continue
        foreign = module.__dict__.pop("forward", None)
        if foreign is not None:
            _instance_originals[module] = foreign
        module.__class__ = patched_class(cls, conv)
        patched.append(name)
        by_class[cls] = by_class.get(cls, 0) + 1
    for cls, count in by_class.items():
        _log.info(
            "patched %s in %d module(s), recognised by %s", qualname(cls), count, recognised_by(cls)
        )
    for (cls_name, why), names in odd.items():
        left[f"{cls_name} in {len(names)} module(s), e.g. {names[0]!r}"] = why
    reasons = "; ".join(f"{cls}: {why}" for cls, why in sorted(left.items()))
    if not patched:
        raise ValueError(
            f"no normalization layer of a known class in {type(model).__name__} "
            f"(model_type={model_type!r})" + (f"; left alone: {reasons}" if reasons else "")
        )
    if reasons:
        warnings.warn(
            f"rmsnorm.integrations.hf.patch: left these norm layers unpatched: {reasons}",
            stacklevel=2,
        )
    return patched


def explain(model: nn.Module) -> list[dict]:
    """What :func:`patch` does with each norm class of ``model``, without patching: one row per
    class (patched, or named like a norm), in the order the classes first appear, with ``class``
    (qualified name), ``modules`` (their names), ``patched`` (bool), ``recognised_by``
    (``"register"``, ``"table"``, ``"source"``, ``"behaviour"``; None where refused) and
    ``decision`` (the convention, or why not).

    Args:
        model (torch.nn.Module): a model, patched or not.

    Returns:
        list[dict]: one row per class.

    Example::

        >>> import types
        >>> from rmsnorm.integrations import hf
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
        >>> model.config = types.SimpleNamespace(model_type="gpt2")
        >>> row = hf.explain(model)[0]
        >>> row["class"].rsplit(".", 1)[-1], row["modules"], row["patched"], row["recognised_by"]
        ('LayerNorm', ['1'], True, 'table')
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    model_type = _model_type(model)
    rows: dict[type, dict] = {}
    for name, module in model.named_modules():
        cls = base_of(type(module)) or type(module)
        row = rows.get(cls)
        if row is None:
            conv = decide(cls)
            patchable = not isinstance(conv, str)
            if patchable and conv.model_types and model_type not in conv.model_types:
                conv = f"it is patched only in models of type {list(conv.model_types)}"
                patchable = False
            if not patchable and not looks_like_norm(module):
                continue
            row = rows[cls] = {
                "class": qualname(cls),
                "modules": [],
                "patched": patchable,
                "recognised_by": recognised_by(cls) if patchable else None,
                "decision": conv,
            }
        if row["patched"] and instance_problem(module, row["decision"]) is not None:
            continue
        row["modules"].append(name)
    return list(rows.values())


def unpatch(model: nn.Module) -> list[str]:
    """Restore the original class (and any instance-level forward it had) of every module
    :func:`patch` patched in ``model``, also in a copy or an unpickled copy of a patched model.
    Returns the names of the restored modules.

    Args:
        model (torch.nn.Module): a model :func:`patch` changed (or a copy of one).

    Returns:
        list[str]: the names of the restored modules.

    Example::

        >>> import copy, types
        >>> from rmsnorm.integrations import hf
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
        >>> model.config = types.SimpleNamespace(model_type="gpt2")  # as in a GPT-2 model
        >>> hf.patch(model)
        ['1']
        >>> hf.unpatch(copy.deepcopy(model)), hf.unpatch(model)
        (['1'], ['1'])
        >>> hf.is_patched(model[1])
        False
    """
    restored = []
    for name, module in model.named_modules():
        base = base_of(type(module))
        if base is None:
            continue
        module.__class__ = base
        original = _instance_originals.pop(module, None)
        if original is not None:
            module.forward = original
        restored.append(name)
    return restored


def is_patched(module: nn.Module) -> bool:
    """True when ``module``'s forward (its own or its class's) is one of this library's.

    Args:
        module (torch.nn.Module): any module.

    Example::

        >>> from rmsnorm.integrations import hf
        >>> hf.is_patched(torch.nn.LayerNorm(8))
        False
    """
    return is_replacement(module.forward)


def patch_classes(classes: Iterable[type | str] | None = None) -> list[str]:
    """Swap the ``forward`` of whole classes, so models built afterwards use this library's ops.

    ``classes``: classes or qualified class names, each recognised as by :func:`convention_of`
    (else ``ValueError`` naming it and why), or model names (packages of ``transformers.models``,
    e.g. ``"qwen3_moe"``: their recognised classes). ``None`` means every recognised class of the
    installed transformers, which imports all its modeling files (about 9 s and 330 MB with
    transformers 5.24). ``torch.nn.LayerNorm`` is refused: it is shared by every model. Instances
    are not checked one by one as :func:`patch` does; the op's own checks reject one it cannot run
    (e.g. a 2-D weight). Returns the qualified names patched. Undo with :func:`unpatch_classes`.

    Args:
        classes (iterable of type or str, optional): classes, qualified class names or model
            names; ``None`` for every recognised class of the installed transformers.

    Returns:
        list[str]: the qualified names of the classes patched.

    Example::

        >>> from rmsnorm.integrations import hf
        >>> class Norm(torch.nn.Module):  # its forward as Llama's RMSNorm (left out here)
        ...     def __init__(self, n):
        ...         super().__init__()
        ...         self.weight = torch.nn.Parameter(torch.ones(n))
        ...         self.variance_epsilon = 1e-6
        >>> hf.register(Norm, "llama")
        >>> [name.rsplit(".", 1)[-1] for name in hf.patch_classes([Norm])]
        ['Norm']
        >>> hf.is_patched(Norm(8))  # built after: runs this library's op
        True
        >>> [name.rsplit(".", 1)[-1] for name in hf.unpatch_classes([Norm])]
        ['Norm']
    """
    # discovery is imported on the first use, not with the package (as recognition is)
    from .discovery import modeling_module_names, recognised_classes, resolve_classes

    if classes is None:
        resolved = recognised_classes(modeling_module_names(), skip_missing=True)
    else:
        resolved = resolve_classes(classes)
    done = []
    for cls, conv in resolved:
        if cls not in _class_originals:
            _class_originals[cls] = cls.__dict__.get("forward", _MISSING)
            cls.forward = forward_for(conv)
        done.append(qualname(cls))
    return done


def unpatch_classes(classes: Iterable[type | str] | None = None) -> list[str]:
    """Restore the forward of classes patched by :func:`patch_classes` (``None``: all of them).
    Returns the qualified names restored.

    Args:
        classes (iterable of type or str, optional): as :func:`patch_classes`; ``None`` for every
            class it patched.

    Returns:
        list[str]: the qualified names of the classes restored (those not patched are skipped).

    Example::

        >>> from rmsnorm.integrations import hf
        >>> class Norm(torch.nn.Module):  # computes as Llama's RMSNorm (left out here)
        ...     pass
        >>> hf.register(Norm, "llama")
        >>> patched = hf.patch_classes([Norm])
        >>> hf.unpatch_classes([Norm]) == patched, hf.unpatch_classes([Norm])  # once
        (True, [])
        >>> hf.is_patched(Norm())
        False
    """
    from .discovery import resolve_classes

    if classes is None:
        targets = list(_class_originals)
    else:
        targets = [cls for cls, _ in resolve_classes(classes)]
    done = []
    for cls in targets:
        original = _class_originals.pop(cls, None)
        if original is None:
            continue
        if original is _MISSING:
            del cls.forward
        else:
            cls.forward = original
        done.append(qualname(cls))
    return done
