"""Model inspection (lab/inspection/run.py): the built-in and tiny Hugging Face models (built
from a config, offline), local model directories, inputs, and errors naming what was looked for."""

import pytest
import torch
from torch import nn

from rmsnorm.lab import capture, inspection

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_inspect_builtin_and_errors():
    res = inspection.inspect_source("builtin", batch=2, seq_len=8)
    assert res.to_dict()["norm_layers"] == 25
    text = inspection.inspect_source("builtin-rms", "hello world", seq_len=8)
    assert "UTF-8 bytes" in text.inputs and text.layers[0]["kind"] == "rmsnorm"
    with pytest.raises(ValueError, match="no LayerNorm / RMSNorm"):
        inspection.inspect_model(nn.Linear(3, 3), torch.randn(2, 3))
    with pytest.raises(FileNotFoundError, match="no such directory.*config.json"):
        inspection.load_runnable_model("/nonexistent/model-dir")


def test_directory_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        inspection.load_runnable_model(str(tmp_path))


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


@pytest.mark.parametrize("name, n_layers", [("tiny-gpt2", 2), ("tiny-llama", 2)])
def test_tiny_hf_models(transformers, name, n_layers):
    loaded = inspection.load_runnable_model(name)
    found = capture.find_norm_layers(loaded.model)
    assert len(found) == 2 * n_layers + 1
    expected = "layernorm" if name == "tiny-gpt2" else "rmsnorm"
    assert {k for _, _, k in found} == {expected}
    ids, _ = inspection.make_inputs(loaded, batch=2, seq_len=16)
    res = inspection.inspect_model(loaded.model, ids, forward=loaded.forward)
    for layer in res.layers:
        assert layer["tokens"] == 32 and layer["swap_error"] is None
        assert 0 < layer["predicted_cosine"]["mean"] <= 1


def test_hf_directory_round_trip(transformers, tmp_path):
    """A saved tiny model loads from its directory offline (local_files_only)."""
    loaded = inspection.load_runnable_model("tiny-llama")
    loaded.model.save_pretrained(tmp_path)
    again = inspection.load_runnable_model(str(tmp_path))
    assert again.kind == "hf" and again.tokenizer is None
    assert len(capture.find_norm_layers(again.model)) == 5
