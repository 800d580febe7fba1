"""What the centering does to a pretrained model end to end, on held-out text.

RMSNorm models (:func:`causal_swap_study`): the centering added at chosen norm sites (each input
row has its mean subtracted before the norm, so an RMSNorm becomes LayerNorm without a bias with
its own γ, ε and weight convention, Gemma's 1 + γ included; for a QK-norm, per head) at all sites
at once, at each kind of site alone, and at all the sites of one block at a time. Per variant:
KL(original ‖ centered) of the next-token distributions, the change of cross-entropy on the text's
next tokens (nats per token), top-1 agreement, on the first position and on the others, each with
a 95% bootstrap interval over sequences. The model runs once per batch for the reference and once
per variant, batch by batch, so only one batch of logits is held at a time.

LayerNorm encoders (:func:`encoder_swap_study`, MiniLM): every LayerNorm made an RMSNorm naively
(y = γ·x/√(mean(x²) + ε) + β, the same γ, β, ε), and a second attempt that first centers every
writer it can (the embedding tables' rows; the attention and MLP output projections' rows and
biases), which makes the embedding norm's input centered but not the residual that each later
norm's input carries: the previous norm's output γ·x̂ + β has the mean mean(γ·x̂) + mean(β), which
is zero only when γ is constant and β has zero mean (true at initialization, not after training).
So a post-LN network has no exact conversion by centering its writers; the one that exists for
pre-LN networks (:mod:`rmsnorm.convert`) relies on every reader of the stream being a norm.
Measured on sentence embeddings (mean over tokens, then unit length, as the model is used): the
cosine between original and swapped embeddings, nearest-neighbour agreement and the rank
correlation of all pairwise similarities.
"""

from __future__ import annotations

import contextlib
import copy

import torch
import torch.nn.functional as F

from ..._progress import ensure
from ..models.text import sentences, token_windows
from .sites import Site, find_sites

__all__ = ["centered", "rms_instead", "causal_swap_study", "encoder_swap_study", "variants_of"]

_BOOTSTRAP = 200
_LOGIT_ELEMENTS = 48 * 2**20  # one batch's logits at most (192 MB in float32)


@contextlib.contextmanager
def centered(chosen: list[Site]):
    """Within the block, each chosen norm receives its input minus the input's mean over the
    normalized (last) dimension."""

    def hook(module, args, kwargs):
        if args:
            x = args[0]
            return (x - x.mean(-1, keepdim=True), *args[1:]), kwargs
        key = next(iter(kwargs))
        x = kwargs[key]
        return args, {**kwargs, key: x - x.mean(-1, keepdim=True)}

    handles = [s.module.register_forward_pre_hook(hook, with_kwargs=True) for s in chosen]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def variants_of(found: list[Site], layers: list[int] | None = None) -> dict[str, list[Site]]:
    """The variants of the study: ``all``, ``kind:<kind>`` per kind present, ``layer:<i>`` for the
    blocks ``layers`` (all blocks when None)."""
    rms = [s for s in found if s.norm == "rmsnorm"]
    out = {"all": rms}
    for kind in dict.fromkeys(s.kind for s in rms):
        out[f"kind:{kind}"] = [s for s in rms if s.kind == kind]
    blocks = sorted({s.layer for s in rms if s.layer is not None})
    for layer in blocks if layers is None else [b for b in blocks if b in layers]:
        out[f"layer:{layer}"] = [s for s in rms if s.layer == layer]
    return out


def _interval(per_sequence: torch.Tensor, gen: torch.Generator) -> dict:
    """Mean over sequences with a 95% bootstrap interval (whole sequences resampled)."""
    n = per_sequence.shape[0]
    draws = torch.randint(0, n, (_BOOTSTRAP, n), generator=gen)
    boot = per_sequence[draws].mean(-1)
    lo, hi = torch.quantile(boot, torch.tensor([0.025, 0.975], dtype=boot.dtype))
    return {"value": float(per_sequence.mean()), "lo": float(lo), "hi": float(hi)}


@torch.no_grad()
def _reference(ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's probabilities (float32) and log-normalizers (float64), once per batch."""
    return F.softmax(ref.float(), -1), torch.logsumexp(ref.double(), -1)


@torch.no_grad()
def _token_costs(ref: torch.Tensor, new: torch.Tensor, ids: torch.Tensor, cached=None) -> dict:
    """Per token (B, T): KL(ref ‖ new), Δ cross-entropy of the next token (position T − 1 has
    no target: NaN), top-1 agreement, and the reference's cross-entropy. With log q − log p =
    (new − ref) − (lse_new − lse_ref): KL = Σ p·(ref − new) − lse_ref + lse_new, the sum in
    float32 (its value is at most |lse_ref − lse_new| + KL, so its rounding is ~1e-7 of that), the
    log-normalizers in float64. A vocabulary of 262,144 makes a float64 log-softmax per variant
    cost as much as the model's own head. ``cached``: :func:`_reference` of ``ref``."""
    p, lse_ref = _reference(ref) if cached is None else cached
    ref, new = ref.float(), new.float()
    lse_new = torch.logsumexp(new.double(), -1)
    kl = ((p * (ref - new)).sum(-1).double() - lse_ref + lse_new).clamp_min(0.0)
    target = ids[:, 1:, None]
    at_ref = ref[:, :-1].gather(-1, target)[..., 0].double()
    at_new = new[:, :-1].gather(-1, target)[..., 0].double()
    dce = torch.full_like(kl, float("nan"))
    dce[:, :-1] = (at_ref - lse_ref[:, :-1]) - (at_new - lse_new[:, :-1])
    ce = torch.full_like(kl, float("nan"))
    ce[:, :-1] = lse_ref[:, :-1] - at_ref
    agree = (ref.argmax(-1) == new.argmax(-1)).double()
    return {"kl": kl, "dce": dce, "top1": agree, "ce": ce}


def _summary(costs: dict[str, torch.Tensor], gen: torch.Generator) -> dict:
    kl, dce, top1 = costs["kl"], costs["dce"], costs["top1"]
    return {
        "kl": _interval(kl.mean(1), gen),
        "kl_first": _interval(kl[:, 0], gen),
        "kl_rest": _interval(kl[:, 1:].mean(1), gen),
        "delta_ce": _interval(dce[:, :-1].mean(1), gen),
        "top1": _interval(top1.mean(1), gen),
        "top1_rest": _interval(top1[:, 1:].mean(1), gen),
        "kl_max": float(kl.max()),
    }


def causal_swap_study(
    loaded,
    source,
    *,
    sequences: int = 8,
    seq_len: int = 128,
    layers: list[int] | None = None,
    progress=None,
) -> dict:
    """The RMSNorm model study of the module docstring on the held-out part of ``source``:
    ``{"text", "loss", "variants": {name: {"sites", "kl", "kl_first", "kl_rest", "delta_ce",
    "top1", "top1_rest", "kl_max"}}}``; ``layers``: the blocks swapped one at a time (all when
    None)."""
    if loaded.encoder:
        raise ValueError(f"{loaded.name} is an encoder: use encoder_swap_study")
    model = loaded.model
    windows, text_info = token_windows(
        source, loaded.tokenizer, part="heldout", sequences=sequences, seq_len=seq_len
    )
    variants = variants_of(find_sites(model), layers)
    if not variants["all"]:
        raise ValueError(f"{loaded.name} has no RMSNorm to add the centering to")
    batch = max(1, _LOGIT_ELEMENTS // (seq_len * loaded.vocab_size))
    parts: dict[str, list[dict]] = {name: [] for name in variants}
    reference: list[torch.Tensor] = []
    with ensure(progress).task("centering variants × batches", len(variants) * sequences) as tick:
        for start in range(0, sequences, batch):
            ids = windows[start : start + batch]
            ref = model(input_ids=ids, use_cache=False).logits.float()
            cached = _reference(ref)
            reference.append(_token_costs(ref, ref, ids, cached)["ce"])
            for name, chosen in variants.items():
                with centered(chosen):
                    new = model(input_ids=ids, use_cache=False).logits.float()
                parts[name].append(_token_costs(ref, new, ids, cached))
                tick(ids.shape[0])
    gen = torch.Generator().manual_seed(0)
    out = {}
    for name, chunks in parts.items():
        costs = {k: torch.cat([c[k] for c in chunks]) for k in chunks[0]}
        out[name] = {"sites": [s.name for s in variants[name]], **_summary(costs, gen)}
    ce = torch.cat(reference)
    return {
        "text": source.describe() | text_info,
        "loss": _interval(ce[:, :-1].mean(1), gen),
        "variants": out,
    }


# ----------------------------------------------------------------------------------------------
# A LayerNorm encoder: the naive swap and the centered writers
# ----------------------------------------------------------------------------------------------
@contextlib.contextmanager
def rms_instead(chosen: list[Site]):
    """Each chosen LayerNorm outputs γ·x/√(mean(x²) + ε) + β instead (same γ, β, ε)."""

    def hook(module, args, output):
        x = args[0].float()
        y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + module.eps)
        y = y * module.weight if module.weight is not None else y
        return (y + module.bias if module.bias is not None else y).to(output.dtype)

    handles = [s.module.register_forward_hook(hook) for s in chosen]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _center_writers(model) -> int:
    """Center the rows every writer into a LayerNorm's input adds (in place on a copy): BERT's
    embedding tables and its attention and MLP output projections. Returns how many it changed."""
    changed = 0
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Embedding):
                module.weight -= module.weight.mean(-1, keepdim=True)
                changed += 1
            elif isinstance(module, torch.nn.Linear) and name.endswith("output.dense"):
                module.weight -= module.weight.mean(0, keepdim=True)
                if module.bias is not None:
                    module.bias -= module.bias.mean()
                changed += 1
    return changed


def _embed(model, batch: dict) -> torch.Tensor:
    states = model(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].to(states.dtype)
    pooled = (states * mask).sum(1) / mask.sum(1)
    return F.normalize(pooled.double(), dim=-1)


def _agreement(ref: torch.Tensor, new: torch.Tensor) -> dict:
    from scipy.stats import spearmanr

    cos = (ref * new).sum(-1)
    sim_ref, sim_new = ref @ ref.T, new @ new.T
    n = ref.shape[0]
    eye = torch.eye(n, dtype=torch.bool)
    nn_ref = sim_ref.masked_fill(eye, -2).argmax(-1)
    nn_new = sim_new.masked_fill(eye, -2).argmax(-1)
    upper = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
    rho = spearmanr(sim_ref[upper].numpy(), sim_new[upper].numpy()).statistic
    return {
        "cosine_mean": float(cos.mean()),
        "cosine_min": float(cos.min()),
        "one_minus_cosine_mean": float((1 - cos).mean()),
        "nearest_neighbour_agreement": float((nn_ref == nn_new).double().mean()),
        "similarity_rank_correlation": float(rho),
    }


@torch.no_grad()
def encoder_swap_study(
    loaded, source, *, count: int = 64, progress=None, only: tuple[str, ...] | None = None
) -> dict:
    """The encoder study of the module docstring on ``count`` held-out sentences: per variant
    (``naive:all``, ``naive:layer:<i>``, ``naive:kind:<kind>``, ``centered-writers:all``) the
    agreement of sentence embeddings with the original model's; ``only``: those variants alone."""
    if not loaded.encoder:
        raise ValueError(f"{loaded.name} is not an encoder: use causal_swap_study")
    texts = sentences(source, count)
    batch = loaded.tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    batch = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask")}
    model = loaded.model
    found = [s for s in find_sites(model) if s.norm == "layernorm"]
    variants = {"naive:all": found}
    for kind in dict.fromkeys(s.kind for s in found):
        variants[f"naive:kind:{kind}"] = [s for s in found if s.kind == kind]
    for layer in sorted({s.layer for s in found if s.layer is not None}):
        variants[f"naive:layer:{layer}"] = [s for s in found if s.layer == layer]
    if only is not None:
        variants = {k: v for k, v in variants.items() if k in only}
    ref = _embed(model, batch)
    out = {}
    with ensure(progress).task("encoder variants", len(variants) + 1) as tick:
        for name, chosen in variants.items():
            with rms_instead(chosen):
                out[name] = {
                    "sites": [s.name for s in chosen],
                    **_agreement(ref, _embed(model, batch)),
                }
            tick()
        if only is not None and "centered-writers:all" not in only:
            return {
                "sentences": len(texts),
                "tokens": int(batch["attention_mask"].sum()),
                "text": source.describe(),
                "variants": out,
            }
        writers = copy.deepcopy(model)
        changed = _center_writers(writers)
        moved = _agreement(ref, _embed(writers, batch))  # centering the writers alone
        swapped = [s for s in find_sites(writers) if s.norm == "layernorm"]
        with rms_instead(swapped):
            out["centered-writers:all"] = {
                "sites": [s.name for s in swapped],
                "writers_centered": changed,
                "writers_alone": moved,
                **_agreement(ref, _embed(writers, batch)),
            }
        tick()
    return {
        "sentences": len(texts),
        "tokens": int(batch["attention_mask"].sum()),
        "text": source.describe(),
        "variants": out,
    }
