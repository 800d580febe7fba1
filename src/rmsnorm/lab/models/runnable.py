"""A model with what it takes to run it (:class:`RunnableModel`), and the one import of
transformers the lab's loaders share (:func:`_transformers`): a leaf that both
:mod:`~rmsnorm.lab.experiments.inspection` and :mod:`~rmsnorm.lab.models.pretrained` build on."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["RunnableModel"]


@dataclass
class RunnableModel:
    """A model with what it takes to run it: ``forward(tokens)`` runs it on (batch, seq) token
    ids of its vocabulary (``vocab_size``), at most ``max_len`` long; ``tokenizer`` (when it has
    one) turns text into those ids."""

    name: str
    model: nn.Module
    vocab_size: int
    max_len: int
    tokenizer: object | None = None
    kind: str = "torch"  # "builtin" (the simulated transformer), "hf" or "torch"
    encoder: bool = False  # a Hugging Face encoder (no language-model head): forward gives states
    provenance: dict | None = None  # pretrained models: the files read and their sha256

    def forward(self, tokens: torch.Tensor):
        if self.kind == "hf":
            return self.model(input_ids=tokens)
        return self.model(tokens)


def _transformers():
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(
            "this model needs the transformers package (the hf extra): pip install 'rmsnorm[hf]'"
        ) from exc
    transformers.logging.set_verbosity_error()
    return transformers
