"""Weight files as an attacker would write them: every header field that sizes something set
past the file, types that do not exist, tensors that overlap or leave gaps, shapes that disagree
with config.json. Each is one :class:`WeightFileError` naming the file and what is wrong, raised
before any library parses the file, never a traceback from inside transformers or a large
allocation sized by the header."""

from __future__ import annotations

import json
import struct
import tracemalloc

import pytest
import torch

from rmsnorm.lab.models import pretrained
from rmsnorm.lab.models.weightfiles import (
    WeightFileError,
    check_gguf_architecture,
    read_gguf_header,
    read_safetensors_header,
)

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RMSNORM_CACHE", str(tmp_path / "cache"))


# --- GGUF, written byte by byte ---------------------------------------------------------------
def _s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def _kv_string(key: str, value: str) -> bytes:
    return _s(key) + struct.pack("<I", 8) + _s(value)


def _tensor(name: str, dims=(4,), kind: int = 0, offset: int = 0) -> bytes:
    out = _s(name) + struct.pack("<I", len(dims))
    out += b"".join(struct.pack("<Q", d) for d in dims)
    return out + struct.pack("<IQ", kind, offset)


def _gguf(
    *,
    version: int = 3,
    kvs: list[bytes] | None = None,
    tensors: list[bytes] | None = None,
    data: bytes = bytes(16),
    counts: tuple[int, int] | None = None,
    arch: str = "llama",
) -> bytes:
    kvs = [_kv_string("general.architecture", arch)] if kvs is None else kvs
    tensors = [_tensor("t")] if tensors is None else tensors
    n_tensors, n_kv = counts if counts is not None else (len(tensors), len(kvs))
    head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + b"".join(kvs)
    head += b"".join(tensors)
    head += bytes(-len(head) % 32)
    return head + data


def _file(tmp_path, raw: bytes, name: str = "m.gguf"):
    path = tmp_path / name
    path.write_bytes(raw)
    return path


def _fails(path, *fragments: str, reader=read_gguf_header):
    with pytest.raises(WeightFileError) as info:
        reader(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_a_valid_handmade_gguf_is_read(tmp_path):
    header = read_gguf_header(_file(tmp_path, _gguf()))
    assert header.architecture == "llama" and [t.name for t in header.tensors] == ["t"]
    assert check_gguf_architecture(header) == "llama"


def test_gguf_bad_magic(tmp_path):
    _fails(_file(tmp_path, b"GGML" + _gguf()[4:]), "not a GGUF file", "b'GGML'")


@pytest.mark.parametrize("version", [1, 4, 0x03000000])
def test_gguf_unsupported_version(tmp_path, version):
    _fails(_file(tmp_path, _gguf(version=version)), f"GGUF version {version}", "not supported")


@pytest.mark.parametrize("counts", [(2**62, 1), (1, 2**62), (10_000, 10_000)])
def test_gguf_counts_larger_than_the_file(tmp_path, counts):
    tracemalloc.start()
    try:
        _fails(_file(tmp_path, _gguf(counts=counts)), "claims", "more than its")
        assert tracemalloc.get_traced_memory()[1] < 16 << 20  # nothing sized by the count
    finally:
        tracemalloc.stop()


def test_gguf_key_length_larger_than_the_file(tmp_path):
    kv = struct.pack("<Q", 2**60) + b"general.architecture"
    _fails(_file(tmp_path, _gguf(kvs=[kv])), "a metadata key", "runs past the file")


def test_gguf_string_value_larger_than_the_file(tmp_path):
    kv = _s("general.architecture") + struct.pack("<IQ", 8, 2**40) + b"llama"
    _fails(_file(tmp_path, _gguf(kvs=[kv])), "string value of 'general.architecture'", "runs past")


def test_gguf_array_count_larger_than_the_file(tmp_path):
    kv = _s("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, 2**50)
    kvs = [_kv_string("general.architecture", "llama"), kv]
    _fails(_file(tmp_path, _gguf(kvs=kvs)), "array 'tokenizer.ggml.scores'", "runs past")


def test_gguf_string_array_count_larger_than_the_file(tmp_path):
    kv = _s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2**50)
    kvs = [_kv_string("general.architecture", "llama"), kv]
    _fails(_file(tmp_path, _gguf(kvs=kvs)), "claims", "strings")


def test_gguf_unknown_value_type(tmp_path):
    kv = _s("general.architecture") + struct.pack("<I", 77) + _s("llama")
    _fails(_file(tmp_path, _gguf(kvs=[kv])), "value type 77")


def test_gguf_unknown_tensor_type(tmp_path):
    _fails(_file(tmp_path, _gguf(tensors=[_tensor("t", kind=99)])), "'t'", "type 99")


def test_gguf_tensor_data_past_the_end(tmp_path):
    _fails(_file(tmp_path, _gguf(tensors=[_tensor("t", offset=4096)])), "'t'", "past the file")


def test_gguf_tensor_larger_than_the_file(tmp_path):
    tracemalloc.start()
    try:
        path = _file(tmp_path, _gguf(tensors=[_tensor("t", dims=(2**31, 2**31))]))
        _fails(path, "'t'", "more bytes than the whole file")
        assert tracemalloc.get_traced_memory()[1] < 16 << 20
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("dims", [(), (1, 1, 1, 1, 1)])
def test_gguf_dimension_count(tmp_path, dims):
    _fails(_file(tmp_path, _gguf(tensors=[_tensor("t", dims=dims)])), "dimensions")


def test_gguf_duplicate_tensor_name(tmp_path):
    tensors = [_tensor("t"), _tensor("t", offset=32)]
    _fails(_file(tmp_path, _gguf(tensors=tensors, data=bytes(64))), "'t' is declared twice")


def test_gguf_overlapping_tensors(tmp_path):
    tensors = [_tensor("a", dims=(8,)), _tensor("b", dims=(8,), offset=0)]
    _fails(_file(tmp_path, _gguf(tensors=tensors, data=bytes(64))), "overlaps")


def test_gguf_truncated_in_the_header(tmp_path):
    raw = _gguf()
    _fails(_file(tmp_path, raw[:30]), "truncated")


def test_gguf_unknown_architecture_is_named(tmp_path):
    path = _file(tmp_path, _gguf(arch="xyz"))
    with pytest.raises(WeightFileError) as info:
        pretrained.load_pretrained(str(path))
    message = str(info.value)
    assert "GGUF architecture 'xyz' is not supported; supported: " in message
    assert "llama" in message and "gemma3" in message and "without tensors" not in message


def test_gguf_tensor_names_are_only_keys(tmp_path):
    """A tensor named like a path writes nothing anywhere: names are keys, never paths."""
    path = _file(tmp_path, _gguf(tensors=[_tensor("../../escaped")]))
    header = read_gguf_header(path)
    assert header.tensors[0].name == "../../escaped"
    pretrained.locate(str(path))
    assert sorted(p.name for p in tmp_path.parent.iterdir() if p.name == "escaped") == []


# --- safetensors --------------------------------------------------------------------------------
def _st(header: dict | bytes, data: bytes, length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


_GOOD = {
    "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
    "b": {"dtype": "F16", "shape": [2, 2], "data_offsets": [8, 16]},
}


def _st_fails(tmp_path, raw: bytes, *fragments: str):
    return _fails(
        _file(tmp_path, raw, "model.safetensors"), *fragments, reader=read_safetensors_header
    )


def test_a_valid_handmade_safetensors_is_read(tmp_path):
    tensors = read_safetensors_header(_file(tmp_path, _st(_GOOD, bytes(16)), "m.safetensors"))
    assert tensors["b"].shape == (2, 2) and tensors["b"].dtype == "F16"


def test_safetensors_header_length_larger_than_the_file(tmp_path):
    tracemalloc.start()
    try:
        _st_fails(tmp_path, _st(_GOOD, bytes(16), length=2**62), "header length", "larger than")
        assert tracemalloc.get_traced_memory()[1] < 16 << 20
    finally:
        tracemalloc.stop()


def test_safetensors_header_not_json(tmp_path):
    _st_fails(tmp_path, _st(b"\x80not json", bytes(16)), "not JSON")


def test_safetensors_header_not_an_object(tmp_path):
    _st_fails(tmp_path, _st(b"[1, 2, 3]", bytes(16)), "list, not an object")


def test_safetensors_unknown_dtype(tmp_path):
    header = {**_GOOD, "b": {**_GOOD["b"], "dtype": "F13"}}
    _st_fails(tmp_path, _st(header, bytes(16)), "'b'", "'F13'")


def test_safetensors_offsets_out_of_range(tmp_path):
    header = {**_GOOD, "b": {**_GOOD["b"], "data_offsets": [8, 10**12]}}
    _st_fails(tmp_path, _st(header, bytes(16)), "'b'", "truncated or its offsets are out of range")


def test_safetensors_overlapping_tensors(tmp_path):
    header = {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
    }
    _st_fails(tmp_path, _st(header, bytes(12)), "overlaps")


def test_safetensors_gap_between_tensors(tmp_path):
    header = {"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}
    _st_fails(tmp_path, _st(header, bytes(8)), "belong to no tensor")


def test_safetensors_data_not_covered(tmp_path):
    _st_fails(tmp_path, _st(_GOOD, bytes(64)), "cover 16 of the data's 64 bytes")


def test_safetensors_offsets_disagree_with_the_shape(tmp_path):
    header = {**_GOOD, "b": {**_GOOD["b"], "shape": [3, 3]}}
    _st_fails(tmp_path, _st(header, bytes(16)), "'b'", "needs 18 bytes")


def test_safetensors_truncated(tmp_path):
    _st_fails(tmp_path, _st(_GOOD, bytes(16))[:-3], "'b'", "truncated")


def test_safetensors_shorter_than_its_length_field(tmp_path):
    _st_fails(tmp_path, b"\x01\x02", "truncated")


def _tiny_llama_dir(tmp_path):
    cfg = transformers.LlamaConfig(
        hidden_size=16,
        num_hidden_layers=1,
        vocab_size=32,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    model = transformers.LlamaForCausalLM(cfg)
    folder = tmp_path / "llama"
    model.save_pretrained(folder)
    return folder, model


def test_safetensors_shape_against_config_names_both(tmp_path):
    from safetensors.torch import load_file, save_file

    folder, _ = _tiny_llama_dir(tmp_path)
    file = folder / "model.safetensors"
    state = load_file(file)
    name = "model.layers.0.mlp.up_proj.weight"
    state[name] = torch.zeros(40, 16)
    save_file(state, file, metadata={"format": "pt"})
    with pytest.raises(WeightFileError) as info:
        pretrained.load_pretrained(str(folder))
    message = str(info.value)
    assert str(file) in message and name in message
    assert "[40, 16]" in message and "[32, 16]" in message and "config.json" in message


def test_a_corrupt_safetensors_in_a_model_directory(tmp_path):
    folder, _ = _tiny_llama_dir(tmp_path)
    file = folder / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-100])
    with pytest.raises(WeightFileError, match="model.safetensors.*truncated"):
        pretrained.locate(str(folder))


def test_the_command_prints_one_line(tmp_path):
    from typer.testing import CliRunner

    from rmsnorm.cli import app

    path = _file(tmp_path, _gguf(arch="xyz"))
    result = CliRunner().invoke(app, ["inspect", "--model", str(path)])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[0].startswith("rmsnorm inspect: weight file") and "'xyz'" in result.output
    assert "Traceback" not in result.output
