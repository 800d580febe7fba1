"""Naming transformers classes in tests so that a release that renames one does not fail the
suite on the name: :func:`current_name` finds the class a short name ("model.Class") stood for by
what it computes, or skips the test with the reason."""

from __future__ import annotations

import importlib

import pytest

from rmsnorm.integrations import hf
from rmsnorm.integrations.hf import discovery, known_forwards, registry


def find_current(short: str) -> tuple[str | None, str]:
    """(the short name the installed transformers gives the class ``short`` named, or None; why
    not): ``short`` itself where it exists, else the one class of the same model that computes as
    the known forward written from ``short`` does (a release renamed it: Mamba2's gated norm was
    ``MambaRMSNormGated`` up to 5.24, ``Mamba2RMSNormGated`` from 5.25)."""
    model, name = short.split(".")
    try:
        module = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
    except ImportError as exc:  # an optional dependency of that model, or an older transformers
        return None, f"transformers.models.{model}: {exc}"
    if hasattr(module, name):  # its own name, or an alias a release kept for it
        return f"{model}.{getattr(module, name).__name__}", ""
    conventions = [c for origin, c, _ in known_forwards.KNOWN_FORWARDS if origin == short]
    if not conventions:
        return None, f"{short} is not in the installed transformers"
    found = []
    for cls in discovery.module_classes(module):
        decision = registry.decide(cls)
        if isinstance(decision, hf.Convention) and decision in conventions:
            found.append(cls.__name__)
    if len(found) != 1:
        return None, (
            f"{short} is not in the installed transformers, and {len(found)} classes of {model} "
            f"compute as it did ({', '.join(found) or 'none'})"
        )
    return f"{model}.{found[0]}", ""


def current_name(short: str) -> str:
    """:func:`find_current`'s name, or skip the test with its reason."""
    name, why = find_current(short)
    if name is None:
        pytest.skip(why)
    return name


def current_class(short: str) -> type:
    """The class :func:`current_name` names."""
    model, name = current_name(short).split(".")
    module = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
    return getattr(module, name)
