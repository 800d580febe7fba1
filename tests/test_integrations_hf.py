"""Parity of rmsnorm.integrations.hf: every supported Hugging Face class, patched, matches the
unpatched model (logits and gradients) on tiny random models built offline from a config."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rmsnorm.integrations import hf
from rmsnorm.testing import assert_close_to_reference

transformers = pytest.importorskip("transformers")

VOCAB, BATCH, SEQ = 64, 2, 8
_DEC = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
    bos_token_id=1, eos_token_id=2,
)  # fmt: skip

# name -> (config class, model class, config overrides, norm classes the model must contain).
# head_dim=8 keeps Qwen3 / Gemma q_norm and k_norm at the head size (their interesting case).
CASES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, ["llama.LlamaRMSNorm"]),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}, ["mistral.MistralRMSNorm"]),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(num_local_experts=4, num_experts_per_tok=2),
        ["mixtral.MixtralRMSNorm"],
    ),  # fmt: skip
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}, ["qwen2.Qwen2RMSNorm"]),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=8), ["qwen3.Qwen3RMSNorm"]),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(head_dim=8), ["gemma.GemmaRMSNorm"]),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=8), ["gemma2.Gemma2RMSNorm"]),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(head_dim=8),
        ["gemma3.Gemma3RMSNorm"],
    ),  # fmt: skip
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}, ["phi3.Phi3RMSNorm"]),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}, ["olmo2.Olmo2RMSNorm"]),
    "t5": (
        "T5Config",
        "T5ForConditionalGeneration",
        dict(
            vocab_size=VOCAB,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_heads=4,
            decoder_start_token_id=0,
            pad_token_id=0,
        ),
        ["t5.T5LayerNorm"],
    ),  # fmt: skip
    "gpt2": (
        "GPT2Config",
        "GPT2LMHeadModel",
        dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64),
        ["torch.LayerNorm"],
    ),  # fmt: skip
    "gpt_neox": (
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        dict(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
        ),
        ["torch.LayerNorm"],
    ),  # fmt: skip
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _qualified(short: str) -> str:
    if short == "torch.LayerNorm":
        return "torch.nn.modules.normalization.LayerNorm"
    model, cls = short.split(".")
    return f"transformers.models.{model}.modeling_{model}.{cls}"


def build(name: str, seed: int = 0) -> torch.nn.Module:
    """A tiny model with random weights; norm weights (and biases) moved away from their init so
    that an offset or a missing weight would show."""
    config_cls, model_cls, overrides, _ = CASES[name]
    kwargs = overrides if name in ("t5", "gpt2", "gpt_neox") else {**_DEC, **overrides}
    torch.manual_seed(seed)
    config = getattr(transformers, config_cls)(**kwargs)
    config._attn_implementation = "eager"  # same attention kernel in every dtype
    config._experts_implementation = "eager"  # grouped_mm has no float64 (the expected model)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for module in model.modules():
            if hf._convention_of(module, model.config.model_type) is not None:
                for p in module.parameters(recurse=False):
                    p.copy_(torch.randn_like(p) * 0.5 + (p.mean() if p.numel() else 0))
    return model


def inputs(name: str) -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)
    if name == "t5":
        decoder_ids = torch.randint(3, VOCAB, (BATCH, 5), generator=g)
        return dict(input_ids=ids, decoder_input_ids=decoder_ids)
    return dict(input_ids=ids)


def logits_and_grads(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    logits = model(**batch).logits
    # A fixed random cotangent: every logit contributes, with its own sign.
    g = torch.Generator().manual_seed(2)
    cot = torch.randn(logits.shape, generator=g, dtype=torch.float64).to(logits.dtype)
    (logits * cot).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads


def test_every_table_entry_has_a_parity_case():
    covered = {_qualified(c) for case in CASES.values() for c in case[3]}
    assert covered == set(hf.CONVENTIONS)


@pytest.mark.parametrize("name", list(CASES))
def test_patch_parity_float32(name):
    model = build(name)
    batch = inputs(name)
    ref_logits, ref_grads = logits_and_grads(model, batch)
    names = hf.patch(model)
    norm_classes = {_qualified(c) for c in CASES[name][3]}
    seen = {hf._qualname(type(m)) for n, m in model.named_modules() if n in names}
    assert seen == norm_classes
    if name in ("qwen3", "gemma3"):  # the per-head q_norm / k_norm are patched too
        assert any(n.endswith("q_norm") for n in names) and any(n.endswith("k_norm") for n in names)
    logits, grads = logits_and_grads(model, batch)
    assert (logits - ref_logits).abs().max().item() <= 1e-5
    assert grads.keys() == ref_grads.keys()
    for key, ref in ref_grads.items():
        err = (grads[key] - ref).abs().max().item()
        assert err <= 1e-5 * max(1.0, ref.abs().max().item()), (key, err)


def _fp64_expected(name: str, batch: dict) -> tuple[torch.Tensor, dict]:
    model = build(name).double()
    return logits_and_grads(model, batch)


@pytest.mark.parametrize("name", list(CASES))
def test_patch_parity_bfloat16(name):
    """Whole-model logits and gradients within the shared tolerance rule: the patched bf16 model's
    error against the float64 model is at most about twice the unpatched bf16 model's."""
    batch = inputs(name)
    expected_logits, expected_grads = _fp64_expected(name, batch)
    model = build(name).to(torch.bfloat16)
    eager_logits, eager_grads = logits_and_grads(model, batch)
    hf.patch(model)
    logits, grads = logits_and_grads(model, batch)
    assert_close_to_reference(logits, expected_logits, eager_logits, name=f"{name} logits")
    for key, expected in expected_grads.items():
        assert_close_to_reference(
            grads[key], expected, eager_grads[key], name=f"{name} d{key}", rows=BATCH * SEQ
        )


@pytest.mark.parametrize("name", list(CASES))
def test_patch_parity_autocast_mixed_precision(name):
    """fp32 weights with bf16 activations (CPU autocast): the case where the classes' casting
    rules differ most (Llama returns fp32, Gemma the input dtype, T5 fp32); output dtypes and
    values must match the unpatched model's."""
    batch = inputs(name)
    expected_logits, _ = _fp64_expected(name, batch)
    model = build(name)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager_logits, _ = logits_and_grads(model, batch)
        hf.patch(model)
        logits, _ = logits_and_grads(model, batch)
    assert_close_to_reference(logits, expected_logits, eager_logits, name=f"{name} logits")


def _norm_outputs(model: torch.nn.Module, x_by_name: dict) -> dict:
    return {n: m(x_by_name[n]) for n, m in model.named_modules() if n in x_by_name}


@pytest.mark.parametrize("name", ["llama", "gemma3", "olmo2", "t5"])
# (input, weight): a bf16 model, fp32 weights under bf16 activations, a bf16 model fed fp32.
@pytest.mark.parametrize(
    "dtypes",
    [
        (torch.bfloat16, torch.bfloat16),
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.bfloat16),
    ],
)
def test_patched_norm_follows_each_class_dtype_rules(name, dtypes):
    """Each norm layer alone, for every (input, weight) dtype pair: same output dtype as the
    class's own forward and values within one rounding of the output dtype."""
    x_dtype, w_dtype = dtypes
    model = build(name).to(w_dtype)
    norms = {n: m for n, m in model.named_modules() if hf._convention_of(m, None) is not None}
    xs = {n: torch.randn(3, 5, m.weight.shape[0]).to(x_dtype) for n, m in norms.items()}
    before = {n: x.clone() for n, x in xs.items()}
    ref = _norm_outputs(model, xs)
    hf.patch(model)
    out = _norm_outputs(model, xs)
    for n in norms:
        assert out[n].dtype == ref[n].dtype, (n, out[n].dtype, ref[n].dtype)
        u = torch.finfo(ref[n].dtype).eps
        assert (out[n].double() - ref[n].double()).abs().max() <= 2 * u * ref[n].abs().max()
        assert torch.equal(xs[n], before[n])  # inputs are not modified


def test_unpatch_restores_original_forward_and_outputs():
    model = build("llama")
    batch = inputs("llama")
    ref = model(**batch).logits
    state = {k: v.clone() for k, v in model.state_dict().items()}
    names = hf.patch(model)
    assert all(hf.is_patched(model.get_submodule(n)) for n in names)
    assert hf.patch(model) == names  # idempotent
    model(**batch).logits.sum().backward()
    assert hf.unpatch(model) == names
    assert not any(hf.is_patched(model.get_submodule(n)) for n in names)
    assert all("forward" not in model.get_submodule(n).__dict__ for n in names)
    assert torch.equal(model(**batch).logits, ref)
    # Patching changed no parameter or buffer (values and the state_dict's keys).
    after = model.state_dict()
    assert after.keys() == state.keys() and all(torch.equal(after[k], v) for k, v in state.items())


def test_unpatch_keeps_a_foreign_instance_forward_and_works_on_copies():
    model = build("qwen3")
    norm = model.model.norm
    sentinel = norm.forward.__func__.__get__(norm)  # an instance-level forward set by someone else
    norm.forward = sentinel
    hf.patch(model)
    twin = copy.deepcopy(model)
    assert hf.is_patched(twin.model.norm) and twin.model.norm.forward.__self__ is twin.model.norm
    hf.unpatch(model)
    assert norm.forward is sentinel
    assert hf.unpatch(twin) and not hf.is_patched(twin.model.layers[0].self_attn.q_norm)


def test_patch_classes_before_building():
    batch = inputs("qwen3")
    ref_logits, _ = logits_and_grads(build("qwen3"), batch)
    try:
        names = hf.patch_classes(["transformers.models.qwen3.modeling_qwen3.Qwen3RMSNorm"])
        assert names == ["transformers.models.qwen3.modeling_qwen3.Qwen3RMSNorm"]
        model = build("qwen3")
        assert hf.is_patched(model.model.layers[0].self_attn.k_norm)
        logits, _ = logits_and_grads(model, batch)
        assert (logits - ref_logits).abs().max() <= 1e-5
    finally:
        hf.unpatch_classes()
    assert not hf.is_patched(build("qwen3").model.norm)


def test_patch_classes_default_covers_every_hf_class():
    try:
        names = hf.patch_classes()
        assert set(names) == {k for k, c in hf.CONVENTIONS.items() if not c.model_types}
    finally:
        assert set(hf.unpatch_classes()) == set(names)


def test_errors_are_clear():
    with pytest.raises(ValueError, match="shared by every model"):
        hf.patch_classes([torch.nn.LayerNorm])
    with pytest.raises(ValueError, match="not in the conventions table"):
        hf.patch_classes([torch.nn.Linear])
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        hf.patch("llama")
    # A model without any known norm (nn.LayerNorm outside GPT-2 / GPT-NeoX stays alone).
    with pytest.raises(ValueError, match="no normalization layer of a known class"):
        hf.patch(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)))


def test_patch_warns_about_unknown_norm_classes():
    model = build("llama")

    class MyRMSNorm(torch.nn.Module):
        def forward(self, x):
            return x

    model.model.extra_norm = MyRMSNorm()
    with pytest.warns(UserWarning, match="MyRMSNorm"):
        hf.patch(model)


def test_importing_does_not_import_transformers():
    code = (
        "import sys, rmsnorm, rmsnorm.integrations, rmsnorm.integrations.hf, "
        "rmsnorm.integrations.distributed, rmsnorm.convert; "
        "assert 'transformers' not in sys.modules, 'transformers imported'"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)
