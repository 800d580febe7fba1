"""Finding normalization classes: the modeling modules of the installed transformers (listed on
disk, imported only when asked), the module classes they define and which of them are recognised,
and the classes that a list of classes, class names and model names stands for."""

from __future__ import annotations

import importlib
import importlib.util
import os
import types
from collections.abc import Iterable

from torch import nn

from .conventions import Convention
from .registry import convention_of, decide, qualname

__all__ = ["modeling_module_names", "module_classes", "recognised_classes", "resolve_classes"]


def modeling_module_names() -> list[str]:
    """``transformers.models.<model>.modeling_<name>`` of the installed transformers, found on
    disk without importing them (none when transformers is not installed)."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return []
    root = os.path.join(spec.submodule_search_locations[0], "models")
    names = []
    for model in sorted(os.listdir(root)):
        folder = os.path.join(root, model)
        if not os.path.isdir(folder):
            continue
        for file in sorted(os.listdir(folder)):
            if file.startswith("modeling_") and file.endswith(".py"):
                if not file.startswith(("modeling_tf_", "modeling_flax_")):
                    names.append(f"transformers.models.{model}.{file[:-3]}")
    return names


def module_classes(module: types.ModuleType) -> list[type]:
    """The torch.nn.Module classes defined in ``module``, each once (a release may keep an old
    name as an alias of a renamed class)."""
    found = {
        id(c): c
        for c in vars(module).values()
        if isinstance(c, type) and issubclass(c, nn.Module) and c.__module__ == module.__name__
    }
    return list(found.values())


def recognised_classes(names: list[str], skip_missing: bool) -> list[tuple[type, Convention]]:
    """(class, convention) of every recognised class, not shared by every model, defined in the
    modules ``names`` (imported here); ``skip_missing``: skip a module that cannot be imported
    (a model whose optional dependency is missing) rather than raise."""
    found = []
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError:  # a model whose optional dependency is missing (e.g. torchaudio)
            if skip_missing:
                continue
            raise
        for cls in module_classes(module):
            conv = decide(cls)
            if isinstance(conv, Convention) and not conv.model_types:
                found.append((cls, conv))
    return found


def resolve_classes(classes: Iterable[type | str]) -> list[tuple[type, Convention]]:
    """(class, convention) of each item of a list of classes, qualified class names and model
    names (packages of ``transformers.models``: their recognised classes). Raises ``ValueError``
    naming an item that is none of these, or not recognised, or shared by every model."""
    if isinstance(classes, (str, type)):
        raise TypeError("classes must be a list of classes or names (or None), not one")
    return [pair for item in classes for pair in _expand(item)]


def _expand(item: type | str) -> list[tuple[type, Convention]]:
    """A class, a qualified class name, or a model (a package of ``transformers.models``: its
    recognised classes)."""
    if not (isinstance(item, str) and item.isidentifier()):
        return [_resolve(item)]
    modules = [n for n in modeling_module_names() if n.split(".")[2] == item]
    if not modules:
        raise ValueError(
            f"{item!r} is neither a class nor a model of the installed transformers "
            "(a package name of transformers.models, e.g. 'qwen3_moe')"
        )
    found = recognised_classes(modules, skip_missing=False)
    if not found:
        raise ValueError(f"transformers model {item!r} has no recognised normalization class")
    return found


def _resolve(cls_or_name: type | str) -> tuple[type, Convention]:
    if isinstance(cls_or_name, str) and "." in cls_or_name:
        module_name, _, attr = cls_or_name.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot import the class {cls_or_name!r}: {exc}") from exc
    elif isinstance(cls_or_name, type):
        cls = cls_or_name
    else:
        raise ValueError(f"classes must be classes or qualified class names, got {cls_or_name!r}")
    if not issubclass(cls, nn.Module):
        raise ValueError(f"{qualname(cls)} is not a torch.nn.Module class")
    conv = convention_of(cls)
    if conv.model_types:
        raise ValueError(
            f"{qualname(cls)} is shared by every model; patching the class would change all of "
            "them. Use patch(model) on a built model, or rmsnorm.integrations.replace_norms(model)"
        )
    return cls, conv
