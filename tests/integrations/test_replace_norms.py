"""rmsnorm.integrations: norm_kind (is this a norm layer?), and replace_norms / restore_norms:
torch's norm modules become this library's in place, with the same parameters, hooks and
state_dict, and back."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import rmsnorm
from rmsnorm.integrations import hf, norm_kind, replace_norms, restore_norms


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(12, 12)
        self.rms = nn.RMSNorm(12, eps=1e-6)
        self.rms_default_eps = nn.RMSNorm(12)
        self.ln = nn.LayerNorm(12, eps=1e-5)
        self.ln_no_bias = nn.LayerNorm(12, bias=False)
        self.ln_plain = nn.LayerNorm(12, elementwise_affine=False)
        self.head = nn.Linear(12, 3)

    def forward(self, x):
        x = self.rms_default_eps(self.rms(self.fc(x)))
        return self.head(self.ln_plain(self.ln_no_bias(self.ln(x))))


def make() -> Net:
    torch.manual_seed(0)
    net = Net()
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "fc" not in name and "head" not in name:
                p.add_(0.3 * torch.randn_like(p))
    return net


def forward_backward(net, x):
    net.zero_grad(set_to_none=True)
    out = net(x)
    out.square().sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in net.named_parameters()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_replace_norms_is_drop_in(dtype):
    net = make().to(dtype)
    x = torch.randn(5, 7, 12, dtype=dtype)
    ref_out, ref_grads = forward_backward(net, x)
    params = {n: p for n, p in net.named_parameters()}
    state = {k: v.clone() for k, v in net.state_dict().items()}
    modules = dict(net.named_modules())

    names = replace_norms(net)
    assert names == ["rms", "rms_default_eps", "ln", "ln_no_bias", "ln_plain"]
    assert isinstance(net.rms, rmsnorm.RMSNorm) and isinstance(net.ln, rmsnorm.LayerNorm)
    assert isinstance(net.rms, nn.RMSNorm)  # still torch's class too
    assert dict(net.named_modules()) == modules  # the same module objects
    assert all(p is params[n] for n, p in net.named_parameters())  # the same Parameter objects
    assert net.state_dict().keys() == state.keys()
    assert all(torch.equal(net.state_dict()[k], v) for k, v in state.items())

    out, grads = forward_backward(net, x)
    assert out.dtype == ref_out.dtype
    u = torch.finfo(dtype).eps
    scale = ref_out.abs().max().item()
    assert (out.double() - ref_out.double()).abs().max() <= 4 * u * scale
    for n, g in ref_grads.items():
        assert (grads[n].double() - g.double()).abs().max() <= 8 * u * max(1.0, g.abs().max()), n


def test_restore_norms_undoes_it_and_keeps_hooks():
    net = make()
    calls = []
    net.ln.register_forward_hook(lambda m, i, o: calls.append(type(m).__name__))
    x = torch.randn(3, 12)
    ref = net(x)
    replace_norms(net)
    net(x)
    assert replace_norms(net) == []  # already this library's: nothing to do
    assert restore_norms(net) == ["rms", "rms_default_eps", "ln", "ln_no_bias", "ln_plain"]
    assert type(net.rms) is nn.RMSNorm and type(net.ln) is nn.LayerNorm
    assert not hasattr(net.rms, "casting_mode") and "bias" not in net.rms._parameters
    assert torch.equal(net(x), ref)
    assert calls == ["LayerNorm"] * 3  # before, while replaced, after: the hook stayed on
    # A restored model loads into and from plain torch models.
    nn.Module.load_state_dict(make(), net.state_dict())


def test_restore_leaves_the_library_own_modules_alone_and_works_on_copies():
    net = nn.Sequential(rmsnorm.RMSNorm(4, offset=1.0), nn.LayerNorm(4))
    replace_norms(net)
    twin = copy.deepcopy(net)
    assert restore_norms(twin) == ["1"]
    assert type(twin[0]) is rmsnorm.RMSNorm and twin[0].offset == 1.0
    assert type(twin[1]) is nn.LayerNorm


def test_subclasses_are_left_alone():
    class MyNorm(nn.LayerNorm):
        def forward(self, x):
            return super().forward(x) * 2

    net = nn.Sequential(MyNorm(4))
    assert replace_norms(net) == []
    with pytest.raises(TypeError, match="torch.nn.Module"):
        replace_norms([nn.LayerNorm(4)])


class OwnRMSNorm(nn.Module):
    """Written like transformers' LlamaRMSNorm, under other names: recognised by its code."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        mean_square = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(mean_square + self.variance_epsilon)
        return self.weight * x.to(dtype)


class ScaledRMSNorm(OwnRMSNorm):
    """Named like a norm, but its forward is none of the known ones."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * super().forward(x)


class SubLayerNorm(nn.LayerNorm):
    pass


@pytest.mark.parametrize(
    "module, kind",
    [
        (nn.RMSNorm(8), "rms"),
        (nn.LayerNorm(8), "layer"),
        (rmsnorm.RMSNorm(8, offset=1.0), "rms"),
        (rmsnorm.AddRMSNorm(8), "rms"),
        (rmsnorm.GatedRMSNorm(8, group_size=4), "rms"),  # not an nn.RMSNorm, still an RMSNorm
        (rmsnorm.RMSNorm(8, group_size=4), "rms"),
        (rmsnorm.LayerNorm(8, bias=False), "layer"),
        (SubLayerNorm(8), "layer"),  # a subclass is still a LayerNorm (replace_norms skips it)
        (OwnRMSNorm(8), "rms"),
        (ScaledRMSNorm(8), None),
        (nn.BatchNorm1d(8), None),
        (nn.GroupNorm(2, 8), None),
        (nn.Linear(8, 8), None),
        (nn.Sequential(nn.LayerNorm(8)), None),  # a container is not a norm layer
    ],
)
def test_norm_kind(module, kind):
    assert norm_kind(module) == kind


def test_norm_kind_follows_the_hf_recognition():
    """Patched modules keep their kind; a registration decides for a class of one's own."""
    module = nn.Sequential(OwnRMSNorm(8))
    hf.patch(module)
    assert hf.is_patched(module[0]) and norm_kind(module[0]) == "rms"

    class RegisteredNorm(ScaledRMSNorm):
        pass

    class NeverNorm(OwnRMSNorm):
        pass

    hf.register(RegisteredNorm, "llama")
    hf.register(NeverNorm, None)
    assert norm_kind(RegisteredNorm(8)) == "rms" and norm_kind(NeverNorm(8)) is None
    with pytest.raises(TypeError, match="module must be a torch.nn.Module"):
        norm_kind(nn.LayerNorm)


def test_norm_kind_never_imports_transformers():
    code = (
        "import sys, torch\n"
        "from rmsnorm.integrations import norm_kind\n"
        "class N(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)\n"
        "assert norm_kind(N()) is None and norm_kind(torch.nn.Linear(2, 2)) is None\n"
        "assert 'transformers' not in sys.modules, 'transformers imported'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)
