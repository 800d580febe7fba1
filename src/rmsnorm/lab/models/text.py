"""English text for the pretrained models, offline: the docstrings of this interpreter's standard
library (the modules of :data:`~rmsnorm.lab.models.corpus.STDLIB_FILES`, read with :mod:`ast`, in
that order), a second kind of text that ships with it (the reference manual's help topics of
:mod:`pydoc_data.topics`: language reference prose, grammar and examples, not docstrings), or a
user's text file.

The text is split in two once, by document: every fourth document (docstring, or paragraph of a
user's file) is held out for the swap's end-to-end metrics, the rest feeds the statistics, so no
sentence is in both. Each split is tokenized by the model's own tokenizer as one stream and cut into
consecutive windows of ``seq_len`` tokens, each framed by the special tokens the tokenizer adds by
default (Gemma's ``<bos>`` first, BERT's ``[CLS]`` and ``[SEP]``, none for SmolLM2), as the models
see text. :meth:`TextSource.describe` records what was selected (source, documents, characters, the
text's sha256), which the report prints and the caches are keyed by. Different Python versions
ship different docstrings, so numbers are comparable within one interpreter.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import platform
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from .corpus import STDLIB_FILES

__all__ = [
    "TextSource",
    "stdlib_docstrings",
    "pydoc_topics",
    "TEXTS",
    "builtin_text",
    "text_file",
    "text_string",
    "token_windows",
    "sentences",
]

HELD_OUT_EVERY = 4  # every fourth document is held out
_MIN_CHARS = 40  # shorter docstrings ("Return x.") carry little running text
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


@dataclass(frozen=True)
class TextSource:
    """Documents of English text in a fixed order, and where they came from."""

    name: str
    documents: tuple[str, ...]
    origin: str

    def split(self, part: str) -> list[str]:
        """``"stats"`` (three documents of four) or ``"heldout"`` (the fourth)."""
        if part not in ("stats", "heldout"):
            raise ValueError(f"part must be 'stats' or 'heldout', got {part!r}")
        held = part == "heldout"
        return [d for i, d in enumerate(self.documents) if (i % HELD_OUT_EVERY == 3) == held]

    @property
    def sha256(self) -> str:
        return hashlib.sha256("\n\x00\n".join(self.documents).encode()).hexdigest()

    def describe(self) -> dict:
        return {
            "name": self.name,
            "origin": self.origin,
            "documents": len(self.documents),
            "characters": sum(len(d) for d in self.documents),
            "heldout_documents": len(self.split("heldout")),
            "sha256": self.sha256,
        }


def _docstrings(tree: ast.Module) -> list[str]:
    out = []
    nodes = [tree, *ast.walk(tree)]
    for node in nodes:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc and len(doc) >= _MIN_CHARS and doc not in out:
                out.append(doc)
    return out


def stdlib_docstrings() -> TextSource:
    """The docstrings (module, class, function; at least 40 characters, each once) of the
    standard-library sources in :data:`STDLIB_FILES` present in this interpreter."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs: list[str] = []
    files = []
    for rel in STDLIB_FILES:
        path = root / rel
        if not path.is_file():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        docs.extend(d for d in _docstrings(tree) if d not in docs)
        files.append(rel)
    if not docs:
        raise FileNotFoundError(f"no standard-library sources with docstrings under {root}")
    origin = (
        f"docstrings of {len(files)} modules of the Python {platform.python_version()} standard "
        f"library ({', '.join(files)})"
    )
    return TextSource("python-stdlib-docstrings", tuple(docs), origin)


def pydoc_topics() -> TextSource:
    """The help topics of :mod:`pydoc_data.topics` (the text ``help("assert")`` prints), in
    sorted topic order, split at blank lines into paragraphs of at least 40 characters, each once:
    the language reference's prose, with its grammar rules and code examples."""
    from pydoc_data import topics

    docs: list[str] = []
    seen = set()
    for name in sorted(topics.topics):
        for para in re.split(r"\n\s*\n", topics.topics[name]):
            para = inspect.cleandoc(para)
            if len(para) >= _MIN_CHARS and para not in seen:
                seen.add(para)
                docs.append(para)
    if not docs:
        raise FileNotFoundError("pydoc_data.topics holds no help topics in this interpreter")
    origin = (
        f"the {len(topics.topics)} help topics of pydoc_data.topics (Python "
        f"{platform.python_version()}'s reference manual as help() prints it)"
    )
    return TextSource("python-help-topics", tuple(docs), origin)


# The built-in texts by name: the first is the lab's primary text.
TEXTS = {"docstrings": stdlib_docstrings, "help-topics": pydoc_topics}


def builtin_text(name: str) -> TextSource:
    """A built-in text of :data:`TEXTS` by name."""
    if name not in TEXTS:
        raise ValueError(f"text must be one of {', '.join(TEXTS)}, got {name!r}")
    return TEXTS[name]()


def text_file(path: str | Path) -> TextSource:
    """A user's text file, its paragraphs (split at blank lines) as documents."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"text file not found: {path}")
    return text_string(path.read_text(encoding="utf-8", errors="replace"), path.name)


def text_string(text: str, name: str = "text") -> TextSource:
    """Text given as a string (a file's content), its paragraphs (split at blank lines; lines
    when there are fewer than four paragraphs) as documents."""
    docs = tuple(inspect.cleandoc(p) for p in re.split(r"\n\s*\n", text) if p.strip())
    if len(docs) < HELD_OUT_EVERY:
        docs = tuple(d for d in text.splitlines() if d.strip())
    if len(docs) < HELD_OUT_EVERY:
        raise ValueError(
            f"text {name} has {len(docs)} paragraphs or lines; at least {HELD_OUT_EVERY} "
            "are needed (one in four is held out)"
        )
    return TextSource(name, docs, f"the text {name}")


def _specials(tokenizer) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after a text by default (Gemma's <bos>;
    BERT's [CLS] and [SEP]; none for SmolLM2's)."""
    bare = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    for i in range(len(full) - len(bare) + 1):
        if full[i : i + len(bare)] == bare:
            return list(full[:i]), list(full[i + len(bare) :])
    return [], []


def token_windows(
    source: TextSource, tokenizer, *, part: str, sequences: int, seq_len: int
) -> tuple[torch.Tensor, dict]:
    """``sequences`` consecutive windows of ``seq_len`` tokens from ``part`` of ``source``,
    (sequences, seq_len) int64, each framed by the special tokens the tokenizer adds by default,
    and what they are. ValueError when the part is too short, saying how many windows it holds."""
    if sequences < 1 or seq_len < 4:
        raise ValueError(f"need sequences >= 1 and seq_len >= 4, got {sequences}, {seq_len}")
    before, after = _specials(tokenizer)
    body = seq_len - len(before) - len(after)
    ids: list[int] = []
    gap = tokenizer("\n\n", add_special_tokens=False)["input_ids"]
    for doc in source.split(part):
        ids.extend(tokenizer(doc, add_special_tokens=False)["input_ids"])
        ids.extend(gap)
        if len(ids) >= sequences * body:
            break
    if len(ids) < sequences * body:
        raise ValueError(
            f"the {part} part of {source.name} has {len(ids)} tokens, {len(ids) // body} windows "
            f"of {seq_len}; {sequences} were asked for (fewer sequences, or a longer text)"
        )
    windows = torch.tensor(ids[: sequences * body], dtype=torch.int64).reshape(sequences, body)
    frame = [torch.tensor([before] * sequences, dtype=torch.int64).reshape(sequences, -1)]
    frame += [windows, torch.tensor([after] * sequences, dtype=torch.int64).reshape(sequences, -1)]
    first = tokenizer.convert_ids_to_tokens(before[0]) if before else "a text token"
    info = {
        "part": part,
        "sequences": sequences,
        "seq_len": seq_len,
        "tokens": sequences * seq_len,
        "first_token": first,
        "special_tokens": len(before) + len(after),
    }
    return torch.cat(frame, 1), info


def sentences(source: TextSource, count: int, *, part: str = "heldout") -> list[str]:
    """``count`` sentences (6 to 40 words) of ``part`` in order: the first sentences of its
    documents, then their second ones (for sentence embeddings)."""
    docs = [" ".join(d.split()) for d in source.split(part)]
    split = [_SENTENCE.split(d) for d in docs]
    out: list[str] = []
    for k in range(4):
        for parts in split:
            if k < len(parts) and 6 <= len(parts[k].split()) <= 40 and parts[k] not in out:
                out.append(parts[k])
                if len(out) == count:
                    return out
    raise ValueError(f"the {part} part of {source.name} has {len(out)} sentences, {count} needed")
