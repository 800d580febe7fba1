"""rmsnorm.integrations.hf on the gated and grouped norms: ``generate()`` of every tiny gated family
patched against unpatched, the optional and required gate, Falcon-H1's ranks, float64 inputs,
recognition of respelled and altered gated forwards, the per-instance refusals (an unknown
activation, xLSTM's half-precision reductions), AXK2's container, copies and pickles, compile.

The whole-model logits and gradients of the gated families (float32, bfloat16, autocast) and the
class-by-class sweep are in tests/integrations/test_hf.py, whose models and helpers this reuses."""

from __future__ import annotations

import copy
import types
import warnings

import pytest
import torch
from torch import nn

import rmsnorm
from hf_support import current_class, current_name
from rmsnorm import reference as ref
from rmsnorm.integrations import hf, norm_kind
from rmsnorm.testing import assert_close_to_reference

transformers = pytest.importorskip("transformers")
from test_hf import (  # noqa: E402  (the shared tiny models; after the skip)
    GATED_CASES,
    _round_trip,
    build,
    inputs,
    patch_as_expected,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N, EPS = 24, 0.1


def _cls(short: str) -> type:
    return current_class(short)


def _MAMBA2_GATED() -> str:  # noqa: N802 (a name that a release changed)
    return current_name("mamba2.MambaRMSNormGated").split(".")[1]


def _data(dtype: torch.dtype, shape=(2, 3, N)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(*shape, generator=g, dtype=torch.float64) + 0.4
    z = torch.randn(*shape, generator=g, dtype=torch.float64) * 3
    return x.to(dtype), z.to(dtype)


def _randomized(module: nn.Module) -> nn.Module:
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5 + 0.8)
    return module


def _patched_pair(module: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(patched module, a copy running the class's own forward)."""
    theirs = copy.deepcopy(module)
    assert hf.patch(module) == [""]
    return module, theirs


# ------------------------------------------------------------------------------------------------
# generate()
# ------------------------------------------------------------------------------------------------
NEW_TOKENS = 6


def _generate(model: nn.Module, ids: torch.Tensor, forced: torch.Tensor | None = None):
    """Greedy generate(); ``forced`` (the sequences of another run) makes every step pick its
    token, so that the raw logits of two models are compared on the same cached path."""
    allowed = None
    if forced is not None:

        def allowed(batch: int, sequence: torch.Tensor) -> list[int]:
            return [int(forced[batch, sequence.shape[0]])]

    out = model.generate(
        ids,
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        prefix_allowed_tokens_fn=allowed,
        pad_token_id=0,
    )
    return out.sequences, torch.stack(out.logits, 1)


@pytest.mark.parametrize("name", list(GATED_CASES))
def test_generate_float32_matches_the_unpatched_model(name):
    """Prefill and every cached decoding step (one token per sequence through the mixers' cached
    paths) give the unpatched model's tokens, with logits within 1e-5."""
    model = build(name)
    ids = inputs(name)["input_ids"]
    with torch.no_grad():
        seq_ref, logits_ref = _generate(model, ids)
        patch_as_expected(name, model)
        seq, logits = _generate(model, ids)
    assert torch.equal(seq, seq_ref)
    assert (logits - logits_ref).abs().max().item() <= 1e-5


@pytest.mark.parametrize("name", ["qwen3_next", "kimi_linear", "mamba2", "falcon_h1", "zamba2"])
def test_generate_bfloat16_within_the_tolerance_rule(name):
    """bf16: the patched model generates; on its tokens, the unpatched bf16 model (the eager
    error) and the float64 one are forced along the same cached path, and every step's logits
    are within the shared tolerance rule."""
    ids = inputs(name)["input_ids"]
    model = build(name).to(torch.bfloat16)
    patch_as_expected(name, model)
    with torch.no_grad():
        seq, logits = _generate(model, ids)
        hf.unpatch(model)
        seq_eager, eager = _generate(model, ids, forced=seq)
        seq64, expected = _generate(build(name).double(), ids, forced=seq)
    assert torch.equal(seq_eager, seq) and torch.equal(seq64, seq)
    assert_close_to_reference(logits, expected, eager, name=f"{name} generate logits")


# ------------------------------------------------------------------------------------------------
# The gate: optional (Mamba2 family, Falcon-H1) or required
# ------------------------------------------------------------------------------------------------
_REQUIRED = [
    "qwen3_next.Qwen3NextRMSNormGated",  # forward(hidden_states, gate)
    "kimi_linear.KimiLinearRMSNormGated",  # forward(hidden_states, gate=None), fails on None
    "lara_mini.LaraMiniRMSNormGated",
]


@pytest.mark.parametrize("short", _REQUIRED)
def test_a_required_gate_missing_is_an_error_as_in_the_class(short):
    patched, theirs = _patched_pair(_cls(short)(N, eps=EPS))
    x, z = _data(torch.float32)
    with pytest.raises((TypeError, AttributeError)):
        theirs(x)
    with pytest.raises(TypeError, match=r"needs a gate.*got gate=None"):
        patched(x)
    with pytest.raises(TypeError, match="needs a gate"):
        patched(x, gate=None)
    torch.testing.assert_close(patched(x, gate=z), theirs(x, gate=z), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "module",
    [
        lambda: _cls("mamba2.MambaRMSNormGated")(N, group_size=8, eps=EPS),
        lambda: _cls("falcon_h1.FalconH1RMSNormGated")(N, eps=EPS, n_groups=3),
    ],
    ids=["mamba2", "falcon_h1"],
)
def test_an_optional_gate_of_none_is_the_grouped_norm(module):
    patched, theirs = _patched_pair(_randomized(module()))
    x, _ = _data(torch.float32)
    y = patched(x)
    torch.testing.assert_close(y, theirs(x), rtol=0, atol=1e-5)
    torch.testing.assert_close(patched(x, None), y, rtol=0, atol=0)
    w = patched.weight
    grouped = rmsnorm.rms_norm(x, N, w, EPS, group_size=8)  # Falcon-H1's convention
    if "Mamba" in type(patched).__name__:  # x̂ cast to the input dtype, then × weight
        grouped = rmsnorm.rms_norm(x, N, w, EPS, group_size=8, casting_mode="llama")
    assert torch.equal(y, grouped)


# ------------------------------------------------------------------------------------------------
# Falcon-H1: 2-D and 3-D inputs only, n_groups dividing the width
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(N,), (2, 3, 4, N)], ids=["1-D", "4-D"])
def test_falcon_h1_refuses_the_ranks_its_forward_refuses(shape):
    patched, theirs = _patched_pair(_cls("falcon_h1.FalconH1RMSNormGated")(N, eps=EPS, n_groups=3))
    x, z = _data(torch.float32, shape)
    with pytest.raises(ValueError):
        theirs(x, z)
    with pytest.raises(ValueError, match=r"FalconH1RMSNormGated takes 2-D or 3-D hidden_states"):
        patched(x, z)
    with pytest.raises(ValueError, match="2-D or 3-D"):
        patched(x)


def test_falcon_h1_n_groups_must_divide_the_width():
    module = _cls("falcon_h1.FalconH1RMSNormGated")(N, eps=EPS, n_groups=5)
    with pytest.raises(ValueError, match=r"is not patched: its n_groups 5 does not divide .* 24"):
        hf.convention_of(module)
    module.n_groups = 3
    hf.patch(module)
    module.n_groups = 5  # changed after patching: the forward says why, as the class fails too
    x, z = _data(torch.float32)
    with pytest.raises(ValueError, match=r"hidden_states \(24\) is not divisible"):
        module(x, z)


# ------------------------------------------------------------------------------------------------
# float64 inputs: the classes compute them in float32, the patched op in float64
# ------------------------------------------------------------------------------------------------
_F64 = [
    ("qwen3_next.Qwen3NextRMSNormGated", {}, dict(casting_mode="llama")),
    ("kimi_linear.KimiLinearRMSNormGated", {}, dict(activation="sigmoid")),
    (
        "mamba2.MambaRMSNormGated",
        {"group_size": 8},
        dict(casting_mode="llama", norm_before_gate=False, group_size=8),
    ),
    ("falcon_h1.FalconH1RMSNormGated", {"n_groups": 3}, dict(group_size=8)),
]


@pytest.mark.parametrize("short, build_kw, options", _F64, ids=[c[0] for c in _F64])
def test_float64_inputs_are_computed_in_float64(short, build_kw, options):
    """Same output dtype as the class; the values are the float64 spec's (the class's differ
    from it at float32's rounding, ~1e-7 relative)."""
    patched, theirs = _patched_pair(_randomized(_cls(short)(N, eps=EPS, **build_kw)).double())
    x, z = _data(torch.float64)
    y, y_theirs = patched(x, z), theirs(x, z)
    assert y.dtype == y_theirs.dtype == torch.float64
    exact = ref.gated_rms_norm(x, z, patched.weight.detach(), EPS, **options)
    scale = exact.abs().max().item()
    assert (y - exact).abs().max().item() <= 1e-13 * scale
    err_theirs = (y_theirs - exact).abs().max().item()
    assert 1e-10 * scale < err_theirs <= 1e-6 * scale  # float32 arithmetic in the class


# ------------------------------------------------------------------------------------------------
# Recognition by code
# ------------------------------------------------------------------------------------------------
class MyGatedNorm(nn.Module):
    """The Mamba2 family's gated norm, spelled another way (names, annotations, comments)."""

    def __init__(self, d: int, group_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d))
        self.variance_epsilon = eps
        self.group_size = group_size

    def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        """Gate, then normalize each group."""
        dtype = x.dtype
        x = x.to(torch.float32)
        if z is not None:
            x = x * nn.functional.silu(z.to(torch.float32))  # the gate first
        *lead, n = x.shape
        groups = n // self.group_size
        xg = x.view(*lead, groups, self.group_size)
        ms = xg.pow(2).mean(-1, keepdim=True)
        xg = xg * torch.rsqrt(ms + self.variance_epsilon)
        x = xg.view(*lead, groups * self.group_size)
        return self.weight * x.to(dtype)


class SigmoidGatedNorm(MyGatedNorm):
    def forward(self, x, z=None):  # one token changed: the gate's activation
        dtype = x.dtype
        x = x.to(torch.float32)
        if z is not None:
            x = x * nn.functional.sigmoid(z.to(torch.float32))
        *lead, n = x.shape
        groups = n // self.group_size
        xg = x.view(*lead, groups, self.group_size)
        ms = xg.pow(2).mean(-1, keepdim=True)
        xg = xg * torch.rsqrt(ms + self.variance_epsilon)
        x = xg.view(*lead, groups * self.group_size)
        return self.weight * x.to(dtype)


def test_a_respelled_gated_forward_is_recognised_and_a_changed_one_refused():
    assert hf.convention_of(MyGatedNorm) == hf.NAMED_CONVENTIONS["mamba2_gated"]
    assert norm_kind(MyGatedNorm(N, 8)) == "rms"
    module = MyGatedNorm(N, 8, eps=EPS)
    theirs = copy.deepcopy(module)
    assert hf.patch(module) == [""]
    x, z = _data(torch.float32)
    torch.testing.assert_close(module(x, z), theirs(x, z), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="takes x, z besides self and is none of the known gated"):
        hf.convention_of(SigmoidGatedNorm)
    assert norm_kind(SigmoidGatedNorm(N, 8)) is None


def test_a_gated_forward_reading_another_act2fn_is_refused():
    cls = _cls("qwen3_next.Qwen3NextRMSNormGated")
    forward = cls.forward
    fake = types.FunctionType(forward.__code__, {**forward.__globals__, "ACT2FN": {}})
    shadow = type("Qwen3NextRMSNormGated", (cls,), {"forward": fake})
    with pytest.raises(ValueError, match="reads the global 'ACT2FN'"):
        hf.convention_of(shadow)


@pytest.mark.parametrize(
    "activation, expected", [("silu", "silu"), ("swish", "silu"), ("sigmoid", "sigmoid")]
)
def test_the_gate_activation_is_read_per_instance(activation, expected):
    module = _randomized(_cls("qwen4_exp.Qwen4ExpTextRMSNormGated")(N, eps=EPS))
    module.activation = activation  # what config.output_gate_type / hidden_act set
    patched, theirs = _patched_pair(module)
    x, z = _data(torch.float32)
    y = patched(x, z)
    torch.testing.assert_close(y, theirs(x, z), rtol=0, atol=1e-5)
    w = patched.weight
    call = rmsnorm.gated_rms_norm(x, z, N, w, EPS, casting_mode="llama", activation=expected)
    assert torch.equal(y, call)


def test_an_instance_with_another_activation_is_left_alone_with_why():
    module = _cls("qwen4_exp.Qwen4ExpTextRMSNormGated")(N, eps=EPS, activation="gelu")
    with pytest.raises(ValueError, match=r"its activation is 'gelu': the gate activations"):
        hf.convention_of(module)
    model = nn.Sequential(module, _cls("qwen4_exp.Qwen4ExpTextRMSNormGated")(N, eps=EPS))
    with pytest.warns(UserWarning, match=r"Qwen4ExpTextRMSNormGated in 1 module\(s\), e.g. '0'"):
        assert hf.patch(model) == ["1"]
    assert not hf.is_patched(model[0])
    # Changed after patching: the patched forward says why rather than computing another gate.
    model[1].activation = "relu"
    x, z = _data(torch.float32)
    with pytest.raises(ValueError, match=r"activation is 'relu'"):
        model[1](x, z)


def test_register_a_gated_class_by_name():
    class OtherGatedNorm(MyGatedNorm):
        def forward(self, x, gate=None):  # the same computation, in another order of lines
            u = x.float() * nn.functional.silu(gate.float()) if gate is not None else x.float()
            u = u.unflatten(-1, (-1, self.group_size))
            u = u * torch.rsqrt(u.square().mean(-1, keepdim=True) + self.variance_epsilon)
            return self.weight * u.flatten(-2).to(x.dtype)

    with pytest.raises(ValueError, match="none of the known gated"):
        hf.convention_of(OtherGatedNorm)
    hf.register(OtherGatedNorm, "mamba2_gated")
    module = OtherGatedNorm(N, 8, eps=EPS)
    patched, theirs = _patched_pair(module)
    x, z = _data(torch.float32)
    torch.testing.assert_close(patched(x, z), theirs(x, z), rtol=0, atol=1e-5)


def test_gated_conventions_are_checked():
    with pytest.raises(ValueError, match="gate must be None, 'required' or 'optional'"):
        hf.Convention("rms", "eps", gate="yes")
    with pytest.raises(ValueError, match="activation must be one of"):
        hf.Convention("rms", "eps", gate="required", activation="gelu")
    with pytest.raises(ValueError, match="need a gate"):
        hf.Convention("rms", "eps", norm_before_gate=False)
    with pytest.raises(ValueError, match="options of kind='rms'"):
        hf.Convention("layer", "eps", gate="optional")
    with pytest.raises(ValueError, match="exclude each other"):
        hf.Convention("rms", "eps", group_size_attr="g", n_groups_attr="k")
    with pytest.raises(ValueError, match="must be an attribute name"):
        hf.Convention("rms", "eps", group_size_attr="not a name")
    with pytest.raises(ValueError, match="ranks must be a tuple"):
        hf.Convention("rms", "eps", ranks=[2, 3])
    with pytest.raises(ValueError, match="offset_in_weight_dtype needs an offset"):
        hf.Convention("rms", "eps", offset_in_weight_dtype=True)
    with pytest.raises(ValueError, match="optional_params reads weight and bias"):
        hf.Convention("rms", "eps", optional_params=True)


# ------------------------------------------------------------------------------------------------
# The plain classes patched now: MuseSpark's centered norm, xLSTM's
# ------------------------------------------------------------------------------------------------
def test_muse_spark_sums_one_plus_weight_in_the_weights_dtype():
    module = _cls("muse_spark.MuseSparkTextCenteredRMSNorm")(N, eps=EPS)
    with torch.no_grad():  # γ near 0, where 1 + γ in bf16 loses γ's low bits
        module.weight.copy_(torch.randn(N, generator=torch.Generator().manual_seed(5)) * 0.01)
    patched, theirs = _patched_pair(module.to(torch.bfloat16))
    x, _ = _data(torch.bfloat16)
    y = patched(x)
    w = patched.weight
    assert torch.equal(y, rmsnorm.rms_norm(x, N, 1.0 + w, EPS))
    assert not torch.equal(y, rmsnorm.rms_norm(x, N, w, EPS, offset=1.0))
    expected = theirs.double()(x.double())
    assert_close_to_reference(y, expected, theirs.to(torch.bfloat16)(x), name="MuseSpark")


def _xlstm(**kwargs) -> nn.Module:
    cls = _cls("xlstm.xLSTMRMSNorm")
    if cls.__module__ != "transformers.models.xlstm.modeling_xlstm":
        pytest.skip("xLSTMRMSNorm comes from the xlstm package here")
    return _randomized(cls(N, eps=EPS, **kwargs))


def test_xlstm_half_precision_reductions_are_refused_per_instance():
    module = _xlstm(force_float32_reductions=False)
    with pytest.raises(ValueError, match="its force_float32_reductions is False: it then reduces"):
        hf.convention_of(module)
    model = nn.Sequential(module, _xlstm())
    with pytest.warns(UserWarning, match="force_float32_reductions is False"):
        assert hf.patch(model) == ["1"]
    # patch_classes checks no instance: the forward computes float32 (the same function) and
    # refuses half precision, where the class reduces in the input dtype.
    try:
        hf.patch_classes([type(module)])
        x, _ = _data(torch.float32)
        other = _xlstm(force_float32_reductions=False)
        hf.unpatch_classes([type(module)])
        y_theirs = other(x)
        hf.patch_classes([type(module)])
        torch.testing.assert_close(other(x), y_theirs, rtol=0, atol=1e-5)
        with pytest.raises(ValueError, match="reduces in the input dtype.*torch.bfloat16"):
            other.to(torch.bfloat16)(x.to(torch.bfloat16))
    finally:
        hf.unpatch_classes()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_xlstm_bias_alone_in_another_dtype_promotes_as_the_class(dtype):
    """use_weight=False, use_bias=True and a float32 bias: the class returns promote(x, bias)."""
    patched, theirs = _patched_pair(_xlstm(use_weight=False, use_bias=True))
    x, _ = _data(dtype)
    y, y_theirs = patched(x), theirs(x)
    assert y.dtype == y_theirs.dtype == torch.float32
    torch.testing.assert_close(y, y_theirs, rtol=0, atol=1e-5 if dtype == torch.float32 else 0)


# ------------------------------------------------------------------------------------------------
# AXK2's container, norm_kind, copies, classes, compile
# ------------------------------------------------------------------------------------------------
def test_axk2_gated_container_is_refused_and_its_norm_patched():
    model = build("axk2")
    container = next(m for m in model.modules() if type(m).__name__ == "AXK2GatedRMSNorm")
    with pytest.raises(ValueError, match="is not patched: it is a container, not one norm"):
        hf.convention_of(container)
    assert norm_kind(container) is None and norm_kind(container.norm) == "rms"
    patch_as_expected("axk2", model)
    assert hf.is_patched(container.norm) and not hf.is_patched(container)


def test_gated_norms_count_as_norm_layers():
    from rmsnorm.integrations.distributed import norm_parameters
    from rmsnorm.lab.models.norm_layers import find_norm_layers

    model = build("mamba2")
    gated = {n for n, m in model.named_modules() if type(m).__name__ == _MAMBA2_GATED()}
    assert gated
    names = set(hf.patch(model))
    assert gated <= names
    found = {name: kind for name, _, kind in find_norm_layers(model)}
    assert names <= found.keys() and all(found[n] == "rmsnorm" for n in names)
    weights = {id(model.get_submodule(n).weight) for n in names}
    assert weights == {id(p) for p in norm_parameters(model)}


@pytest.mark.parametrize("how", ["pickle", "deepcopy", "torch.save"])
@pytest.mark.parametrize("name", ["falcon_h1", "qwen3_next"])
def test_a_patched_gated_model_stays_patched_through_copies_and_pickles(name, how):
    model = build(name)
    batch = inputs(name)
    with torch.no_grad():
        reference_logits = model(**batch).logits
        names = hf.patch(model)
        twin = _round_trip(model, how)
        assert all(hf.is_patched(twin.get_submodule(n)) for n in names)
        assert not any("forward" in m.__dict__ for m in twin.modules())
        assert torch.equal(twin(**batch).logits, model(**batch).logits)
        assert hf.unpatch(twin) == names
        assert torch.equal(twin(**batch).logits, reference_logits)


def test_patch_classes_of_a_gated_model_before_building():
    batch = inputs("mamba2")
    with torch.no_grad():
        reference_logits = build("mamba2")(**batch).logits
    try:
        names = hf.patch_classes(["mamba2"])
        assert {n.rsplit(".", 1)[-1] for n in names} == {_MAMBA2_GATED(), "Mamba2RMSNorm"}
        model = build("mamba2")
        mixer_norm = model.backbone.layers[0].mixer.norm
        assert hf.is_patched(mixer_norm)
        with torch.no_grad():
            assert (model(**batch).logits - reference_logits).abs().max() <= 1e-5
    finally:
        hf.unpatch_classes()


@pytest.mark.parametrize(
    "module",
    [
        lambda: _cls("mamba2.MambaRMSNormGated")(N, group_size=8, eps=EPS),
        lambda: _cls("falcon_h1.FalconH1RMSNormGated")(N, eps=EPS, n_groups=3),
        lambda: _cls("qwen3_next.Qwen3NextRMSNormGated")(N, eps=EPS),
    ],
    ids=["mamba2", "falcon_h1", "qwen3_next"],
)
def test_compile_fullgraph_of_a_patched_gated_norm(module):
    patched, _ = _patched_pair(_randomized(module()))
    x, z = _data(torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = torch.compile(patched, fullgraph=True, backend="aot_eager")
        torch.testing.assert_close(compiled(x, z), patched(x, z), rtol=0, atol=1e-6)
