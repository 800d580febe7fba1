"""Norm-layer capture and model inspection (lab/models/norm_layers.py,
lab/experiments/inspection/): which modules are norm layers, what the hooks record on plain, grouped
and gated norms, and the models ``rmsnorm inspect`` reads."""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch
from torch import nn

import rmsnorm
from rmsnorm.lab.experiments import inspection
from rmsnorm.lab.experiments.inspection import capture, inspect_model
from rmsnorm.lab.models import norm_layers
from rmsnorm.lab.models.transformer import Transformer, TransformerConfig
from rmsnorm.lab.stats import summarize

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# --------------------------------------------------------------------------------------------------
# Norm-layer detection (lab/models/norm_layers.py) and the capture hooks
# (lab/experiments/inspection/capture.py) on torch modules: which modules are norm layers and of
# which kind, what the hooks record, and the swap they measure.


class T5StyleLayerNorm(nn.Module):
    """Named LayerNorm but does not subtract the mean (T5's): the probe must call it RMSNorm."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.variance_epsilon = eps

    def forward(self, x):
        return (
            self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        )


class GemmaStyleRMSNorm(nn.Module):
    """Offset weight (1 + w), w initialised to zeros."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1 + self.weight)


class MyLayerNorm(nn.Module):
    """A hand-written LayerNorm with the usual attribute names."""

    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.eps = eps

    def forward(self, x):
        mu = x.mean(-1, keepdim=True)
        var = (x - mu).pow(2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + self.eps) * self.weight + self.bias


@pytest.mark.parametrize(
    "module, kind",
    [
        (nn.LayerNorm(16), "layernorm"),
        (nn.RMSNorm(16), "rmsnorm"),
        (rmsnorm.LayerNorm(16), "layernorm"),
        (rmsnorm.RMSNorm(16), "rmsnorm"),
        (T5StyleLayerNorm(16), "rmsnorm"),  # the name says LayerNorm, the probe says otherwise
        (GemmaStyleRMSNorm(16), "rmsnorm"),
        (MyLayerNorm(16), "layernorm"),
        (nn.BatchNorm1d(16), None),
        (nn.GroupNorm(2, 16), None),
        (nn.Linear(16, 16), None),
    ],
)
def test_norm_kind(module, kind):
    assert norm_layers.norm_kind(module) == kind


def test_counts_in_torch_models():
    model = nn.Sequential(
        nn.Linear(8, 8),
        nn.LayerNorm(8),
        nn.ReLU(),
        T5StyleLayerNorm(8),
        nn.BatchNorm1d(8),
        nn.Sequential(rmsnorm.RMSNorm(8), MyLayerNorm(8)),
    )
    kinds = [k for _, _, k in norm_layers.find_norm_layers(model)]
    assert kinds == ["layernorm", "rmsnorm", "rmsnorm", "layernorm"]
    cfg = TransformerConfig(n_layers=3, d_model=32, n_heads=2, seq_len=8)
    found = norm_layers.find_norm_layers(Transformer(cfg))
    assert len(found) == 2 * 3 + 1  # norm1, norm2 per block + the final norm


def test_hooks_record_and_are_removed():
    model = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), GemmaStyleRMSNorm(16))
    x = torch.randn(4, 5, 16)
    with capture.NormCapture(model) as cap:
        model(x)
        model(x)
    for module in model:
        assert not module._forward_hooks
    summary = cap.summary()
    assert [s["calls"] for s in summary] == [2, 2]
    assert [s["tokens"] for s in summary] == [40, 40]
    assert summary[0]["swap_to"] == "rmsnorm" and summary[1]["swap_to"] == "layernorm"
    # the output of an LN layer is centered, so the RMS layer after it loses nothing by a swap
    assert summary[1]["swap_max_abs_diff"] < 1e-4
    assert summary[1]["mu_over_sigma"]["max"] < 1e-5


def test_swap_difference_matches_the_relation():
    """LN swapped for RMSNorm (γ = 1, β = 0): ‖Δy‖²/d per row = 2 − 2σ/RMS (tiny ε)."""
    ln = nn.LayerNorm(64, eps=1e-12, dtype=torch.float64)
    x = torch.randn(200, 64, dtype=torch.float64) + 0.3
    res = inspect_model(ln, x)
    layer = res.layers[0]
    s = rmsnorm.lab.row_stats(x)
    expected = (2 - 2 * s.std / s.rms).mean()  # Σ‖Δ‖² / Σ‖y‖², with ‖y‖²/d = 1 per row
    assert layer["swap_rel_diff"] == pytest.approx(float(expected.sqrt()), rel=1e-6)
    assert layer["mu_over_sigma"]["q50"] == pytest.approx(
        float(s.ratio.median()), rel=1e-3, abs=1e-3
    )


# --------------------------------------------------------------------------------------------------
# The capture (lab/experiments/inspection/capture.py) on grouped and gated RMSNorm: the statistics
# are of what each norm normalizes (x, or x·act(z) when it gates first), per group, and the swap is
# the centering LayerNorm of that (then the same gate), all checked against hand computations in
# float64, for this library's modules, the Hugging Face gated classes (patched and not) inside a
# small module, the tiny gated models of ``rmsnorm inspect``, and the layers it cannot read.

N, EPS = 12, 1e-3
NTG, GTN = capture.NORM_THEN_GATE, capture.GATE_THEN_NORM
_ACT = {"silu": nn.functional.silu, "sigmoid": torch.sigmoid}


class Mixer(nn.Module):
    """A projection to (x, z), then the norm: ``call`` passes the gate by position, by keyword or
    not at all. It keeps what its norm saw and returned, for the hand computations."""

    def __init__(self, norm: nn.Module, n: int = N, call: str = "positional", dtype=None):
        super().__init__()
        self.proj = nn.Linear(8, 2 * n, dtype=dtype)
        self.norm = norm
        self.call = call

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x, z = self.proj(h).chunk(2, dim=-1)  # z is a strided view
        x = x + 0.5  # a mean, per row and per group, for the statistics to see
        if self.call == "none":
            y = self.norm(x)
        elif self.call == "keyword":
            y = self.norm(x, gate=z)
        else:
            y = self.norm(x, z)
        self.seen = (x.detach(), None if self.call == "none" else z.detach(), y.detach())
        return y


def expected(x, z, weight, eps, g, order, activation="silu") -> dict:
    """Hand computation in float64 of what the capture should report: the rows v the norm
    normalizes (x, or x·act(z) gating first), their per-group |μ|/σ, μ²/RMS², σ/RMS, and the
    centering LayerNorm of v per group with γ (then × act(z) gating after)."""
    x = x.double()
    a = None if z is None else _ACT[activation](z.double())
    v = x * a if a is not None and order == GTN else x
    groups = v.reshape(-1, g)
    mu = groups.mean(-1)
    sd = (groups - mu[:, None]).square().mean(-1).sqrt()
    rms = groups.square().mean(-1).sqrt()
    ln = (groups - mu[:, None]) / (sd[:, None].square() + eps).sqrt()
    ln = ln.reshape(v.shape) * weight.detach().double()
    if a is not None and order == NTG:
        ln = ln * a
    return {"ratio": mu.abs() / sd, "share": (mu / rms).square(), "cos": sd / rms, "ln": ln}


def assert_measures(layer: dict, want: dict, y: torch.Tensor, rel: float) -> None:
    """The layer's summary against :func:`expected`: the statistics' quantiles and means, and the
    swap's largest and relative difference from the layer's own output y."""
    ratio = summarize(want["ratio"])
    for q in ("mean", "q05", "q50", "q95"):
        assert layer["mu_over_sigma"][q] == pytest.approx(ratio[q], rel=rel), q
    assert layer["mean_energy_share"]["mean"] == pytest.approx(float(want["share"].mean()), rel=rel)
    assert layer["predicted_cosine"]["mean"] == pytest.approx(float(want["cos"].mean()), rel=rel)
    assert layer["rows"] == want["ratio"].numel()
    assert layer["swap_error"] is None
    diff = y.double() - want["ln"]
    assert layer["swap_max_abs_diff"] == pytest.approx(float(diff.abs().max()), rel=rel)
    swap_rel = float(diff.norm() / y.double().norm())
    assert layer["swap_rel_diff"] == pytest.approx(swap_rel, rel=rel)


def run(model: Mixer, dtype=torch.float64, **kwargs) -> dict:
    h = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0), dtype=dtype)
    with capture.NormCapture(model, **kwargs) as cap:
        model(h)
    (layer,) = [s for s in cap.summary() if s["name"] == "norm"]
    return layer


def randomized(module: nn.Module) -> nn.Module:
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.rand(p.shape, generator=g, dtype=p.dtype) + 0.5)
    return module


# ------------------------------------------------------------------------------------------------
# This library's modules
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("call", ["positional", "keyword", "none"])
@pytest.mark.parametrize("group_size", [None, 4])
@pytest.mark.parametrize(
    "norm_before_gate, activation", [(True, "silu"), (False, "silu"), (False, "sigmoid")]
)
def test_gated_rms_norm(norm_before_gate, activation, group_size, call):
    norm = rmsnorm.GatedRMSNorm(
        N,
        EPS,
        group_size=group_size,
        norm_before_gate=norm_before_gate,
        activation=activation,
        dtype=torch.float64,
    )
    model = Mixer(randomized(norm), call=call, dtype=torch.float64)
    layer = run(model)
    x, z, y = model.seen
    order = NTG if norm_before_gate else GTN
    g = group_size or N
    assert_measures(layer, expected(x, z, norm.weight, EPS, g, order, activation), y, 1e-9)
    assert layer["kind"] == "rmsnorm" and layer["gate"] == order
    assert layer["group_size"] == g and layer["groups"] == N // g
    assert layer["tokens"] == 10 and layer["gated_calls"] == (call != "none")
    what = f"x·{activation}(gate)" if order == GTN and call != "none" else "x"
    per_group = ", per group of 4" if group_size else ""
    assert layer["normalizes"] == what + per_group


def test_grouped_rms_norm_and_its_residual_form():
    norm = randomized(rmsnorm.RMSNorm(N, EPS, group_size=3, dtype=torch.float64))
    model = Mixer(norm, call="none", dtype=torch.float64)
    layer = run(model)
    x, _, y = model.seen
    assert_measures(layer, expected(x, None, norm.weight, EPS, 3, None), y, 1e-9)
    assert layer["groups"] == 4 and layer["normalizes"] == "x, per group of 3"

    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = randomized(rmsnorm.AddRMSNorm(N, EPS, group_size=4, dtype=torch.float64))

        def forward(self, h):
            out, h_out = self.norm(h[..., :N], residual=h[..., N:] + 1.0)
            self.seen = (h_out.detach(), out.detach())
            return out

    model = Residual()
    h = torch.randn(3, 2 * N, dtype=torch.float64)
    with capture.NormCapture(model) as cap:
        model(h)
    (layer,) = cap.summary()
    v, y = model.seen  # it normalizes x + residual, its second output
    assert_measures(layer, expected(v, None, model.norm.weight, EPS, 4, None), y, 1e-9)
    assert layer["normalizes"] == "x + residual, per group of 4"


def test_a_gated_norm_in_half_precision_and_the_token_cap():
    """bfloat16: the statistics of x·silu(z) computed in float32 as the norm does, the swap
    within bfloat16's rounding of the output; the cap counts tokens, each with its G groups."""
    norm = rmsnorm.GatedRMSNorm(N, EPS, group_size=4, norm_before_gate=False)
    model = Mixer(randomized(norm)).to(torch.bfloat16)
    layer = run(model, torch.bfloat16, max_tokens_per_layer=4)
    x, z, y = model.seen
    want = expected(x, z, norm.weight, EPS, 4, GTN)
    assert layer["tokens"] == 4 and layer["rows"] == 4 * 3
    kept = summarize(want["ratio"][:12])
    assert layer["mu_over_sigma"]["q50"] == pytest.approx(kept["q50"], rel=1e-5)
    diff = y.double() - want["ln"]
    assert layer["swap_max_abs_diff"] == pytest.approx(float(diff.abs().max()), abs=0.05)
    assert layer["swap_max_abs_diff"] > 0.1  # the swap's own difference, well above rounding


# ------------------------------------------------------------------------------------------------
# Hugging Face's gated classes, unpatched and patched
# ------------------------------------------------------------------------------------------------
def _hf_class(short: str) -> type:
    pytest.importorskip("transformers")
    from hf_support import current_class

    return current_class(short)


HF_CASES = [
    # (class, constructor keywords, how the gate is passed, order, g, activation)
    ("qwen3_next.Qwen3NextRMSNormGated", {}, "positional", NTG, N, "silu"),
    ("kimi_linear.KimiLinearRMSNormGated", {}, "keyword", NTG, N, "sigmoid"),
    ("mamba2.MambaRMSNormGated", {"group_size": 4}, "positional", GTN, 4, "silu"),
    ("mamba2.MambaRMSNormGated", {"group_size": 4}, "none", GTN, 4, "silu"),
    ("bamba.BambaRMSNormGated", {"group_size": 6}, "keyword", GTN, 6, "silu"),
    ("falcon_h1.FalconH1RMSNormGated", {"n_groups": 3, "norm_before_gate": False}, "positional",
     GTN, 4, "silu"),
    ("falcon_h1.FalconH1RMSNormGated", {"n_groups": 2, "norm_before_gate": True}, "positional",
     NTG, 6, "silu"),
]  # fmt: skip


@pytest.mark.parametrize("patched", [False, True], ids=["unpatched", "patched"])
@pytest.mark.parametrize("case", HF_CASES, ids=lambda c: f"{c[0]}{c[1] or ''}-{c[2]}")
def test_hugging_face_gated_classes(case, patched):
    short, build, call, order, g, activation = case
    norm = randomized(_hf_class(short)(N, eps=EPS, **build))
    model = Mixer(norm, call=call)
    if patched:
        from rmsnorm.integrations import hf

        assert hf.patch(model) == ["norm"]
    layer = run(model, torch.float32)
    x, z, y = model.seen
    # the classes compute in float32: statistics and swap to its rounding
    assert_measures(layer, expected(x, z, norm.weight, EPS, g, order, activation), y, 1e-4)
    assert layer["gate"] == order and layer["activation"] == activation
    assert layer["groups"] == N // g


class Direct(nn.Module):
    def __init__(self, norm: nn.Module):
        super().__init__()
        self.norm = norm

    def forward(self, x, z):
        return self.norm(x, z)


@pytest.mark.parametrize("patched", [False, True], ids=["unpatched", "patched"])
@pytest.mark.parametrize(
    "short, build",
    [("qwen3_next.Qwen3NextRMSNormGated", {}), ("mamba2.MambaRMSNormGated", {"group_size": 4})],
)
def test_rows_centered_per_group_lose_nothing_in_the_swap(short, build, patched):
    """Where what the norm normalizes is centered in every group, RMSNorm is LayerNorm: the swap
    changes nothing. Mamba2 normalizes u = x·silu(z): x = u/silu(z) with u centered per group
    and x not (a capture that centered x, or dropped the gate, would see a difference of order
    1, or, for Qwen3-Next's required gate, fail)."""
    norm = randomized(_hf_class(short)(N, eps=1e-9, **build))
    model = Direct(norm)
    if patched:
        from rmsnorm.integrations import hf

        assert hf.patch(model) == ["norm"]
    gen = torch.Generator().manual_seed(1)
    u = torch.randn(6, N // 4, 4, generator=gen, dtype=torch.float64)
    u = (u - u.mean(-1, keepdim=True)).reshape(6, N)
    z = torch.randn(6, N, generator=gen, dtype=torch.float64).abs() + 0.5
    x = u / nn.functional.silu(z) if "mamba" in short else u
    with capture.NormCapture(model) as cap:
        model(x.float(), z.float())
    (layer,) = cap.summary()
    assert layer["swap_error"] is None and layer["swap_rel_diff"] < 1e-6
    assert layer["mu_over_sigma"]["max"] < 1e-5


# ------------------------------------------------------------------------------------------------
# Layers the capture cannot read: a clear swap_error, no number
# ------------------------------------------------------------------------------------------------
class MyRMSNormGated(nn.Module):
    """A gated norm that no convention knows: found by its name, gate then norm, per group."""

    def __init__(self, n, group_size, eps=EPS):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.variance_epsilon = eps
        self.group_size = group_size

    def forward(self, hidden_states, gate=None):
        h = hidden_states.float()
        if gate is not None:
            h = h * nn.functional.silu(gate.float())
        groups = h.unflatten(-1, (-1, self.group_size))
        groups = groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * groups.flatten(-2).to(hidden_states.dtype)


def test_an_unknown_gated_class_is_not_measured_until_registered():
    from rmsnorm.integrations import hf

    class LocalRMSNormGated(MyRMSNormGated):
        pass

    norm = randomized(LocalRMSNormGated(N, 4))
    model = Mixer(norm)
    assert norm_layers.norm_kind(norm) == "rmsnorm"  # by its name and the probe
    layer = run(model, torch.float32)
    assert layer["tokens"] == 0 and layer["calls"] == 1
    assert re.search(r"recognised by its name only.*argument 1.*hf\.register", layer["swap_error"])
    assert layer["swap_rel_diff"] != layer["swap_rel_diff"]  # NaN, not a number
    hf.register(LocalRMSNormGated, "mamba2_gated")  # how it computes: Mamba2's convention
    layer = run(model, torch.float32)
    x, z, y = model.seen
    assert_measures(layer, expected(x, z, norm.weight, EPS, 4, GTN), y, 1e-4)


def test_gating_first_with_an_activation_the_library_does_not_compute():
    from rmsnorm.integrations import hf

    class GeluRMSNormGated(MyRMSNormGated):
        def __init__(self, n):
            super().__init__(n, n)
            self.activation = "gelu"

    hf.register(
        GeluRMSNormGated,
        hf.Convention(
            "rms",
            "variance_epsilon",
            "llama",
            gate="optional",
            norm_before_gate=False,
            activation_attr="activation",
            group_size_attr="group_size",
        ),
    )
    layer = run(Mixer(GeluRMSNormGated(N)), torch.float32)
    assert "activation 'gelu'" in layer["swap_error"] and layer["tokens"] == 0


# ------------------------------------------------------------------------------------------------
# rmsnorm inspect on tiny gated models
# ------------------------------------------------------------------------------------------------
def _recording(model: nn.Module, suffix: str) -> dict:
    """Forward hooks that keep the (x, gate, y) of the first call of the layers whose name ends
    with ``suffix`` (the capture's swap calls a norm-then-gate layer again, on centered x)."""
    seen = {}
    for name, module in model.named_modules():
        if name.endswith(suffix):

            def hook(module, args, output, name=name):
                seen.setdefault(name, (args[0].detach(), args[1].detach(), output.detach()))

            module.register_forward_hook(hook)
    return seen


@pytest.mark.parametrize(
    "source, suffix, order, groups, tokens",
    [
        ("tiny-mamba2", "mixer.norm", GTN, 2, 2 * 16),
        ("tiny-qwen3-next", "linear_attn.norm", NTG, 1, 2 * 16 * 4),
    ],
)
def test_inspect_tiny_gated_models(source, suffix, order, groups, tokens):
    """Every gated layer measured, with the model's own gate, against a hand computation from
    what the layer saw (Qwen3-Next normalizes each of its 4 value heads as a row)."""
    pytest.importorskip("transformers")
    loaded = inspection.load_runnable_model(source)
    seen = _recording(loaded.model, suffix)
    ids, how = inspection.make_inputs(loaded, batch=2, seq_len=16)
    res = inspection.inspect_model(loaded.model, ids, forward=loaded.forward, description=how)
    gated = [layer for layer in res.layers if layer["name"].endswith(suffix)]
    assert len(gated) == (2 if order == GTN else 1) and set(seen) == {g["name"] for g in gated}
    for layer in gated:
        module = loaded.model.get_submodule(layer["name"])
        x, z, y = seen[layer["name"]]
        g = x.shape[-1] // groups
        want = expected(x, z, module.weight, module.variance_epsilon, g, order)
        assert_measures(layer, want, y, 1e-4)
        assert layer["gated_calls"] == layer["calls"] == 1 and layer["tokens"] == tokens
    for layer in res.layers:
        assert layer["swap_error"] is None and 0 < layer["predicted_cosine"]["mean"] <= 1


def test_inspect_command_on_a_saved_gated_model(tmp_path):
    """``rmsnorm inspect`` on a tiny Mamba2 saved to a directory (loaded offline) and on the
    built-in Qwen3-Next: the gated kinds in the table, the gated layers in the JSON."""
    pytest.importorskip("transformers")
    from typer.testing import CliRunner

    from rmsnorm.cli import app

    model = copy.deepcopy(inspection.load_runnable_model("tiny-mamba2").model)
    model.save_pretrained(tmp_path / "mamba2")
    runner = CliRunner()
    out = tmp_path / "inspect.json"
    args = ["--seq-len", "16", "--batch", "2", "--no-channels"]
    result = runner.invoke(
        app, ["inspect", "--model", str(tmp_path / "mamba2"), *args, "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "z→RMS/2" in result.output and "statistics and swap per group" in result.output
    layers = json.loads(out.read_text())["layers"]
    from hf_support import current_name

    gated = current_name("mamba2.MambaRMSNormGated").split(".")[1]
    mixers = [layer for layer in layers if layer["class"] == gated]
    assert len(mixers) == 2 and {layer["normalizes"] for layer in mixers} == {
        "x·silu(gate), per group of 64"
    }
    result = runner.invoke(app, ["inspect", "--model", "tiny-qwen3-next", *args])
    assert result.exit_code == 0, result.output
    assert "RMS→z" in result.output and "no swap" not in result.output


# --------------------------------------------------------------------------------------------------
# Model inspection (lab/experiments/inspection/run.py): the built-in and tiny Hugging Face models
# (built from a config, offline), local model directories, inputs, and errors naming what was looked
# for.


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
    found = norm_layers.find_norm_layers(loaded.model)
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
    assert len(norm_layers.find_norm_layers(again.model)) == 5
