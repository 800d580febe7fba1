"""The gated, grouped and other formerly refused RMSNorm classes of Hugging Face transformers, each
instantiated directly (small widths) and compared with this library's functional API called with
the options docs/conventions.md lists for it: float32 values and gradients to 1e-5; in float16 and
bfloat16 the spec bit for bit (each class's rounding order is reproduced) and the API, whose kernels
sum in another order, by the shared tolerance rule; weights in the input's dtype and in float32."""

from __future__ import annotations

import copy
import importlib
import warnings
from dataclasses import dataclass, field

import pytest
import torch

import rmsnorm
from hf_support import current_name, find_current
from rmsnorm import reference as ref
from rmsnorm.testing import assert_close_to_reference

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N = 24  # not a power of two; groups of 8 (Mamba2's n_groups = 3)
EPS = 0.1  # large enough that where ε enters shows in the output
HALF = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Gated:
    """One gated class: "model.Class", its constructor's keywords besides the width and ε, the
    ``gated_rms_norm`` keywords that compute it, and whether its forward accepts gate=None."""

    short: str
    build: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    gate_optional: bool = False


_QWEN = dict(casting_mode="llama")  # x̂ rounded to the input dtype, × weight, × act(z) in fp32
_KIMI = dict(casting_mode="gemma", activation="sigmoid")  # fp32 throughout, sigmoid gate
_MAMBA = dict(casting_mode="llama", norm_before_gate=False, group_size=8)  # gate, then norm
GATED = [
    Gated("qwen3_next.Qwen3NextRMSNormGated", {}, _QWEN),
    Gated("qwen3_5.Qwen3_5RMSNormGated", {}, _QWEN),
    Gated("qwen3_5_moe.Qwen3_5MoeRMSNormGated", {}, _QWEN),
    Gated("olmo_hybrid.OlmoHybridRMSNormGated", {}, _QWEN),
    Gated("qwen4_exp.Qwen4ExpTextRMSNormGated", {"activation": "silu"}, _QWEN),
    Gated(
        "qwen4_exp.Qwen4ExpTextRMSNormGated",
        {"activation": "sigmoid"},
        {**_QWEN, "activation": "sigmoid"},
    ),
    Gated("kimi_linear.KimiLinearRMSNormGated", {}, _KIMI),
    Gated("glm5_next.Glm5NextTextRMSNormGated", {}, _KIMI),
    Gated("bailing_hybrid.BailingHybridRMSNormGated", {}, _KIMI),
    Gated("lara_mini.LaraMiniRMSNormGated", {}, dict(casting_mode="gemma")),
    Gated("mamba2.MambaRMSNormGated", {"group_size": 8}, _MAMBA, True),
    Gated("bamba.BambaRMSNormGated", {"group_size": 8}, _MAMBA, True),
    Gated("nemotron_h.NemotronHRMSNormGated", {"group_size": 8}, _MAMBA, True),
    Gated("granitemoehybrid.GraniteMoeHybridRMSNormGated", {"group_size": 8}, _MAMBA, True),
    Gated("zamba2.Zamba2RMSNormGated", {"group_size": 8}, _MAMBA, True),
    Gated("zamba2.Zamba2RMSNormGated", {"group_size": N}, {**_MAMBA, "group_size": N}, True),
    Gated(
        "falcon_h1.FalconH1RMSNormGated",
        {"n_groups": 3, "norm_before_gate": True},
        dict(casting_mode="gemma", group_size=8),
        True,
    ),
    Gated(
        "falcon_h1.FalconH1RMSNormGated",
        {"n_groups": 1, "norm_before_gate": False},
        dict(casting_mode="gemma", norm_before_gate=False),
        True,
    ),
]


def _class(short: str) -> type:
    model, name = current_name(short).split(".")
    try:
        module = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
    except ImportError as exc:  # an optional dependency of that model, or an older transformers
        pytest.skip(f"{short}: {exc}")
    if not hasattr(module, name):
        pytest.skip(f"{short} is not in the installed transformers")
    return getattr(module, name)


def _data(dtype: torch.dtype, shape=(2, 3, N)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    # rows where ε matters (RMS ≈ 0.1 against ε = 0.1) and rows where it does not
    rows = torch.tensor([0.05, 0.3, 1.0, 2.0, 4.0, 0.5], dtype=torch.float64)
    x = x * rows.view(*shape[:-1], 1) + 0.4
    z = torch.randn(*shape, generator=g, dtype=torch.float64) * 3  # silu(z) from −0.28 to ~9
    return x.to(dtype), z.to(dtype)


def _randomize(module: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5 + 0.8)


def _grads(fn, tensors: list, params: list) -> tuple[torch.Tensor, list]:
    leaves = [t.clone().requires_grad_() for t in tensors]
    y = fn(*leaves)
    cot = torch.randn(y.shape, generator=torch.Generator().manual_seed(4)).to(y.dtype)
    grads = torch.autograd.grad((y * cot).sum(), leaves + params)
    return y.detach(), list(grads)


def _assert_parity(theirs, ours, spec, tensors, params, label):
    """``ours`` (the API) and ``spec`` (the same call of :mod:`rmsnorm.reference`) against the
    class's forward ``theirs``, all three functions of ``tensors`` reading ``params``.

    float32: the API's values and gradients to 1e-5. Half precision: the spec bit for bit (the
    class's rounding order is reproduced exactly), and the API's values and gradients within the
    shared tolerance rule of the float64 spec, the class's own being the eager error.
    """
    dtype = tensors[0].dtype
    y_t, g_t = _grads(theirs, tensors, params)
    y_o, g_o = _grads(ours, tensors, params)
    assert y_o.dtype == y_t.dtype, (label, y_o.dtype, y_t.dtype)
    if dtype not in HALF:
        assert (y_o - y_t).abs().max().item() <= 1e-5, label
        for i, (a, e) in enumerate(zip(g_o, g_t, strict=True)):
            err = (a - e).abs().max().item()
            assert err <= 1e-5 * max(1.0, e.abs().max().item()), (label, i, err)
        return
    y_s = spec(*tensors, *params).detach()
    assert torch.equal(y_s, y_t), (label, (y_s.double() - y_t.double()).abs().max().item())
    f64 = [t.detach().double() for t in tensors + params]
    y64, g64 = _grads(spec, f64, [])
    rows = tensors[0].numel() // N
    names = [f"d{i}" for i in range(len(tensors))] + [f"d param {i}" for i in range(len(params))]
    assert_close_to_reference(y_o, y64, y_t, name=f"{label} y")
    for i, (a, e, t) in enumerate(zip(g_o, g64, g_t, strict=True)):
        summed = rows if i >= len(tensors) else 1
        assert_close_to_reference(a, e, t.to(a.dtype), name=f"{label} {names[i]}", rows=summed)


@pytest.mark.parametrize("wdtype", [None, torch.float32], ids=["weights-in-input-dtype", "fp32"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", GATED, ids=lambda c: f"{c.short}{c.build or ''}")
def test_gated_class_parity(case, dtype, wdtype):
    cls = _class(case.short)
    module = cls(N, eps=EPS, **case.build)
    _randomize(module)
    module.to(wdtype or dtype)
    w = module.weight
    x, z = _data(dtype)
    label = f"{case.short}({case.build}) {dtype} weights {w.dtype}"

    def ours(x, z):
        return rmsnorm.gated_rms_norm(x, z, N, w, EPS, **case.options)

    def spec(x, z, w):
        return ref.gated_rms_norm(x, z, w, EPS, **case.options)

    _assert_parity(module, ours, spec, [x, z], [w], label)
    # 2-D inputs (the Falcon-H1 class takes 2-D and 3-D only)
    x2, z2 = _data(dtype, (6, N))
    _assert_parity(module, ours, spec, [x2, z2], [w], f"{label} 2-D")
    if case.gate_optional:  # gate=None: the grouped RMSNorm alone, the same through rms_norm
        plain = {k: v for k, v in case.options.items() if k != "norm_before_gate"}

        def ours_plain(x):
            return rmsnorm.gated_rms_norm(x, None, N, w, EPS, **plain)

        def spec_plain(x, w):
            return ref.gated_rms_norm(x, None, w, EPS, **plain)

        _assert_parity(module, ours_plain, spec_plain, [x], [w], f"{label} no gate")
        plain.pop("activation", None)
        torch.testing.assert_close(rmsnorm.rms_norm(x, N, w, EPS, **plain), ours_plain(x))


@pytest.mark.parametrize("case", GATED, ids=lambda c: f"{c.short}{c.build or ''}")
def test_gated_module_loads_the_class_state_dict_and_computes_it(case):
    cls = _class(case.short)
    theirs = cls(N, eps=EPS, **case.build)
    _randomize(theirs)
    ours = rmsnorm.GatedRMSNorm(N, eps=EPS, **case.options)
    ours.load_state_dict(theirs.state_dict())
    for dtype in (torch.float32, torch.bfloat16):
        x, z = _data(dtype)
        a, b = copy.deepcopy(ours).to(dtype), copy.deepcopy(theirs).to(dtype)
        y_ours, y_theirs = a(x, z).detach(), b(x, z).detach()
        assert y_ours.dtype == y_theirs.dtype, (case.short, dtype)
        if dtype == torch.float32:
            assert (y_ours - y_theirs).abs().max().item() <= 1e-5, case.short
        else:  # the kernels sum in another order: the shared rule, the class as the eager error
            w64 = b.weight.detach().double()
            y64 = ref.gated_rms_norm(x.double(), z.double(), w64, EPS, **case.options)
            assert_close_to_reference(y_ours, y64, y_theirs, name=f"{case.short} {dtype}")


def test_gated_classes_are_all_covered():
    """Every class of the installed transformers whose forward takes a gate after the input is in
    the table above (a new one shows up here first)."""
    import inspect

    from rmsnorm.integrations.hf import discovery

    seen = set()
    for name in discovery.modeling_module_names():
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for cls in discovery.module_classes(module):
            forward = cls.__dict__.get("forward")
            if "Norm" not in cls.__name__ or forward is None:
                continue
            params = list(inspect.signature(forward).parameters)[1:]
            if params[1:2] == ["gate"]:
                seen.add(f"{name.split('.')[2]}.{cls.__name__}")
    table = {find_current(c.short)[0] for c in GATED} - {None}
    assert table <= seen, table - seen  # each class of the table that exists is found
    new = sorted(seen - table)
    if new:  # decided all the same (patched or refused with a reason): the golden list shows how
        warnings.warn(f"gated norm classes not in this table yet: {', '.join(new)}", stacklevel=1)


# ------------------------------------------------------------------------------------------------
# Plain classes once refused: grouped (Qwen4-Exp), 1 + γ rounded in the weight's dtype
# (MuseSpark), optional weight and bias (xLSTM)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("wdtype", [None, torch.float32], ids=["weights-in-input-dtype", "fp32"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group_size", [None, 8])
def test_qwen4_exp_grouped_rmsnorm(group_size, dtype, wdtype):
    cls = _class("qwen4_exp.Qwen4ExpTextRMSNorm")
    module = cls(N, group_size=group_size, eps=EPS)
    _randomize(module)
    module.to(wdtype or dtype)
    w = module.weight
    x, _ = _data(dtype)

    def ours(x):  # Gemma's convention (× (1 + γ) in fp32, one cast), per group
        return rmsnorm.rms_norm(x, N, w, EPS, offset=1.0, group_size=group_size)

    def spec(x, w):
        return ref.rms_norm(x, w, EPS, offset=1.0, group_size=group_size)

    _assert_parity(module, ours, spec, [x], [w], f"Qwen4ExpTextRMSNorm {group_size} {dtype}")


@pytest.mark.parametrize("wdtype", [None, torch.float32], ids=["weights-in-input-dtype", "fp32"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_muse_spark_centered_rmsnorm(dtype, wdtype):
    cls = _class("muse_spark.MuseSparkTextCenteredRMSNorm")
    module = cls(N, eps=EPS)
    with torch.no_grad():  # γ near 0, where 1 + γ in bf16 loses γ's low bits
        module.weight.copy_(torch.randn(N, generator=torch.Generator().manual_seed(5)) * 0.01)
    module.to(wdtype or dtype)
    w = module.weight
    x, _ = _data(dtype)

    def ours(x):  # 1 + γ summed in γ's dtype, as the class does, then the "gemma" convention
        return rmsnorm.rms_norm(x, N, 1.0 + w, EPS)

    def spec(x, w):
        return ref.rms_norm(x, 1.0 + w, EPS)

    _assert_parity(module, ours, spec, [x], [w], f"MuseSparkTextCenteredRMSNorm {dtype}")
    if w.dtype == torch.bfloat16:  # the offset option (1 + γ in fp32) is a different function
        assert not torch.equal(rmsnorm.rms_norm(x, N, w, EPS, offset=1.0), module(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "use_weight, use_bias", [(True, False), (True, True), (False, False)], ids=str
)
def test_xlstm_rmsnorm(use_weight, use_bias, dtype):
    cls = _class("xlstm.xLSTMRMSNorm")
    if cls.__module__ != "transformers.models.xlstm.modeling_xlstm":
        pytest.skip("xLSTMRMSNorm comes from the xlstm package here")
    module = cls(N, eps=EPS, use_weight=use_weight, use_bias=use_bias)
    _randomize(module)
    module.to(dtype)
    params = list(module.parameters())
    x, _ = _data(dtype)

    def ours(x):  # x̂ in fp32, cast to the input dtype, × weight, + bias: "llama"
        return rmsnorm.rms_norm(x, N, module.weight, EPS, casting_mode="llama", bias=module.bias)

    def spec(x, *params):
        w, b = params[0] if use_weight else None, params[-1] if use_bias else None
        return ref.rms_norm(x, w, EPS, casting_mode="llama", bias=b)

    _assert_parity(module, ours, spec, [x], params, f"xLSTMRMSNorm {use_weight} {use_bias}")


def test_xlstm_rmsnorm_half_precision_reductions_are_not_expressible():
    """force_float32_reductions=False computes mean(x²) and rsqrt in the input dtype: the same
    function in float32, another one in half precision, where this library always reduces in
    float32 (a half-precision sum of squares overflows fp16 past |x| ≈ 256)."""
    cls = _class("xlstm.xLSTMRMSNorm")
    if cls.__module__ != "transformers.models.xlstm.modeling_xlstm":
        pytest.skip("xLSTMRMSNorm comes from the xlstm package here")
    module = cls(N, eps=EPS, force_float32_reductions=False)
    _randomize(module)
    x, _ = _data(torch.float32)
    ours = rmsnorm.rms_norm(x, N, module.weight, EPS, casting_mode="llama")
    assert (ours - module(x)).abs().max().item() <= 1e-5
    x16 = torch.randn(64, N, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    half = module.to(torch.bfloat16)
    ours16 = rmsnorm.rms_norm(x16, N, half.weight, EPS, casting_mode="llama")
    assert not torch.equal(ours16, half(x16))
    spec = ref.rms_norm(x16.double(), half.weight.double(), EPS, casting_mode="llama")
    err_ours = (ours16.double() - spec).abs().max()
    assert err_ours <= (half(x16).double() - spec).abs().max()  # fp32 reductions: never worse
