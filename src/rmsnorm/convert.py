"""Exact LayerNorm → RMSNorm conversion of pre-LN transformers (Jiang et al., NeurIPS 2023,
"Pre-RMSNorm and Pre-CRMSNorm Transformers"): center every layer that writes into the residual
stream, then replace each LayerNorm by an RMSNorm carrying the same γ and β; the logits do not
change.

Supported: the lab's :class:`~rmsnorm.lab.transformer.Transformer` (pre-LN, LayerNorm), Hugging
Face GPT-2 and GPT-NeoX (Pythia) models. Anything else is refused with the reason.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import statistics
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from . import _backend
from .modules import RMSNorm

__all__ = [
    "ConversionError",
    "layernorm_to_rmsnorm",
    "recenter_",
    "residual_writers",
    "verify_conversion",
    "time_inference",
    "save_model",
    "load_model",
    "convert_directory",
]

# Written into the converted model's config: what was done, so a loader can rebuild the RMSNorms.
CONVERSION_TAG = {
    "method": "centered residual writers, LayerNorm -> RMSNorm (Jiang et al., NeurIPS 2023)",
    "norm": "rmsnorm.RMSNorm",
    "eps_mode": "mean_square",
    "casting_mode": "gemma",
}
# The name written into saved directories, as first released: changing it would orphan them.
_LAB_FORMAT = "rmsnorm.analysis.transformer.Transformer"
_LAB_WEIGHTS = "model.pt"


class ConversionError(ValueError):
    """The model cannot be converted exactly (the message says why)."""


@dataclass
class _Plan:
    """Where a supported architecture writes into its residual stream and where its norms sit."""

    arch: str
    writers: list[tuple[nn.Module, str, int]] = field(default_factory=list)  # (module, param, dim)
    norms: list[tuple[nn.Module, str]] = field(default_factory=list)  # (parent, attribute)


# ----------------------------------------------------------------------------------------------
# Architectures: each returns the writers (parameter and the dim that is the hidden dim) and the
# norm slots, or raises ConversionError.
# ----------------------------------------------------------------------------------------------
def _linear_writer(plan: _Plan, linear: nn.Module) -> None:
    plan.writers.append((linear, "weight", 0))  # nn.Linear weight: (out = hidden, in)
    plan.writers.append((linear, "bias", 0))


def _conv1d_writer(plan: _Plan, conv: nn.Module) -> None:
    plan.writers.append((conv, "weight", 1))  # HF Conv1D weight: (in, out = hidden)
    plan.writers.append((conv, "bias", 0))


def _embedding_writer(plan: _Plan, emb: nn.Module) -> None:
    plan.writers.append((emb, "weight", 1))  # (rows, hidden)


def _plan_lab(model: nn.Module) -> _Plan:
    cfg = model.cfg
    if cfg.norm_position != "pre":
        raise ConversionError(
            "post-LN model (norm_position='post'): each norm reads x + f(x) and its output, not a "
            "centered sum, is the residual stream, so centering the writers cannot make RMSNorm "
            "equal LayerNorm; only pre-LN models convert exactly"
        )
    plan = _Plan("rmsnorm-lab-transformer")
    _embedding_writer(plan, model.tok_emb)
    _embedding_writer(plan, model.pos_emb)
    for block in model.blocks:
        _linear_writer(plan, block.attn.proj)
        _linear_writer(plan, block.mlp.proj)
        plan.norms += [(block, "norm1"), (block, "norm2")]
    plan.norms.append((model, "norm_f"))
    return plan


def _plan_gpt2(model: nn.Module) -> _Plan:
    if getattr(model.config, "add_cross_attention", False):
        raise ConversionError(
            "GPT-2 with cross-attention (add_cross_attention=True) is not supported: only "
            "decoder-only GPT-2 models are converted"
        )
    base = model.base_model
    plan = _Plan("gpt2")
    _embedding_writer(plan, base.wte)  # also the token-type embedding, when given
    _embedding_writer(plan, base.wpe)
    for block in base.h:
        _conv1d_writer(plan, block.attn.c_proj)
        _conv1d_writer(plan, block.mlp.c_proj)
        plan.norms += [(block, "ln_1"), (block, "ln_2")]
    plan.norms.append((base, "ln_f"))
    return plan


def _plan_gpt_neox(model: nn.Module) -> _Plan:
    # With use_parallel_residual the attention and the MLP both read normalized copies of the
    # same stream and both add into it; every writer is centered, so the stream stays centered
    # either way.
    base = model.base_model
    plan = _Plan("gpt_neox")
    _embedding_writer(plan, base.embed_in)
    for layer in base.layers:
        _linear_writer(plan, layer.attention.dense)
        _linear_writer(plan, layer.mlp.dense_4h_to_h)
        plan.norms += [(layer, "input_layernorm"), (layer, "post_attention_layernorm")]
    plan.norms.append((base, "final_layer_norm"))
    return plan


_HF_PLANS = {"gpt2": _plan_gpt2, "gpt_neox": _plan_gpt_neox}


def _plan(model: nn.Module) -> _Plan:
    from .lab.transformer import Transformer

    if isinstance(model, Transformer):
        plan = _plan_lab(model)
    else:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        if model_type not in _HF_PLANS or not hasattr(model, "base_model"):
            raise ConversionError(
                f"unknown architecture {type(model).__name__} (model_type={model_type!r}): "
                "supported are rmsnorm.lab.transformer.Transformer (pre-LN) and Hugging Face "
                f"models of type {sorted(_HF_PLANS)}"
            )
        plan = _HF_PLANS[model_type](model)
    return plan


def residual_writers(model: nn.Module) -> list[str]:
    """Names of the parameters that write into the residual stream of a supported model (those
    the conversion centers along the hidden dimension)."""
    names = {id(p): n for n, p in model.named_parameters()}  # a tied weight under its first name
    plan = _plan(model)
    return [names[id(p)] for m, a, _ in plan.writers if (p := getattr(m, a)) is not None]


# ----------------------------------------------------------------------------------------------
# The conversion
# ----------------------------------------------------------------------------------------------
def _center_(p: torch.Tensor, dim: int) -> None:
    # The mean in float64 so that the centered float32 value is as close to zero-mean as rounding
    # allows (the residual mean is then ~1e-8 of the row's scale).
    pd = p.detach().double()
    p.copy_(pd - pd.mean(dim=dim, keepdim=True))


def _untie_output_head(model: nn.Module) -> bool:
    """Give a head tied to the token embedding its own copy of the (uncentered) weights."""
    get_out = getattr(model, "get_output_embeddings", None)
    get_in = getattr(model, "get_input_embeddings", None)
    if get_out is None or get_in is None:
        return False
    out, emb = get_out(), get_in()
    if out is None or emb is None or out.weight is not emb.weight:
        return False
    out.weight = nn.Parameter(emb.weight.detach().clone(), requires_grad=emb.weight.requires_grad)
    config = model.config
    config.tie_word_embeddings = False
    if hasattr(config, "get_text_config"):
        config.get_text_config().tie_word_embeddings = False
    if hasattr(model, "all_tied_weights_keys"):  # transformers >= 5 drops tied keys when saving
        model.all_tied_weights_keys = model.get_expanded_tied_weights_keys(all_submodels=True)
    return True


def _rmsnorm_like(ln: nn.LayerNorm) -> RMSNorm:
    """An RMSNorm (mean_square ε placement, same ε) holding ``ln``'s own γ and β Parameters."""
    if len(ln.normalized_shape) != 1:
        raise ConversionError(
            f"LayerNorm over {list(ln.normalized_shape)}: only norms over the hidden dim convert"
        )
    w = ln.weight
    rms = RMSNorm(
        ln.normalized_shape, eps=ln.eps, elementwise_affine=ln.elementwise_affine,
        bias=ln.bias is not None, eps_mode="mean_square", casting_mode="gemma",
        device=w.device if w is not None else None, dtype=w.dtype if w is not None else None,
    )  # fmt: skip
    if ln.elementwise_affine:
        rms.weight = ln.weight
    if ln.bias is not None:
        rms.bias = ln.bias
    rms.train(ln.training)
    return rms


def _check_no_stray_layernorm(plan: _Plan, model: nn.Module) -> None:
    slots = {id(getattr(parent, attr)) for parent, attr in plan.norms}
    stray = [
        n for n, m in model.named_modules() if isinstance(m, nn.LayerNorm) and id(m) not in slots
    ]
    if stray:
        raise ConversionError(
            f"LayerNorms outside the known residual-stream layout: {stray}; the conversion "
            "would not be exact for them"
        )


def _swap_norms(plan: _Plan, model: nn.Module) -> None:
    _check_no_stray_layernorm(plan, model)
    for parent, attr in plan.norms:
        ln = getattr(parent, attr)
        if not isinstance(ln, nn.LayerNorm):
            raise ConversionError(
                f"expected a LayerNorm at {type(parent).__name__}.{attr}, found "
                f"{type(ln).__name__} (is the model already converted?)"
            )
        setattr(parent, attr, _rmsnorm_like(ln))


def _mark_converted(model: nn.Module) -> None:
    from .lab.transformer import Transformer

    if isinstance(model, Transformer):
        # cfg describes the model as built now; the bias of each RMSNorm follows cfg.bias.
        model.cfg = dataclasses.replace(model.cfg, norm="rmsnorm")
        model.rmsnorm_conversion = dict(CONVERSION_TAG)
    else:
        model.config.rmsnorm_conversion = dict(CONVERSION_TAG)


def layernorm_to_rmsnorm(model: nn.Module, *, inplace: bool = False) -> nn.Module:
    """The exactly equivalent RMSNorm model of a pre-LN transformer.

    Centers, along the hidden dim, the weights and biases of every layer writing into the residual
    stream (token and position embeddings, attention and MLP output projections), so that the
    stream is zero-mean and LayerNorm(x) = γ ⊙ x/sqrt(mean(x²) + ε) + β; then replaces each
    LayerNorm by :class:`rmsnorm.RMSNorm` (``eps_mode="mean_square"``, same ε, ``bias=True``) with
    the same γ and β. A head tied to the token embedding is untied first and keeps the original
    weights. Returns a converted copy (``inplace=True`` converts ``model`` itself).

    Inputs given as ready embeddings (``embeddings=`` / ``inputs_embeds=``) bypass the centered
    embedding tables; center them yourself (subtract their mean over the hidden dim).
    Raises :class:`ConversionError` for models where the conversion is not exact.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    _check_convertible(model)
    if not inplace:
        model = copy.deepcopy(model)
    plan = _plan(model)
    _untie_output_head(model)
    with torch.no_grad():
        for module, attr, dim in plan.writers:
            p = getattr(module, attr)
            if p is not None:
                _center_(p, dim)
    _swap_norms(plan, model)
    _mark_converted(model)
    return model


def _is_converted(model: nn.Module) -> bool:
    return bool(
        getattr(model, "rmsnorm_conversion", None)
        or getattr(getattr(model, "config", None), "rmsnorm_conversion", None)
    )


def _check_convertible(model: nn.Module) -> None:
    """Raise before copying anything: unsupported architecture, post-LN, no LayerNorm to convert."""
    from .lab.transformer import Transformer

    plan = _plan(model)
    if _is_converted(model):
        raise ConversionError("the model is already converted (it records rmsnorm_conversion)")
    if isinstance(model, Transformer) and model.cfg.norm != "layernorm":
        raise ConversionError(
            f"the model's norm is {model.cfg.norm!r}; only LayerNorm models are converted"
        )
    for parent, attr in plan.norms:
        if not isinstance(getattr(parent, attr), nn.LayerNorm):
            raise ConversionError(
                f"{type(parent).__name__}.{attr} is {type(getattr(parent, attr)).__name__}, not a "
                "LayerNorm (already converted?)"
            )
    _check_no_stray_layernorm(plan, model)


@torch.no_grad()
def recenter_(model: nn.Module) -> nn.Module:
    """Re-center the residual-stream writers of a converted model in place (call it after each
    optimizer step when fine-tuning, so the RMSNorm model stays exactly its LayerNorm twin)."""
    if not _is_converted(model):
        raise ConversionError(
            "recenter_ expects a model returned by layernorm_to_rmsnorm (an unconverted model "
            "may still tie its head to the embedding, which centering would change)"
        )
    plan = _plan(model)
    for module, attr, dim in plan.writers:
        p = getattr(module, attr)
        if p is not None:
            _center_(p, dim)
    return model


# ----------------------------------------------------------------------------------------------
# Checking and timing
# ----------------------------------------------------------------------------------------------
def _logits(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    from .lab.transformer import Transformer

    if isinstance(model, Transformer):
        return model(tokens)
    out = model(input_ids=tokens)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _vocab_and_context(model: nn.Module) -> tuple[int, int]:
    from .lab.transformer import Transformer

    if isinstance(model, Transformer):
        return model.cfg.vocab_size, model.cfg.seq_len
    cfg = model.config
    ctx = getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", 1024)
    return cfg.vocab_size, ctx


def random_tokens(model: nn.Module, batch: int = 2, seq_len: int = 32, seed: int = 0):
    """Random token ids (batch, min(seq_len, context)) for ``model``."""
    vocab, ctx = _vocab_and_context(model)
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, min(seq_len, ctx)), generator=g)


@torch.no_grad()
def verify_conversion(
    model: nn.Module,
    dtype: torch.dtype = torch.float32,
    *,
    batch: int = 2,
    seq_len: int = 32,
    seed: int = 0,
) -> float:
    """Max |logits(original) − logits(converted)| on random tokens, both models in ``dtype`` (the
    conversion itself is done in ``dtype``, so a float64 check measures the method, not float32
    rounding of the centered weights). ``model`` is not modified."""
    original = copy.deepcopy(model).to(dtype).eval()
    converted = layernorm_to_rmsnorm(original).eval()
    tokens = random_tokens(model, batch, seq_len, seed)
    return (_logits(original, tokens) - _logits(converted, tokens)).abs().max().item()


@torch.no_grad()
def time_inference(
    models: Mapping[str, nn.Module], tokens: torch.Tensor, repeats: int = 10, warmup: int = 2
) -> dict[str, float]:
    """Median wall time in seconds of one inference forward of each model on ``tokens``.

    The models take turns (one forward each per round, ``repeats`` rounds), so a change in the
    machine's load during the measurement affects all of them alike.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    modes = {name: m.training for name, m in models.items()}
    times: dict[str, list[float]] = {name: [] for name in models}
    try:
        for m in models.values():
            m.eval()
            for _ in range(warmup):
                _logits(m, tokens)
        for _ in range(repeats):
            for name, m in models.items():
                t0 = time.perf_counter()
                _logits(m, tokens)
                times[name].append(time.perf_counter() - t0)
    finally:
        for name, m in models.items():
            m.train(modes[name])
    return {name: statistics.median(t) for name, t in times.items()}


# ----------------------------------------------------------------------------------------------
# Model directories
# ----------------------------------------------------------------------------------------------
def save_model(model: nn.Module, directory: str | Path) -> Path:
    """Write ``model`` to ``directory``: Hugging Face models with ``save_pretrained`` (a converted
    model's config records the conversion); the lab transformer as ``config.json`` (its config and
    format) plus ``model.pt`` (the state_dict). Converted checkpoints keep the LayerNorms' keys
    (``weight``, ``bias``), so plain transformers loads them too, as the equivalent LayerNorm model.
    """
    from .lab.transformer import Transformer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if isinstance(model, Transformer):
        meta = {"format": _LAB_FORMAT, "transformer_config": model.cfg.to_dict()}
        if getattr(model, "rmsnorm_conversion", None):
            meta["rmsnorm_conversion"] = model.rmsnorm_conversion
        (directory / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
        torch.save(model.state_dict(), directory / _LAB_WEIGHTS)
    elif hasattr(model, "save_pretrained"):
        model.save_pretrained(directory)
    else:
        raise TypeError(
            f"cannot save {type(model).__name__}: expected the lab Transformer or a Hugging Face "
            "model"
        )
    return directory


def _swap_to_rmsnorm_structurally(model: nn.Module) -> None:
    # A converted checkpoint's weights are already centered: only the modules change.
    _swap_norms(_plan(model), model)


def load_model(directory: str | Path) -> nn.Module:
    """Load a model directory written by :func:`save_model` or by Hugging Face ``save_pretrained``
    (local files only; never the network). Converted models come back with their RMSNorms."""
    directory = Path(directory)
    config_path = directory / "config.json"
    if not directory.is_dir():
        raise FileNotFoundError(f"model directory not found: {directory}")
    if not config_path.is_file():
        raise FileNotFoundError(f"no config.json in {directory} (looked for {config_path})")
    meta = json.loads(config_path.read_text())
    if meta.get("format") == _LAB_FORMAT:
        from .lab.transformer import Transformer, TransformerConfig

        cfg = dict(meta["transformer_config"])
        converted = "rmsnorm_conversion" in meta
        if converted:
            cfg["norm"] = "layernorm"  # build the LayerNorm layout, then swap like the conversion
        model = Transformer(TransformerConfig(**cfg))
        if converted:
            _swap_to_rmsnorm_structurally(model)
            _mark_converted(model)
        state = torch.load(directory / _LAB_WEIGHTS, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
        return model.eval()
    if "model_type" not in meta:
        raise ValueError(
            f"{config_path} is neither a Hugging Face config (no model_type) nor a "
            f"{_LAB_FORMAT} directory"
        )
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(
            "loading a Hugging Face model needs transformers: pip install 'rmsnorm[hf]'"
        ) from exc
    architectures = meta.get("architectures") or []
    cls = getattr(transformers, architectures[0], None) if architectures else None
    if cls is None:
        cls = transformers.AutoModelForCausalLM
    model = cls.from_pretrained(directory, local_files_only=True)
    if getattr(model.config, "rmsnorm_conversion", None):
        _swap_to_rmsnorm_structurally(model)
    return model.eval()


@dataclass
class ConversionReport:
    """What :func:`convert_directory` measured."""

    architecture: str
    source: str
    destination: str
    max_abs_logit_diff: dict[str, float]  # dtype name -> max |Δ logits| on random tokens
    inference_s: dict[str, float]  # model variant -> median seconds per inference forward
    tokens_shape: tuple[int, int]
    untied_head: bool
    backend: str  # this library's backend that ran the norms
    threads: int  # torch CPU threads during the timing

    def to_dict(self) -> dict:
        return asdict(self)


def convert_directory(
    source: str | Path,
    destination: str | Path,
    *,
    check_dtypes: tuple[str, ...] = ("float32", "float64"),
    batch: int = 2,
    seq_len: int = 32,
    repeats: int = 10,
    progress=None,
) -> ConversionReport:
    """Load ``source``, convert it, write it to ``destination``, then check and time it.

    Checks: the max abs logit difference between the original and the converted model on random
    tokens for each dtype in ``check_dtypes`` (float32 compares the saved model itself; other dtypes
    convert a copy in that dtype). Timing: median forward time of the original, of the original
    with this library's LayerNorm, and of the converted model (``repeats`` runs each).
    ``progress(message)`` is called before each step.
    """
    from .integrations import replace_norms

    for name, value in (("batch", batch), ("seq_len", seq_len), ("repeats", repeats)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    step = progress or (lambda message: None)
    step("loading")
    original = load_model(source)
    plan = _plan(original)
    was_tied = _is_tied(original)
    step("converting")
    converted = layernorm_to_rmsnorm(original)
    save_model(converted, destination)
    step("reloading the written model")
    reloaded = load_model(destination)
    tokens = random_tokens(original, batch, seq_len)
    diffs = {}
    for name in check_dtypes:
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"check_dtypes entries must be torch float dtype names, got {name!r}")
        step(f"checking logits in {name}")
        if dtype == next(original.parameters()).dtype:
            with torch.no_grad():
                diff = (_logits(original, tokens) - _logits(reloaded, tokens)).abs().max().item()
        else:
            diff = verify_conversion(original, dtype, batch=batch, seq_len=seq_len)
        diffs[name] = diff
    step("timing inference")
    variants = {"original": original}
    with_our_ln = copy.deepcopy(original)
    if replace_norms(with_our_ln):  # the original ran torch's LayerNorm: also time ours
        variants["original with rmsnorm.LayerNorm"] = with_our_ln
    variants["converted (rmsnorm.RMSNorm)"] = reloaded
    times = time_inference(variants, tokens, repeats)
    return ConversionReport(
        architecture=plan.arch,
        source=str(source),
        destination=str(destination),
        max_abs_logit_diff=diffs,
        inference_s=times,
        tokens_shape=tuple(tokens.shape),
        untied_head=was_tied,
        backend=_backend.describe(tokens.device.type),
        threads=torch.get_num_threads(),
    )


def _is_tied(model: nn.Module) -> bool:
    get_out = getattr(model, "get_output_embeddings", None)
    get_in = getattr(model, "get_input_embeddings", None)
    if get_out is None or get_in is None or get_out() is None or get_in() is None:
        return False
    return get_out().weight is get_in().weight
