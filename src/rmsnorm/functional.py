"""The functional API: validate arguments, flatten to (M, N) rows, call the custom op, restore the
shape.

Signatures and defaults follow ``torch.nn.functional.rms_norm`` / ``layer_norm``; the conventions
(``eps_mode``, ``casting_mode``, ``offset``, ``bias``, ``partial``) are keyword-only and documented
in :mod:`rmsnorm.reference`, which states each formula.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from . import _backend, _ops  # noqa: F401  (_ops registers torch.ops.rmsnorm.*)
from .reference import CASTING_MODES, EPS_MODES, default_eps, partial_size

__all__ = ["rms_norm", "add_rms_norm", "layer_norm"]

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
# Devices on which torch's autocast runs rms_norm / layer_norm in float32
# (aten/src/ATen/autocast_mode.cpp);
# on CPU autocast leaves both ops alone, and so do we.
_AUTOCAST_FP32_RMS = ("cuda", "xpu", "mtia", "maia")
_AUTOCAST_FP32_LN = _AUTOCAST_FP32_RMS + ("mps",)

ShapeLike = int | Sequence[int] | torch.Size


# ----------------------------------------------------------------------------------------------
# Validation: every message names the argument and the expected form.
# ----------------------------------------------------------------------------------------------
def _check_float_tensor(t: object, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be a floating-point tensor (float32, bfloat16, float16 or float64), "
            f"got dtype {t.dtype}"
        )


def _normalized_shape(input: torch.Tensor, normalized_shape: ShapeLike) -> tuple[tuple, int]:
    """The normalized dims as a tuple and their element count N (input's trailing dims)."""
    if isinstance(normalized_shape, int) and not isinstance(normalized_shape, bool):
        shape = (normalized_shape,)
    elif isinstance(normalized_shape, (Sequence, torch.Size)) and all(
        isinstance(d, (int, torch.SymInt)) and not isinstance(d, bool) for d in normalized_shape
    ):
        shape = tuple(normalized_shape)
    else:
        raise TypeError(
            f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}"
        )
    if len(shape) == 0:
        raise ValueError("normalized_shape must name at least one dimension, got ()")
    if input.dim() < len(shape) or tuple(input.shape[input.dim() - len(shape) :]) != shape:
        raise ValueError(
            f"normalized_shape {list(shape)} must match the trailing dimensions of input, "
            f"whose shape is {list(input.shape)}"
        )
    n = math.prod(shape)
    if n == 0:
        raise ValueError(f"normalized_shape {list(shape)} has no elements to normalize over")
    return shape, n


def _check_param(p: torch.Tensor | None, name: str, shape: tuple, input: torch.Tensor) -> None:
    if p is None:
        return
    _check_float_tensor(p, name)
    if tuple(p.shape) != shape:
        raise ValueError(
            f"{name} must have shape {list(shape)} (the normalized_shape), got {list(p.shape)}"
        )
    if p.device != input.device:
        raise ValueError(f"{name} is on {p.device} but input is on {input.device}")


def _check_eps(eps: object, input: torch.Tensor) -> float:
    if eps is None:
        return default_eps(input.dtype)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a float or None, got {type(eps).__name__}")
    eps = float(eps)
    # Comparisons (unlike math.isfinite) stay traceable under torch.compile; NaN fails them too.
    if not (0.0 <= eps < math.inf):
        raise ValueError(f"eps must be a finite number >= 0, got {eps}")
    return eps


def _check_rms_options(
    eps_mode: str, casting_mode: str, offset: float, partial: float | None, weight
) -> float:
    if eps_mode not in EPS_MODES:
        raise ValueError(f"eps_mode must be one of {EPS_MODES}, got {eps_mode!r}")
    if casting_mode not in CASTING_MODES:
        raise ValueError(f"casting_mode must be one of {CASTING_MODES}, got {casting_mode!r}")
    if (
        isinstance(offset, bool)
        or not isinstance(offset, (int, float))
        or not (-math.inf < offset < math.inf)
    ):
        raise ValueError(f"offset must be a finite float, got {offset!r}")
    if offset != 0.0 and weight is None:
        raise ValueError(
            f"offset={offset} scales the weight (offset + weight) and needs a weight, "
            "got weight=None"
        )
    if partial is not None and (
        isinstance(partial, bool)
        or not isinstance(partial, (int, float))
        or not (0.0 < partial <= 1.0)
    ):
        raise ValueError(f"partial must be a float in (0, 1] or None, got {partial!r}")
    return float(offset)


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """(M, N) view of t when possible; kernels need a unit stride along N (rows may be strided)."""
    t2 = t.reshape(-1, n)
    return t2 if n == 1 or t2.stride(-1) == 1 else t2.contiguous()


def _flat(p: torch.Tensor | None, n: int) -> torch.Tensor | None:
    return None if p is None else p.reshape(n)


def _fp32(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None or t.dtype in (torch.float32, torch.float64):
        return t
    return t.float()


def _autocast_to_fp32(device_type: str, devices: tuple[str, ...]) -> bool:
    return device_type in devices and torch.is_autocast_enabled(device_type)


def _forward(name: str, *tensors: torch.Tensor | None):
    """The forward to call: the custom op, or, when the dispatcher could do nothing but route the
    call to the backend (eager, no gradient wanted, plain CPU/CUDA tensors, no mode or transform
    active), the backend's launcher itself. Decoding-size calls are launch-bound and the dispatcher
    plus the autograd wrapper cost several times a kernel launch; compile, export, autograd,
    dispatch modes and tensor subclasses always see the op."""
    if (
        torch.compiler.is_compiling()
        or torch._C._len_torch_dispatch_stack()
        or torch._C._is_torch_function_mode_enabled()
        or torch._C._are_functorch_transforms_active()
        or tensors[0].device.type not in ("cpu", "cuda")
    ):
        return getattr(torch.ops.rmsnorm, name)
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) is not torch.Tensor or (grad and t.requires_grad)):
            return getattr(torch.ops.rmsnorm, name)
    return getattr(_backend.launchers(tensors[0].device.type), name)


def _rms_arguments(
    input, normalized_shape, weight, eps, eps_mode, casting_mode, offset, bias, partial
):
    """The checks rms_norm and add_rms_norm share, then autocast; returns what the op needs:
    (input, weight, bias, N, eps, offset, k)."""
    shape, n = _normalized_shape(input, normalized_shape)
    _check_param(weight, "weight", shape, input)
    _check_param(bias, "bias", shape, input)
    eps = _check_eps(eps, input)
    offset = _check_rms_options(eps_mode, casting_mode, offset, partial, weight)
    if _autocast_to_fp32(input.device.type, _AUTOCAST_FP32_RMS):
        input, weight, bias = _fp32(input), _fp32(weight), _fp32(bias)
    return input, weight, bias, n, eps, offset, partial_size(n, partial)


# ----------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------
def rms_norm(
    input: torch.Tensor,
    normalized_shape: ShapeLike,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    eps_mode: str = "mean_square",
    casting_mode: str = "gemma",
    offset: float = 0.0,
    bias: torch.Tensor | None = None,
    partial: float | None = None,
) -> torch.Tensor:
    """Root Mean Square Layer Normalization over the trailing ``normalized_shape`` dims.

    y = (offset + weight) ⊙ x / RMS(x) + bias, with the ε placement of ``eps_mode``
    (``"mean_square"``: x·rsqrt(mean(x²) + ε), torch's and most models'; ``"rms"``: x/(RMS(x) + ε),
    the paper's chapter formula), the rounding order of ``casting_mode`` (``"gemma"``, torch's
    default; ``"llama"``; ``"none"``) and, with ``partial=p``, the RMS estimated from the first k =
    ⌊p·N⌋ elements. Positional arguments and defaults match ``torch.nn.functional.rms_norm``;
    ``eps=None`` is the machine epsilon of the compute dtype, as there.
    """
    _check_float_tensor(input, "input")
    input, weight, bias, n, eps, offset, k = _rms_arguments(
        input, normalized_shape, weight, eps, eps_mode, casting_mode, offset, bias, partial
    )
    y, _ = _forward("rms_norm_fwd", input, weight, bias)(
        _rows(input, n),
        _flat(weight, n),
        _flat(bias, n),
        eps,
        eps_mode,
        casting_mode,
        offset,
        k,
    )
    return y.view(input.shape)


def add_rms_norm(
    input: torch.Tensor,
    residual: torch.Tensor,
    normalized_shape: ShapeLike,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    eps_mode: str = "mean_square",
    casting_mode: str = "gemma",
    offset: float = 0.0,
    bias: torch.Tensor | None = None,
    partial: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused residual add + RMSNorm: returns ``(out, residual_out)``.

    residual_out = input + residual, summed in fp32 and stored in ``residual``'s dtype (an fp32
    residual stream with bf16 inputs is allowed); out = rms_norm(residual_out) with ``input``'s
    dtype as the input dtype of the casting mode. Keywords as :func:`rms_norm`.
    """
    _check_float_tensor(input, "input")
    _check_float_tensor(residual, "residual")
    if residual.shape != input.shape:
        raise ValueError(
            f"residual must have the shape of input {list(input.shape)}, got {list(residual.shape)}"
        )
    if residual.device != input.device:
        raise ValueError(f"residual is on {residual.device} but input is on {input.device}")
    input, weight, bias, n, eps, offset, k = _rms_arguments(
        input, normalized_shape, weight, eps, eps_mode, casting_mode, offset, bias, partial
    )
    y, h, _ = _forward("add_rms_norm_fwd", input, residual, weight, bias)(
        _rows(input, n),
        _rows(residual, n),
        _flat(weight, n),
        _flat(bias, n),
        eps,
        eps_mode,
        casting_mode,
        offset,
        k,
    )
    return y.view(input.shape), h.view(input.shape)


def layer_norm(
    input: torch.Tensor,
    normalized_shape: ShapeLike,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """Layer Normalization, as ``torch.nn.functional.layer_norm``:
    y = weight ⊙ (x − μ) / sqrt(σ² + ε) + bias with σ² the population variance over the trailing
    ``normalized_shape`` dims; statistics in fp32 (fp64 for fp64 inputs), output in input's dtype.
    """
    _check_float_tensor(input, "input")
    shape, n = _normalized_shape(input, normalized_shape)
    _check_param(weight, "weight", shape, input)
    _check_param(bias, "bias", shape, input)
    eps = _check_eps(eps, input)
    if _autocast_to_fp32(input.device.type, _AUTOCAST_FP32_LN):
        input, weight, bias = _fp32(input), _fp32(weight), _fp32(bias)
    y, _, _ = _forward("layer_norm_fwd", input, weight, bias)(
        _rows(input, n), _flat(weight, n), _flat(bias, n), eps
    )
    return y.view(input.shape)
