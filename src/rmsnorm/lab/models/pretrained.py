"""Pretrained models as lab inputs: a local Hugging Face directory, a ``.gguf`` file, a Hub id
already in the local Hugging Face cache, or a built-in name
(:data:`~rmsnorm.lab.models.weights.BUILTIN`), loaded in float32 as a
:class:`~.runnable.RunnableModel`.

What is read: safetensors and GGUF only, never a pickle (a directory holding only ``*.bin`` /
``*.pt`` weights is refused); a built-in model's files are checked against their pinned sha256
first, and every other weight file's sha256 is recorded with the model (:attr:`provenance`), which
the lab's caches are keyed by. Nothing is downloaded: Hub ids resolve with
``local_files_only=True``. A GGUF file is checked before transformers parses it (its magic, its
header, and that every tensor lies inside the file), so a truncated or corrupt file is one clear
error. GGUF weights are dequantized on loading, which takes seconds per hundred million
parameters, so the dequantized model and its tokenizer are saved once as safetensors under
``cache_dir()/dequantized/`` keyed by the GGUF file's digest and the transformers and gguf
versions, with the digest of every saved file, checked when read back.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ... import _cache as cache
from ..._files import atomic_dir, write_text
from .weightfiles import (
    WeightFileError,
    check_gguf_architecture,
    check_shapes,
    read_gguf_header,
    read_safetensors_header,
)
from .weights import BUILTIN, cache_dir, resolve, sha256_file, verify_file

__all__ = [
    "Located",
    "locate",
    "check_gguf",
    "load_pretrained",
    "WeightFileError",
    "prepare",
    "is_prepared",
]

_PICKLES = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_FORMS = (
    "a built-in name ({names}), a local Hugging Face directory (config.json and *.safetensors), "
    "a .gguf file, or a Hub id already in the local Hugging Face cache"
)


@dataclass
class Located:
    """Where a model's files are: ``directory`` (what ``from_pretrained`` is given) and, for
    GGUF, ``gguf_file`` inside it; ``digests`` maps each weight file to its sha256."""

    source: str
    form: str  # "builtin", "directory", "gguf", "hub"
    directory: Path
    gguf_file: str | None = None
    digests: dict[str, str] = field(default_factory=dict)
    builtin: str | None = None

    @property
    def gguf_sha256(self) -> str | None:
        return None if self.gguf_file is None else self.digests[self.gguf_file]

    @property
    def weights_format(self) -> str:
        if self.builtin is not None:
            m = BUILTIN[self.builtin]
            if m.quantization:
                return f"{m.fmt} ({m.quantization}, dequantized to float32)"
            return m.fmt
        return "gguf (dequantized to float32)" if self.gguf_file else "safetensors"


def check_gguf(path: str | Path) -> Path:
    """``path`` if it is a readable GGUF file (:func:`~.weightfiles.read_gguf_header`: every
    length and count inside the file, every tensor type known, every tensor inside the data) of
    an architecture the installed transformers loads, with tensors; :class:`WeightFileError`
    naming the file and what is wrong otherwise (FileNotFoundError if it does not exist)."""
    try:
        import gguf  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "reading GGUF files needs the gguf package (the lab extra): pip install 'rmsnorm[lab]'"
        ) from exc
    header = read_gguf_header(path)
    check_gguf_architecture(header)
    if not header.tensors:
        raise WeightFileError(header.path, "a GGUF file without tensors")
    return header.path


def _safetensors_dir(path: Path) -> dict[str, str]:
    """The sha256 of each safetensors file of a model directory; errors for a directory with only
    pickled weights or none."""
    weights = sorted(path.glob("*.safetensors"))
    if weights:
        for w in weights:
            read_safetensors_header(w)  # a corrupt file is one clear error, before any parse
        return {w.name: sha256_file(w) for w in weights}
    pickles = sorted(p.name for pattern in _PICKLES for p in path.glob(pattern))
    if pickles:
        raise ValueError(
            f"{path} holds its weights only as pickles ({', '.join(pickles)}), which the lab "
            "never loads (unpickling runs code); convert them to safetensors first"
        )
    raise FileNotFoundError(f"{path} has no weights: looked for *.safetensors and *.gguf")


def _directory(source: str, path: Path, form: str) -> Located:
    ggufs = sorted(path.glob("*.gguf"))
    if not (path / "config.json").is_file():
        if len(ggufs) == 1:
            only = check_gguf(ggufs[0])
            return Located(source, form, path, only.name, {only.name: sha256_file(only)})
        if ggufs:
            names = ", ".join(g.name for g in ggufs)
            raise ValueError(f"{path} holds several GGUF files ({names}): name one of them")
        if not any(path.glob("*.safetensors")):
            raise FileNotFoundError(
                f"{path} has no weights: looked for config.json with *.safetensors, and *.gguf"
            )
        raise FileNotFoundError(f"{path} has safetensors but no config.json")
    return Located(source, form, path, None, _safetensors_dir(path))


def locate(source: str) -> Located:
    """Where the files of ``source`` are (see the module docstring); checks digests and GGUF
    structure, reads no weights."""
    if not isinstance(source, str) or not source:
        raise ValueError(f"model must be {_FORMS.format(names=', '.join(BUILTIN))}; got {source!r}")
    if source in BUILTIN:
        resolved = resolve(source)
        model = BUILTIN[source]
        digests = dict(resolved.digests)
        gguf_file = None
        if model.fmt == "gguf":  # its pinned digest matched: the known file, no parse needed
            gguf_file = resolved.weights.name
            digests[gguf_file] = model.weights.sha256
        return Located(source, "builtin", resolved.directory, gguf_file, digests, builtin=source)
    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(
                f"model {source!r} is a file but not a .gguf one; only GGUF files and directories "
                "of safetensors are read"
            )
        check_gguf(path)
        return Located(source, "gguf", path.parent, path.name, {path.name: sha256_file(path)})
    if path.is_dir():
        return _directory(source, path, "directory")
    if _HUB_ID.match(source):
        try:
            from huggingface_hub import snapshot_download

            snapshot = snapshot_download(source, local_files_only=True)
        except Exception as exc:
            raise FileNotFoundError(
                f"model {source!r} is neither a local path nor a Hub id in the local Hugging "
                f"Face cache ({type(exc).__name__}); nothing is downloaded. Give "
                + _FORMS.format(names=", ".join(BUILTIN))
            ) from exc
        return _directory(source, Path(snapshot), "hub")
    raise FileNotFoundError(
        f"model {source!r}: no such directory or file ({path.resolve()}); give "
        + _FORMS.format(names=", ".join(BUILTIN))
    )


def _is_encoder(config) -> bool:
    archs = getattr(config, "architectures", None) or []
    return bool(archs) and all(a.endswith("Model") and not a.endswith("LMHeadModel") for a in archs)


def _dequantized_cache(digest: str) -> Path:
    import importlib.metadata as md

    import transformers

    key = f"{digest[:16]}-tf{transformers.__version__}-gguf{md.version('gguf')}"
    return cache_dir() / "dequantized" / key


def _read_cached(folder: Path) -> bool:
    """Whether ``folder`` holds a complete dequantized copy whose files match its manifest."""
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        return False
    files = json.loads(manifest.read_text())["files"]
    for name, digest in files.items():
        verify_file(folder / name, digest)
    cache.used(folder)
    return True


def _write_cached(folder: Path, model, tokenizer) -> None:
    """Save the dequantized model and tokenizer as safetensors + JSON, atomically (a temporary
    folder renamed into place), with a manifest of digests."""
    with atomic_dir(folder, replace=True) as tmp:
        # transformers will not save a model it loaded from GGUF (it counts as quantized); its
        # weights are plain float32 now, so they go out as safetensors with the config
        from safetensors.torch import save_model

        config = copy.deepcopy(model.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(tmp)
        save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        files = {
            str(p.relative_to(tmp)): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()
        }
        write_text(json.dumps({"files": files}, indent=1), tmp / "manifest.json")
    cache.wrote(folder)


def is_prepared(source: str) -> bool | None:
    """Whether the GGUF model ``source`` has its dequantized copy in the cache (None for a model
    that is not GGUF)."""
    located = locate(source)
    if located.gguf_file is None:
        return None
    folder = _dequantized_cache(located.gguf_sha256)
    return (folder / "manifest.json").is_file()


def prepare(source: str, *, progress=None) -> bool:
    """Dequantize the GGUF model ``source`` into the cache now (so that its first use does not
    pay for it); False if it was there already or is not a GGUF model."""
    if is_prepared(source) is not False:
        return False
    load_pretrained(source, progress=progress)
    return True


@contextlib.contextmanager
def _quiet_gguf_bar():
    """transformers' GGUF reader without its tqdm bar: tqdm reads TQDM_DISABLE when first
    imported, so once it is the bar is silenced at the name the reader calls."""
    try:
        import functools
        from unittest import mock

        from transformers import modeling_gguf_pytorch_utils as gguf_utils

        bar = functools.partial(gguf_utils.tqdm, disable=True)
        patch = mock.patch.object(gguf_utils, "tqdm", bar)
    except (ImportError, AttributeError):  # another transformers: its bar, if any, stays
        patch = contextlib.nullcontext()
    with patch:
        yield


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _check_shapes(auto, config, directory: Path) -> None:
    """The safetensors files' tensor shapes against the model ``config`` describes, built on the
    meta device (no memory): a mismatch is one error naming the file, the tensor and both
    shapes, not transformers' report of it."""
    try:
        with torch.device("meta"):
            skeleton = auto.from_config(config)
    except Exception:  # a config transformers builds only its own way: its loader will say
        return
    shapes = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    check_shapes(directory, config, shapes)


def _from_pretrained(tf, directory: Path, file_kw: dict, weights_kw: dict):
    """(config, is it an encoder, model in float32, tokenizer or None) from ``directory``."""
    where = directory / file_kw["gguf_file"] if "gguf_file" in file_kw else directory
    try:
        config = tf.AutoConfig.from_pretrained(str(directory), local_files_only=True, **file_kw)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WeightFileError(where, f"its config cannot be read: {_first_line(exc)}") from exc
    encoder = _is_encoder(config)
    auto = tf.AutoModel if encoder else tf.AutoModelForCausalLM
    if "gguf_file" not in weights_kw:
        _check_shapes(auto, config, directory)
    try:
        model = auto.from_pretrained(
            str(directory), dtype=torch.float32, local_files_only=True, **weights_kw
        )
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        if isinstance(exc, WeightFileError):
            raise
        raise WeightFileError(
            where, f"transformers cannot load it: {type(exc).__name__}: {_first_line(exc)}"
        ) from exc
    try:
        tokenizer = tf.AutoTokenizer.from_pretrained(
            str(directory), local_files_only=True, **file_kw
        )
    except Exception:  # no tokenizer files: text falls back to bytes
        tokenizer = None
    return config, encoder, model, tokenizer


def load_pretrained(source: str, *, progress=None, cache: bool = True, located=None):
    """A :class:`~.runnable.RunnableModel` of ``source`` in float32, eval mode, with
    its tokenizer when its files are there and ``provenance`` (form, files and digests, weight
    format). ``cache``: keep dequantized GGUF weights in the cache (see the module docstring);
    ``located``: :func:`locate`'s answer for ``source`` when already asked (its digests read)."""
    from ..._progress import ensure
    from .runnable import RunnableModel, _transformers

    progress = ensure(progress)
    located = locate(source) if located is None else located
    tf = _transformers()
    tf.utils.logging.disable_progress_bar()
    directory = located.directory
    cached = None
    if located.gguf_file is not None and cache:
        cached = _dequantized_cache(located.gguf_sha256)
    with progress.task(f"loading {source}", 1) as advance:
        if cached is not None and _read_cached(cached):
            directory, file_kw, weights_kw = cached, {}, {"use_safetensors": True}
        elif located.gguf_file is not None:
            file_kw = weights_kw = {"gguf_file": located.gguf_file}
        else:
            file_kw, weights_kw = {}, {"use_safetensors": True}
        # transformers' GGUF reader draws its own tqdm bar, which disable_progress_bar does not
        # reach; this task's progress line stands for it
        quiet = contextlib.ExitStack()
        if "TQDM_DISABLE" not in os.environ:
            quiet.callback(os.environ.pop, "TQDM_DISABLE", None)
            os.environ["TQDM_DISABLE"] = "1"
        if "gguf_file" in file_kw:
            quiet.enter_context(_quiet_gguf_bar())
        with quiet:
            config, encoder, model, tokenizer = _from_pretrained(tf, directory, file_kw, weights_kw)
        if cached is not None and directory != cached:
            _write_cached(cached, model, tokenizer)
        advance()
    cfg = model.config
    max_len = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", 1024)
    loaded = RunnableModel(source, model.eval(), int(cfg.vocab_size), int(max_len), tokenizer, "hf")
    loaded.encoder = encoder
    loaded.provenance = {
        "source": source,
        "form": located.form,
        "builtin": located.builtin,
        "format": located.weights_format,
        "digests": dict(located.digests),
        "model_type": cfg.model_type,
        "dequantized_cache": str(cached) if cached is not None else None,
    }
    return loaded
