"""The public API's docstrings, torch-style: every public function and module has ``Args:`` and a
runnable ``Example::`` (run here with :mod:`doctest`), and those taking tensors a ``Shape:``."""

import doctest

import pytest
import torch

import rmsnorm
from rmsnorm import integrations
from rmsnorm.integrations import distributed, hf
from rmsnorm.integrations import kernels as kernel_route

TENSOR_API = [
    rmsnorm.rms_norm,
    rmsnorm.add_rms_norm,
    rmsnorm.gated_rms_norm,
    rmsnorm.layer_norm,
    rmsnorm.RMSNorm,
    rmsnorm.AddRMSNorm,
    rmsnorm.GatedRMSNorm,
    rmsnorm.LayerNorm,
]
OTHER_API = [
    rmsnorm.use_backend,
    rmsnorm.set_debug,
    rmsnorm.last_calls,
    integrations.replace_norms,
    integrations.restore_norms,
    integrations.norm_kind,
    hf.register,
    hf.convention_of,
    hf.recognised_by,
    hf.explain,
    hf.patch,
    hf.unpatch,
    hf.is_patched,
    hf.patch_classes,
    hf.unpatch_classes,
    distributed.norm_parameters,
    distributed.all_reduce_norm_grads,
    kernel_route.Repository,
    kernel_route.kernel_mapping,
    kernel_route.routes,
]
NEEDS = {kernel_route.kernel_mapping: "kernels"}  # an optional package the example imports
PUBLIC = TENSOR_API + OTHER_API


def _name(obj) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def test_the_list_covers_the_public_api():
    listed = {obj.__name__ for obj in PUBLIC}
    assert set(rmsnorm.__all__) - {"__version__"} <= listed
    assert set(integrations.__all__) <= listed
    assert set(distributed.__all__) <= listed
    assert {n for n in hf.__all__ if callable(getattr(hf, n)) and n != "Convention"} <= listed
    # the kernel route's functions and repository (its layers are bound by kernels, not called)
    route = kernel_route
    assert {n for n in route.__all__ if callable(getattr(route, n)) and "Layer" not in n} <= listed


@pytest.mark.parametrize("obj", PUBLIC, ids=_name)
def test_sections(obj):
    doc = obj.__doc__ or ""
    assert "\n    Args:\n" in doc and "\n    Example::\n" in doc, _name(obj)
    if obj in TENSOR_API:
        assert "\n    Shape:\n" in doc, _name(obj)


@pytest.mark.parametrize("obj", PUBLIC, ids=_name)
def test_examples_run(obj):
    if obj in NEEDS:
        pytest.importorskip(NEEDS[obj])
    finder = doctest.DocTestFinder(recurse=False)
    (test,) = finder.find(obj, _name(obj), globs={"torch": torch, "rmsnorm": rmsnorm})
    assert test.examples, f"{_name(obj)} has no example"
    report = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS, verbose=False)
    torch.manual_seed(0)
    result = runner.run(test, out=report.append)
    assert result.failed == 0, "".join(report)
