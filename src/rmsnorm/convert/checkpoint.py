"""The conversion as a tool on model directories: load a model, convert it, save it, check its
logits against the original and time both (what ``rmsnorm convert`` runs)."""

from __future__ import annotations

import copy
import dataclasses
import json
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from .. import _backend
from .._validate import positive_int
from ..integrations import replace_norms
from .architectures import (
    ARCHITECTURES,
    LAB_TRANSFORMER,
    Architecture,
    architecture_of,
    find_architecture,
)
from .exact import conversion_record, layernorm_to_rmsnorm, swap_norms

__all__ = [
    "random_tokens",
    "verify_conversion",
    "time_inference",
    "save_model",
    "load_model",
    "ConversionReport",
    "convert_directory",
]

# Models that are not Hugging Face ones are saved as config.json (this format tag and the config)
# beside their state_dict.
_WEIGHTS = "model.pt"
# Directories written before the format tag was the architecture's name.
_OLD_FORMATS = {"rmsnorm.analysis.transformer.Transformer": LAB_TRANSFORMER}


# ----------------------------------------------------------------------------------------------
# Running a model
# ----------------------------------------------------------------------------------------------
def _logits(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    out = model(tokens)
    if isinstance(out, torch.Tensor):  # the lab's Transformer
        return out
    logits = getattr(out, "logits", None)  # a Hugging Face model with a head, or without
    return logits if logits is not None else out.last_hidden_state


def random_tokens(
    model: nn.Module, batch: int = 2, seq_len: int = 32, seed: int = 0
) -> torch.Tensor:
    """Random token ids (batch, min(seq_len, context)) for a model of a supported architecture."""
    arch = architecture_of(model)
    config = getattr(model, arch.config)
    g = torch.Generator().manual_seed(seed)
    size = (batch, min(seq_len, getattr(config, arch.context)))
    return torch.randint(0, config.vocab_size, size, generator=g)


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
    positive_int("repeats", repeats)
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
    model's config records the conversion); the lab transformer as ``config.json`` (its format and
    config) plus ``model.pt`` (the state_dict). Converted checkpoints keep the LayerNorms' keys
    (``weight``, ``bias``), so plain transformers loads them too, as the equivalent LayerNorm model.
    """
    directory = Path(directory)
    arch = None if hasattr(model, "save_pretrained") else find_architecture(model)
    if arch is None and not hasattr(model, "save_pretrained"):
        raise TypeError(
            f"cannot save {type(model).__name__}: expected the lab Transformer or a Hugging Face "
            "model"
        )
    directory.mkdir(parents=True, exist_ok=True)
    if arch is None:
        model.save_pretrained(directory)
        return directory
    meta = {"format": arch.name, "transformer_config": asdict(getattr(model, arch.config))}
    record = conversion_record(model)
    if record:
        meta["rmsnorm_conversion"] = record
    (directory / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
    torch.save(model.state_dict(), directory / _WEIGHTS)
    return directory


def _load_state_dict_format(arch: Architecture, meta: dict, directory: Path) -> nn.Module:
    config = dict(meta["transformer_config"])
    record = meta.get("rmsnorm_conversion")
    if record:  # build the LayerNorm layout, then swap its norms as the conversion did
        config.update({attr: before for attr, before, _ in arch.converted_config})
    model = arch.build(config)
    if record:
        swap_norms(model, record)
    state = torch.load(directory / _WEIGHTS, map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.eval()


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
    fmt = _OLD_FORMATS.get(meta.get("format"), meta.get("format"))
    arch = ARCHITECTURES.get(fmt) if isinstance(fmt, str) else None
    if arch is not None and arch.build is not None:
        return _load_state_dict_format(arch, meta, directory)
    if "model_type" not in meta:
        formats = sorted(a.name for a in ARCHITECTURES.values() if a.build is not None)
        raise ValueError(
            f"{config_path} is neither a Hugging Face config (no model_type) nor a directory "
            f"written by save_model (format one of {formats})"
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
    record = getattr(model.config, "rmsnorm_conversion", None)
    if record:  # the weights are centered already: only the modules change
        swap_norms(model, record)
    return model.eval()


# ----------------------------------------------------------------------------------------------
# The tool
# ----------------------------------------------------------------------------------------------
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
        return dataclasses.asdict(self)


def convert_directory(
    source: str | Path,
    destination: str | Path,
    *,
    check_dtypes: tuple[str, ...] = ("float32", "float64"),
    batch: int = 2,
    seq_len: int = 32,
    repeats: int = 10,
    progress: Callable[[str], object] | None = None,
) -> ConversionReport:
    """Load ``source``, convert it, write it to ``destination``, then check and time it.

    Checks: the max abs logit difference between the original and the converted model on random
    tokens for each dtype in ``check_dtypes`` (float32 compares the saved model itself; other dtypes
    convert a copy in that dtype). Timing: median forward time of the original, of the original
    with this library's LayerNorm, and of the converted model (``repeats`` runs each).
    ``progress(message)`` is called before each step.
    """
    for name, value in (("batch", batch), ("seq_len", seq_len), ("repeats", repeats)):
        positive_int(name, value)
    dtypes = {}
    for name in check_dtypes:
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"check_dtypes entries must be torch float dtype names, got {name!r}")
        dtypes[name] = dtype
    step = progress or (lambda message: None)
    step("loading")
    original = load_model(source)
    arch = architecture_of(original)
    step("converting")
    converted = layernorm_to_rmsnorm(original)
    save_model(converted, destination)
    step("reloading the written model")
    reloaded = load_model(destination)
    tokens = random_tokens(original, batch, seq_len)
    diffs = {}
    for name, dtype in dtypes.items():
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
        architecture=arch.name,
        source=str(source),
        destination=str(destination),
        max_abs_logit_diff=diffs,
        inference_s=times,
        tokens_shape=tuple(tokens.shape),
        untied_head=bool(conversion_record(converted)["untied"]),
        backend=_backend.describe(tokens.device.type),
        threads=torch.get_num_threads(),
    )
