"""The conversion as a tool on model directories: load a model, convert it, save it, check its
logits against the original and time both (what ``rmsnorm convert`` runs). A model directory is
written beside its destination and renamed into place once complete, so no failure or interruption
leaves half a model, and nothing is written over a source or a non-empty directory unasked."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import shutil
import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from .. import _backend
from .._validate import ArgumentError, positive_int
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
def _refuse(text: str, **paths: Path) -> ArgumentError:
    """An :class:`ArgumentError` whose fields ``{source}``, ``{destination}``, ``{overwrite}``
    name the arguments, each path after its name: the library says ``destination /a/b`` and
    ``overwrite``, the command line ``DESTINATION /a/b`` and ``--overwrite``."""

    def escaped(path: Path) -> str:
        return str(path).replace("{", "{{").replace("}", "}}")

    fields = {"overwrite": "{overwrite}"}
    fields.update({name: "{" + name + "} " + escaped(path) for name, path in paths.items()})
    param = next(iter(paths))
    plain = {"overwrite": "overwrite", **{name: f"{name} {path}" for name, path in paths.items()}}
    return ArgumentError(param, text.format(**plain), template=text.format(**fields))


def _is_empty_dir(path: Path) -> bool:
    with os.scandir(path) as entries:
        return next(entries, None) is None


def _check_destination(
    destination: str | Path, *, source: str | Path | None = None, overwrite: bool = False
) -> Path:
    """The directory a model may be written to, resolved (symlinks followed), or an
    :class:`~rmsnorm._validate.ArgumentError` saying why not: it is ``source``, or inside it, or
    contains it (replacing it would delete the source); it exists and is not a directory; it is a
    non-empty directory and ``overwrite`` is false."""
    dst = Path(destination).expanduser().resolve()
    if source is not None:
        src = Path(source).expanduser().resolve()
        if dst == src:
            raise _refuse(
                "{destination} is {source}: the conversion would write over the model it reads",
                destination=dst,
                source=src,
            )
        if dst.is_relative_to(src):
            raise _refuse(
                "{destination} is inside {source}: the converted model would be "
                "written into the model it reads",
                destination=dst,
                source=src,
            )
        if src.is_relative_to(dst):
            raise _refuse(
                "{destination} contains {source}: replacing it would delete the model "
                "being converted",
                destination=dst,
                source=src,
            )
    if dst.exists() and not dst.is_dir():
        raise _refuse("{destination} exists and is not a directory", destination=dst)
    if dst.is_dir() and not overwrite and not _is_empty_dir(dst):
        raise _refuse(
            "{destination} is not empty: refusing to mix a model into its files (set "
            "{overwrite} to replace the directory once the new one is complete)",
            destination=dst,
        )
    return dst


def _new_sibling(path: Path, tag: str) -> Path:
    """A new name beside ``path`` (hidden: a listing shows the models only)."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.{tag}")


@contextlib.contextmanager
def _staged(destination: Path, overwrite: bool) -> Iterator[Path]:
    """A fresh directory beside ``destination`` to write into; when the block ends without an
    exception it becomes ``destination`` (an old ``destination`` is moved aside first and deleted
    only once the new one is in place). On any exception, interruptions included, it is deleted
    and ``destination`` is as it was."""
    parent = destination.parent
    missing = [p for p in (parent, *parent.parents) if not p.exists()]
    parent.mkdir(parents=True, exist_ok=True)
    staging = _new_sibling(destination, "partial")
    staging.mkdir()  # mode from the umask, as the final directory should have
    try:
        yield staging
        _commit(staging, destination, overwrite)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for p in missing:  # directories made for this write only, innermost first
            with contextlib.suppress(OSError):
                p.rmdir()
        raise


def _commit(staging: Path, destination: Path, overwrite: bool) -> None:
    """Rename the complete ``staging`` to ``destination``. The checks are repeated here, as the
    destination may have changed while the model was written."""
    if destination.is_dir() and not _is_empty_dir(destination):
        _check_destination(destination, overwrite=overwrite)  # refused unless overwrite
        old = _new_sibling(destination, "old")
        os.rename(destination, old)
        try:
            os.rename(staging, destination)
        except BaseException:
            os.rename(old, destination)
            raise
        shutil.rmtree(old, ignore_errors=True)
        return
    _check_destination(destination, overwrite=overwrite)  # a file that appeared meanwhile
    if destination.is_dir():  # empty: POSIX renames over it; elsewhere remove it first
        try:
            os.rename(staging, destination)
            return
        except OSError:
            destination.rmdir()
    os.rename(staging, destination)


def _saved_as(model: nn.Module) -> Architecture | None:
    """How :func:`save_model` writes ``model``: None for ``save_pretrained``, else the entry of
    the architecture whose format it writes; TypeError for a model it cannot write."""
    if hasattr(model, "save_pretrained"):
        return None
    arch = find_architecture(model)
    if arch is None:
        raise TypeError(
            f"cannot save {type(model).__name__}: expected the lab Transformer or a Hugging Face "
            "model"
        )
    return arch


def _write_model(model: nn.Module, directory: Path) -> None:
    arch = _saved_as(model)
    if arch is None:
        model.save_pretrained(directory)
        return
    meta = {"format": arch.name, "transformer_config": asdict(getattr(model, arch.config))}
    record = conversion_record(model)
    if record:
        meta["rmsnorm_conversion"] = record
    (directory / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
    torch.save(model.state_dict(), directory / _WEIGHTS)


def save_model(model: nn.Module, directory: str | Path, *, overwrite: bool = False) -> Path:
    """Write ``model`` to ``directory``: Hugging Face models with ``save_pretrained`` (a converted
    model's config records the conversion); the lab transformer as ``config.json`` (its format and
    config) plus ``model.pt`` (the state_dict). Converted checkpoints keep the LayerNorms' keys
    (``weight``, ``bias``), so plain transformers loads them too, as the equivalent LayerNorm model.

    The files are written to a new directory beside ``directory``, which is renamed to
    ``directory`` once they are complete: a failure or an interruption leaves ``directory`` as it
    was. A ``directory`` that exists must be empty, unless ``overwrite=True`` (then it is replaced
    as a whole, and deleted only after the new one is in place). Returns the resolved path.
    """
    _saved_as(model)  # a model it cannot write is refused before any directory is made
    directory = _check_destination(directory, overwrite=overwrite)
    with _staged(directory, overwrite) as staging:
        _write_model(model, staging)
    return directory


def _unreadable(path: Path, exc: BaseException, what: str) -> ValueError:
    return ValueError(f"{path}: cannot be read as {what} ({type(exc).__name__}: {exc})")


def _read_config(directory: Path) -> tuple[Path, dict]:
    config_path = directory / "config.json"
    if not directory.is_dir():
        raise FileNotFoundError(f"model directory not found: {directory}")
    if not config_path.is_file():
        raise FileNotFoundError(f"no config.json in {directory} (looked for {config_path})")
    try:
        meta = json.loads(config_path.read_bytes())
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise _unreadable(config_path, exc, "JSON") from exc
    if not isinstance(meta, dict):
        raise ValueError(
            f"{config_path}: expected a JSON object (a model config), got {type(meta).__name__}"
        )
    return config_path, meta


def _load_state_dict_format(
    arch: Architecture, meta: dict, directory: Path, config_path: Path
) -> nn.Module:
    try:
        config = dict(meta["transformer_config"])
        record = meta.get("rmsnorm_conversion")
        if record:  # build the LayerNorm layout, then swap its norms as the conversion did
            config.update({attr: before for attr, before, _ in arch.converted_config})
        model = arch.build(config)
        if record:
            swap_norms(model, record)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"{config_path}: not a valid {arch.name} config ({type(exc).__name__}: {exc})"
        ) from exc
    weights = directory / _WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(f"no {_WEIGHTS} in {directory} (looked for {weights})")
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated zip, a foreign pickle, ...: each its own type
        raise _unreadable(weights, exc, "a state_dict") from exc
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as exc:
        raise ValueError(
            f"{weights} does not hold the weights {config_path} describes: {exc}"
        ) from exc
    return model.eval()


def _first_unreadable(directory: Path) -> tuple[Path, BaseException] | None:
    """The first file of a Hugging Face model directory whose header or JSON cannot be read (what
    to name when transformers fails on it), if any."""
    for path in sorted(directory.iterdir()):
        try:
            if path.suffix == ".json":
                json.loads(path.read_bytes())
            elif path.suffix == ".safetensors":
                from safetensors import safe_open

                with safe_open(path, framework="pt") as f:
                    f.keys()
        except Exception as exc:
            return path, exc
    return None


def load_model(directory: str | Path) -> nn.Module:
    """Load a model directory written by :func:`save_model` or by Hugging Face ``save_pretrained``
    (local files only; never the network). Converted models come back with their RMSNorms. A
    missing, corrupt or mismatched file is an error that names it."""
    directory = Path(directory)
    config_path, meta = _read_config(directory)
    fmt = meta.get("format")
    arch = ARCHITECTURES.get(fmt) if isinstance(fmt, str) else None
    if arch is not None and arch.build is not None:
        return _load_state_dict_format(arch, meta, directory, config_path)
    if fmt == LAB_TRANSFORMER:  # its entry comes with the lab, which this package never imports
        raise ValueError(
            f"{config_path} holds the lab's Transformer ({LAB_TRANSFORMER}): import rmsnorm.lab "
            "first, which registers its class with the conversion (rmsnorm convert does)"
        )
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
    try:
        model = cls.from_pretrained(directory, local_files_only=True)
    except (ImportError, KeyboardInterrupt):
        raise
    except Exception as exc:  # transformers and safetensors raise many types, some unnamed
        bad = _first_unreadable(directory)
        if bad is not None:
            raise _unreadable(bad[0], bad[1], "part of a model") from exc
        if isinstance(exc, OSError):  # a missing weights file: transformers names the directory
            raise
        raise ValueError(
            f"{directory}: transformers could not load the model ({type(exc).__name__}: {exc})"
        ) from exc
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
    overwrite: bool = False,
    progress: Callable[[str], object] | None = None,
) -> ConversionReport:
    """Load ``source``, convert it, write it to ``destination``, then check and time it.

    ``destination`` may not be ``source``, lie inside it or contain it (paths are compared
    resolved, symlinks followed); if it exists it must be an empty directory, unless
    ``overwrite=True``. The model is written to a new directory beside ``destination`` and
    reloaded from there; only then is it renamed to ``destination`` (an existing one is replaced
    as a whole, and deleted only after the new one is in place). A failure or an interruption
    before that leaves ``destination`` as it was and nothing else behind.

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
    # Refused before minutes of loading and converting; checked again when renaming into place.
    target = _check_destination(destination, source=source, overwrite=overwrite)
    step = progress or (lambda message: None)
    step("loading")
    original = load_model(source)
    arch = architecture_of(original)
    step("converting")
    converted = layernorm_to_rmsnorm(original)
    with _staged(target, overwrite) as staging:
        step(f"writing to {staging}")
        _write_model(converted, staging)
        step("reloading the written model")
        reloaded = load_model(staging)
        step(f"moving it to {target}")
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
