"""Drop-in modules against torch's own, and the casting modes against the model code they name."""

import pytest
import torch
import torch.nn.functional as F

import rmsnorm
from rmsnorm import reference as ref
from rmsnorm.testing import assert_close_to_reference

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _grads(module, x, dy):
    x = x.detach().clone().requires_grad_()
    y = module(x)
    y.backward(dy)
    return y, x.grad, module.weight.grad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("eps", [None, 1e-6])
def test_rmsnorm_matches_torch_module(dtype, eps):
    torch.manual_seed(0)
    ours = rmsnorm.RMSNorm(64, eps=eps, dtype=dtype)
    theirs = torch.nn.RMSNorm(64, eps=eps, dtype=dtype)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(64))
        theirs.weight.copy_(ours.weight)
    x = torch.randn(3, 5, 64, dtype=dtype) * 2
    dy = torch.randn(3, 5, 64, dtype=dtype)
    y1, dx1, dw1 = _grads(ours, x, dy)
    y2, dx2, dw2 = _grads(theirs, x, dy)
    # torch's module is itself a same-dtype eager implementation: hold both to the float64 spec.
    x64, w64, dy64 = x.double().requires_grad_(), ours.weight.double().detach(), dy.double()
    w64.requires_grad_()
    y64 = ref.rms_norm(x64, w64, eps)
    dx64, dw64 = torch.autograd.grad(y64, (x64, w64), dy64)
    assert_close_to_reference(y1, y64, y2, name="y")
    assert_close_to_reference(dx1, dx64, dx2, name="dx")
    assert_close_to_reference(dw1, dw64, dw2, name="dweight", rows=15)


def test_state_dict_round_trip_both_ways():
    ours, theirs = rmsnorm.RMSNorm((4, 8)), torch.nn.RMSNorm((4, 8))
    with torch.no_grad():
        theirs.weight.normal_()
    ours.load_state_dict(theirs.state_dict())
    assert torch.equal(ours.weight, theirs.weight)
    back = torch.nn.RMSNorm((4, 8))
    back.load_state_dict(ours.state_dict())
    assert torch.equal(back.weight, theirs.weight)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight"]
    assert isinstance(ours, torch.nn.RMSNorm)


def test_offset_and_bias_init_give_identity_scale():
    m = rmsnorm.RMSNorm(16, offset=1.0, bias=True)
    assert torch.equal(m.weight, torch.zeros(16)) and torch.equal(m.bias, torch.zeros(16))
    x = torch.randn(4, 16)
    torch.testing.assert_close(m(x), rmsnorm.rms_norm(x, 16))
    assert sorted(m.state_dict()) == ["bias", "weight"]
    assert "offset=1.0" in repr(m) and "bias=True" in repr(m)


def test_layernorm_matches_torch_module():
    ours, theirs = rmsnorm.LayerNorm(32), torch.nn.LayerNorm(32)
    with torch.no_grad():
        theirs.weight.normal_()
        theirs.bias.normal_()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(7, 32) + 3
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    assert isinstance(ours, torch.nn.LayerNorm)


def test_add_rmsnorm_module_is_add_then_norm():
    m = rmsnorm.AddRMSNorm(24, eps=1e-6)
    x, r = torch.randn(5, 24), torch.randn(5, 24)
    out, res = m(x, r)
    torch.testing.assert_close(res, x + r)
    torch.testing.assert_close(out, F.rms_norm(x + r, (24,), m.weight, 1e-6))


# ------------------------------------------------------------------------------------------------
# Casting modes against the code of the models they are named after
# ------------------------------------------------------------------------------------------------
def _llama_style(x, weight, eps):
    """Hugging Face LlamaRMSNorm.forward: normalize in fp32, cast to the input dtype, × weight."""
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(input_dtype)


def _gemma_style(x, weight, eps):
    """Hugging Face GemmaRMSNorm.forward: everything in fp32, × (1 + weight), cast at the end."""
    out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    out = out * (1.0 + weight.float())
    return out.type_as(x)


@pytest.mark.parametrize("wdtype", [torch.bfloat16, torch.float32])
def test_llama_mode_matches_llama_code_bitwise(wdtype):
    x = torch.randn(8, 128, dtype=torch.bfloat16) * 3
    w = torch.randn(128, dtype=wdtype)
    ours = rmsnorm.rms_norm(x, 128, w, 1e-6, casting_mode="llama")
    theirs = _llama_style(x, w, 1e-6)
    assert ours.dtype == theirs.dtype
    assert torch.equal(ours, theirs)


def test_gemma_mode_with_offset_matches_gemma_code_bitwise():
    x = torch.randn(8, 128, dtype=torch.bfloat16) * 3
    w = torch.randn(128, dtype=torch.bfloat16) * 0.1
    ours = rmsnorm.rms_norm(x, 128, w, 1e-6, casting_mode="gemma", offset=1.0)
    assert torch.equal(ours, _gemma_style(x, w, 1e-6))
    module = rmsnorm.RMSNorm(128, eps=1e-6, offset=1.0, dtype=torch.bfloat16)
    with torch.no_grad():
        module.weight.copy_(w)
    assert torch.equal(module(x), _gemma_style(x, w, 1e-6))


def test_none_mode_rounds_in_input_dtype():
    x = torch.randn(4, 64, dtype=torch.float16)
    w = torch.randn(64, dtype=torch.float16)
    rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(torch.float16)
    expected = (x * rstd) * w
    assert torch.equal(rmsnorm.rms_norm(x, 64, w, 1e-6, casting_mode="none"), expected)


def test_modes_agree_in_float32():
    x, w = torch.randn(4, 64), torch.randn(64)
    outs = [rmsnorm.rms_norm(x, 64, w, 1e-6, casting_mode=m) for m in ref.CASTING_MODES]
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("make", [
    lambda: rmsnorm.RMSNorm(8, bias=True),
    lambda: rmsnorm.GatedRMSNorm(8, bias=True),
    lambda: rmsnorm.LayerNorm(8),
], ids=["RMSNorm", "GatedRMSNorm", "LayerNorm"])  # fmt: skip
def test_forward_reads_parameters_wherever_torch_puts_them(make):
    # The forwards read parameters from the module's parameter dict, not through
    # nn.Module.__getattr__: a parametrization, torch.func.functional_call and a plain tensor put
    # in a parameter's place must still be what the forward uses.
    from torch.nn.utils import parametrize

    x = torch.randn(3, 8)

    def expected(norm, weight, bias):
        if isinstance(norm, rmsnorm.LayerNorm):
            return F.layer_norm(x, (8,), weight, bias, norm.eps)
        return ref.rms_norm(x, weight, norm.eps, bias=bias)

    norm = make()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.normal_()
    w, b = norm.weight.detach().clone(), norm.bias.detach().clone()
    torch.testing.assert_close(norm(x), expected(norm, w, b))

    w2, b2 = torch.rand(8) + 0.5, torch.randn(8)
    out = torch.func.functional_call(norm, {"weight": w2, "bias": b2}, (x,))
    torch.testing.assert_close(out, expected(norm, w2, b2))
    torch.testing.assert_close(norm(x), expected(norm, w, b))  # and back

    class Double(torch.nn.Module):
        def forward(self, p):
            return 2 * p

    parametrize.register_parametrization(norm, "weight", Double())
    torch.testing.assert_close(norm(x), expected(norm, 2 * w, b))

    del norm.bias
    norm.bias = b2  # a plain tensor attribute where the parameter was
    torch.testing.assert_close(norm(x), expected(norm, 2 * w, b2))
