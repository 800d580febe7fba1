"""rmsnorm.integrations.hf: every normalization class of the installed transformers is either
patched with parity or refused with its reason; patched tiny models (built offline from a config)
match the originals in logits and gradients, and stay patched through copies and pickles."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import io
import os
import pickle
import subprocess
import sys
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from torch import nn

from hf_support import current_name
from rmsnorm.integrations import hf, norm_kind
from rmsnorm.integrations.hf import discovery, known_forwards, patching, registry, replacements
from rmsnorm.testing import assert_close_to_reference

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB, BATCH, SEQ = 64, 2, 8
_DEC = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


@dataclass
class Case:
    """A tiny model: config and model classes, config overrides, the norm classes patch must
    patch (short names "model.Class"), and those it must leave alone with a warning."""

    config: str
    model: str
    overrides: dict = field(default_factory=dict)
    patched: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()
    decoder: bool = True  # built on top of _DEC


# head_dim=8 keeps Qwen3 / Gemma q_norm and k_norm at the head size (their interesting case).
CASES = {
    "llama": Case("LlamaConfig", "LlamaForCausalLM", patched=("llama.LlamaRMSNorm",)),
    "mistral": Case("MistralConfig", "MistralForCausalLM", patched=("mistral.MistralRMSNorm",)),
    "mixtral": Case(
        "MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2),
        ("mixtral.MixtralRMSNorm",),
    ),
    "qwen2": Case("Qwen2Config", "Qwen2ForCausalLM", patched=("qwen2.Qwen2RMSNorm",)),
    "qwen3": Case("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=8), ("qwen3.Qwen3RMSNorm",)),
    "qwen3_moe": Case(
        "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
        dict(head_dim=8, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2),
        ("qwen3_moe.Qwen3MoeRMSNorm",),
    ),
    "gemma": Case("GemmaConfig", "GemmaForCausalLM", dict(head_dim=8), ("gemma.GemmaRMSNorm",)),
    "gemma2": Case(
        "Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=8), ("gemma2.Gemma2RMSNorm",)
    ),
    "gemma3": Case(
        "Gemma3TextConfig", "Gemma3ForCausalLM", dict(head_dim=8), ("gemma3.Gemma3RMSNorm",)
    ),
    # Gemma 3n: no offset, and v_norm is built with_scale=False (no weight at all).
    "gemma3n": Case(
        "Gemma3nTextConfig", "Gemma3nForCausalLM",
        dict(
            head_dim=8, num_kv_shared_layers=0, laurel_rank=4, hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=VOCAB, altup_num_inputs=2,
            layer_types=["sliding_attention", "full_attention"],
            activation_sparsity_pattern=[0.0, 0.0],
        ),
        ("gemma3n.Gemma3nRMSNorm",),
    ),
    "phi3": Case("Phi3Config", "Phi3ForCausalLM", patched=("phi3.Phi3RMSNorm",)),
    # OLMo 2's and GPT-OSS's: the weight product in fp32, cast at the end.
    "olmo2": Case("Olmo2Config", "Olmo2ForCausalLM", patched=("olmo2.Olmo2RMSNorm",)),
    "gpt_oss": Case(
        "GptOssConfig", "GptOssForCausalLM",
        dict(head_dim=8, num_local_experts=4, num_experts_per_tok=2), ("gpt_oss.GptOssRMSNorm",),
    ),
    # Llama 4: Llama's casting with ε in `eps`.
    "llama4": Case(
        "Llama4TextConfig", "Llama4ForCausalLM",
        dict(head_dim=8, num_local_experts=2, intermediate_size_mlp=64),
        ("llama4.Llama4TextRMSNorm", "llama4.Llama4TextL2Norm"),
    ),
    # OLMo (1): LayerNorm without parameters. Cohere: LayerNorm without bias; its per-head
    # q_norm / k_norm hold a (heads, head_dim) weight, which the op cannot take: left alone.
    "olmo": Case("OlmoConfig", "OlmoForCausalLM", patched=("olmo.OlmoLayerNorm",)),
    "cohere": Case(
        "CohereConfig", "CohereForCausalLM", dict(use_qk_norm=True),
        ("cohere.CohereLayerNorm",), refused=("cohere.CohereLayerNorm",),
    ),
    "t5": Case(
        "T5Config", "T5ForConditionalGeneration",
        dict(
            vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
            decoder_start_token_id=0, pad_token_id=0,
        ),
        ("t5.T5LayerNorm",), decoder=False,
    ),
    "gpt2": Case(
        "GPT2Config", "GPT2LMHeadModel",
        dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64),
        ("torch.LayerNorm",), decoder=False,
    ),
    "gpt_neox": Case(
        "GPTNeoXConfig", "GPTNeoXForCausalLM",
        dict(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=64,
        ),
        ("torch.LayerNorm",), decoder=False,
    ),
}  # fmt: skip

# The hybrid linear-attention and state-space families, whose mixers normalize with a gated RMSNorm
# (norm, then gate: Qwen3-Next ... LaraMini; gate, then norm, per group: Mamba2 ... Zamba2;
# Falcon-H1 either way). Each is two layers, one of them a linear-attention / Mamba layer, running
# the pure-torch paths (no fla / mamba_ssm kernels here).
_LINEAR = dict(
    linear_num_value_heads=4,
    linear_num_key_heads=2,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    layer_types=["linear_attention", "full_attention"],
)
_SMALL_MOE = dict(
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    shared_expert_intermediate_size=16,
)
_MLA = dict(
    moe_intermediate_size=16,
    num_experts=4,
    num_experts_per_token=2,
    kv_lora_rank=8,
    qk_rope_head_dim=4,
    v_head_dim=8,
    qk_nope_head_dim=4,
    linear_head_dim=8,
    linear_num_heads=4,
    layer_types=["linear_attention", "full_attention"],
    mlp_layer_types=["dense", "sparse"],
    num_key_value_heads=4,
)
_MAMBA = dict(
    mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=2, mamba_d_state=8, mamba_chunk_size=4
)
GATED_CASES = {
    "qwen3_next": Case(
        "Qwen3NextConfig", "Qwen3NextForCausalLM", dict(head_dim=8, **_LINEAR, **_SMALL_MOE),
        ("qwen3_next.Qwen3NextRMSNorm", "qwen3_next.Qwen3NextRMSNormGated"),
    ),
    "qwen3_5": Case(
        "Qwen3_5TextConfig", "Qwen3_5ForCausalLM", dict(head_dim=8, **_LINEAR),
        ("qwen3_5.Qwen3_5RMSNorm", "qwen3_5.Qwen3_5RMSNormGated"),
    ),
    "qwen3_5_moe": Case(
        "Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", dict(head_dim=8, **_LINEAR, **_SMALL_MOE),
        ("qwen3_5_moe.Qwen3_5MoeRMSNorm", "qwen3_5_moe.Qwen3_5MoeRMSNormGated"),
    ),
    # The sigmoid gate (output_gate_type), and Qwen4-Exp's grouped plain norm.
    "qwen4_exp": Case(
        "Qwen4ExpTextConfig", "Qwen4ExpForCausalLM",
        dict(
            head_dim=8, **_LINEAR, **_SMALL_MOE, hc_lowrank=4, ple_embed_dim=8,
            output_gate_type="sigmoid", indexer_n_heads=2, indexer_kv_heads=1,
            indexer_head_dim=8, indexer_budget=8, indexer_compress_ratio=4,
        ),
        ("qwen4_exp.Qwen4ExpTextRMSNorm", "qwen4_exp.Qwen4ExpTextRMSNormGated"),
    ),
    "olmo_hybrid": Case(
        "OlmoHybridConfig", "OlmoHybridForCausalLM", dict(head_dim=8),
        ("olmo_hybrid.OlmoHybridRMSNorm", "olmo_hybrid.OlmoHybridRMSNormGated"),
    ),
    "kimi_linear": Case(
        "KimiLinearConfig", "KimiLinearForCausalLM", _MLA,
        ("kimi_linear.KimiLinearRMSNorm", "kimi_linear.KimiLinearRMSNormGated"),
    ),
    "bailing_hybrid": Case(
        "BailingHybridConfig", "BailingHybridForCausalLM",
        dict(
            _MLA, num_expert_group=1, topk_group=1, layer_group_size=2,
            num_nextn_predict_layers=0,
        ),
        ("bailing_hybrid.BailingHybridRMSNorm", "bailing_hybrid.BailingHybridRMSNormGated"),
    ),
    "lara_mini": Case(
        "LaraMiniConfig", "LaraMiniForCausalLM", dict(head_dim=8, **_LINEAR, **_SMALL_MOE),
        ("lara_mini.LaraMiniRMSNorm", "lara_mini.LaraMiniRMSNormGated"),
    ),
    "mamba2": Case(
        "Mamba2Config", "Mamba2ForCausalLM",
        dict(num_heads=8, head_dim=8, n_groups=2, state_size=8, expand=2, chunk_size=4),
        ("mamba2.Mamba2RMSNorm", "mamba2.MambaRMSNormGated"),
    ),
    "bamba": Case(
        "BambaConfig", "BambaForCausalLM", dict(_MAMBA, attn_layer_indices=[1]),
        ("bamba.BambaRMSNorm", "bamba.BambaRMSNormGated"),
    ),
    "nemotron_h": Case(
        "NemotronHConfig", "NemotronHForCausalLM",
        dict(
            layers_block_type=["linear_attention", "moe", "full_attention", "mlp"],
            num_hidden_layers=4, head_dim=8, ssm_state_size=8, mamba_num_heads=8,
            mamba_head_dim=8, n_groups=2, chunk_size=4, n_routed_experts=4,
            moe_intermediate_size=16, moe_shared_expert_intermediate_size=16,
            use_mamba_kernels=False,
        ),
        ("nemotron_h.NemotronHRMSNorm", "nemotron_h.NemotronHRMSNormGated"),
    ),
    "granitemoehybrid": Case(
        "GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
        dict(
            _MAMBA, layer_types=["linear_attention", "full_attention"], num_local_experts=4,
            shared_intermediate_size=16,
        ),
        ("granitemoehybrid.GraniteMoeHybridRMSNorm",
         "granitemoehybrid.GraniteMoeHybridRMSNormGated"),
    ),
    "zamba2": Case(
        "Zamba2Config", "Zamba2ForCausalLM",
        dict(
            layers_block_type=["linear_attention", "hybrid"], mamba_d_state=8, mamba_ngroups=2,
            n_mamba_heads=8, chunk_size=4, adapter_rank=4, use_mamba_kernels=False,
        ),
        ("zamba2.Zamba2RMSNorm", "zamba2.Zamba2RMSNormGated"),
    ),
    # Falcon-H1: the gated norm is built only with mamba_rms_norm=True; norm, then gate.
    "falcon_h1": Case(
        "FalconH1Config", "FalconH1ForCausalLM",
        dict(_MAMBA, head_dim=8, mamba_d_ssm=64, mamba_rms_norm=True),
        ("falcon_h1.FalconH1RMSNorm", "falcon_h1.FalconH1RMSNormGated"),
    ),
    # AXK2's gated norm is a container (refused, with why); its inner AXK2RMSNorm is patched. Its
    # torch LayerNorm (the indexer's) is left alone: torch's class is patched only in GPT-2 /
    # GPT-NeoX.
    "axk2": Case(
        "AXK2Config", "AXK2ForCausalLM",
        dict(
            _MLA, layer_types=["indexed_attention", "indexed_attention"], q_lora_rank=8,
            n_routed_experts=4, num_experts_per_tok=2, index_head_dim=8, index_n_heads=2,
            head_dim=4, gated_norm_rank=4,
        ),
        ("axk2.AXK2RMSNorm",), refused=("axk2.AXK2GatedRMSNorm", "torch.LayerNorm"),
    ),
}  # fmt: skip
CASES.update(GATED_CASES)


def _qualified(short: str) -> str:
    if short == "torch.LayerNorm":
        return "torch.nn.modules.normalization.LayerNorm"
    model, cls = current_name(short).split(".")
    return f"transformers.models.{model}.modeling_{model}.{cls}"


def _patchable(module: nn.Module, model_type: str | None) -> bool:
    try:
        conv = hf.convention_of(module)
    except ValueError:
        return False
    return not conv.model_types or model_type in conv.model_types


def build(name: str, seed: int = 0) -> nn.Module:
    """A tiny model with random weights; norm weights (and biases) moved away from their init so
    that an offset or a missing weight would show."""
    case = CASES[name]
    kwargs = {**_DEC, **case.overrides} if case.decoder else case.overrides
    if not hasattr(transformers, case.config):
        pytest.skip(f"transformers {transformers.__version__} has no {case.config}")
    torch.manual_seed(seed)
    config = getattr(transformers, case.config)(**kwargs)
    config._attn_implementation = "eager"  # same attention kernel in every dtype
    config._experts_implementation = "eager"  # grouped_mm has no float64 (the expected model)
    model = getattr(transformers, case.model)(config).eval()
    with torch.no_grad():
        for module in model.modules():
            if _patchable(module, model.config.model_type) or "Norm" in type(module).__name__:
                for p in module.parameters(recurse=False):
                    p.copy_(torch.randn_like(p) * 0.5 + (p.mean() if p.numel() else 0))
    return model


def patch_as_expected(name: str, model: nn.Module) -> list[str]:
    """hf.patch, checking that it patched exactly the case's classes and warned about exactly its
    refused ones."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        names = hf.patch(model)
    messages = " ".join(str(w.message) for w in caught if "rmsnorm" in str(w.message))
    refused = CASES[name].refused
    assert all(_qualified(c) in messages for c in refused), messages
    assert bool(messages) == bool(refused), messages
    seen = {registry.qualname(replacements.base_of(type(model.get_submodule(n)))) for n in names}
    assert seen == {_qualified(c) for c in CASES[name].patched}
    return names


def inputs(name: str) -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)
    if name == "t5":
        decoder_ids = torch.randint(3, VOCAB, (BATCH, 5), generator=g)
        return dict(input_ids=ids, decoder_input_ids=decoder_ids)
    return dict(input_ids=ids)


def logits_and_grads(model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    logits = model(**batch).logits
    # A fixed random cotangent: every logit contributes, with its own sign.
    g = torch.Generator().manual_seed(2)
    cot = torch.randn(logits.shape, generator=g, dtype=torch.float64).to(logits.dtype)
    (logits * cot).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads


# ----------------------------------------------------------------------------------------------
# Whole tiny models
# ----------------------------------------------------------------------------------------------
def _class(short: str) -> type | None:
    """The class, or None where the installed transformers predates its model."""
    module, _, name = _qualified(short).rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def test_every_named_convention_and_known_forward_has_a_model_or_class():
    """The whole-model cases cover every named convention; every known forward matches the class
    it was written from (so none of them is mistyped)."""
    classes = [_class(c) for case in CASES.values() for c in case.patched]
    covered = {hf.convention_of(cls) for cls in classes if cls is not None}
    assert set(hf.NAMED_CONVENTIONS.values()) - {hf.NAMED_CONVENTIONS["layer_norm"]} <= covered
    assert hf.CONVENTIONS[_qualified("torch.LayerNorm")] in covered
    by_origin: dict[str, list] = {}
    for origin, conv, _ in known_forwards.KNOWN_FORWARDS:  # a class may have one per release
        by_origin.setdefault(origin, []).append(conv)
    for origin, convs in by_origin.items():
        cls = _class(origin)
        assert cls is not None or origin != "llama.LlamaRMSNorm"
        if cls is None:
            continue
        got = hf.convention_of(cls)
        if hf.recognised_by(cls) == "behaviour":  # a release rewrote it: computes as it did
            assert any(dataclasses.replace(c, eps_attr=got.eps_attr) == got for c in convs), origin
        else:
            assert got in convs, origin


@pytest.mark.parametrize("name", list(CASES))
def test_patch_parity_float32(name):
    model = build(name)
    batch = inputs(name)
    ref_logits, ref_grads = logits_and_grads(model, batch)
    names = patch_as_expected(name, model)
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
    patch_as_expected(name, model)
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
        patch_as_expected(name, model)
        logits, _ = logits_and_grads(model, batch)
    assert_close_to_reference(logits, expected_logits, eager_logits, name=f"{name} logits")


def _norm_outputs(model: nn.Module, x_by_name: dict) -> dict:
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
    norms = {n: m for n, m in model.named_modules() if _patchable(m, None)}
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
    # Same class name, module and repr as before: only the forward differs.
    norm = model.model.norm
    assert type(norm).__name__ == "LlamaRMSNorm" and repr(norm).startswith("LlamaRMSNorm(")
    assert isinstance(norm, transformers.models.llama.modeling_llama.LlamaRMSNorm)
    assert hf.patch(model) == names  # idempotent
    model(**batch).logits.sum().backward()
    assert hf.unpatch(model) == names
    assert not any(hf.is_patched(model.get_submodule(n)) for n in names)
    assert all("forward" not in model.get_submodule(n).__dict__ for n in names)
    assert type(norm) is transformers.models.llama.modeling_llama.LlamaRMSNorm
    assert torch.equal(model(**batch).logits, ref)
    # Patching changed no parameter or buffer (values and the state_dict's keys).
    after = model.state_dict()
    assert after.keys() == state.keys() and all(torch.equal(after[k], v) for k, v in state.items())
    assert b"rmsnorm" not in pickle.dumps(model)  # no trace left


def test_unpatch_keeps_a_foreign_instance_forward_and_works_on_copies():
    model = build("qwen3")
    norm = model.model.norm
    sentinel = norm.forward.__func__.__get__(norm)  # an instance-level forward set by someone else
    norm.forward = sentinel
    hf.patch(model)
    assert hf.is_patched(norm) and "forward" not in norm.__dict__
    twin = copy.deepcopy(model)
    assert hf.is_patched(twin.model.norm) and twin.model.norm.forward.__self__ is twin.model.norm
    hf.unpatch(model)
    assert norm.forward is sentinel
    assert hf.unpatch(twin) and not hf.is_patched(twin.model.layers[0].self_attn.q_norm)


# ----------------------------------------------------------------------------------------------
# Copies, pickles, spawned processes
# ----------------------------------------------------------------------------------------------
def _round_trip(model: nn.Module, how: str) -> nn.Module:
    if how == "pickle":
        return pickle.loads(pickle.dumps(model))
    if how == "deepcopy":
        return copy.deepcopy(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


@pytest.mark.parametrize("how", ["pickle", "deepcopy", "torch.save"])
def test_a_patched_model_stays_patched_through_copies_and_pickles(how):
    model = build("qwen3")
    batch = inputs("qwen3")
    ref = model(**batch).logits
    names = hf.patch(model)
    twin = _round_trip(model, how)
    assert all(hf.is_patched(twin.get_submodule(n)) for n in names)
    # No bound method stored in any module (which would pin a forward past unpatch/patch_classes).
    assert not any("forward" in m.__dict__ for m in twin.modules())
    assert type(twin.model.norm).__name__ == "Qwen3RMSNorm"
    assert torch.equal(twin(**batch).logits, model(**batch).logits)
    assert hf.unpatch(twin) == names
    assert type(twin.model.norm) is transformers.models.qwen3.modeling_qwen3.Qwen3RMSNorm
    assert torch.equal(twin(**batch).logits, ref)


def test_patch_classes_reaches_an_unpickled_model():
    model = build("qwen3")
    hf.patch(model)
    twin = pickle.loads(pickle.dumps(model))
    hf.unpatch(twin)
    norms = [m for m in twin.modules() if "RMSNorm" in type(m).__name__]
    assert norms and not any(hf.is_patched(m) for m in norms)
    try:
        hf.patch_classes(["qwen3"])
        assert all(hf.is_patched(m) for m in norms)
    finally:
        hf.unpatch_classes()


def test_a_patched_model_loads_patched_in_a_fresh_process(tmp_path):
    """What a spawned worker sees: torch.load in a new interpreter rebuilds the patched classes."""
    model = build("qwen3")
    names = hf.patch(model)
    torch.save(model, tmp_path / "model.pt")
    code = (
        "import sys, torch; from rmsnorm.integrations import hf; "
        f"m = torch.load({str(tmp_path / 'model.pt')!r}, weights_only=False); "
        f"names = {names!r}; "
        "assert all(hf.is_patched(m.get_submodule(n)) for n in names); "
        "assert not any('forward' in x.__dict__ for x in m.modules()); print('ok')"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, timeout=300, capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_save_pretrained_of_a_patched_model_loads_in_plain_transformers(tmp_path):
    model = build("gemma3n")
    batch = inputs("gemma3n")
    ref = model(**batch).logits
    hf.patch(model)
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, attn_implementation="eager"
    ).eval()
    assert not any(hf.is_patched(m) for m in loaded.modules())
    assert torch.equal(loaded(**batch).logits, ref)


def test_compile_of_a_patched_model_has_no_graph_break():
    model = build("qwen3")
    hf.patch(model)
    explanation = torch._dynamo.explain(model)(**inputs("qwen3"))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    norm = model.model.layers[0].self_attn.q_norm
    compiled = torch.compile(norm, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 3, 4, 8)
    assert torch.equal(compiled(x), norm(x))


# ----------------------------------------------------------------------------------------------
# Classes, registration, recognition
# ----------------------------------------------------------------------------------------------
def test_patch_classes_before_building():
    batch = inputs("qwen3")
    ref_logits, _ = logits_and_grads(build("qwen3"), batch)
    try:
        names = hf.patch_classes(["transformers.models.qwen3.modeling_qwen3.Qwen3RMSNorm"])
        assert names == ["transformers.models.qwen3.modeling_qwen3.Qwen3RMSNorm"]
        model = build("qwen3")
        assert hf.is_patched(model.model.layers[0].self_attn.k_norm)
        assert hf.patch(model)  # counts the class-patched norms, changes nothing
        logits, _ = logits_and_grads(model, batch)
        assert (logits - ref_logits).abs().max() <= 1e-5
    finally:
        hf.unpatch_classes()
    assert not hf.is_patched(build("qwen3").model.norm)


def test_patch_classes_by_model_name_and_default_covers_every_recognised_class():
    mixtral = "transformers.models.mixtral.modeling_mixtral.MixtralRMSNorm"
    try:
        assert hf.patch_classes(["mixtral"]) == [mixtral]
    finally:
        assert hf.unpatch_classes(["mixtral"]) == [mixtral]
    expected = {registry.qualname(cls) for cls in _recognised_classes() if not _shared(cls)}
    try:
        names = hf.patch_classes()
        assert set(names) == expected
    finally:
        assert set(hf.unpatch_classes()) == expected


def _shared(cls: type) -> bool:
    return bool(hf.convention_of(cls).model_types)


class T5LikeNorm(nn.Module):
    """T5LayerNorm's computation written another way: known only through hf.register."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d))
        self.variance_epsilon = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = torch.rsqrt(x.float().square().mean(-1, keepdim=True) + self.variance_epsilon)
        xhat = x * r
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            xhat = xhat.to(self.weight.dtype)
        return self.weight * xhat


def test_conventions_hold_only_real_casting_modes():
    """T5LayerNorm's rule is a variant of the llama casting mode, not a casting mode of its own;
    register(cls, "t5") still names it."""
    from rmsnorm.reference import CASTING_MODES

    known = [conv for _, conv, _ in known_forwards.KNOWN_FORWARDS]
    for conv in [*hf.NAMED_CONVENTIONS.values(), *hf.CONVENTIONS.values(), *known]:
        assert conv.casting_mode in CASTING_MODES, conv
    t5 = hf.NAMED_CONVENTIONS["t5"]
    assert (t5.kind, t5.casting_mode, t5.cast_to_weight) == ("rms", "llama", True)
    with pytest.raises(ValueError, match="'t5' is not a casting mode.*cast_to_weight=True"):
        hf.Convention("rms", "variance_epsilon", "t5")
    with pytest.raises(ValueError, match="variant of casting_mode='llama'"):
        hf.Convention("rms", "eps", "gemma", cast_to_weight=True)
    with pytest.raises(ValueError, match="variant of casting_mode='llama'"):
        hf.Convention("layer", "eps", cast_to_weight=True)
    with pytest.raises(ValueError, match="needs weight=True"):
        hf.Convention("rms", "eps", "llama", cast_to_weight=True, weight=False)
    with pytest.raises(ValueError, match="cast_to_weight must be True or False"):
        hf.Convention("rms", "eps", "llama", cast_to_weight=1)

    hf.register(T5LikeNorm, "t5")
    assert hf.convention_of(T5LikeNorm) is t5
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(0))
    for weight_dtype in (torch.bfloat16, torch.float32):
        module = T5LikeNorm(16).to(weight_dtype)
        ref = copy.deepcopy(module)
        assert hf.patch(module) == [""]
        with torch.no_grad():
            y, y_ref = module(x), ref(x)
        assert y.dtype == y_ref.dtype == weight_dtype  # the output follows the weight
        torch.testing.assert_close(y, y_ref)

    class T5FixedEps(T5LikeNorm):  # ε fixed by the convention, no attribute
        pass

    hf.register(T5FixedEps, hf.Convention("rms", None, "llama", eps=1e-6, cast_to_weight=True))
    module = T5FixedEps(16)
    ref = copy.deepcopy(module)
    hf.patch(module)
    with torch.no_grad():
        torch.testing.assert_close(module(x), ref(x))


def test_errors_are_clear():
    with pytest.raises(ValueError, match="shared by every model"):
        hf.patch_classes([nn.LayerNorm])
    with pytest.raises(ValueError, match=r"torch\.nn\.modules\.linear\.Linear is not patched"):
        hf.patch_classes([nn.Linear])
    with pytest.raises(ValueError, match="neither a class nor a model"):
        hf.patch_classes(["no_such_model"])
    with pytest.raises(TypeError, match="a list of classes or names"):
        hf.patch_classes("llama")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        hf.patch("llama")
    # A model without any known norm (nn.LayerNorm outside GPT-2 / GPT-NeoX stays alone).
    with pytest.raises(ValueError, match="no normalization layer of a known class.*replace_norms"):
        hf.patch(nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)))
    with pytest.raises(ValueError, match="casting_mode"):
        hf.Convention("rms", "eps", "bogus")
    with pytest.raises(ValueError, match="eps must be a number when eps_attr is None"):
        hf.Convention("rms", None)
    with pytest.raises(ValueError, match="needs weight=True"):
        hf.Convention("rms", "eps", offset=1.0, weight=False)
    with pytest.raises(ValueError, match="convention must be"):
        hf.register(LlamaCopyNorm, "bogus")
    with pytest.raises(TypeError, match="cls must be"):
        hf.register("LlamaCopyNorm", "llama")
    with pytest.raises(TypeError, match="torch.nn.Module subclass"):
        hf.register(int, "llama")


def test_patch_warns_about_unknown_norm_classes():
    model = build("llama")

    class MyRMSNorm(nn.Module):
        def forward(self, x):
            return x

    model.model.extra_norm = MyRMSNorm()
    with pytest.warns(
        UserWarning,
        match="MyRMSNorm: its forward is none of the known normalization forwards, and the "
        "behaviour probe cannot tell",
    ):
        hf.patch(model)


class LlamaCopyNorm(nn.Module):
    """A norm of one's own, written like LlamaRMSNorm (other names, a docstring, annotations)."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize."""
        dtype = x.dtype
        x = x.to(torch.float32)
        ms = x.pow(2).mean(-1, keepdim=True)  # the mean square
        x = x * torch.rsqrt(ms + self.variance_epsilon)
        return self.weight * x.to(dtype)


class EpsRenamedNorm(LlamaCopyNorm):
    def forward(self, x):  # ε read from another attribute: not Llama's forward
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class ConstantChangedNorm(LlamaCopyNorm):
    def forward(self, x):  # mean over dim -2
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-2, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


class PropertyEpsNorm(LlamaCopyNorm):
    @property
    def variance_epsilon(self):
        return 0.5

    @variance_epsilon.setter
    def variance_epsilon(self, value):
        pass


def test_recognition_is_by_code_and_refuses_any_difference():
    assert hf.convention_of(LlamaCopyNorm) == hf.NAMED_CONVENTIONS["llama"]
    for cls, why in [
        (EpsRenamedNorm, "none of the"),
        (ConstantChangedNorm, "none of the"),
        (PropertyEpsNorm, "reads self.variance_epsilon through a property"),
    ]:
        with pytest.raises(ValueError, match=f"{cls.__qualname__} is not patched: .*{why}"):
            hf.convention_of(cls)
    # The same code reading another `torch` is not the known forward.
    shadow = type("Shadow", (LlamaCopyNorm,), {})
    fake_torch = types.SimpleNamespace(float32=torch.float32, rsqrt=torch.rsqrt)
    shadow.forward = type(LlamaCopyNorm.forward)(
        LlamaCopyNorm.forward.__code__, {"torch": fake_torch}
    )
    with pytest.raises(ValueError, match="reads the global 'torch'"):
        hf.convention_of(shadow)
    # A gated norm: two inputs.
    gated = type("GatedRMSNorm", (nn.Module,), {"forward": lambda self, x, gate: x})
    with pytest.raises(ValueError, match="takes x, gate besides self"):
        hf.convention_of(gated)


def test_a_class_whose_forward_is_replaced_is_decided_again():
    cls = type("SwappedNorm", (LlamaCopyNorm,), {})
    assert hf.convention_of(cls) == hf.NAMED_CONVENTIONS["llama"]
    cls.forward = EpsRenamedNorm.forward
    with pytest.raises(ValueError, match="SwappedNorm is not patched: its forward is none of"):
        hf.convention_of(cls)


def test_register_wins_over_recognition(monkeypatch):
    monkeypatch.setattr(registry, "_registered_classes", {})
    monkeypatch.setattr(registry, "_registered_names", {})
    model = nn.Sequential(LlamaCopyNorm(8), EpsRenamedNorm(8))
    with pytest.warns(UserWarning, match="EpsRenamedNorm"):
        assert hf.patch(model) == ["0"]
    hf.unpatch(model)
    model[1].eps = 1e-5
    hf.register(EpsRenamedNorm, hf.Convention("rms", "eps", "llama"))
    hf.register(f"{LlamaCopyNorm.__module__}.{LlamaCopyNorm.__qualname__}", "olmo2")
    assert hf.patch(model) == ["0", "1"]
    assert model[0].forward._rmsnorm_convention == hf.NAMED_CONVENTIONS["olmo2"]
    x = torch.randn(3, 8)
    ref = EpsRenamedNorm.forward(model[1], x)
    assert (model[1](x) - ref).abs().max() <= 1e-6
    hf.unpatch(model)
    hf.register(LlamaCopyNorm, None)  # a class wins over its name; None: never patched
    with pytest.raises(ValueError, match="LlamaCopyNorm is not patched: it is registered as not"):
        hf.convention_of(LlamaCopyNorm)
    with pytest.warns(UserWarning, match="LlamaCopyNorm: it is registered as not to be patched"):
        assert hf.patch(model) == ["1"]


def test_an_instance_the_op_cannot_run_is_left_alone_with_its_reason():
    norm = LlamaCopyNorm(8)
    norm.weight = nn.Parameter(torch.ones(2, 8))  # broadcast per row pair: not a 1-D weight
    with pytest.raises(ValueError, match=r"LlamaCopyNorm is not patched: its weight is \[2, 8\]"):
        hf.convention_of(norm)
    norm.weight = nn.Parameter(torch.ones(8))
    norm.variance_epsilon = torch.tensor(1e-6)
    with pytest.raises(ValueError, match="its variance_epsilon is tensor"):
        hf.convention_of(norm)


def test_norm_parameters_finds_recognised_classes():
    from rmsnorm.integrations.distributed import norm_parameters

    model = build("qwen3_moe")
    expected = {id(m.weight) for m in model.modules() if type(m).__name__ == "Qwen3MoeRMSNorm"}
    assert expected and {id(p) for p in norm_parameters(model)} == expected


def test_importing_does_not_import_transformers():
    code = (
        "import sys, rmsnorm, rmsnorm.integrations, rmsnorm.integrations.hf, "
        "rmsnorm.integrations.distributed, rmsnorm.convert; "
        "assert 'transformers' not in sys.modules, 'transformers imported'"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


# ----------------------------------------------------------------------------------------------
# The sweep: every normalization class of the installed transformers, one modeling module per
# test (collection lists the files without importing them; each test imports its own module, so
# pytest-xdist spreads the imports).
# ----------------------------------------------------------------------------------------------
MODELING = discovery.modeling_module_names()
WIDTH = 24  # not a power of two
EPS = 0.1  # large enough that where and how ε enters shows in the output
_WIDTH_ARGS = frozenset(
    {
        "hidden_size",
        "dim",
        "size",
        "c_in",
        "normalized_shape",
        "num_features",
        "d_model",
        "hidden_dim",
        "embed_dim",
        "num_channels",
    }
)

# Families users hit first (each raised "no normalization layer of a known class" with only the
# table of 11 classes); skipped where the installed transformers predates the model.
_FAMILIES = [
    "qwen3_moe.Qwen3MoeRMSNorm",
    "deepseek_v3.DeepseekV3RMSNorm",
    "mistral3.Mistral3RMSNorm",
    "gpt_oss.GptOssRMSNorm",
    "smollm3.SmolLM3RMSNorm",
    "granite.GraniteRMSNorm",
    "llama4.Llama4TextRMSNorm",
    "qwen2_5_vl.Qwen2_5_VLRMSNorm",
    "glm4.Glm4RMSNorm",
    "olmo3.Olmo3RMSNorm",
    "gemma3n.Gemma3nRMSNorm",
    "cohere.CohereLayerNorm",
]


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as exc:  # an optional dependency of that model (e.g. torchaudio)
        pytest.skip(f"{name}: {exc}")


def _norm_classes(module) -> list[type]:
    """The classes of ``module`` named like a norm, and any other that patch would patch."""
    return [
        cls
        for cls in discovery.module_classes(module)
        if "norm" in cls.__name__.lower() or isinstance(registry.decide(cls), hf.Convention)
    ]


def _recognised_classes() -> list[type]:
    found = []
    for name in MODELING:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        found += [c for c in _norm_classes(module) if isinstance(registry.decide(c), hf.Convention)]
    return found


# Options of the grouped and gated norms, with the values to build them with at WIDTH: a required
# one takes the first value, an optional one is also built once with each value.
_OPTION_VALUES = {"group_size": [8, WIDTH], "n_groups": [3], "activation": ["sigmoid", "swish"]}


def _constructions(cls: type) -> list[dict] | None:
    """Keyword arguments that build ``cls`` at WIDTH (one set, plus one per boolean option
    flipped, e.g. Gemma 3n's with_scale, and one per value of a group or activation option), or
    None when an argument is not a width, ε, flag or such an option."""
    try:
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    base, variants = {}, []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name in _WIDTH_ARGS:
            base[p.name] = WIDTH
        elif p.name == "eps":
            base["eps"] = EPS
        elif isinstance(p.default, bool):
            variants.append({p.name: not p.default})
        elif p.name in _OPTION_VALUES:
            values = _OPTION_VALUES[p.name]
            if p.default is p.empty:
                base[p.name] = values[0]
                values = values[1:]
            variants += [{p.name: v} for v in values]
        elif p.default is p.empty:
            return None
    return [base] + [{**base, **v} for v in variants]


def _x(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, WIDTH, generator=g, dtype=torch.float64)
    # rows where ε matters (RMS ≈ 0.4 against ε = 0.1) and rows where it does not; the +0.4 gives
    # each row a mean, so that LayerNorm and RMSNorm differ.
    scale = torch.tensor([0.05, 0.3, 1.0, 2.0, 4.0, 0.5], dtype=torch.float64).view(2, 3, 1)
    return (x * scale + 0.4).to(dtype)


def _randomize(module: nn.Module) -> None:
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            if t.is_floating_point():
                t.copy_(torch.randn(t.shape, generator=g) * 0.5 + 0.8)


def _z(dtype: torch.dtype) -> torch.Tensor:
    """A gate of _x's shape: silu(z) from −0.28 to ~9, the sigmoid from ~0 to ~1."""
    g = torch.Generator().manual_seed(6)
    return (torch.randn(2, 3, WIDTH, generator=g, dtype=torch.float64) * 3).to(dtype)


def _run(module: nn.Module, *inputs: torch.Tensor) -> tuple[torch.Tensor, dict]:
    leaves = [t.clone().requires_grad_(True) for t in inputs]
    y = module(*leaves)
    g = torch.Generator().manual_seed(4)
    cot = torch.randn(y.shape, generator=g, dtype=torch.float64).to(y.dtype)
    (y * cot).sum().backward()
    names = ["input", "gate"][: len(leaves)]
    grads = {k: t.grad for k, t in zip(names, leaves, strict=True)}
    grads.update({n: p.grad for n, p in module.named_parameters()})
    module.zero_grad(set_to_none=True)
    return y.detach(), grads


def _gate_cases(conv: hf.Convention) -> list[bool]:
    """Whether to pass a gate: always for a gated class; also without one where it is optional."""
    if conv.gate is None:
        return [False]
    return [True, False] if conv.gate == "optional" else [True]


def _check_parity(cls: type, module: nn.Module, conv: hf.Convention, label: str) -> None:
    _randomize(module)
    ref = copy.deepcopy(module)  # keeps the class's own forward
    assert norm_kind(ref) == conv.kind, label  # "is this a norm layer?" has one answer
    assert hf.patch(module) == [""], label
    assert hf.is_patched(module) and type(module).__name__ == cls.__name__, label
    for gated in _gate_cases(conv):
        _check_values(module, ref, gated, f"{label}{' gated' if gated else ''}")


def _check_values(module: nn.Module, ref: nn.Module, gated: bool, label: str) -> None:
    # float32: values and gradients (of the input, the gate and every parameter).
    inputs = [_x(torch.float32), _z(torch.float32)][: 1 + gated]
    before = [t.clone() for t in inputs]
    (y, grads), (y_ref, grads_ref) = _run(module, *inputs), _run(ref, *inputs)
    assert all(torch.equal(a, b) for a, b in zip(inputs, before, strict=True)), label
    assert y.dtype == y_ref.dtype, label
    assert (y - y_ref).abs().max().item() <= 1e-5, (label, (y - y_ref).abs().max().item())
    assert grads.keys() == grads_ref.keys(), label
    for key, g_ref in grads_ref.items():
        if g_ref is None:
            assert grads[key] is None, (label, key)
            continue
        err = (grads[key] - g_ref).abs().max().item()
        assert err <= 1e-5 * max(1.0, g_ref.abs().max().item()), (label, key, err)
    # bfloat16: a bf16 module, and fp32 weights with bf16 inputs (autocast's case).
    half = [_x(torch.bfloat16), _z(torch.bfloat16)][: 1 + gated]
    for weights in (torch.bfloat16, torch.float32):
        expected = copy.deepcopy(ref).to(weights).double()(*[t.double() for t in half])
        eager = copy.deepcopy(ref).to(weights)(*half)
        out = copy.deepcopy(module).to(weights)(*half)
        assert out.dtype == eager.dtype, (label, weights, out.dtype, eager.dtype)
        assert_close_to_reference(out.detach(), expected, eager.detach(), name=f"{label} {weights}")


def _check_refused(cls: type) -> None:
    qualname = registry.qualname(cls)
    with pytest.raises(ValueError) as info:
        hf.convention_of(cls)
    message = str(info.value)
    assert message.startswith(f"{qualname} is not patched: "), message
    assert len(message.split(" is not patched: ", 1)[1]) >= 15, message
    builds = _constructions(cls)
    if builds is None:
        return
    try:
        instance = cls(**builds[0])
    except Exception:  # an argument the heuristics cannot fill: the class-level check suffices
        return
    if not patching.looks_like_norm(instance):
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            hf.patch(instance)
            said = " ".join(str(w.message) for w in caught)
        except ValueError as exc:
            said = str(exc)
    assert f"{qualname}: " in said, said
    assert not hf.is_patched(instance)


def test_the_sweep_sees_the_installed_transformers():
    assert len(MODELING) >= 100 and all(".modeling_" in n for n in MODELING)
    for short in _FAMILIES:
        model, name = short.split(".")
        qualified = f"transformers.models.{model}.modeling_{model}.{name}"
        if f"transformers.models.{model}.modeling_{model}" in MODELING:
            cls = getattr(importlib.import_module(qualified.rpartition(".")[0]), name)
            assert isinstance(hf.convention_of(cls), hf.Convention), qualified


@pytest.mark.parametrize("module_name", MODELING, ids=lambda n: n.split(".", 2)[2])
def test_every_norm_class_is_patched_with_parity_or_refused(module_name):
    module = _import(module_name)
    for cls in _norm_classes(module):
        try:
            conv = hf.convention_of(cls)
        except ValueError:
            _check_refused(cls)
            continue
        builds = _constructions(cls)
        assert builds is not None, f"cannot build {registry.qualname(cls)} to check its parity"
        for kwargs in builds:
            instance = cls(**kwargs)
            label = f"{registry.qualname(cls)}({kwargs})"
            try:
                instance_conv = hf.convention_of(instance)
            except ValueError as exc:  # e.g. a weight the op cannot take: refused, with why
                assert registry.qualname(cls) in str(exc)
                continue
            assert instance_conv == conv
            _check_parity(cls, instance, conv, label)
