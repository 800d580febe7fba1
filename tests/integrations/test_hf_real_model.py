"""A real pretrained model patched end to end: SmolLM2-135M-Instruct (Llama architecture, 30
layers, 61 RMSNorms; the registry package's Q4_1 GGUF dequantized to float32). ``hf.patch`` and
transformers' kernel route give logits within the shared tolerance rule of the float64 model, in
float32 and bfloat16, and patch every norm. Skipped, with the install command, where the weights
are not installed (``make test`` installs them)."""

from __future__ import annotations

import copy

import pytest
import torch

import rmsnorm
from rmsnorm.integrations import hf
from rmsnorm.testing import assert_close_to_reference

pytest.importorskip("transformers")
pytest.importorskip("gguf")

PROMPT = "The centering of LayerNorm subtracts the mean of every hidden vector before scaling it."


@pytest.fixture(scope="module")
def smollm2():
    from rmsnorm.lab.models import weights
    from rmsnorm.lab.models.pretrained import load_pretrained

    try:
        weights.resolve("smollm2-135m")
    except weights.WeightsMissingError as exc:
        pytest.skip(str(exc))
    loaded = load_pretrained("smollm2-135m")
    ids = loaded.tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        exact = copy.deepcopy(loaded.model).double()(ids).logits
    return loaded.model, ids, exact


def _kernelize(model: torch.nn.Module) -> int:
    kernels = pytest.importorskip("kernels")
    from rmsnorm.integrations.kernels import kernel_mapping, routes

    with kernels.use_kernel_mapping(kernel_mapping(devices=("cpu",))):
        kernels.kernelize(model, mode=kernels.Mode.INFERENCE, device="cpu")
    served = routes(model)
    assert all(isinstance(conv, hf.Convention) for conv in served.values()), served
    return len(served)


@pytest.mark.parametrize("route", ["hf.patch", "kernelize"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_smollm2_logits_within_the_tolerance_rule(smollm2, route, dtype):
    model, ids, exact = smollm2
    base = copy.deepcopy(model).to(dtype)
    routed = copy.deepcopy(base)
    n = len(hf.patch(routed)) if route == "hf.patch" else _kernelize(routed)
    assert n == 61  # 2 per layer, 30 layers, and the final norm
    with torch.no_grad():
        eager = base(ids).logits
        rmsnorm.set_debug(True)  # records this library's calls: proves its op ran
        try:
            got = routed(ids).logits
            call = rmsnorm.last_calls().get("rms_norm")
        finally:
            rmsnorm.set_debug(False)
    assert call is not None and call["dtype"] == str(dtype).removeprefix("torch."), call
    assert_close_to_reference(got, exact, eager, name=f"SmolLM2 {route} {dtype} logits")
