"""The architectures the exact conversion supports, as one table: for each, the attribute paths of
the layers that write into the residual stream and of the LayerNorms that read it, and the
configurations it refuses. :func:`~rmsnorm.convert.layernorm_to_rmsnorm` reads only this table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

__all__ = [
    "ConversionError",
    "HIDDEN_DIM",
    "Architecture",
    "ARCHITECTURES",
    "LAB_TRANSFORMER",
    "POST_LN",
    "register_architecture",
    "find_architecture",
    "architecture_of",
]


class ConversionError(ValueError):
    """The model cannot be converted exactly (the message says why)."""


# Which dim of each parameter of a residual writer is the hidden (stream) dim, by the writer's
# layout. A wrong dim would center the wrong axis and the logits would move.
HIDDEN_DIM: dict[str, tuple[tuple[str, int], ...]] = {
    "linear": (("weight", 0), ("bias", 0)),  # torch.nn.Linear: weight (hidden, in)
    "conv1d": (("weight", 1), ("bias", 0)),  # Hugging Face Conv1D (GPT-2): weight (in, hidden)
    "embedding": (("weight", 1),),  # torch.nn.Embedding: (rows, hidden)
}


@dataclass(frozen=True)
class Architecture:
    """Where a pre-LN architecture writes into its residual stream and where its norms read it.

    Paths are dotted attribute names; ``""`` is the object itself.

    Attributes:
        name: the key in :data:`ARCHITECTURES`, and the format of the directories
            :func:`~rmsnorm.convert.save_model` writes for models that are not Hugging Face ones.
        description: what the entry covers, for messages.
        embeddings: under ``base``, the tables whose rows start the stream.
        layers: under ``base``, the list of blocks.
        writers: in each block, ``(path, layout)`` of the layers whose output is added to the
            stream; the layout (a key of :data:`HIDDEN_DIM`) says which dim of their parameters is
            the hidden one.
        norms: in each block, the LayerNorms that read the stream.
        final_norm: under ``base``, the LayerNorm before the head.
        requires: ``(config attribute, required value, why)``: a model whose config has another
            value is refused with ``why``.
        model_type: a Hugging Face ``config.model_type`` that recognises the model (saved with
            ``save_pretrained``; the conversion is recorded in its config).
        model_class: or a function returning the model's class, so that the class is imported
            only when a model is checked against the entry.
        build: with ``model_class``, makes a model from its config as a dict (a directory of such a
            model is its config and its state_dict).
        base: the module holding the embeddings, blocks and final norm (Hugging Face models:
            ``base_model``, which is the model itself or its body under a head).
        config: the model's attribute holding its configuration.
        context: the config attribute holding the longest sequence the model takes.
        converted_config: ``(config attribute, value before, value after)`` for the fields that
            name the norm, rewritten on conversion (the lab's ``norm``).
    """

    name: str
    description: str
    embeddings: tuple[str, ...]
    layers: str
    writers: tuple[tuple[str, str], ...]
    norms: tuple[str, ...]
    final_norm: str
    requires: tuple[tuple[str, object, str], ...] = ()
    model_type: str | None = None
    model_class: Callable[[], type] | None = None
    build: Callable[[dict], nn.Module] | None = None
    base: str = "base_model"
    config: str = "config"
    context: str = "max_position_embeddings"
    converted_config: tuple[tuple[str, object, object], ...] = ()

    def __post_init__(self) -> None:
        if (self.model_type is None) == (self.model_class is None):
            raise ValueError(
                f"Architecture {self.name!r} needs exactly one of model_type (a Hugging Face "
                "config.model_type) or model_class (a function returning the class)"
            )
        if self.model_class is not None and self.build is None:
            raise ValueError(f"Architecture {self.name!r} with model_class needs build")
        for path, layout in self.writers:
            if layout not in HIDDEN_DIM:
                raise ValueError(
                    f"Architecture {self.name!r}: the layout of writer {path!r} must be one of "
                    f"{sorted(HIDDEN_DIM)}, got {layout!r}"
                )

    @property
    def hugging_face(self) -> bool:
        return self.model_type is not None

    def matches(self, model: nn.Module) -> bool:
        if self.model_class is not None:
            return isinstance(model, self.model_class())
        config = getattr(model, "config", None)
        return getattr(config, "model_type", None) == self.model_type and hasattr(
            model, "base_model"
        )


POST_LN = (
    "post-LN model (norm_position='post'): each norm reads x + f(x) and its output, not a "
    "centered sum, is the residual stream, so centering the writers cannot make RMSNorm equal "
    "LayerNorm; only pre-LN models convert exactly"
)

# The format name of the lab's Transformer: its entry is registered by the lab
# (rmsnorm.lab.models.transformer), which imports this module; the conversion never imports the lab.
LAB_TRANSFORMER = "rmsnorm-lab-transformer"

ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in (
        Architecture(
            name="gpt2",
            description="Hugging Face GPT-2 (decoder-only)",
            # wte is also the token-type embedding, when token types are given: centered alike.
            embeddings=("wte", "wpe"),
            layers="h",
            writers=(("attn.c_proj", "conv1d"), ("mlp.c_proj", "conv1d")),
            norms=("ln_1", "ln_2"),
            final_norm="ln_f",
            requires=(
                (
                    "add_cross_attention",
                    False,
                    "GPT-2 with cross-attention (add_cross_attention=True) is not supported: "
                    "only decoder-only GPT-2 models are converted",
                ),
            ),
            model_type="gpt2",
            context="n_positions",
        ),
        Architecture(
            name="gpt_neox",
            description="Hugging Face GPT-NeoX / Pythia (parallel or sequential residual)",
            # With use_parallel_residual the attention and the MLP both read normalized copies of
            # the same stream and both add into it; both writers are centered, so the stream stays
            # centered either way and one entry serves both.
            embeddings=("embed_in",),
            layers="layers",
            writers=(("attention.dense", "linear"), ("mlp.dense_4h_to_h", "linear")),
            norms=("input_layernorm", "post_attention_layernorm"),
            final_norm="final_layer_norm",
            model_type="gpt_neox",
        ),
    )
}


def register_architecture(architecture: Architecture) -> None:
    """Add ``architecture`` to :data:`ARCHITECTURES` (after the entries already there), or replace
    the entry of its name: how a model defined outside this package (the lab's Transformer) makes
    itself convertible without this package importing it."""
    if not isinstance(architecture, Architecture):
        raise TypeError(
            "architecture must be a rmsnorm.convert.Architecture, "
            f"got {type(architecture).__name__}"
        )
    ARCHITECTURES.pop(architecture.name, None)
    ARCHITECTURES[architecture.name] = architecture


def find_architecture(model: nn.Module) -> Architecture | None:
    """The entry of :data:`ARCHITECTURES` that ``model`` is an instance of (None when none is)."""
    return next((a for a in ARCHITECTURES.values() if a.matches(model)), None)


def architecture_of(model: nn.Module) -> Architecture:
    """The entry of :data:`ARCHITECTURES` for ``model``; :class:`ConversionError` naming the
    supported ones when there is none."""
    arch = find_architecture(model)
    if arch is None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        supported = "; ".join(
            a.description + (f" (model_type {a.model_type!r})" if a.hugging_face else "")
            for a in ARCHITECTURES.values()
        )
        raise ConversionError(
            f"unknown architecture {type(model).__name__} (model_type={model_type!r}): "
            f"supported are {supported}"
        )
    return arch
