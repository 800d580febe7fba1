"""The per-class decision: a registration (:func:`register`), the table :data:`CONVENTIONS`, or
recognition by code, made once per class and cached; :func:`convention_of` says it, or why not."""

from __future__ import annotations

import re
import weakref

from torch import nn

from .conventions import NAMED_CONVENTIONS, Convention, instance_problem
from .replacements import base_of

__all__ = ["CONVENTIONS", "register", "convention_of", "decide", "qualname", "recognised_by"]

# Classes that need an entry because their forward is not one of the known ones: qualified class
# name -> convention. torch's LayerNorm is shared by every model, so it is patched only inside the
# models that use it as their own norm.
CONVENTIONS: dict[str, Convention] = {
    "torch.nn.modules.normalization.LayerNorm": Convention(
        "layer", "eps", bias=True, model_types=("gpt2", "gpt_neox"), shape_attr="normalized_shape"
    ),
}


def qualname(cls: type) -> str:
    """``module.QualifiedName`` of a class: how registrations, the table and messages name it."""
    return f"{cls.__module__}.{cls.__qualname__}"


# The classes the behaviour probe runs: named like a norm ("...RMSNorm", "...Layernorm",
# "...BatchNorm2d"), not like a layer, block or model holding one.
_NAMED_LIKE_A_NORM = re.compile(r"[Nn]orm[a-z0-9]*$")

_registered_classes: dict[type, Convention | None] = {}
_registered_names: dict[str, Convention | None] = {}
# class -> (its forward when decided, the decision, how it was decided); weak keys: classes can be
# garbage-collected.
_recognized: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def register(cls: type | str, convention: Convention | str | None) -> None:
    """Declare how ``cls`` computes: a :class:`Convention`, the name of one in
    :data:`NAMED_CONVENTIONS`, or ``None`` to never patch the class. ``cls`` is a class or its
    qualified name (``"package.module.ClassName"``; nothing is imported). A registration wins over
    the table and the automatic recognition; register before patching.

    Args:
        cls (type or str): a ``torch.nn.Module`` subclass or its qualified name.
        convention (Convention or str or None): how it computes; a name is one of
            :data:`NAMED_CONVENTIONS` (``"llama"``, ``"gemma"``, ``"olmo2"``, ``"t5"``,
            ``"layer_norm"``, and the gated ``"qwen3_next_gated"``, ``"kimi_linear_gated"``,
            ``"mamba2_gated"``, ``"falcon_h1_gated"``).

    Example::

        >>> from rmsnorm.integrations import hf
        >>> class Norm(torch.nn.Module):  # computes as Llama's RMSNorm
        ...     def __init__(self, n):
        ...         super().__init__()
        ...         self.weight = torch.nn.Parameter(torch.ones(n))
        ...         self.variance_epsilon = 1e-6
        ...     def forward(self, x):
        ...         h = x.float()
        ...         h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        ...         return self.weight * h.to(x.dtype)
        >>> hf.register(Norm, "llama")
        >>> hf.convention_of(Norm).casting_mode
        'llama'
        >>> hf.register("mypackage.modeling.OtherNorm", None)  # never patch this one
    """
    if isinstance(convention, str):
        if convention not in NAMED_CONVENTIONS:
            raise ValueError(
                f"convention must be a Convention, None or one of {sorted(NAMED_CONVENTIONS)}, "
                f"got {convention!r}"
            )
        convention = NAMED_CONVENTIONS[convention]
    elif convention is not None and not isinstance(convention, Convention):
        raise TypeError(
            f"convention must be a Convention, a name or None, got {type(convention).__name__}"
        )
    if isinstance(cls, type):
        if not issubclass(cls, nn.Module):
            raise TypeError(f"cls must be a torch.nn.Module subclass, got {qualname(cls)}")
        _registered_classes[cls] = convention
    elif isinstance(cls, str) and "." in cls and all(p.isidentifier() for p in cls.split(".")):
        _registered_names[cls] = convention
    else:
        raise TypeError(
            f"cls must be a class or a qualified class name 'package.module.Class', got {cls!r}"
        )


def decide(cls: type) -> Convention | str:
    """The convention of ``cls``, or why it has none (a short reason): from :func:`register`,
    :data:`CONVENTIONS`, its source (:func:`.recognition.recognise`) or, for a class named like a
    norm whose one-input forward is none of the known ones, its behaviour
    (:func:`.behaviour.probe`), in that order; decided once per class (again when its forward is
    replaced)."""
    return _decide(cls)[0]


def recognised_by(cls: type) -> str | None:
    """How :func:`decide` gives ``cls`` its convention: ``"register"``, ``"table"``
    (:data:`CONVENTIONS`), ``"source"`` (its forward is a known one, as code) or ``"behaviour"``
    (the probe); None where it is not patched.

    Args:
        cls (type): a norm class (or one patched by :func:`patch`).

    Returns:
        str or None: how it is recognised.

    Example::

        >>> from rmsnorm.integrations import hf
        >>> hf.recognised_by(torch.nn.LayerNorm), hf.recognised_by(torch.nn.Linear)
        ('table', None)
    """
    conv, how = _decide(base_of(cls) or cls)
    return how if isinstance(conv, Convention) else None


def _decide(cls: type) -> tuple[Convention | str, str]:
    if cls in _registered_classes or qualname(cls) in _registered_names:
        conv = _registered_classes.get(cls, _registered_names.get(qualname(cls)))
        return (conv if conv is not None else "it is registered as not to be patched"), "register"
    conv = CONVENTIONS.get(qualname(cls))
    if conv is not None:
        return conv, "table"
    forward = getattr(cls, "forward", None)
    cached = _recognized.get(cls)
    if cached is not None and cached[0] is forward:  # the class's forward has not been replaced
        return cached[1], cached[2]
    result, how = getattr(forward, "_rmsnorm_convention", None), "source"
    if result is not None:  # patched by patch_classes: how it was decided before patching
        how = cached[2] if cached is not None else "source"
    else:
        # Imported at the first class decided by its code, so that importing the package does
        # not pay for the comparison and the known forwards.
        from .recognition import UNKNOWN_FORWARD, recognise

        result = recognise(cls)
        if result == UNKNOWN_FORWARD and _NAMED_LIKE_A_NORM.search(cls.__name__):
            from .behaviour import probe

            result, how = probe(cls), "behaviour"
    _recognized[cls] = (forward, result, how)
    return result, how


def convention_of(cls_or_module: type | nn.Module) -> Convention:
    """The convention :func:`patch` uses for a class (or a module: its class, and the module's own
    attributes are checked), from :func:`register`, :data:`CONVENTIONS` or the known forwards.
    Raises ``ValueError`` naming the class and why it is not patched.

    Args:
        cls_or_module (type or torch.nn.Module): a norm class, or one of its instances.

    Returns:
        Convention: how :func:`patch` would run it.

    Example::

        >>> from rmsnorm.integrations import hf
        >>> hf.convention_of(torch.nn.LayerNorm).model_types  # patched only inside these models
        ('gpt2', 'gpt_neox')
        >>> hf.convention_of(torch.nn.Linear)
        Traceback (most recent call last):
        ...
        ValueError: torch.nn.modules.linear.Linear is not patched: its forward is none of ...
    """
    module = cls_or_module if isinstance(cls_or_module, nn.Module) else None
    cls = type(module) if module is not None else cls_or_module
    if not isinstance(cls, type):
        raise TypeError(f"expected a class or a torch.nn.Module, got {cls_or_module!r}")
    cls = base_of(cls) or cls
    result = decide(cls)
    if isinstance(result, str):
        raise ValueError(f"{qualname(cls)} is not patched: {result}")
    if module is not None:
        problem = instance_problem(module, result)
        if problem is not None:
            raise ValueError(f"{qualname(cls)} is not patched: {problem}")
    return result
