"""Recognition by behaviour (rmsnorm.integrations.hf.behaviour): a norm class whose code is none of
the known forwards is patched when one convention matches it in every probe and it holds exactly
what that convention reads; otherwise it is refused with a reason that says what differs, or that
the probe cannot tell. Each class here is written differently from every known forward."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from rmsnorm.integrations import hf
from rmsnorm.integrations.hf import behaviour, recognition
from rmsnorm.testing import assert_close_to_reference

N = 40


class _Base(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps


class LlamaWrittenOtherwiseRMSNorm(_Base):
    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        inv = (torch.mean(h * h, dim=-1, keepdim=True) + self.variance_epsilon) ** -0.5
        return self.weight * (h * inv).to(dtype)


class GemmaWrittenOtherwiseRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        h = x.float()
        h = h / torch.sqrt(h.square().mean(-1, keepdim=True) + self.eps)
        return (h * (self.weight.float() + 1.0)).to(x.dtype)


class WeightlessWrittenOtherwiseRMSNorm(nn.Module):
    def __init__(self, eps: float = 1e-6) -> None:
        super().__init__()
        self.epsilon = eps

    def forward(self, x):
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.epsilon)).to(x.dtype)


class OtherwiseWrittenLayerNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, x):
        return nn.functional.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)


class EpsOutsideRootRMSNorm(_Base):
    def forward(self, x):
        h = x.float()
        rms = h.pow(2).mean(-1, keepdim=True).sqrt()
        return (self.weight * (h / (rms + self.variance_epsilon))).to(x.dtype)


class BufferRMSNorm(LlamaWrittenOtherwiseRMSNorm):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__(hidden_size, eps)
        self.register_buffer("scale", torch.ones(1))


class ExtraParameterRMSNorm(LlamaWrittenOtherwiseRMSNorm):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__(hidden_size, eps)
        self.shift = nn.Parameter(torch.zeros(hidden_size))


class ClampingRMSNorm(_Base):
    """Llama's, except on rows it finds too large: a branch on the data."""

    def forward(self, x):
        if x.abs().amax() > 1e6:
            return x
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(x.dtype)


class ConfigRMSNorm(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(config.hidden_size))

    def forward(self, x):
        return x


def _fresh(cls: type) -> type:
    """A copy of ``cls`` that no other test has decided (decisions are cached per class)."""
    return type(cls.__name__, (cls,), {"__module__": __name__})


@pytest.mark.parametrize(
    "cls, expected",
    [
        (LlamaWrittenOtherwiseRMSNorm, hf.Convention("rms", "variance_epsilon", "llama")),
        (GemmaWrittenOtherwiseRMSNorm, hf.Convention("rms", "eps", offset=1.0)),
        (WeightlessWrittenOtherwiseRMSNorm, hf.Convention("rms", "epsilon", weight=False)),
        (OtherwiseWrittenLayerNorm, hf.Convention("layer", "eps", bias=True)),
    ],
    ids=["llama", "gemma", "weightless", "layer_norm"],
)
def test_a_class_of_unknown_code_is_patched_with_the_convention_it_computes(cls, expected):
    assert recognition.recognise(cls) == recognition.UNKNOWN_FORWARD  # not by its source
    assert hf.convention_of(cls) == expected
    assert hf.recognised_by(cls) == "behaviour"


@pytest.mark.parametrize(
    "cls",
    [LlamaWrittenOtherwiseRMSNorm, GemmaWrittenOtherwiseRMSNorm, OtherwiseWrittenLayerNorm],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_what_the_probe_patches_is_at_parity_forward_and_backward(cls, dtype):
    torch.manual_seed(0)
    ref = cls(N).to(dtype)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape) * 0.4 + 0.3)
    module = copy.deepcopy(ref)
    assert hf.patch(module) == [""] and hf.is_patched(module)
    x = (torch.randn(3, 5, N, dtype=torch.float64) + 0.5).to(dtype)
    dy = torch.randn(3, 5, N, dtype=torch.float64)

    def run(m: nn.Module, x: torch.Tensor):
        x = x.detach().clone().requires_grad_(True)
        y = m(x)
        grads = torch.autograd.grad((y * dy.to(y.dtype)).sum(), [x, *m.parameters()])
        return [y.detach(), *grads]

    got, eager = run(module, x), run(ref, x)
    exact = run(copy.deepcopy(ref).double(), x.double())
    names = ["y", "dx", "dweight", "dbias"][: len(got)]
    rows = [1, N, 15, 15][: len(got)]  # y, dx (a reduction over the row), summed over 15 rows
    for name, a, g, e, r in zip(names, got, eager, exact, rows, strict=True):
        assert_close_to_reference(a, e, g, name=f"{cls.__name__} {dtype} {name}", rows=r)


@pytest.mark.parametrize(
    "cls, says",
    [
        (EpsOutsideRootRMSNorm, "its outputs match none of the conventions"),
        (BufferRMSNorm, "it holds buffers (scale)"),
        (ExtraParameterRMSNorm, "it holds parameters beyond weight and bias (shift)"),
        (ClampingRMSNorm, f"{behaviour.UNDECIDED}: its forward branches (If on `x.abs().amax()"),
        (ConfigRMSNorm, f"{behaviour.UNDECIDED}: its constructor needs 'config'"),
    ],
    ids=["eps-outside-the-root", "buffer", "extra-parameter", "data-branch", "config"],
)
def test_a_class_the_probe_does_not_serve_is_refused_with_a_reason(cls, says):
    cls = _fresh(cls)
    with pytest.raises(ValueError, match="is not patched: its forward is none of the known") as e:
        hf.convention_of(cls)
    assert says in str(e.value), str(e.value)
    assert hf.recognised_by(cls) is None


def test_the_refusal_names_the_closest_convention_and_the_probes_it_misses():
    message = behaviour.probe(_fresh(EpsOutsideRootRMSNorm))
    # ε outside the root: off wherever ε matters (the probes' rows of magnitude 1e-3), and its
    # gradient at a zero row is NaN (the derivative of √ at 0) where the conventions' is finite
    assert "closest: RMSNorm(casting 'gemma', offset 0, weight=True)" in message, message
    assert "ε = 0.5 (off by" in message, message
    assert "gradient (its output's dtype, shape or NaN / inf pattern differs)" in message, message


def test_a_class_not_named_like_a_norm_is_not_probed():
    class Scale(LlamaWrittenOtherwiseRMSNorm):
        pass

    with pytest.raises(ValueError, match="none of the known normalization forwards \\(hf"):
        hf.convention_of(Scale)


def test_the_probe_leaves_the_random_state_and_grad_mode_alone():
    state = torch.get_rng_state()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        conv = behaviour.probe(_fresh(LlamaWrittenOtherwiseRMSNorm))
        assert not torch.is_grad_enabled()
    assert isinstance(conv, hf.Convention)
    with torch.inference_mode():  # patching a model inside an inference block
        assert behaviour.probe(_fresh(LlamaWrittenOtherwiseRMSNorm)) == conv
    assert torch.equal(torch.get_rng_state(), state)


def test_explain_says_how_each_class_was_recognised(caplog):
    model = nn.Sequential(nn.Linear(N, N), _fresh(GemmaWrittenOtherwiseRMSNorm)(N))
    model.add_module("odd", _fresh(BufferRMSNorm)(N))
    rows = {row["class"].rsplit(".", 1)[-1]: row for row in hf.explain(model)}
    assert rows["GemmaWrittenOtherwiseRMSNorm"]["recognised_by"] == "behaviour"
    assert rows["GemmaWrittenOtherwiseRMSNorm"]["modules"] == ["1"]
    assert rows["BufferRMSNorm"]["patched"] is False
    assert "holds buffers" in rows["BufferRMSNorm"]["decision"]
    assert "Linear" not in rows
    with pytest.warns(UserWarning, match="BufferRMSNorm"), caplog.at_level("INFO"):
        assert hf.patch(model) == ["1"]
    assert "GemmaWrittenOtherwiseRMSNorm in 1 module(s), recognised by behaviour" in caplog.text
    assert hf.explain(model)[0]["modules"] == ["1"]  # a patched model reads the same
