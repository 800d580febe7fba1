"""Offline text for training: character-level (UTF-8 bytes) text from the Python standard
library's own source files, found at run time, or any text file.

The selection is fixed (``STDLIB_FILES``, in that order; files a Python version lacks are skipped)
and the last ``val_fraction`` of the concatenated bytes is the held-out validation split. Different
Python versions ship different sources, so losses are comparable within one interpreter, not across
versions.
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

STDLIB_FILES = (
    "argparse.py",
    "ast.py",
    "collections/__init__.py",
    "contextlib.py",
    "dataclasses.py",
    "difflib.py",
    "enum.py",
    "functools.py",
    "inspect.py",
    "json/decoder.py",
    "json/encoder.py",
    "logging/__init__.py",
    "pprint.py",
    "random.py",
    "shutil.py",
    "string.py",
    "subprocess.py",
    "textwrap.py",
    "threading.py",
    "typing.py",
    "unittest/case.py",
    "tokenize.py",
    "heapq.py",
    "fractions.py",
    "statistics.py",
    "csv.py",
    "configparser.py",
    "calendar.py",
    "copy.py",
)


@dataclass
class Corpus:
    """Byte-level text split into train / validation token tensors (int64, values 0..255)."""

    name: str
    train: torch.Tensor  # (n_train,)
    val: torch.Tensor  # (n_val,)
    sources: list[str]

    @property
    def vocab_size(self) -> int:
        return 256

    def batch(
        self, split: str, batch_size: int, seq_len: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows (inputs, next-byte targets), each (batch_size, seq_len), drawn with
        ``generator`` so a seed fixes the data order."""
        data = self.train if split == "train" else self.val
        if data.numel() <= seq_len + 1:
            raise ValueError(f"the {split} split has {data.numel()} bytes, fewer than seq_len + 2")
        starts = torch.randint(0, data.numel() - seq_len - 1, (batch_size,), generator=generator)
        idx = starts[:, None] + torch.arange(seq_len + 1)
        windows = data[idx]
        return windows[:, :-1], windows[:, 1:]


def _from_bytes(name: str, raw: bytes, sources: list[str], val_fraction: float) -> Corpus:
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(torch.int64)
    n_val = max(1, int(len(data) * val_fraction))
    return Corpus(name, data[:-n_val], data[-n_val:], sources)


def stdlib_corpus(val_fraction: float = 0.1, max_bytes: int | None = None) -> Corpus:
    """The default corpus: ``STDLIB_FILES`` from this interpreter's standard library."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts, sources = [], []
    for rel in STDLIB_FILES:
        path = root / rel
        if path.is_file():
            parts.append(path.read_bytes())
            sources.append(str(path))
    if not parts:
        raise FileNotFoundError(f"none of the standard-library sources were found under {root}")
    raw = b"\n".join(parts)
    if max_bytes is not None:
        raw = raw[:max_bytes]
    return _from_bytes("python-stdlib", raw, sources, val_fraction)


def text_corpus(path: str | Path, val_fraction: float = 0.1) -> Corpus:
    """Any text file, read as bytes."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"text file not found: {path}")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read text file {path}: {exc}") from exc
    if len(raw) < 1024:
        raise ValueError(f"text file {path} has {len(raw)} bytes; at least 1024 are needed")
    return _from_bytes(path.name, raw, [str(path)], val_fraction)
