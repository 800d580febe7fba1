"""The norm sites of a pretrained transformer: every norm layer, its block (layer index) and the
kind of site it is, and what it normalizes on a batch of token windows, captured as
(sequences, tokens, rows per token, width) float32.

Kinds of site (:func:`site_kind`), from where the norm sits in its block (its attribute name and
its siblings'), for the Hugging Face Llama, Gemma 2/3 and BERT families and names that follow them:

- ``pre-norm``: the residual stream as it enters a sublayer (Llama's ``input_layernorm`` and
  ``post_attention_layernorm``, which despite its name normalizes the stream before the MLP;
  Gemma's ``input_layernorm`` and ``pre_feedforward_layernorm``; GPT-2's ``ln_1``, ``ln_2``);
- ``post-sublayer``: a sublayer's output before it joins the stream (Gemma's
  ``post_attention_layernorm``, since its block also has a ``pre_feedforward_layernorm``, and
  ``post_feedforward_layernorm``);
- ``qk-norm``: queries and keys per head (``q_norm``, ``k_norm``): one row per head and token;
- ``final``: the norm after the last block (``norm``, ``norm_f``, ``ln_f``);
- ``post-ln``: BERT's LayerNorm of residual + sublayer output (``attention.output.LayerNorm``,
  ``output.LayerNorm``); ``embedding``: BERT's LayerNorm of the summed embeddings;
- ``other``: any norm none of these rules names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

from ..models.norm_layers import find_norm_layers

__all__ = ["Site", "site_kind", "find_sites", "capture_inputs", "effective_weight", "KINDS"]

KINDS = ("pre-norm", "post-sublayer", "qk-norm", "final", "post-ln", "embedding", "other")
_LAYER = re.compile(r"\.(\d+)\.")
_PRE = {"input_layernorm", "pre_feedforward_layernorm", "ln_1", "ln_2", "pre_attention_layernorm"}
_POST = {"post_feedforward_layernorm", "post_mlp_layernorm"}
_FINAL = {"norm", "norm_f", "ln_f", "final_layernorm", "final_layer_norm"}


@dataclass
class Site:
    """A norm layer of the model: its qualified name, block index (None outside the blocks),
    kind, the kind of norm (``layernorm`` / ``rmsnorm``) and its module."""

    name: str
    layer: int | None
    kind: str
    norm: str
    module: nn.Module

    def to_dict(self) -> dict:
        return {"name": self.name, "layer": self.layer, "kind": self.kind, "norm": self.norm}


def site_kind(name: str, modules: dict[str, nn.Module]) -> str:
    """The kind of the norm called ``name`` in a model whose ``named_modules()`` are
    ``modules`` (see the module docstring)."""
    parent, _, attr = name.rpartition(".")
    in_block = _LAYER.search("." + name + ".") is not None
    if attr in ("q_norm", "k_norm", "query_layernorm", "key_layernorm"):
        return "qk-norm"
    if attr == "LayerNorm":
        if parent.endswith("embeddings"):
            return "embedding"
        if parent.endswith("output"):
            return "post-ln"
    if attr == "post_attention_layernorm":
        siblings = dict(modules[parent].named_children()) if parent in modules else {}
        return "post-sublayer" if "pre_feedforward_layernorm" in siblings else "pre-norm"
    if attr in _PRE:
        return "pre-norm"
    if attr in _POST:
        return "post-sublayer"
    if attr in _FINAL and not in_block:
        return "final"
    return "other"


def find_sites(model: nn.Module) -> list[Site]:
    """Every norm layer of ``model`` (:func:`~rmsnorm.lab.models.norm_layers.find_norm_layers`) as a
    :class:`Site`, in registration order."""
    modules = dict(model.named_modules())
    sites = []
    for name, module, norm in find_norm_layers(model):
        match = _LAYER.search("." + name + ".")
        layer = int(match.group(1)) if match else None
        sites.append(Site(name, layer, site_kind(name, modules), norm, module))
    return sites


@torch.no_grad()
def effective_weight(module: nn.Module, width: int) -> torch.Tensor | None:
    """The per-channel scale a norm layer applies after normalizing, in its own convention (Gemma's
    1 + γ included), float64 (width,); None for a norm without one. An RMSNorm is probed with
    the all-ones row, whose RMS is 1, so its output is the scale over √(1 + ε) (ε = 0 in the
    "rms" placement of x/(RMS + ε) but 1 + ε there too): only ratios of the scale are used. A
    LayerNorm's scale is its weight."""
    from ..models.norm_layers import norm_kind

    kind = norm_kind(module)
    if kind == "layernorm":
        w = getattr(module, "weight", None)
        return None if w is None else w.detach().to(torch.float64).reshape(-1)
    p = next(module.parameters(), None)
    dtype = p.dtype if p is not None else torch.float32
    y = module(torch.ones(1, width, dtype=dtype))
    return y.detach().to(torch.float64).reshape(-1)


def _as_rows(x: torch.Tensor, batch: int, tokens: int) -> torch.Tensor:
    """A norm input as (batch, tokens, rows per token, width): (B, T, d), (B, T, H, hd), or the
    attention layout (B, H, T, hd)."""
    if x.dim() == 3 and x.shape[:2] == (batch, tokens):
        return x[:, :, None, :]
    if x.dim() == 4 and x.shape[0] == batch:
        if x.shape[1] == tokens:
            return x
        if x.shape[2] == tokens:
            return x.transpose(1, 2)
    raise ValueError(f"a norm input of shape {tuple(x.shape)} does not match {batch} × {tokens}")


@torch.no_grad()
def capture_inputs(
    model: nn.Module,
    windows: torch.Tensor,
    *,
    sites: list[Site] | None = None,
    batch: int = 4,
    forward=None,
    progress=None,
) -> dict[str, torch.Tensor]:
    """What every site normalizes on ``windows`` (sequences, tokens) of token ids, run ``batch``
    sequences at a time: {site name: (sequences, tokens, rows per token, width) float32}.
    ``forward(ids)`` runs the model (default: its ``base_model`` on ``input_ids``, which skips a
    language-model head; the final norm still runs)."""
    from ..._progress import ensure

    sites = find_sites(model) if sites is None else sites
    if not sites:
        raise ValueError(f"{type(model).__name__} has no norm layer the lab recognises")
    if forward is None:
        base = getattr(model, "base_model", model)

        def forward(ids):
            return base(input_ids=ids)

    parts: dict[str, list[torch.Tensor]] = {s.name: [] for s in sites}
    current: list[tuple[int, int]] = []

    def hook_for(name):
        def hook(module, args, kwargs):
            x = args[0] if args else next(iter(kwargs.values()))
            b, t = current[0]
            parts[name].append(_as_rows(x.detach().float(), b, t).clone())

        return hook

    handles = [
        s.module.register_forward_pre_hook(hook_for(s.name), with_kwargs=True) for s in sites
    ]
    was_training = model.training
    model.eval()
    try:
        with ensure(progress).task("norm inputs", windows.shape[0]) as advance:
            for start in range(0, windows.shape[0], batch):
                ids = windows[start : start + batch]
                current[:] = [tuple(ids.shape)]
                forward(ids)
                advance(ids.shape[0])
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    out = {}
    for name, chunks in parts.items():
        if not chunks:
            continue  # a norm this forward never called (a head the base model skips)
        calls = len(chunks) // -(-windows.shape[0] // batch)
        if calls != 1:
            raise ValueError(f"{name} was called {calls} times per forward; one is expected")
        out[name] = torch.cat(chunks, 0)
    return out


def site_study(
    loaded,
    source,
    *,
    sequences: int = 16,
    seq_len: int = 128,
    batch: int = 4,
    bootstrap: int = 100,
    progress=None,
) -> dict:
    """The statistics of :mod:`~rmsnorm.lab.stats.sitestats` at every norm site of a loaded
    pretrained model (:func:`~rmsnorm.lab.models.pretrained.load_pretrained`) on ``sequences``
    windows of ``seq_len`` tokens of the statistics part of ``source``
    (:mod:`~rmsnorm.lab.models.text`); ``bootstrap``: resamples of the intervals (0: values
    alone)."""
    from ..._progress import ensure
    from ..models.text import token_windows
    from ..stats.sitestats import site_statistics

    if loaded.tokenizer is None:
        raise ValueError(f"{loaded.name} has no tokenizer: the pretrained-model study needs one")
    progress = ensure(progress)
    windows, text_info = token_windows(
        source, loaded.tokenizer, part="stats", sequences=sequences, seq_len=seq_len
    )
    found = find_sites(loaded.model)
    inputs = capture_inputs(loaded.model, windows, sites=found, batch=batch, progress=progress)
    rows = []
    with progress.task("site statistics", len(found)) as advance:
        for site in found:
            if site.name in inputs:
                stats = site_statistics(inputs.pop(site.name), bootstrap=bootstrap)
                rows.append(site.to_dict() | stats)
            advance()
    return {
        "model": loaded.name,
        "provenance": loaded.provenance,
        "text": source.describe() | text_info,
        "sites": rows,
    }
