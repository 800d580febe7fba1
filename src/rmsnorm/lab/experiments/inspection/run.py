"""Inspect the norm layers of a model (``rmsnorm inspect``): load a local Hugging Face model
directory or a built-in tiny model, run text or random tokens through it, and report, per norm
layer, how centered its inputs are and what swapping LayerNorm for RMSNorm (or back) would change.

Nothing is downloaded: Hugging Face models load with ``local_files_only=True`` and transformers is
imported only when such a model is asked for.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field

import torch
from torch import nn

from ...._validate import positive_int
from ...models.runnable import RunnableModel, _transformers
from .capture import NormCapture

__all__ = [
    "BUILTIN_MODELS",
    "RunnableModel",
    "load_runnable_model",
    "make_inputs",
    "inspect_model",
    "inspect_source",
    "InspectResult",
]

BUILTIN_MODELS = {
    "builtin": "the simulated 12-layer pre-LN transformer (LayerNorm) at initialization",
    "builtin-rms": "the simulated 12-layer pre-LN transformer with RMSNorm, at initialization",
    "tiny-gpt2": "a 2-layer Hugging Face GPT-2 from a config (random weights; needs transformers)",
    "tiny-llama": "a 2-layer Hugging Face Llama from a config (random weights; needs transformers)",
    "tiny-mamba2": "a 2-layer Hugging Face Mamba2 from a config: gated RMSNorm, gate then norm, "
    "2 groups (random weights; needs transformers)",
    "tiny-qwen3-next": "a 2-layer Hugging Face Qwen3-Next from a config: gated RMSNorm, norm then "
    "gate, in its linear-attention layer (random weights; needs transformers)",
}
_TINY_HF = ("tiny-gpt2", "tiny-llama", "tiny-mamba2", "tiny-qwen3-next")


def _tiny_config(tf, name: str):
    """The config of a built-in tiny model: 2 layers, width 64, a vocabulary of 256."""
    if name == "tiny-gpt2":
        return tf.GPT2Config(
            n_layer=2,
            n_embd=64,
            n_head=4,
            vocab_size=256,
            n_positions=128,
            bos_token_id=0,
            eos_token_id=0,
        )
    decoder = dict(
        hidden_size=64,
        num_hidden_layers=2,
        vocab_size=256,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    if name == "tiny-mamba2":  # 8 heads of 16: an inner width of 128 in n_groups = 2 groups of 64
        return tf.Mamba2Config(
            **decoder,
            num_heads=8,
            head_dim=16,
            n_groups=2,
            state_size=16,
            expand=2,
            chunk_size=16,
        )
    attention = dict(
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    if name == "tiny-qwen3-next":  # a linear-attention layer (its gated norm), then full attention
        return tf.Qwen3NextConfig(
            **decoder,
            **attention,
            head_dim=16,
            linear_num_value_heads=4,
            linear_num_key_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            layer_types=["linear_attention", "full_attention"],
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
        )
    return tf.LlamaConfig(**decoder, **attention)


def _tiny_hf(name: str, seed: int) -> RunnableModel:
    tf = _transformers()
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(_tiny_config(tf, name))
    return RunnableModel(name, model.eval(), 256, 128, None, "hf")


def load_runnable_model(source: str, seed: int = 0) -> RunnableModel:
    """A :class:`RunnableModel` from a built-in name (:data:`BUILTIN_MODELS`, or a pretrained one of
    :data:`rmsnorm.lab.models.weights.BUILTIN`), a local Hugging Face model directory, a ``.gguf``
    file or a Hub id in the local cache (:func:`rmsnorm.lab.models.pretrained.load_pretrained`; the
    tokenizer is used when its files are there). Raises FileNotFoundError naming what was looked
    for."""
    if not isinstance(source, str) or not source:
        raise ValueError(f"model must be a built-in name or a directory path, got {source!r}")
    if source in ("builtin", "builtin-rms"):
        from ...models.transformer import Transformer, TransformerConfig

        torch.manual_seed(seed)
        cfg = TransformerConfig(norm="rmsnorm" if source == "builtin-rms" else "layernorm")
        return RunnableModel(
            source, Transformer(cfg).eval(), cfg.vocab_size, cfg.seq_len, None, "builtin"
        )
    if source in _TINY_HF:
        return _tiny_hf(source, seed)
    from ...models.pretrained import load_pretrained

    return load_pretrained(source)


def make_inputs(
    loaded: RunnableModel,
    text: str | None = None,
    *,
    batch: int = 4,
    seq_len: int = 64,
    seed: int = 0,
) -> tuple[torch.Tensor, str]:
    """Token ids (batch, seq) and a description. ``text``: one sequence, through the model's
    tokenizer when it has one, else as UTF-8 bytes (mod the vocabulary size); truncated to the
    model's context. Without text: ``batch`` rows of ``seq_len`` uniform random tokens."""
    positive_int("batch", batch)
    positive_int("seq_len", seq_len)
    if text is not None:
        if not text:
            raise ValueError("text is empty")
        if loaded.tokenizer is not None:
            ids = loaded.tokenizer(text, return_tensors="pt")["input_ids"][:, : loaded.max_len]
            how = "tokenizer"
        else:
            raw = torch.tensor(list(text.encode("utf-8")), dtype=torch.int64)
            ids = (raw % loaded.vocab_size)[None, : loaded.max_len]
            how = "UTF-8 bytes"
        return ids, f"text: {ids.shape[1]} tokens ({how})"
    length = min(seq_len, loaded.max_len)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, loaded.vocab_size, (batch, length), generator=gen)
    return ids, f"random tokens: {batch} × {length} (seed {seed})"


@dataclass
class InspectResult:
    """Per norm layer summaries (see :meth:`NormLayerRecord.summary`) plus what was run."""

    model: str
    inputs: str
    layers: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "inputs": self.inputs,
            "machine": platform.platform(),
            "torch": torch.__version__,
            "norm_layers": len(self.layers),
            "layers": self.layers,
        }


def inspect_model(
    model: nn.Module,
    inputs,
    *,
    name: str | None = None,
    description: str = "",
    forward=None,
    max_tokens_per_layer: int | None = 100_000,
) -> InspectResult:
    """Run ``model`` once on ``inputs`` (a tensor → ``model(inputs)``, a dict → ``model(**inputs)``,
    a tuple → ``model(*inputs)``; or pass ``forward``, a callable taking ``inputs``) with hooks on
    every norm layer and return what each saw. Raises ValueError if the model has no norm layer."""
    capture = NormCapture(model, max_tokens_per_layer)
    if not capture.layers:
        raise ValueError(
            f"{name or type(model).__name__} has no LayerNorm / RMSNorm layers that the detection "
            "rule recognises (see rmsnorm.lab.models.norm_layers)"
        )
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), capture:
            if forward is not None:
                forward(inputs)
            elif isinstance(inputs, dict):
                model(**inputs)
            elif isinstance(inputs, (tuple, list)):
                model(*inputs)
            else:
                model(inputs)
    finally:
        model.train(was_training)
    return InspectResult(name or type(model).__name__, description, capture.summary())


def inspect_source(
    source: str, text: str | None = None, *, batch: int = 4, seq_len: int = 64, seed: int = 0
) -> InspectResult:
    """:func:`load_runnable_model` + :func:`make_inputs` + :func:`inspect_model` (what the CLI
    runs)."""
    loaded = load_runnable_model(source, seed)
    ids, how = make_inputs(loaded, text, batch=batch, seq_len=seq_len, seed=seed)
    return inspect_model(
        loaded.model, ids, name=loaded.name, description=how, forward=loaded.forward
    )
