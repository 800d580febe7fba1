"""The exact LayerNorm -> RMSNorm conversion: logits unchanged (float32 and float64) for every
architecture of the table (the lab transformer, GPT-2 with its tied head, GPT-NeoX with parallel
and sequential residual); refusals; the table's own checks; model directories and the CLI."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from rmsnorm import LayerNorm, RMSNorm
from rmsnorm.convert import (
    ARCHITECTURES,
    Architecture,
    ConversionError,
    convert_directory,
    layernorm_to_rmsnorm,
    load_model,
    random_tokens,
    recenter_,
    residual_writers,
    save_model,
    verify_conversion,
)
from rmsnorm.convert.architectures import find_architecture
from rmsnorm.convert.checkpoint import _logits
from rmsnorm.convert.exact import conversion_record, swap_norms
from rmsnorm.lab.models.transformer import Transformer, TransformerConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _perturb(model: nn.Module) -> nn.Module:
    """Norm γ, β away from 1, 0 and embeddings with a clear mean along the hidden dim, so that
    a missed centering or a dropped β shows in the logits."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
            if any(k in name for k in ("norm", "ln_", "layernorm", "layer_norm")):
                p.add_(0.3 * noise)
            elif "emb" in name or "wte" in name or "wpe" in name:
                p.add_(0.1 * noise[..., :1])  # one offset per row: a mean along the hidden dim
    return model.eval()


def lab(**overrides) -> Transformer:
    torch.manual_seed(0)
    cfg = {**dict(n_layers=3, d_model=32, n_heads=4, seq_len=16, vocab_size=40), **overrides}
    return _perturb(Transformer(TransformerConfig(**cfg)))


def gpt2(**overrides) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=40, n_embd=32, n_layer=2, n_head=4, n_positions=32, **overrides
    )
    return _perturb(transformers.GPT2LMHeadModel(cfg))


def neox(**overrides) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPTNeoXConfig(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=32,
        **overrides,
    )
    return _perturb(transformers.GPTNeoXForCausalLM(cfg))


MODELS = {
    "lab": lab,
    "lab-no-bias": lambda: lab(bias=False),
    "gpt2-tied": gpt2,
    "gpt-neox-parallel": neox,
    "gpt-neox-sequential-tied": lambda: neox(use_parallel_residual=False, tie_word_embeddings=True),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_logits_equal_float32_and_float64(name):
    model = MODELS[name]()
    assert verify_conversion(model, torch.float32) <= 1e-5  # measured 2e-7 .. 8e-6
    assert verify_conversion(model, torch.float64) <= 1e-12  # measured 4e-16 .. 1e-14


def test_every_architecture_of_the_table_is_tested():
    """A new entry of ARCHITECTURES needs a model in MODELS, so its exactness is checked."""
    pytest.importorskip("transformers")
    tested = {find_architecture(build()).name for build in MODELS.values()}
    assert tested == set(ARCHITECTURES)


def test_lab_head_tied_to_the_embedding_is_untied():
    """Any other use of a writer's Parameter keeps the uncentered values, whatever the
    architecture (here the lab's head sharing the token embedding)."""
    model = lab()
    model.head.weight = model.tok_emb.weight
    assert verify_conversion(model, torch.float64) <= 1e-12
    converted = layernorm_to_rmsnorm(model)
    assert converted.head.weight is not converted.tok_emb.weight
    assert torch.equal(converted.head.weight, model.tok_emb.weight)
    assert conversion_record(converted)["untied"] == ["head.weight"]


@pytest.mark.parametrize("name", ["lab", "gpt2-tied", "gpt-neox-parallel"])
def test_centering_is_what_makes_it_exact(name):
    """The same swap without centering the writers changes the logits by far more than the
    tolerance: the test above would catch a missed writer."""
    model = MODELS[name]().double()
    tokens = random_tokens(model)
    ref = _logits(model, tokens)
    swap_norms(model, {})
    assert (_logits(model, tokens) - ref).abs().max() > 1e-3


def test_converted_model_structure_and_original_untouched():
    model = gpt2()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    wte = model.transformer.wte.weight
    assert model.lm_head.weight is wte
    converted = layernorm_to_rmsnorm(model)
    # The original is not modified.
    assert model.lm_head.weight is model.transformer.wte.weight
    assert isinstance(model.transformer.ln_f, nn.LayerNorm)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    # Untied: the head keeps the original embedding; the embedding table is centered.
    assert converted.lm_head.weight is not converted.transformer.wte.weight
    assert torch.equal(converted.lm_head.weight, wte)
    assert converted.config.tie_word_embeddings is False
    assert converted.transformer.wte.weight.double().mean(dim=1).abs().max() < 1e-7
    norms = [m for m in converted.modules() if isinstance(m, RMSNorm)]
    assert len(norms) == 2 * 2 + 1
    assert not any(isinstance(m, nn.LayerNorm) for m in converted.modules())
    for m in norms:
        assert m.eps_mode == "mean_square" and m.eps == model.config.layer_norm_epsilon
        assert m.bias is not None and m.offset == 0.0
    # The state_dict keeps the LayerNorm keys (plus the now separate head).
    assert set(converted.state_dict()) == set(state) | {"lm_head.weight"}


def test_residual_stream_is_zero_mean():
    model = layernorm_to_rmsnorm(lab().double())
    _, residuals = model(random_tokens(model), return_residuals=True)
    for h in residuals:
        assert (h.mean(dim=-1).abs() / h.square().mean(dim=-1).sqrt()).max() < 1e-12


def test_residual_writers_lists_every_writer():
    names = residual_writers(lab())
    assert names[:2] == ["tok_emb.weight", "pos_emb.weight"]
    assert len(names) == 2 + 3 * 4  # per block: attn.proj and mlp.proj, weight and bias
    assert "transformer.wte.weight" in residual_writers(gpt2())


@pytest.mark.parametrize("recenter", [True, False])
def test_recenter_keeps_training_exact(recenter):
    """Fine-tuning the converted model with recenter_ after each step: it stays exactly the
    LayerNorm model with the same weights. Without it, AdamW's uncentered updates let the stream's
    mean drift and the two part (here by ~0.1 in three steps)."""
    model = layernorm_to_rmsnorm(lab().double())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = random_tokens(model, batch=4)
    for _ in range(3):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(
            model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()
        )
        loss.backward()
        opt.step()
        if recenter:
            recenter_(model)
    twin = _layernorm_twin(model)
    with torch.no_grad():
        diff = (model(tokens) - twin(tokens)).abs().max().item()
    assert diff <= 1e-10 if recenter else diff > 1e-3


def _layernorm_twin(model: Transformer) -> Transformer:
    """The same weights with every RMSNorm replaced by a LayerNorm (same γ, β, ε)."""
    import copy

    twin = copy.deepcopy(model)
    for parent in list(twin.modules()):
        for attr, child in list(parent.named_children()):
            if isinstance(child, RMSNorm):
                ln = LayerNorm(child.normalized_shape, eps=child.eps, dtype=child.weight.dtype)
                ln.weight, ln.bias = child.weight, child.bias
                setattr(parent, attr, ln)
    return twin


def test_refusals_are_clear():
    with pytest.raises(ConversionError, match="cfg.norm_position is 'post'.*post-LN"):
        layernorm_to_rmsnorm(lab(norm_position="post"))
    with pytest.raises(ConversionError, match="only LayerNorm models"):
        layernorm_to_rmsnorm(lab(norm="rmsnorm"))
    with pytest.raises(ConversionError, match="unknown architecture.*supported are.*'gpt_neox'"):
        layernorm_to_rmsnorm(nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)))
    with pytest.raises(ConversionError, match="already converted"):
        layernorm_to_rmsnorm(layernorm_to_rmsnorm(lab()))
    with pytest.raises(ConversionError, match="cross-attention"):
        layernorm_to_rmsnorm(gpt2(add_cross_attention=True))
    with pytest.raises(TypeError, match="torch.nn.Module"):
        layernorm_to_rmsnorm("gpt2")
    with pytest.raises(ConversionError, match="expects a model returned by"):
        recenter_(gpt2())
    # A LayerNorm the layout does not know about: refused before anything is changed.
    model = lab()
    model.blocks[0].attn.extra = nn.LayerNorm(32)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ConversionError, match=r"blocks\.0\.attn\.extra"):
        layernorm_to_rmsnorm(model, inplace=True)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    # A layout the model does not have: named, not an AttributeError.
    model = lab()
    del model.blocks[1].mlp.proj
    with pytest.raises(ConversionError, match="no module at 'mlp.proj'"):
        layernorm_to_rmsnorm(model)


def test_architecture_entries_are_checked():
    common = dict(name="x", description="x", embeddings=(), layers="h", norms=(), final_norm="f")
    with pytest.raises(ValueError, match="exactly one of model_type"):
        Architecture(**common, writers=())
    with pytest.raises(ValueError, match="layout of writer 'proj' must be one of"):
        Architecture(**common, writers=(("proj", "dense"),), model_type="x")
    with pytest.raises(ValueError, match="needs build"):
        Architecture(**common, writers=(), model_class=lambda: nn.Module)


def test_a_wrong_layout_in_the_table_is_refused(monkeypatch):
    """An entry naming the wrong hidden dim for a writer would center the wrong axis."""
    gpt2_entry = ARCHITECTURES["gpt2"]
    writers = (("attn.c_proj", "conv1d"), ("mlp.c_proj", "linear"))  # c_proj is a Conv1D
    monkeypatch.setitem(ARCHITECTURES, "gpt2", dataclasses.replace(gpt2_entry, writers=writers))
    with pytest.raises(ConversionError, match=r"shape \[128, 32\] has no dim 0 of the hidden size"):
        layernorm_to_rmsnorm(gpt2())


def test_converting_hf_models_never_imports_the_lab():
    """The conversion never imports the lab (the lab registers its Transformer with it)."""
    pytest.importorskip("transformers")
    lab_package = "rmsnorm.lab"
    code = (
        "import sys, torch, transformers\n"
        "from rmsnorm.convert import layernorm_to_rmsnorm, verify_conversion\n"
        "cfg = transformers.GPT2Config(vocab_size=40, n_embd=16, n_layer=1, n_head=2)\n"
        "model = transformers.GPT2LMHeadModel(cfg)\n"
        "assert verify_conversion(model, torch.float64) < 1e-12\n"
        f"assert {lab_package!r} not in sys.modules, 'the lab was imported'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


def test_the_lab_registers_its_transformer_and_a_saved_one_says_how_to_load_it(tmp_path):
    """The conversion never imports the lab: a lab Transformer saved to a directory loads in a
    process that imported the lab, and in one that did not the error says what to import; the
    command line registers it itself."""
    d = tmp_path / "lab"
    save_model(lab(), d)
    lab_package = "rmsnorm.lab"
    code = (
        "import sys, pytest\n"
        "from rmsnorm.convert import load_model\n"
        f"assert {lab_package!r} not in sys.modules\n"
        "with pytest.raises(ValueError, match='import rmsnorm.lab first') as info:\n"
        f"    load_model({str(d)!r})\n"
        f"assert {str(d / 'config.json')!r} in str(info.value)\n"
        "import rmsnorm.lab\n"
        f"assert type(load_model({str(d)!r})).__name__ == 'Transformer'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


def test_register_architecture_adds_or_replaces_an_entry():
    from rmsnorm.convert.architectures import ARCHITECTURES, LAB_TRANSFORMER, register_architecture

    entry = ARCHITECTURES[LAB_TRANSFORMER]
    assert list(ARCHITECTURES)[-1] == LAB_TRANSFORMER  # after every Hugging Face entry
    register_architecture(dataclasses.replace(entry, description="another"))
    try:
        assert ARCHITECTURES[LAB_TRANSFORMER].description == "another"
        assert list(ARCHITECTURES).count(LAB_TRANSFORMER) == 1
    finally:
        register_architecture(entry)
    with pytest.raises(TypeError, match="architecture must be a rmsnorm.convert.Architecture"):
        register_architecture({"name": "x"})


def test_refuses_unknown_hf_architecture():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
    )
    with pytest.raises(ConversionError, match="model_type='llama'"):
        layernorm_to_rmsnorm(transformers.LlamaForCausalLM(cfg))


@pytest.mark.parametrize("name", ["lab", "gpt2-tied"])
def test_convert_directory_round_trip(name, tmp_path):
    model = MODELS[name]()
    save_model(model, tmp_path / "src")
    report = convert_directory(tmp_path / "src", tmp_path / "dst", repeats=1, seq_len=8)
    assert report.max_abs_logit_diff["float32"] <= 1e-5
    assert report.max_abs_logit_diff["float64"] <= 1e-10
    assert report.untied_head == (name == "gpt2-tied")
    assert all(t > 0 for t in report.inference_s.values())
    reloaded = load_model(tmp_path / "dst")
    assert any(isinstance(m, RMSNorm) for m in reloaded.modules())
    tokens = random_tokens(model, seq_len=8)
    with torch.no_grad():
        assert (_logits(reloaded, tokens) - _logits(model, tokens)).abs().max() <= 1e-5


def test_converted_checkpoint_loads_in_plain_transformers(tmp_path):
    """The written weights are the equivalent LayerNorm model for anyone without this library."""
    transformers = pytest.importorskip("transformers")
    model = gpt2()
    save_model(layernorm_to_rmsnorm(model), tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["tie_word_embeddings"] is False
    plain = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, local_files_only=True).eval()
    tokens = random_tokens(model, seq_len=8)
    with torch.no_grad():
        assert (plain(tokens).logits - model(tokens).logits).abs().max() <= 1e-5


def test_load_model_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="model directory not found"):
        load_model(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="neither a Hugging Face config"):
        load_model(tmp_path)


def test_cli_convert(tmp_path):
    from typer.testing import CliRunner

    from rmsnorm.cli import app

    save_model(lab(), tmp_path / "src")
    runner = CliRunner()
    args = ["convert", str(tmp_path / "src"), str(tmp_path / "dst"), "--repeats", "1"]
    result = runner.invoke(app, args + ["--json", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    # off a terminal the table is Markdown, so the cell's ``|`` is escaped
    assert r"| max \|Δ logits\| (float64) |" in result.output and "inference" in result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["max_abs_logit_diff"]["float32"] <= 1e-5
    save_model(lab(norm_position="post"), tmp_path / "post")
    result = runner.invoke(app, ["convert", str(tmp_path / "post"), str(tmp_path / "x")])
    assert result.exit_code == 1 and "post-LN" in result.output


# ----------------------------------------------------------------------------------------------
# Nothing lost: the source, a non-empty destination and a failed write
# ----------------------------------------------------------------------------------------------
def _snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root (relative path -> bytes): what must not change."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _convert(src, dst, **kw):
    return convert_directory(src, dst, repeats=1, seq_len=8, check_dtypes=("float32",), **kw)


def test_convert_refuses_its_source_however_spelled(tmp_path, monkeypatch):
    """DST = SRC, DST inside SRC, DST containing SRC: refused before anything is written, through
    relative spellings and symlinks too; the source is byte-for-byte what it was."""
    from rmsnorm._validate import ArgumentError

    src = tmp_path / "models" / "src"
    save_model(lab(), src)
    before = _snapshot(tmp_path)
    (tmp_path / "link").symlink_to(src, target_is_directory=True)
    (tmp_path / "models_link").symlink_to(tmp_path / "models", target_is_directory=True)
    monkeypatch.chdir(tmp_path / "models")
    cases = {
        src: "is source",
        "src": "is source",
        "./src/../src/": "is source",
        tmp_path / "link": "is source",
        tmp_path / "models_link" / "src": "is source",
        src / "converted": "is inside source",
        tmp_path / "link" / "a" / "b": "is inside source",
        tmp_path / "models": "contains source",
        tmp_path: "contains source",
    }
    for dst, message in cases.items():
        for overwrite in (False, True):
            with pytest.raises(ArgumentError, match=message) as info:
                _convert("src", dst, overwrite=overwrite)
            assert str(src) in str(info.value), info.value
            assert _snapshot(tmp_path) == before, (dst, overwrite)
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["src"]


def test_a_non_empty_destination_needs_overwrite(tmp_path):
    from rmsnorm._validate import ArgumentError

    save_model(lab(), tmp_path / "src")
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "notes.txt").write_text("mine")
    with pytest.raises(ArgumentError, match=r"dst is not empty.*set overwrite to replace"):
        _convert(tmp_path / "src", dst)
    assert _snapshot(dst) == {"notes.txt": b"mine"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]
    # A file is never replaced by a directory.
    (tmp_path / "file").write_text("x")
    for overwrite in (False, True):
        with pytest.raises(ArgumentError, match="exists and is not a directory"):
            _convert(tmp_path / "src", tmp_path / "file", overwrite=overwrite)
    assert (tmp_path / "file").read_text() == "x"
    # overwrite=True replaces the directory as a whole: no file of the old one stays.
    _convert(tmp_path / "src", dst, overwrite=True)
    assert "notes.txt" not in _snapshot(dst) and (dst / "model.pt").is_file()
    assert any(isinstance(m, RMSNorm) for m in load_model(dst).modules())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "file", "src"]


def test_an_empty_or_new_destination_is_written(tmp_path):
    save_model(lab(), tmp_path / "src")
    (tmp_path / "empty").mkdir()
    for dst in (tmp_path / "empty", tmp_path / "new" / "deeper"):
        _convert(tmp_path / "src", dst)
        assert set(_snapshot(dst)) == {"config.json", "model.pt"}
    # Written with the umask's mode, as a plain mkdir would make it (not a private temp dir's).
    (tmp_path / "probe").mkdir()
    assert (tmp_path / "new" / "deeper").stat().st_mode == (tmp_path / "probe").stat().st_mode


class _Injected(Exception):
    pass


@pytest.mark.parametrize("error", [_Injected, KeyboardInterrupt])
@pytest.mark.parametrize("existing", [False, True], ids=["new_dst", "overwrite_dst"])
def test_a_failure_mid_write_leaves_the_destination_as_it_was(
    tmp_path, monkeypatch, error, existing
):
    """The weights file half-written when the write fails (an exception, or Ctrl-C): the
    destination is as it was (absent, or the old model intact with overwrite) and no staging
    directory is left beside it, nor a parent made for it."""
    import rmsnorm.convert.checkpoint as checkpoint

    save_model(lab(), tmp_path / "src")
    dst = tmp_path / "out" / "dst"
    if existing:
        save_model(lab(d_model=16), dst)
    before = _snapshot(tmp_path)
    real_save = torch.save

    def failing_save(obj, path, *args, **kwargs):
        real_save(obj, path, *args, **kwargs)
        with open(path, "r+b") as fh:  # truncated, as by a full disk
            fh.truncate(100)
        assert Path(path).parent.name.endswith(".partial"), path
        raise error("injected")

    monkeypatch.setattr(checkpoint.torch, "save", failing_save)
    with pytest.raises(error, match="injected"):
        _convert(tmp_path / "src", dst, overwrite=existing)
    assert _snapshot(tmp_path) == before
    expected = ["out", "src"] if existing else ["src"]
    assert sorted(p.name for p in tmp_path.iterdir()) == expected
    if existing:
        assert [p.name for p in (tmp_path / "out").iterdir()] == ["dst"]
        assert load_model(dst).cfg.d_model == 16


def test_a_failed_rename_keeps_the_old_destination(tmp_path, monkeypatch):
    """With overwrite, the old directory is moved aside before the new one is renamed into place;
    if that rename fails the old one is put back."""
    import rmsnorm.convert.checkpoint as checkpoint

    save_model(lab(), tmp_path / "src")
    dst = tmp_path / "dst"
    save_model(lab(d_model=16), dst)
    before = _snapshot(tmp_path)
    real_rename = os.rename

    def rename(a, b):
        if str(a).endswith(".partial"):
            raise _Injected("injected rename failure")
        real_rename(a, b)

    monkeypatch.setattr(checkpoint.os, "rename", rename)
    with pytest.raises(_Injected):
        _convert(tmp_path / "src", dst, overwrite=True)
    assert _snapshot(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]


def test_save_model_is_atomic_and_refuses_a_non_empty_directory(tmp_path):
    from rmsnorm._validate import ArgumentError

    model = lab()
    save_model(model, tmp_path / "a")
    with pytest.raises(ArgumentError, match="is not empty"):
        save_model(model, tmp_path / "a")
    assert save_model(lab(d_model=16), tmp_path / "a", overwrite=True) == (tmp_path / "a")
    assert load_model(tmp_path / "a").cfg.d_model == 16
    with pytest.raises(TypeError, match="cannot save Linear"):
        save_model(nn.Linear(2, 2), tmp_path / "b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_unreadable_files_are_named(tmp_path):
    """A corrupt, mismatched or missing file of a model directory: the error names it."""
    d = tmp_path / "m"
    save_model(lab(), d)
    config = (d / "config.json").read_text()
    for content, message in (
        (b'{"format": ', "cannot be read as JSON"),
        (b"\xff\xfe\x00garbage", "cannot be read as JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"format": "rmsnorm-lab-transformer"}', "not a valid rmsnorm-lab-transformer config"),
        (
            b'{"format": "rmsnorm-lab-transformer", "transformer_config": {"n_layerz": 1}}',
            "not a valid rmsnorm-lab-transformer config",
        ),
    ):
        (d / "config.json").write_bytes(content)
        with pytest.raises(ValueError, match=message) as info:
            load_model(d)
        assert str(d / "config.json") in str(info.value)
    (d / "config.json").write_text(config)
    weights = (d / "model.pt").read_bytes()
    (d / "model.pt").write_bytes(weights[: len(weights) // 2])
    with pytest.raises(ValueError, match="cannot be read as a state_dict") as info:
        load_model(d)
    assert str(d / "model.pt") in str(info.value)
    torch.save({"tok_emb.weight": torch.zeros(3)}, d / "model.pt")
    with pytest.raises(ValueError, match="does not hold the weights") as info:
        load_model(d)
    assert str(d / "model.pt") in str(info.value) and str(d / "config.json") in str(info.value)
    (d / "model.pt").unlink()
    with pytest.raises(FileNotFoundError, match="no model.pt") as info:
        load_model(d)
    assert str(d / "model.pt") in str(info.value)


def test_unreadable_hugging_face_weights_are_named(tmp_path):
    pytest.importorskip("transformers")
    d = tmp_path / "hf"
    save_model(gpt2(), d)
    weights = d / "model.safetensors"
    assert weights.is_file()
    weights.write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="cannot be read as part of a model") as info:
        load_model(d)
    assert str(weights) in str(info.value)
    with pytest.raises(ValueError, match=str(weights)):
        _convert(d, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_cli_convert_refusals_and_overwrite(tmp_path):
    """The command says the arguments as the user typed them (SOURCE, DESTINATION, --overwrite):
    exit code 2 for a refused destination, 1 for an unreadable model, 0 with --overwrite."""
    from typer.testing import CliRunner

    from rmsnorm.cli import app

    runner = CliRunner()
    src = tmp_path / "src"
    save_model(lab(), src)
    before = _snapshot(src)
    args = ["--repeats", "1", "--seq-len", "8", "--check-dtypes", "float32"]
    result = runner.invoke(app, ["convert", str(src), str(src), *args])
    assert result.exit_code == 2, result.output
    assert f"DESTINATION {src} is SOURCE {src}" in " ".join(result.output.split())
    result = runner.invoke(app, ["convert", str(src), str(src / "x"), *args])
    assert result.exit_code == 2 and "is inside SOURCE" in result.output
    assert _snapshot(src) == before
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "notes.txt").write_text("mine")
    result = runner.invoke(app, ["convert", str(src), str(dst), *args])
    assert result.exit_code == 2 and "set --overwrite to replace" in result.output
    assert (dst / "notes.txt").read_text() == "mine"
    result = runner.invoke(app, ["convert", str(src), str(dst), "--overwrite", *args])
    assert result.exit_code == 0, result.output
    assert set(_snapshot(dst)) == {"config.json", "model.pt"}
    (src / "config.json").write_text("{")
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "new"), *args])
    assert result.exit_code == 1 and "cannot be read as JSON" in result.output
    assert str(src / "config.json") in " ".join(result.output.split())
