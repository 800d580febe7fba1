"""Hugging Face transformers integration: swap the ``forward`` of known normalization classes for
this library's ops, with each class's convention (ε attribute, casting mode, offset) read from one
table. transformers is imported only by :func:`patch_classes`, never at import time."""

from __future__ import annotations

import functools
import importlib
import types
import warnings
import weakref
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from ..functional import layer_norm, rms_norm

__all__ = [
    "Convention",
    "CONVENTIONS",
    "patch",
    "unpatch",
    "patch_classes",
    "unpatch_classes",
    "is_patched",
]

_HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Convention:
    """How one normalization class computes, in this library's terms.

    ``kind``: ``"rms"`` (RMSNorm, ``eps_mode="mean_square"``) or ``"layer"`` (LayerNorm).
    ``eps_attr``: the attribute holding ε (``variance_epsilon`` in Llama-derived classes, ``eps`` in
    Gemma's and torch's). ``casting_mode``: ``"llama"``, ``"gemma"`` (see CONVENTIONS.md) or
    ``"t5"`` (T5LayerNorm's rule, which depends on the weight dtype; see :func:`_t5_norm`).
    ``offset``: the scale is offset + γ. ``bias``: the module's ``bias`` attribute is added.
    ``model_types``: for classes shared by every model (``torch.nn.LayerNorm``), patch only inside
    models whose ``config.model_type`` is listed.
    """

    kind: str
    eps_attr: str
    casting_mode: str = "gemma"
    offset: float = 0.0
    bias: bool = False
    model_types: tuple[str, ...] = ()


# Llama-derived RMSNorms: x.to(fp32) normalized, cast back to the input dtype, then weight * that.
_LLAMA = Convention("rms", "variance_epsilon", "llama")
# Gemma: x.float() normalized, × (1 + weight.float()), cast back at the end (`type_as(x)`).
_GEMMA = Convention("rms", "eps", "gemma", offset=1.0)


def _hf(model: str, cls: str) -> str:
    return f"transformers.models.{model}.modeling_{model}.{cls}"


# The one table: qualified class name -> convention. Each entry was checked against the class's
# forward in transformers 5.24 and is verified by tests/test_integrations_hf.py (docs table).
CONVENTIONS: dict[str, Convention] = {
    _hf("llama", "LlamaRMSNorm"): _LLAMA,
    _hf("mistral", "MistralRMSNorm"): _LLAMA,
    _hf("mixtral", "MixtralRMSNorm"): _LLAMA,
    _hf("qwen2", "Qwen2RMSNorm"): _LLAMA,
    _hf("qwen3", "Qwen3RMSNorm"): _LLAMA,  # also q_norm / k_norm over head_dim
    _hf("phi3", "Phi3RMSNorm"): _LLAMA,
    _hf("gemma", "GemmaRMSNorm"): _GEMMA,
    _hf("gemma2", "Gemma2RMSNorm"): _GEMMA,
    _hf("gemma3", "Gemma3RMSNorm"): _GEMMA,  # also q_norm / k_norm over head_dim
    # OLMo2: normalized in fp32, (weight * x̂) in fp32, cast to the input dtype at the end.
    _hf("olmo2", "Olmo2RMSNorm"): Convention("rms", "variance_epsilon", "gemma"),
    # T5: fp32 variance, x̂ cast to the weight's dtype only when that is half precision.
    _hf("t5", "T5LayerNorm"): Convention("rms", "variance_epsilon", "t5"),
    # GPT-2 and GPT-NeoX use torch's own LayerNorm; only patched inside those models.
    "torch.nn.modules.normalization.LayerNorm": Convention(
        "layer", "eps", bias=True, model_types=("gpt2", "gpt_neox")
    ),
}


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# ----------------------------------------------------------------------------------------------
# The replacement forwards: one function per convention, usable as a class attribute (method) and
# bound to one instance.
# ----------------------------------------------------------------------------------------------
def _t5_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """T5LayerNorm: x̂ = x·rsqrt(mean(x²) + ε) in promote(x, fp32); x̂ is cast to the weight's dtype
    when that is fp16/bf16; the result is weight * x̂ (so fp32 weights give an fp32 output)."""
    if weight.dtype in _HALF:
        if x.dtype == weight.dtype:
            return rms_norm(x, weight.shape, weight, eps, casting_mode="llama")
        # Mixed half weight / other input (rare): the literal T5 expression, normalization fused.
        xhat = rms_norm(x.to(torch.promote_types(x.dtype, torch.float32)), weight.shape, None, eps)
        return weight * xhat.to(weight.dtype)
    # fp32/fp64 weight: x̂ stays in fp32 (exact upcast of a half input), product in promote(x̂, w).
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    return rms_norm(x, weight.shape, weight, eps, casting_mode="llama")


@functools.cache
def _forward_for(conv: Convention):
    if conv.kind == "layer":

        def forward(self, input: torch.Tensor) -> torch.Tensor:
            return layer_norm(
                input, self.normalized_shape, self.weight, self.bias, getattr(self, conv.eps_attr)
            )

    elif conv.casting_mode == "t5":

        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            return _t5_norm(hidden_states, self.weight, getattr(self, conv.eps_attr))

    else:

        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            w = self.weight
            return rms_norm(
                hidden_states, w.shape, w, getattr(self, conv.eps_attr),
                casting_mode=conv.casting_mode, offset=conv.offset,
                bias=self.bias if conv.bias else None,
            )  # fmt: skip

    forward.__qualname__ = forward.__name__ = "forward"
    forward.__doc__ = f"rmsnorm's op with the convention {conv}"
    forward._rmsnorm_convention = conv  # marks our forwards (unpatch, is_patched)
    return forward


def _convention_of(module: nn.Module, model_type: str | None) -> Convention | None:
    conv = CONVENTIONS.get(_qualname(type(module)))
    if conv is None or (conv.model_types and model_type not in conv.model_types):
        return None
    return conv


def _is_ours(fn: object) -> bool:
    return hasattr(getattr(fn, "__func__", fn), "_rmsnorm_convention")


# ----------------------------------------------------------------------------------------------
# Instances
# ----------------------------------------------------------------------------------------------
# A module that already had its own instance-level forward (e.g. another library's hook) gets it
# back on unpatch; weak keys so a patched model can still be garbage-collected.
_instance_originals: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _model_type(model: nn.Module) -> str | None:
    return getattr(getattr(model, "config", None), "model_type", None)


def _looks_like_norm(module: nn.Module) -> bool:
    name = type(module).__name__
    return "Norm" in name and not name.endswith(("Model", "Layer", "Block"))


def patch(model: nn.Module) -> list[str]:
    """Make every normalization layer of a known class in ``model`` run this library's op.

    Swaps the ``forward`` of each module whose class is in :data:`CONVENTIONS` (for
    ``torch.nn.LayerNorm`` only inside GPT-2 / GPT-NeoX models) for one reading the same parameters
    with the class's convention; nothing else changes (parameters, ``state_dict``, hooks) and no
    tensor is modified. Returns the names of the patched modules. Raises ``ValueError`` when there
    is none; warns about norm-like modules of classes not in the table, which keep their forward.
    Undo with :func:`unpatch`.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    model_type = _model_type(model)
    patched, unknown = [], set()
    for name, module in model.named_modules():
        conv = _convention_of(module, model_type)
        if conv is None:
            if _looks_like_norm(module):
                unknown.add(_qualname(type(module)))
            continue
        current = module.__dict__.get("forward")
        if current is not None and _is_ours(current):
            patched.append(name)
            continue
        if current is not None:
            _instance_originals[module] = current
        module.forward = types.MethodType(_forward_for(conv), module)
        patched.append(name)
    if not patched:
        raise ValueError(
            f"no normalization layer of a known class in {type(model).__name__} "
            f"(model_type={model_type!r}); known classes: {sorted(CONVENTIONS)}"
            + (f"; found unknown norm classes: {sorted(unknown)}" if unknown else "")
        )
    if unknown:
        warnings.warn(
            f"rmsnorm.integrations.hf.patch: left these norm classes unpatched (not in the "
            f"table): {sorted(unknown)}",
            stacklevel=2,
        )
    return patched


def unpatch(model: nn.Module) -> list[str]:
    """Restore the original forward of every module :func:`patch` swapped in ``model`` (also in a
    deep copy of a patched model). Returns the names of the restored modules."""
    restored = []
    for name, module in model.named_modules():
        current = module.__dict__.get("forward")
        if current is None or not _is_ours(current):
            continue
        original = _instance_originals.pop(module, None)
        if original is None:
            del module.forward  # the class's forward applies again
        else:
            module.forward = original
        restored.append(name)
    return restored


def is_patched(module: nn.Module) -> bool:
    """True when ``module``'s forward (its own or its class's) is one of this library's."""
    return _is_ours(module.forward)


# ----------------------------------------------------------------------------------------------
# Classes (before a model is built)
# ----------------------------------------------------------------------------------------------
_class_originals: dict[type, object] = {}  # class -> its own forward (None: it inherited one)
_MISSING = object()


def _resolve(cls_or_name: type | str) -> type:
    if isinstance(cls_or_name, type):
        cls = cls_or_name
    elif isinstance(cls_or_name, str) and cls_or_name in CONVENTIONS:
        module_name, _, attr = cls_or_name.rpartition(".")
        cls = getattr(importlib.import_module(module_name), attr)
    else:
        raise ValueError(
            f"classes must be classes or qualified names from CONVENTIONS, got {cls_or_name!r}"
        )
    name = _qualname(cls)
    if name not in CONVENTIONS:
        raise ValueError(f"{name} is not in the conventions table; known: {sorted(CONVENTIONS)}")
    if CONVENTIONS[name].model_types:
        raise ValueError(
            f"{name} is shared by every model; patching the class would change all of them. "
            "Use patch(model) on a built model, or rmsnorm.integrations.replace_norms(model)"
        )
    return cls


def _default_classes() -> list[type]:
    classes = []
    for name, conv in CONVENTIONS.items():
        if conv.model_types:
            continue
        try:
            classes.append(_resolve(name))
        except (ImportError, AttributeError):  # an older transformers without this model
            continue
    return classes


def patch_classes(classes: Iterable[type | str] | None = None) -> list[str]:
    """Swap the ``forward`` of whole classes, so models built afterwards use this library's ops.

    ``classes``: classes or qualified names from :data:`CONVENTIONS`; ``None`` means every
    Hugging Face class in the table that the installed transformers has (this imports those
    modeling files). ``torch.nn.LayerNorm`` is refused: it is shared by every model. Returns the
    qualified names patched. Undo with :func:`unpatch_classes`.
    """
    resolved = _default_classes() if classes is None else [_resolve(c) for c in classes]
    done = []
    for cls in resolved:
        if cls not in _class_originals:
            _class_originals[cls] = cls.__dict__.get("forward", _MISSING)
            cls.forward = _forward_for(CONVENTIONS[_qualname(cls)])
        done.append(_qualname(cls))
    return done


def unpatch_classes(classes: Iterable[type | str] | None = None) -> list[str]:
    """Restore the forward of classes patched by :func:`patch_classes` (``None``: all of them).
    Returns the qualified names restored."""
    targets = list(_class_originals) if classes is None else [_resolve(c) for c in classes]
    done = []
    for cls in targets:
        original = _class_originals.pop(cls, None)
        if original is None:
            continue
        if original is _MISSING:
            del cls.forward
        else:
            cls.forward = original
        done.append(_qualname(cls))
    return done
