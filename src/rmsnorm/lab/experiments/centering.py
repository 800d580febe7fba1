"""What the centering does to a pretrained model end to end, on held-out text.

RMSNorm models (:func:`causal_swap_study`): the centering added at chosen norm sites (each input
row has its mean subtracted before the norm, so an RMSNorm becomes LayerNorm without a bias with
its own γ, ε and weight convention, Gemma's 1 + γ included; for a QK-norm, per head) at all sites
at once, at each kind of site alone, at the sites of one block at a time, and as the interventions
that test why it costs what it costs (:data:`TRANSFORMS` × :data:`POSITIONS`: the mean over the
ordinary channels only, the full mean subtracted from the ordinary channels only, the massive
channels clipped before the norm with and without the centering, the centering at the first
position only or at the others only). Per variant and held-out sequence: KL(original ‖ variant) of
the next-token distributions, the change of cross-entropy on the text's next tokens (nats per
token), top-1 agreement, and the KL measured at the first position and at the others. Only the
per-sequence values are returned; intervals are drawn from them by the caller.

The model runs once per batch for the reference, recording every block's output, and once per
variant; a variant whose first centered site is in block k starts from the reference's output of
block k − 1 (the blocks before it are not run again), which halves the cost of the per-block
sweep. The language-model head (and its softmax over the vocabulary, 262,144 tokens for Gemma 3)
is evaluated at the first position and every ``head_stride``-th position after it, the same in
every variant: each sequence's mean is then the first position's value plus the mean of the
sampled others, weighted as all the positions they stand for.

LayerNorm encoders (:func:`encoder_swap_study`, MiniLM): every LayerNorm made an RMSNorm naively
(y = γ·x/√(mean(x²) + ε) + β, the same γ, β, ε), and a second attempt that first centers every
writer it can (the embedding tables' rows; the attention and MLP output projections' rows and
biases), which makes the embedding norm's input centered but not the residual that each later
norm's input carries: the previous norm's output γ·x̂ + β has the mean mean(γ·x̂) + mean(β), which
is zero only when γ is constant and β has zero mean (true at initialization, not after training).
So a post-LN network has no exact conversion by centering its writers; the one that exists for
pre-LN networks (:mod:`rmsnorm.convert`) relies on every reader of the stream being a norm.
Measured on sentence embeddings (mean over tokens, then unit length, as the model is used): the
cosine between original and swapped embeddings per sentence, nearest-neighbour agreement and the
rank correlation of all pairwise similarities.
"""

from __future__ import annotations

import contextlib
import copy
import re
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..._progress import ensure
from ..models.text import sentences, token_windows
from .sites import Site, find_sites

__all__ = [
    "COSTS",
    "TRANSFORMS",
    "POSITIONS",
    "MECHANISMS",
    "Variant",
    "centered",
    "transformed",
    "rms_instead",
    "variants_of",
    "mechanism_variants",
    "standard_variants",
    "Channels",
    "head_positions",
    "causal_swap_study",
    "encoder_swap_study",
    "mean_pooled",
]

# The per-sequence costs of each variant (:func:`causal_swap_study`).
COSTS = ("kl", "kl_first", "kl_rest", "delta_ce", "top1", "top1_rest")
TRANSFORMS = ("center", "center_ordinary_mean", "center_ordinary_only", "clip", "clip_center")
POSITIONS = ("all", "first", "rest")
# The interventions, each at every RMSNorm site: name -> (transform, positions).
MECHANISMS = {
    "mean of ordinary channels": ("center_ordinary_mean", "all"),
    "ordinary channels shifted": ("center_ordinary_only", "all"),
    "massive clipped": ("clip", "all"),
    "massive clipped, centered": ("clip_center", "all"),
    "first position only": ("center", "first"),
    "other positions only": ("center", "rest"),
}
_LOGIT_ELEMENTS = 96 * 2**20  # one batch's logits at most (384 MB in float32)
_LAYER = re.compile(r"^(.*)\.(\d+)\.")


@dataclass(frozen=True)
class Variant:
    """What one variant changes: at each of ``sites``, the norm's input goes through
    ``transform`` at ``positions`` (:data:`TRANSFORMS`, :data:`POSITIONS`)."""

    name: str
    sites: tuple[Site, ...]
    transform: str = "center"
    positions: str = "all"
    group: str = "standard"  # "standard" (all, kinds), "block", "mechanism"

    def __post_init__(self) -> None:
        if self.transform not in TRANSFORMS:
            raise ValueError(f"transform must be one of {TRANSFORMS}, got {self.transform!r}")
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {self.positions!r}")


@dataclass
class Channels:
    """A site's massive channels (indices into the normalized dim) and the level they are clipped
    to, from the statistics part of the text (:mod:`~rmsnorm.lab.stats.sitestats`)."""

    massive: list[int] = field(default_factory=list)
    clip: float = float("inf")


def _apply(x: torch.Tensor, transform: str, positions: str, ch: Channels | None) -> torch.Tensor:
    """``x`` (batch, tokens, ..., width) after ``transform`` at ``positions``."""
    ch = ch or Channels()
    width = x.shape[-1]
    ordinary = torch.ones(width, dtype=torch.bool, device=x.device)
    ordinary[ch.massive] = False
    if not ordinary.any():
        ordinary[:] = True
    if transform in ("clip", "clip_center") and ch.massive:
        new = x.clone()
        new[..., ch.massive] = x[..., ch.massive].clamp(-ch.clip, ch.clip)
        if transform == "clip_center":
            new = new - new.mean(-1, keepdim=True)
    elif transform == "clip_center":
        new = x - x.mean(-1, keepdim=True)
    elif transform == "clip":
        new = x
    elif transform == "center":
        new = x - x.mean(-1, keepdim=True)
    elif transform == "center_ordinary_mean":
        new = x - x[..., ordinary].mean(-1, keepdim=True)
    else:  # center_ordinary_only
        new = x - x.mean(-1, keepdim=True) * ordinary.to(x.dtype)
    if positions == "first":
        new = torch.cat([new[:, :1], x[:, 1:]], 1)
    elif positions == "rest":
        new = torch.cat([x[:, :1], new[:, 1:]], 1)
    return new


@contextlib.contextmanager
def transformed(
    chosen, transform: str = "center", positions: str = "all", channels: dict | None = None
):
    """Within the block, each chosen norm receives its input through ``transform`` at
    ``positions``; ``channels``: {site name: :class:`Channels`} for the transforms that need the
    massive channels."""
    channels = channels or {}

    def hook_for(site: Site):
        ch = channels.get(site.name)

        def hook(module, args, kwargs):
            if args:
                return (_apply(args[0], transform, positions, ch), *args[1:]), kwargs
            key = next(iter(kwargs))
            return args, {**kwargs, key: _apply(kwargs[key], transform, positions, ch)}

        return hook

    handles = [s.module.register_forward_pre_hook(hook_for(s), with_kwargs=True) for s in chosen]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def centered(chosen: list[Site]):
    """Within the block, each chosen norm receives its input minus the input's mean over the
    normalized (last) dimension."""
    return transformed(chosen, "center", "all")


def variants_of(found: list[Site], layers: list[int] | None = None) -> dict[str, list[Site]]:
    """The centering's variants: ``all``, ``kind:<kind>`` per kind present, ``block:<i>`` for the
    blocks ``layers`` (all blocks when None)."""
    rms = [s for s in found if s.norm == "rmsnorm"]
    out = {"all": rms}
    for kind in dict.fromkeys(s.kind for s in rms):
        out[f"kind:{kind}"] = [s for s in rms if s.kind == kind]
    blocks = sorted({s.layer for s in rms if s.layer is not None})
    for layer in blocks if layers is None else [b for b in blocks if b in layers]:
        out[f"block:{layer}"] = [s for s in rms if s.layer == layer]
    return out


def mechanism_variants(found: list[Site]) -> list[Variant]:
    """The interventions of :data:`MECHANISMS`, each at every RMSNorm site."""
    rms = tuple(s for s in found if s.norm == "rmsnorm")
    return [Variant(f"mech:{k}", rms, t, p, "mechanism") for k, (t, p) in MECHANISMS.items()]


def standard_variants(found: list[Site], layers: list[int] | None = None) -> list[Variant]:
    """:func:`variants_of` as :class:`Variant` values (the plain centering)."""
    return [
        Variant(name, tuple(chosen), group="block" if name.startswith("block:") else "standard")
        for name, chosen in variants_of(found, layers).items()
    ]


# ----------------------------------------------------------------------------------------------
# Running from a block's output
# ----------------------------------------------------------------------------------------------
class _Blocks:
    """The model's stack of blocks (the ModuleList its sites' names index), recording each
    block's output on the reference pass and standing in for the blocks before a variant's first
    changed one."""

    def __init__(self, model: torch.nn.Module, found: list[Site]) -> None:
        self.layers = None
        for s in found:
            match = _LAYER.match(s.name)
            if match and s.layer is not None:
                self.layers = model.get_submodule(match.group(1))
                break
        self.outputs: dict[int, torch.Tensor] = {}

    @property
    def count(self) -> int:
        return 0 if self.layers is None else len(self.layers)

    def first_block(self, variant: Variant) -> int:
        """The first block whose computation the variant changes: its earliest site's block, the
        number of blocks for sites after the stack (the final norm), 0 for any other."""
        if self.layers is None:
            return 0
        firsts = []
        for s in variant.sites:
            if s.layer is not None:
                firsts.append(s.layer)
            elif s.kind == "final":
                firsts.append(self.count)
            else:
                firsts.append(0)
        return min(firsts, default=0)

    @contextlib.contextmanager
    def record(self):
        if self.layers is None:
            yield
            return
        self.outputs.clear()

        def hook_for(i):
            def hook(module, args, output):
                self.outputs[i] = output

            return hook

        handles = [b.register_forward_hook(hook_for(i)) for i, b in enumerate(self.layers)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    @contextlib.contextmanager
    def start_at(self, k: int):
        """Blocks before ``k`` are not run: block k − 1 returns its recorded output, the ones before
        it pass their input through."""
        if self.layers is None or k == 0:
            yield
            return
        stubs = []
        for j in range(k):
            block = self.layers[j]
            out = self.outputs[j] if j == k - 1 else None

            def forward(*args, _out=out, **kwargs):
                if _out is not None:
                    return _out
                return args[0] if args else kwargs["hidden_states"]

            block.forward = forward
            stubs.append(block)
        try:
            yield
        finally:
            for block in stubs:
                del block.forward


def head_positions(seq_len: int, stride: int) -> torch.Tensor:
    """The positions the head is evaluated at: 0 and every ``stride``-th after it."""
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise ValueError(f"head_stride must be a positive integer, got {stride!r}")
    return torch.arange(0, seq_len, stride, dtype=torch.int64)


@torch.no_grad()
def _token_costs(ref: torch.Tensor, new: torch.Tensor, targets: torch.Tensor) -> dict:
    """Per evaluated position (B, K): KL(ref ‖ new), Δ cross-entropy of the next token (NaN where
    ``targets`` is negative: no next token), top-1 agreement, and the reference's cross-entropy.
    With log q − log p = (new − ref) − (lse_new − lse_ref): KL = Σ p·(ref − new) − lse_ref +
    lse_new. Everything in float32: a float64 log-normalizer over Gemma 3's 262,144 logits costs
    as much as the head itself, and float32's rounding here is ~1e-6 nats (measured against
    float64 on SmolLM2: docs/lab.md)."""
    ref, new = ref.float(), new.float()
    lse_ref = torch.logsumexp(ref, -1)
    lse_new = torch.logsumexp(new, -1)
    p = torch.exp(ref - lse_ref[..., None])
    kl = ((p * (ref - new)).sum(-1) - lse_ref + lse_new).clamp_min(0.0)
    has = targets >= 0
    safe = targets.clamp_min(0)[..., None]
    at_ref = ref.gather(-1, safe)[..., 0]
    at_new = new.gather(-1, safe)[..., 0]
    nan = torch.full_like(kl, float("nan"))
    ce = torch.where(has, lse_ref - at_ref, nan)
    dce = torch.where(has, (lse_new - at_new) - (lse_ref - at_ref), nan)
    agree = (ref.argmax(-1) == new.argmax(-1)).float()
    return {"kl": kl, "dce": dce, "top1": agree, "ce": ce}


def _per_sequence(costs: dict[str, torch.Tensor], positions: torch.Tensor, seq_len: int) -> dict:
    """Each sequence's means from its evaluated positions (the first one, and the sampled others
    weighted as the positions they stand for): kl, kl_first, kl_rest, delta_ce, top1, top1_rest,
    ce (lists of floats, one per sequence)."""
    kl, dce, top1, ce = (costs[k].double() for k in ("kl", "dce", "top1", "ce"))
    rest = slice(1, None)
    w_first = 1.0 / seq_len  # the first position's share of a sequence's tokens
    # Δ CE and the reference CE are over the positions with a next token (T − 1 of them)
    scored = positions < seq_len - 1
    first_scored, rest_scored = scored[0].item(), scored[1:]
    w_ce = 1.0 / (seq_len - 1)

    def mean_rest(v, mask=None):
        part = v[:, rest] if mask is None else v[:, rest][:, mask]
        return part.mean(1) if part.shape[1] else torch.zeros(v.shape[0], dtype=v.dtype)

    def mixed(v, w, mask=None):
        first = v[:, 0] if first_scored or mask is None else torch.zeros_like(v[:, 0])
        return w * first + (1 - w) * mean_rest(v, mask)

    out = {
        "kl": mixed(kl, w_first),
        "kl_first": kl[:, 0],
        "kl_rest": mean_rest(kl),
        "delta_ce": mixed(dce, w_ce, rest_scored),
        "top1": mixed(top1, w_first),
        "top1_rest": mean_rest(top1),
        "ce": mixed(ce, w_ce, rest_scored),
    }
    return {k: [float(x) for x in v] for k, v in out.items()}


def causal_swap_study(
    loaded,
    source,
    *,
    sequences: int = 32,
    seq_len: int = 128,
    variants: list[Variant] | None = None,
    channels: dict | None = None,
    head_stride: int = 1,
    progress=None,
) -> dict:
    """The RMSNorm model study of the module docstring on the held-out part of ``source``:
    ``{"text", "head_positions", "reference": {"ce": [...]}, "variants": {name: {"sites",
    "transform", "positions", "group", "first_block", and per-sequence lists "kl", "kl_first",
    "kl_rest", "delta_ce", "top1", "top1_rest", and "kl_max"}}}``. ``variants``: default
    :func:`standard_variants` (every block) and :func:`mechanism_variants`; ``channels``: {site
    name: :class:`Channels`} for the mechanisms."""
    if loaded.encoder:
        raise ValueError(f"{loaded.name} is an encoder: use encoder_swap_study")
    model = loaded.model
    windows, text_info = token_windows(
        source, loaded.tokenizer, part="heldout", sequences=sequences, seq_len=seq_len
    )
    found = find_sites(model)
    if variants is None:
        variants = standard_variants(found) + mechanism_variants(found)
    if not variants or not variants[0].sites:
        raise ValueError(f"{loaded.name} has no RMSNorm to add the centering to")
    positions = head_positions(seq_len, head_stride)
    targets = torch.full((sequences, positions.numel()), -1, dtype=torch.int64)
    scored = positions < seq_len - 1
    targets[:, scored] = windows[:, positions[scored] + 1]
    batch = max(1, _LOGIT_ELEMENTS // (positions.numel() * loaded.vocab_size))
    blocks = _Blocks(model, found)
    firsts = {v.name: blocks.first_block(v) for v in variants}
    chunks: dict[str, list[dict]] = {v.name: [] for v in variants}
    reference: list[dict] = []
    kl_max = dict.fromkeys(chunks, 0.0)
    was_training = model.training
    model.eval()
    task = ensure(progress).task("centering variants × sequences", len(variants) * sequences)
    try:
        with task as tick, torch.no_grad():
            for start in range(0, sequences, batch):
                ids = windows[start : start + batch]
                tgt = targets[start : start + batch]
                with blocks.record():
                    ref = model(input_ids=ids, use_cache=False, logits_to_keep=positions).logits
                ref = ref.float()
                reference.append(_per_sequence(_token_costs(ref, ref, tgt), positions, seq_len))
                for v in variants:
                    with (
                        blocks.start_at(firsts[v.name]),
                        transformed(v.sites, v.transform, v.positions, channels),
                    ):
                        new = model(input_ids=ids, use_cache=False, logits_to_keep=positions)
                    costs = _token_costs(ref, new.logits, tgt)
                    kl_max[v.name] = max(kl_max[v.name], float(costs["kl"].max()))
                    chunks[v.name].append(_per_sequence(costs, positions, seq_len))
                    tick(ids.shape[0])
                blocks.outputs.clear()
    finally:
        model.train(was_training)

    def joined(parts: list[dict]) -> dict:
        return {k: [x for p in parts for x in p[k]] for k in parts[0]}

    out = {}
    for v in variants:
        out[v.name] = {
            "sites": [s.name for s in v.sites],
            "transform": v.transform,
            "positions": v.positions,
            "group": v.group,
            "first_block": firsts[v.name],
            **{k: val for k, val in joined(chunks[v.name]).items() if k != "ce"},
            "kl_max": kl_max[v.name],
        }
    return {
        "text": source.describe() | text_info,
        "head_positions": positions.tolist(),
        "head_stride": head_stride,
        "reference": {"ce": joined(reference)["ce"]},
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


_SENTENCE_BATCH = 32


def _embed(model, batch: dict) -> torch.Tensor:
    """Sentence embeddings (mean over the real tokens, unit length), run in batches of sentences
    of similar length, each cut to its longest (sorting by length cuts the padding, most of a
    256-sentence batch's tokens), returned in the sentences' order."""
    lengths = batch["attention_mask"].sum(1)
    order = torch.argsort(lengths, descending=True, stable=True)
    out = torch.empty(lengths.shape[0], model.config.hidden_size, dtype=torch.float64)
    for start in range(0, order.numel(), _SENTENCE_BATCH):
        idx = order[start : start + _SENTENCE_BATCH]
        width = int(lengths[idx].max())
        part = {k: v[idx, :width] for k, v in batch.items()}
        out[idx] = F.normalize(mean_pooled(model, part).double(), dim=-1)
    return out


def mean_pooled(model, part: dict) -> torch.Tensor:
    """The mean of the last hidden states over each sentence's real tokens (B, d), in the model's
    dtype and with autograd where it is on: one batch of :func:`_embed`, before the unit
    length (the fine-tuning of :mod:`~rmsnorm.lab.experiments.recovery` trains through it)."""
    states = model(**part).last_hidden_state
    mask = part["attention_mask"][..., None].to(states.dtype)
    return (states * mask).sum(1) / mask.sum(1)


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
        "one_minus_cosine": [float(v) for v in 1 - cos],
        "nearest_neighbour_agreement": float((nn_ref == nn_new).double().mean()),
        "similarity_rank_correlation": float(rho),
    }


@torch.no_grad()
def encoder_swap_study(
    loaded, source, *, count: int = 256, progress=None, only: tuple[str, ...] | None = None
) -> dict:
    """The encoder study of the module docstring on ``count`` held-out sentences: per variant
    (``naive:all``, ``naive:block:<i>``, ``naive:kind:<kind>``, ``centered-writers:all``) the
    agreement of sentence embeddings with the original model's, with each sentence's 1 − cosine;
    ``only``: those variants alone."""
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
        variants[f"naive:block:{layer}"] = [s for s in found if s.layer == layer]
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
