"""rmsnorm.integrations.replace_norms / restore_norms: torch's norm modules become this library's
in place, with the same parameters, hooks and state_dict, and back."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import rmsnorm
from rmsnorm.integrations import replace_norms, restore_norms


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
