"""Where the per-token mean μ of the residual stream comes from: its token-shared part (the mean
over tokens, one offset every token carries) and its per-token part, and, in a pre-norm or norm-free
stack, which writer put the shared part there (the embedding, each attention, each MLP).

The split is exact: with m̄ the mean of μ_t over the T tokens, mean_t(μ_t²) = m̄² + var_t(μ_t), and
m̄² / mean_t(μ_t²) is the shared part's share of E[μ²]. Where the stream is a plain sum
(h_l = embedding + Σ_k≤l (attention_k + MLP_k)), m̄ is the sum of the writers' own means. An MLP's
token-shared write is W₂·ā + b₂ with ā the activation's mean over tokens (mean_t(W₂a_t + b₂) =
W₂·mean_t(a_t) + b₂), so an activation with a nonzero mean (GELU, ReLU) writes an offset that every
token shares.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

__all__ = ["MeanDecomposition", "shared_share", "capture_writes", "WriteRecord"]


def shared_share(mean: torch.Tensor) -> tuple[float, float, float]:
    """(m̄, mean_t μ², m̄²/mean_t μ²) of per-token means ``mean`` (tokens,): the token-shared
    offset, E[μ²] over tokens, and the shared part's share of it (0 when every μ is 0)."""
    m = mean.to(torch.float64)
    bar = float(m.mean())
    sq = float(m.square().mean())
    return bar, sq, (bar * bar / sq if sq > 0 else 0.0)


@dataclass
class WriteRecord:
    """What one forward recorded about the writers: per block, the mean over tokens and coordinates
    of the attention and MLP outputs, the mean over units of the MLP activation's token mean ā,
    its RMS over units, and the coordinate mean of the MLP's shared write W₂·ā + b₂."""

    attention: list[float]
    mlp: list[float]
    activation_mean: list[float]
    activation_mean_rms: list[float]
    mlp_shared_write: list[float]


@contextmanager
def capture_writes(model, center_activation: bool = False):
    """Hooks on every block of the lab's :class:`~rmsnorm.lab.models.transformer.Transformer` that
    record a
    :class:`WriteRecord` (yielded, filled after the forward). ``center_activation`` subtracts each
    MLP unit's mean over the tokens of the batch from the activation before ``proj``: the MLP then
    writes no token-shared offset beyond its bias (an ablation that shows where the offset comes
    from)."""
    rec = WriteRecord([], [], [], [], [])
    handles = []

    def on_attention(module, args, output):
        rec.attention.append(float(output.detach().double().mean()))

    def on_mlp(module, args, output):
        rec.mlp.append(float(output.detach().double().mean()))

    def on_activation(module, args):
        a = args[0]
        # (units,), the mean over tokens; taken in the input's dtype (float32: ~1e-7 relative
        # over 1,024 tokens), which is 5× cheaper than converting every activation to float64
        abar = a.detach().flatten(0, -2).mean(dim=0).double()
        rec.activation_mean.append(float(abar.mean()))
        rec.activation_mean_rms.append(float(abar.square().mean().sqrt()))
        w = module.weight.detach().double()
        write = w @ abar
        if module.bias is not None:
            write = write + module.bias.detach().double()
        rec.mlp_shared_write.append(float(write.mean()))
        if center_activation:
            return (a - a.flatten(0, -2).mean(dim=0),)
        return None

    for block in model.blocks:
        handles.append(block.attn.register_forward_hook(on_attention))
        handles.append(block.mlp.register_forward_hook(on_mlp))
        handles.append(block.mlp.proj.register_forward_pre_hook(on_activation))
    try:
        yield rec
    finally:
        for h in handles:
            h.remove()


@dataclass
class MeanDecomposition:
    """Per layer (the embedding, then each block): the token-shared offset m̄ = mean_t μ_t, E[μ²]
    over tokens and the shared part's share of it; in a pre-norm or norm-free stack also the
    cumulative parts of m̄ written by the embedding, the attentions and the MLPs (they sum to m̄;
    None where a norm sits on the stream). Per block: the MLP activation's mean (over units of its
    token mean ā), the RMS of ā over units, and the MLP's shared write mean(W₂·ā + b₂)."""

    shared: list[float]
    mean_square: list[float]
    share: list[float]
    from_embedding: list[float] | None
    from_attention: list[float] | None
    from_mlp: list[float] | None
    activation_mean: list[float]
    activation_mean_rms: list[float]
    mlp_shared_write: list[float]

    @classmethod
    def of(cls, means: torch.Tensor, writes: WriteRecord, additive: bool) -> MeanDecomposition:
        """From per-layer per-token means ``means`` (layers, tokens) and the writers' record;
        ``additive``: the stream is the plain sum of its writes (pre-norm or no norm)."""
        rows = [shared_share(m) for m in means]
        emb = att = mlp = None
        if additive:
            emb = [rows[0][0]] * len(rows)
            att, mlp = [0.0], [0.0]
            for a, m in zip(writes.attention, writes.mlp, strict=True):
                att.append(att[-1] + a)
                mlp.append(mlp[-1] + m)
        return cls(
            shared=[r[0] for r in rows],
            mean_square=[r[1] for r in rows],
            share=[r[2] for r in rows],
            from_embedding=emb,
            from_attention=att,
            from_mlp=mlp,
            activation_mean=list(writes.activation_mean),
            activation_mean_rms=list(writes.activation_mean_rms),
            mlp_shared_write=list(writes.mlp_shared_write),
        )

    def to_dict(self) -> dict:
        return dict(self.__dict__)
