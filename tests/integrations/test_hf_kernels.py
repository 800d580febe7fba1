"""rmsnorm.integrations.kernels, transformers' own kernel route: the mapping handed to the
``kernels`` package's ``kernelize`` on tiny Llama, Qwen3, Gemma3, Qwen3-Next and Qwen3.5 models
(logits and gradients against the un-kernelized model, a spy on this library's calls,
torch.compile), every class of the installed transformers that carries one of the hub names
(served at parity, or keeping its own forward with a reason), and the classes and instances the
layers leave alone. Everything runs offline: the repositories are in process."""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import logging
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

import rmsnorm
from rmsnorm.integrations import hf
from rmsnorm.integrations import kernels as rk
from rmsnorm.integrations.hf import discovery, registry
from rmsnorm.testing import assert_close_to_reference

kernels = pytest.importorskip("kernels", reason="the kernels package is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
from kernels import (  # noqa: E402  (after the skips)
    Mode,
    get_kernelized_layers,
    kernelize,
    use_kernel_forward_from_hub,
    use_kernel_mapping,
)

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
    head_dim=8,  # Qwen3's / Gemma3's q_norm and k_norm at the head size
)
_LINEAR = dict(  # one linear-attention layer (its mixer's gated norm) and one full-attention layer
    linear_num_value_heads=4,
    linear_num_key_heads=2,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    layer_types=["linear_attention", "full_attention"],
)
_MOE = dict(
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    shared_expert_intermediate_size=16,
)
# name -> (config class, model class, overrides), looked up in the installed transformers.
# Gemma3's norm class carries no hub name in transformers 5.25: kernelize leaves it alone and the
# test says so (hf.patch serves it). Qwen3.5 has both "RMSNormGated" and "RMSNormZeroCentered".
MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {}),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM", {**_LINEAR, **_MOE}),
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", _LINEAR),
}


def build(name: str) -> nn.Module:
    """A tiny model with random weights, its norm weights moved away from their init (so that a
    missing offset or weight would show)."""
    config_cls, model_cls, overrides = MODELS[name]
    if not (hasattr(transformers, config_cls) and hasattr(transformers, model_cls)):
        pytest.skip(f"transformers {transformers.__version__} has no {model_cls}")
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(**{**_DEC, **overrides})
    config._attn_implementation = "eager"  # the same attention in every dtype
    config._experts_implementation = "eager"  # grouped_mm has no float64 (the expected model)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for module in model.modules():
            if "Norm" in type(module).__name__:
                for p in module.parameters(recurse=False):
                    p.copy_(torch.randn_like(p) * 0.5 + p.mean())
    return model


def kernelized(model: nn.Module, mode=Mode.INFERENCE) -> nn.Module:
    """``kernels.kernelize`` with this library's mapping alone (no other mapping inherited)."""
    with use_kernel_mapping(rk.kernel_mapping(), inherit_mapping=False):
        return kernelize(model, mode=mode, device="cpu")


def hub_modules(model: nn.Module) -> dict[str, str]:
    """Module name -> hub name, for the modules whose class carries one this library maps."""
    found = {}
    for name, module in model.named_modules():
        hub = getattr(type(module), "kernel_layer_name", None)
        if hub in rk.HUB_NAMES:
            found[name] = hub
    return found


def batch() -> dict:
    g = torch.Generator().manual_seed(1)
    return dict(input_ids=torch.randint(3, VOCAB, (BATCH, SEQ), generator=g))


def logits_and_grads(model: nn.Module, inputs: dict, run=None) -> tuple[torch.Tensor, dict]:
    """Logits, and the gradients of ``model``'s parameters, of ``run`` (default: the model)."""
    model.zero_grad(set_to_none=True)
    logits = (model if run is None else run)(**inputs).logits
    g = torch.Generator().manual_seed(2)  # a fixed cotangent: every logit counts, with its sign
    cot = torch.randn(logits.shape, generator=g, dtype=torch.float64).to(logits.dtype)
    (logits * cot).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads


class _Calls(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record.getMessage())


@contextlib.contextmanager
def spy(model: nn.Module):
    """(this library's calls, as its debug log says them; calls of the hub-named modules)."""
    handler, logger = _Calls(), logging.getLogger("rmsnorm.calls")
    calls: list[str] = []
    hooks = [
        module.register_forward_hook(lambda m, a, o, name=name: calls.append(name))
        for name, module in model.named_modules()
        if name in hub_modules(model)
    ]
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    rmsnorm.set_debug(True)
    try:
        yield handler.records, calls
    finally:
        rmsnorm.set_debug(False)
        logger.setLevel(level)
        logger.removeHandler(handler)
        for hook in hooks:
            hook.remove()


def check_ran(model: nn.Module, records: list[str], calls: list[str]) -> None:
    """Each call of a hub-named module ran exactly one of this library's ops, on its CPU backend."""
    ours = [r for r in records if r.startswith(("rmsnorm.rms_norm ", "rmsnorm.gated_rms_norm "))]
    assert len(ours) == len(calls), (len(ours), len(calls))
    assert all("cpu" in r.split(": ", 1)[1] for r in ours), ours[:2]
    assert set(calls) == set(hub_modules(model))


# ----------------------------------------------------------------------------------------------
# The mapping
# ----------------------------------------------------------------------------------------------
def test_the_mapping_maps_each_hub_name_on_cpu_and_cuda_in_every_mode_the_layer_supports():
    mapping = rk.kernel_mapping()
    assert list(mapping) == ["RMSNorm", "RMSNormGated", "RMSNormZeroCentered"]
    for hub, devices in mapping.items():
        layer = rk.LAYERS[hub]
        assert layer.has_backward is True and layer.can_torch_compile is True
        assert list(devices) == ["cpu", "cuda"]
        for modes in devices.values():
            assert set(modes) == {
                Mode.INFERENCE,
                Mode.TRAINING,
                Mode.INFERENCE | Mode.TORCH_COMPILE,
                Mode.TRAINING | Mode.TORCH_COMPILE,
            }
            assert set(modes.values()) == {rk.Repository(hub)}
            assert next(iter(modes.values())).load() is layer
    assert list(rk.kernel_mapping(["rocm"], ["RMSNormGated"])) == ["RMSNormGated"]
    # what kernels checks of a layer: an nn.Module without a constructor or members of its own
    for layer in rk.LAYERS.values():
        assert issubclass(layer, nn.Module) and layer.__init__ is nn.Module.__init__
        own = set(vars(layer)) - set(vars(nn.Module)) - {"__module__", "__doc__", "forward"}
        assert own <= {"has_backward", "can_torch_compile"}, own


def test_bad_arguments_get_clear_errors():
    with pytest.raises(ValueError, match="devices must be distinct names among"):
        rk.kernel_mapping(["cpu", "tpu"])
    with pytest.raises(ValueError, match="hub_names must be distinct names among"):
        rk.kernel_mapping(hub_names=["LayerNorm"])
    with pytest.raises(TypeError, match="devices must be a list of names, not one name"):
        rk.kernel_mapping("cpu")
    with pytest.raises(ValueError, match="layer_name must be one of"):
        rk.Repository("RMSNormFancy")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        rk.routes("model")


def test_importing_rmsnorm_imports_neither_the_route_nor_kernels_nor_transformers():
    code = (
        "import sys, rmsnorm, rmsnorm.integrations\n"
        "assert 'rmsnorm.integrations.kernels' not in sys.modules\n"
        "import rmsnorm.integrations.kernels\n"
        "bad = [m for m in ('kernels', 'transformers', 'triton') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ----------------------------------------------------------------------------------------------
# Whole tiny models
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(MODELS))
def test_kernelized_model_at_parity_float32_and_our_op_ran(name):
    model = build(name)
    inputs = batch()
    ref_logits, ref_grads = logits_and_grads(model, inputs)
    expected = hub_modules(model)
    assert rk.routes(model).keys() == expected.keys()
    assert all(isinstance(c, hf.Convention) for c in rk.routes(model).values())
    kernelized(model, Mode.TRAINING)
    assert get_kernelized_layers(model).layers.keys() == expected.keys()
    with spy(model) as (records, calls):
        logits, grads = logits_and_grads(model, inputs)
    check_ran(model, records, calls)
    assert (logits - ref_logits).abs().max().item() <= 1e-5
    assert grads.keys() == ref_grads.keys()
    for key, ref in ref_grads.items():
        err = (grads[key] - ref).abs().max().item()
        assert err <= 1e-5 * max(1.0, ref.abs().max().item()), (key, err)
    if not expected:  # Gemma3 in transformers 5.25: nothing ran, as check_ran saw; said here
        pytest.skip(
            f"{name}: no norm class carries a hub name in transformers {transformers.__version__}, "
            "so kernelize leaves its norms alone (hf.patch serves them)"
        )


@pytest.mark.parametrize("name", ["llama", "qwen3", "qwen3_5"])
def test_kernelized_model_at_parity_bfloat16(name):
    """Logits and gradients within the shared tolerance rule: the kernelized bf16 model's error
    against the float64 model is at most about twice the un-kernelized bf16 model's."""
    inputs = batch()
    expected_logits, expected_grads = logits_and_grads(build(name).double(), inputs)
    model = build(name).to(torch.bfloat16)
    eager_logits, eager_grads = logits_and_grads(model, inputs)
    kernelized(model, Mode.TRAINING)
    logits, grads = logits_and_grads(model, inputs)
    assert_close_to_reference(logits, expected_logits, eager_logits, name=f"{name} logits")
    for key, expected in expected_grads.items():
        assert_close_to_reference(
            grads[key], expected, eager_grads[key], name=f"{name} d{key}", rows=BATCH * SEQ
        )


@pytest.mark.parametrize("name", ["llama", "qwen3_5"])
def test_kernelized_model_at_parity_under_autocast(name):
    """fp32 weights with bf16 activations (CPU autocast), where the classes' casting rules give
    different output dtypes: the logits' dtype and values as the un-kernelized model's."""
    inputs = batch()
    expected = build(name).double()(**inputs).logits
    model = build(name)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = model(**inputs).logits
        kernelized(model)
        with spy(model) as (records, calls):
            logits = model(**inputs).logits
    check_ran(model, records, calls)
    assert_close_to_reference(logits.detach(), expected, eager.detach(), name=f"{name} logits")


def _recording_backend(seen: set):
    """A torch.compile backend that notes the ops of the graph dynamo hands it, then runs it."""

    def backend(gm, example_inputs):
        seen.update(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    return backend


def test_compiled_kernelized_llama_has_no_graph_break_and_runs_our_op():
    model = build("llama")
    inputs = batch()
    ref_logits, ref_grads = logits_and_grads(model, inputs)
    kernelized(model, Mode.TRAINING | Mode.TORCH_COMPILE)
    assert get_kernelized_layers(model).layers.keys() == hub_modules(model).keys()
    seen: set = set()
    compiled = torch.compile(model, fullgraph=True, backend=_recording_backend(seen))
    logits, grads = logits_and_grads(model, inputs, run=compiled)
    assert any(t.startswith("rmsnorm.rms_norm") for t in seen), sorted(seen)
    assert (logits - ref_logits).abs().max().item() <= 1e-5
    for key, ref in ref_grads.items():
        err = (grads[key] - ref).abs().max().item()
        assert err <= 1e-5 * max(1.0, ref.abs().max().item()), (key, err)


def test_compiled_gated_and_zero_centered_layers_run_our_ops():
    """Qwen3.5's two hub-named norms, kernelized for training with torch.compile, compiled on
    their own with fullgraph=True (its linear-attention mixer has graph breaks of its own)."""
    model = kernelized(build("qwen3_5"), Mode.TRAINING | Mode.TORCH_COMPILE)
    names = hub_modules(model)
    assert set(names.values()) == {"RMSNormGated", "RMSNormZeroCentered"}
    for name, hub in names.items():
        module = model.get_submodule(name)
        gated = hub == "RMSNormGated"
        n = module.weight.shape[0]
        x = torch.randn(3, 5, n, requires_grad=True)
        z = torch.randn(3, 5, n, requires_grad=True)
        args = (x, z) if gated else (x,)
        seen: set = set()
        compiled = torch.compile(module, fullgraph=True, backend=_recording_backend(seen))
        y = compiled(*args)
        op = "rmsnorm.gated_rms_norm" if gated else "rmsnorm.rms_norm"
        assert any(t.startswith(op) for t in seen), (name, sorted(seen))
        own = type(module).forward(module, *args)
        assert (y - own).abs().max().item() <= 1e-5, name
        dy = torch.randn_like(y)
        got = torch.autograd.grad(y, [*args, module.weight], dy)
        want = torch.autograd.grad(own, [*args, module.weight], dy)
        for a, b in zip(got, want, strict=True):
            assert (a - b).abs().max().item() <= 1e-5 * max(1.0, b.abs().max().item()), name


# ----------------------------------------------------------------------------------------------
# Every class of the installed transformers that carries a hub name
# ----------------------------------------------------------------------------------------------
WIDTH, EPS = 24, 0.1  # not a power of two; ε large enough that where it enters shows


def hub_classes() -> dict[str, list[type]]:
    """Hub name -> the classes of the installed transformers carrying it, found by the mark the
    decorator leaves (``kernel_layer_name``) in the modeling modules whose source names an
    RMSNorm (all of them carry one of these names; the others are not imported)."""
    found: dict[str, list[type]] = {hub: [] for hub in rk.HUB_NAMES}
    for name in discovery.modeling_module_names():
        with open(importlib.util.find_spec(name).origin, encoding="utf-8") as f:
            if "RMSNorm" not in f.read():
                continue
        try:
            module = importlib.import_module(name)
        except ImportError:  # a model whose optional dependency is missing (e.g. torchaudio)
            continue
        for cls in discovery.module_classes(module):
            hub = getattr(cls, "kernel_layer_name", None)
            if hub in found:
                found[hub].append(cls)
    return found


def _rows(dtype: torch.dtype, shape=(2, 6, WIDTH), seed=3) -> torch.Tensor:
    """Ordinary rows, a zero row, rows where ε matters, and large-magnitude rows (x² ~ 1e30)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64) + 0.4
    scale = torch.tensor([1.0, 0.0, 0.05, 3.0, 1e4, 1e15] * 2, dtype=torch.float64)
    return (x * scale.view(shape[0], shape[1], 1)).to(dtype)


def _gate(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(6)
    return (torch.randn(2, 6, WIDTH, generator=g, dtype=torch.float64) * 3).to(dtype)


def _run(module: nn.Module, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, list]:
    leaves = [t.clone().requires_grad_(True) for t in inputs]
    y = module(*leaves)
    g = torch.Generator().manual_seed(4)
    cot = torch.randn(y.shape, generator=g, dtype=torch.float64).to(y.dtype)
    (y * cot).sum().backward()
    grads = [t.grad for t in leaves] + [p.grad for p in module.parameters()]
    module.zero_grad(set_to_none=True)
    return y.detach(), grads


def _check_class(cls: type, hub: str) -> None:
    label = registry.qualname(cls)
    try:
        module = cls(hidden_size=WIDTH, eps=EPS)
    except TypeError as exc:
        raise AssertionError(f"cannot build {label}(hidden_size, eps) to check it: {exc}") from exc
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5 + 0.8)
    own = copy.deepcopy(module)  # keeps the class's own forward
    route = rk.routes(module)[""]
    kernelized(module, Mode.TRAINING)
    n_inputs = 2 if hub == "RMSNormGated" else 1
    if isinstance(route, str):  # refused: its own forward runs, and the reason is said
        assert len(route) >= 15, (label, route)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            x = [_rows(torch.float32), _gate(torch.float32)][:n_inputs]
            assert torch.equal(module(*x), own(*x)), label
        return
    assert (route.gate is not None) == (n_inputs == 2), label
    # float32: values and gradients (input, gate, weight) against the class's own forward
    x = [_rows(torch.float32), _gate(torch.float32)][:n_inputs]
    (y, grads), (y_own, grads_own) = _run(module, x), _run(own, x)
    assert y.dtype == y_own.dtype, label
    assert (y - y_own).abs().max().item() <= 1e-5 * y_own.abs().max().item(), label
    for a, b in zip(grads, grads_own, strict=True):
        assert (a - b).abs().max().item() <= 1e-5 * max(1.0, b.abs().max().item()), label
    # bfloat16 inputs, with bf16 and with fp32 weights (autocast's case): values and gradients
    # within the shared tolerance rule against the class's own forward in float64
    half = [_rows(torch.bfloat16), _gate(torch.bfloat16)][:n_inputs]
    expected = _run(copy.deepcopy(own).double(), [t.double() for t in half])
    for weights in (torch.bfloat16, torch.float32):
        ours = _run(copy.deepcopy(module).to(weights), half)
        eager = _run(copy.deepcopy(own).to(weights), half)
        assert ours[0].dtype == eager[0].dtype, (label, weights)
        assert_close_to_reference(ours[0], expected[0], eager[0], name=f"{label} {weights}")
        for i, (a, e, b) in enumerate(zip(ours[1], expected[1], eager[1], strict=True)):
            rows = 12 if i >= n_inputs else 1  # a weight's gradient sums over the 12 rows
            assert_close_to_reference(a, e, b, name=f"{label} {weights} grad {i}", rows=rows)


def test_every_class_carrying_a_hub_name_is_served_at_parity_or_refused_with_a_reason():
    found = hub_classes()
    if not any(found.values()):
        pytest.skip(f"transformers {transformers.__version__} decorates no norm with these names")
    for hub, classes in found.items():
        for cls in classes:
            _check_class(cls, hub)


# ----------------------------------------------------------------------------------------------
# What the layers leave alone: their own forward runs, with the reason said
# ----------------------------------------------------------------------------------------------
@use_kernel_forward_from_hub("RMSNorm")
class EpsOutsideRootNorm(nn.Module):
    """Carries "RMSNorm" but computes x / (RMS + ε): no convention the recognition knows."""

    def __init__(self, n: int):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(n) + 0.5)
        self.variance_epsilon = 0.1

    def forward(self, hidden_states):
        rms = hidden_states.pow(2).mean(-1, keepdim=True).sqrt()
        return self.weight * hidden_states / (rms + self.variance_epsilon)


@use_kernel_forward_from_hub("RMSNorm")
class GateUnderPlainNameNorm(EpsOutsideRootNorm):
    """Registered as a gated convention while its hub name's classes take one input."""


@use_kernel_forward_from_hub("RMSNormGated")
class ExtraInputGatedNorm(EpsOutsideRootNorm):
    """Registered as Qwen3-Next's gated norm, but its forward takes a third input."""

    def forward(self, hidden_states, gate, scale):
        return super().forward(hidden_states) * gate * scale


def test_an_unrecognised_class_keeps_its_own_forward_with_a_warning_once():
    module = EpsOutsideRootNorm(WIDTH)
    why = rk.routes(module)[""]
    assert isinstance(why, str) and "none of the known" in why, why
    x = _rows(torch.float32)
    own = module(x)
    kernelized(module)
    assert get_kernelized_layers(module).layers.keys() == {""}  # kernelize bound our layer ...
    with pytest.warns(
        UserWarning, match=r"EpsOutsideRootNorm \(hub name 'RMSNorm'\) keeps its own"
    ):
        assert torch.equal(module(x), own)  # ... which runs the class's own forward
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per class and reason
        assert torch.equal(module(x), own)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x), own)


def test_a_convention_that_does_not_fit_the_hub_name_is_refused():
    hf.register(GateUnderPlainNameNorm, "qwen3_next_gated")
    hf.register(ExtraInputGatedNorm, "qwen3_next_gated")
    why = rk.routes(GateUnderPlainNameNorm(WIDTH))[""]
    assert "takes gate, where the classes of 'RMSNorm' take none" in why, why
    module = ExtraInputGatedNorm(WIDTH)
    why = rk.routes(module)[""]
    assert "its forward takes (hidden_states, gate, scale)" in why, why


def test_an_instance_the_op_cannot_run_keeps_its_own_forward():
    model = build("llama")
    norm = model.model.norm  # Llama's class, whatever this release calls it
    norm.variance_epsilon = torch.tensor(1e-6)  # a tensor ε: the convention reads a number
    routes = rk.routes(model)
    assert routes["model.norm"].startswith("this instance: its variance_epsilon is tensor("), routes
    assert isinstance(routes["model.layers.0.input_layernorm"], hf.Convention)
    x = _rows(torch.float32, (2, 6, 32))
    own = norm(x)
    kernelized(model)
    with pytest.warns(UserWarning, match="this instance: its variance_epsilon"):
        assert torch.equal(norm(x), own)
    layer = model.model.layers[0].input_layernorm
    with spy(layer) as (records, calls):
        layer(x)
    check_ran(layer, records, calls)


def test_a_copy_stays_kernelized_hf_patch_composes_and_an_empty_mapping_undoes_it():
    inputs = batch()
    model = build("llama")
    ref = model(**inputs).logits
    hf.patch(model)  # both routes on one model: the same convention
    kernelized(model)
    twin = copy.deepcopy(model)
    for m in (model, twin):
        with spy(m) as (records, calls):
            logits = m(**inputs).logits
        check_ran(m, records, calls)
        assert calls and (logits - ref).abs().max().item() <= 1e-5
    with use_kernel_mapping({}, inherit_mapping=False):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    assert not get_kernelized_layers(model).layers
    assert all("forward" not in m.__dict__ for m in model.modules())
