"""The pretrained models' text: the standard library's docstrings, the held-out split, windows of
tokens framed as each tokenizer frames text, a user's text file."""

from __future__ import annotations

import pytest
import torch

from rmsnorm.lab.models import text


class ByteTokenizer:
    """UTF-8 bytes as ids 3..258, with an optional beginning-of-text id 1 and end id 2 added by
    default (as Gemma's and BERT's tokenizers add theirs)."""

    def __init__(self, bos: bool = False, eos: bool = False) -> None:
        self.bos, self.eos = bos, eos

    def __call__(self, s: str, add_special_tokens: bool = True) -> dict:
        ids = [b + 3 for b in s.encode()]
        if add_special_tokens:
            ids = [1] * self.bos + ids + [2] * self.eos
        return {"input_ids": ids}

    def convert_ids_to_tokens(self, i: int) -> str:
        return {1: "<bos>", 2: "<eos>"}.get(i) or chr(i - 3)

    def decode(self, ids) -> str:
        return bytes(i - 3 for i in ids if i > 2).decode()


@pytest.fixture(scope="module")
def source():
    return text.stdlib_docstrings()


def test_docstrings_are_fixed_and_split_by_document(source):
    again = text.stdlib_docstrings()
    assert again.sha256 == source.sha256 and len(source.documents) > 100
    stats, held = source.split("stats"), source.split("heldout")
    assert len(stats) + len(held) == len(source.documents)
    assert not set(stats) & set(held)
    assert abs(len(held) / len(source.documents) - 0.25) < 0.01
    info = source.describe()
    assert info["documents"] == len(source.documents) and "standard library" in info["origin"]
    with pytest.raises(ValueError, match="part must be"):
        source.split("train")


@pytest.mark.parametrize("bos, eos", [(False, False), (True, False), (True, True)])
def test_windows_are_consecutive_text_framed_like_the_tokenizer(source, bos, eos):
    tok = ByteTokenizer(bos, eos)
    windows, info = text.token_windows(source, tok, part="stats", sequences=16, seq_len=128)
    assert windows.shape == (16, 128) and windows.dtype == torch.int64
    assert info["tokens"] == 2048 and info["special_tokens"] == bos + eos
    assert bool((windows[:, 0] == 1).all()) == bos and bool((windows[:, -1] == 2).all()) == eos
    body = windows[:, int(bos) : 128 - int(eos)].flatten().tolist()
    stream = tok.decode(body)
    first = source.split("stats")[0]
    assert stream.startswith(first[:100])  # the windows continue one another
    assert info["first_token"] == ("<bos>" if bos else "a text token")


def test_heldout_windows_differ_and_a_short_text_says_how_many_fit(source):
    tok = ByteTokenizer()
    a, _ = text.token_windows(source, tok, part="stats", sequences=2, seq_len=64)
    b, _ = text.token_windows(source, tok, part="heldout", sequences=2, seq_len=64)
    assert not torch.equal(a, b)
    short = text.TextSource("short", ("one two three",) * 4, "a test")
    with pytest.raises(ValueError, match=r"has \d+ tokens, 0 windows of 64; 1 were asked for"):
        text.token_windows(short, tok, part="stats", sequences=1, seq_len=64)


def test_text_file_paragraphs(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("\n\n".join(f"Paragraph {i} has a few words in it." for i in range(8)))
    src = text.text_file(path)
    assert len(src.documents) == 8 and src.split("heldout") == [src.documents[3], src.documents[7]]
    (tmp_path / "few.txt").write_text("only one line")
    with pytest.raises(ValueError, match="at least 4 are needed"):
        text.text_file(tmp_path / "few.txt")
    with pytest.raises(FileNotFoundError, match="text file not found"):
        text.text_file(tmp_path / "missing.txt")


def test_sentences_for_embeddings(source):
    out = text.sentences(source, 64)
    assert len(out) == 64 == len(set(out))
    assert all(6 <= len(s.split()) <= 40 for s in out)
    held = " ".join(" ".join(d.split()) for d in source.split("heldout"))
    assert all(s in held for s in out)
