"""Hugging Face transformers integration: make the normalization layers of a model run this
library's ops. A class is recognised when its ``forward`` is one of a few known normalization
forwards (compared as code), by its behaviour (a norm class whose code is unknown is built small
and run on probes: :mod:`.behaviour`), by an explicit table, or by :func:`register`;
transformers itself is imported only by :func:`patch_classes` with no argument, never at import
time.

One job per module: ``conventions`` (the :class:`Convention` value, the named conventions, the
checks of a module's attributes), ``known_forwards`` (the forwards recognised, as source),
``recognition`` (comparing a class's code with them), ``behaviour`` (the probe), ``registry``
(:func:`register`, the table, the per-class decision), ``discovery`` (the classes of the
installed transformers), ``replacements`` (the patched forwards and subclasses, pickling) and
``patching`` (:func:`patch`, :func:`patch_classes` and their undoing)."""

from __future__ import annotations

from .conventions import NAMED_CONVENTIONS, Convention
from .patching import explain, is_patched, patch, patch_classes, unpatch, unpatch_classes
from .registry import CONVENTIONS, convention_of, recognised_by, register

__all__ = [
    "Convention",
    "CONVENTIONS",
    "NAMED_CONVENTIONS",
    "register",
    "convention_of",
    "recognised_by",
    "patch",
    "explain",
    "unpatch",
    "patch_classes",
    "unpatch_classes",
    "is_patched",
]


def __getattr__(name: str) -> object:
    # hf._KNOWN_FORWARDS is the name under which the refusal messages cite the table of known
    # forwards (their text is pinned by the golden lists in tests/integrations/golden/); code
    # imports known_forwards.KNOWN_FORWARDS. Loaded on first use, as the recognition is.
    if name == "_KNOWN_FORWARDS":
        from .known_forwards import KNOWN_FORWARDS

        return KNOWN_FORWARDS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
