"""Tiny Hugging Face models built from configs for the lab's tests (random weights, offline): one
builder per architecture, so that the tests that need a Gemma 3, a BERT or a Llama share its
shape."""

from __future__ import annotations

import torch


def gemma3(tf, vocab_size: int = 256, seed: int = 0):
    """A 2-block Gemma 3 text model (d = 64, head_dim 32, sliding window 16), in eval mode."""
    torch.manual_seed(seed)
    cfg = tf.Gemma3TextConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        intermediate_size=128,
        vocab_size=vocab_size,
        max_position_embeddings=64,
        sliding_window=16,
    )
    return tf.Gemma3ForCausalLM(cfg).eval()


def bert(tf, vocab_size: int = 128, seed: int = 0):
    """A 2-block BERT encoder (d = 32), in eval mode."""
    torch.manual_seed(seed)
    cfg = tf.BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=vocab_size,
        architectures=["BertModel"],
    )
    return tf.BertModel(cfg).eval()


def llama_config(tf, vocab_size: int = 128, **overrides):
    """The config of a 2-block Llama (d = 32)."""
    kwargs = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=vocab_size,
    )
    return tf.LlamaConfig(**{**kwargs, **overrides})


class WordTokenizer:
    """Words to ids by a stable hash (ids 3..vocab-1); pads with 0; [CLS]=1 … [SEP]=2 when asked."""

    def __init__(self, vocab: int, frame: bool = False) -> None:
        self.vocab, self.frame = vocab, frame

    def _ids(self, s: str, specials: bool) -> list[int]:
        ids = [3 + sum(map(ord, w)) % (self.vocab - 3) for w in s.split()]
        return [1, *ids, 2] if specials and self.frame else ids

    def __call__(self, s, add_special_tokens=True, padding=False, truncation=False, **kw):
        if isinstance(s, str):
            return {"input_ids": self._ids(s, add_special_tokens)}
        rows = [self._ids(x, add_special_tokens) for x in s]
        n = max(map(len, rows))
        ids = torch.tensor([r + [0] * (n - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (n - len(r)) for r in rows])
        return {"input_ids": ids, "attention_mask": mask}

    def convert_ids_to_tokens(self, i: int) -> str:
        return str(i)
