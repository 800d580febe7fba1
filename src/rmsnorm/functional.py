"""The functional API: validate arguments, choose the cheapest path that is correct for the call,
return the output in the input's shape and memory format.

Signatures and defaults follow ``torch.nn.functional.rms_norm`` / ``layer_norm``; the conventions
(``eps_mode``, ``casting_mode``, ``offset``, ``bias``, ``partial``) are keyword-only and documented
in :mod:`rmsnorm.reference`, which states each formula.

The paths, from the cheapest:

1. eager, no gradient wanted, plain tensors on CPU/CUDA: the backend's launcher, called directly;
2. eager with gradients: an ``autograd.Function`` calling the launchers (no dispatcher round trip);
3. ``torch.compile`` / ``torch.export`` / ``torch.jit.trace``, dispatch and function modes, tensor
   subclasses (DTensor, ...), other devices: the custom ops ``torch.ops.rmsnorm.*``;
4. forward-mode AD and ``torch.func`` transforms (``jvp``, ``vmap``, ``grad``, ``jacrev``,
   ``hessian``): the spec itself (:mod:`rmsnorm.reference`) as torch operations, which every
   transform supports.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence

import torch
from torch.overrides import handle_torch_function

# _ops registers torch.ops.rmsnorm.*, which _opcall calls
from . import _autograd, _backend, _calls, _dtensor, _launch, _layout, _opcall, _ops  # noqa: F401
from . import reference as ref
from .reference import (
    RMSOptions,
    check_activation,
    check_casting_mode,
    check_eps_mode,
    default_eps,
    partial_size,
)

__all__ = ["rms_norm", "add_rms_norm", "gated_rms_norm", "layer_norm"]

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_FLOAT_SET = frozenset(_FLOAT_DTYPES)
# Devices on which torch's autocast runs rms_norm / layer_norm in float32
# (aten/src/ATen/autocast_mode.cpp); on CPU autocast leaves both ops alone, and so do we.
_AUTOCAST_FP32_RMS = ("cuda", "xpu", "mtia", "maia")
_AUTOCAST_FP32_LN = _AUTOCAST_FP32_RMS + ("mps",)

ShapeLike = int | Sequence[int] | torch.Size

_Tensor, _Parameter = torch.Tensor, torch.nn.Parameter
_has_torch_function = torch._C._has_torch_function_variadic
_functorch_active = torch._C._are_functorch_transforms_active
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled
_tracing = torch._C._get_tracing_state
_is_compiling = torch.compiler.is_compiling
_fwAD = torch.autograd.forward_ad
_default_eps = {dt: default_eps(dt) for dt in _FLOAT_DTYPES}


def _torch_function(fn, relevant: tuple, params: dict):
    """``handle_torch_function`` for the public function ``fn`` from its parameters
    (``locals()`` at its top): positional ones passed by position, keyword-only ones by keyword,
    as its signature has them (what a ``__torch_function__`` override then sees)."""
    code = fn.__code__
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    args = [params[name] for name in names[: code.co_argcount]]
    kwargs = {name: params[name] for name in names[code.co_argcount :]}
    return handle_torch_function(fn, relevant, *args, **kwargs)


_new = tuple.__new__  # RMSOptions from a checked tuple, without the NamedTuple's keyword parsing

# The paths (module docstring), and their names in :mod:`rmsnorm._calls`' records.
_LAUNCH, _FUNCTION, _OP, _SPEC = 0, 1, 2, 3
_PATH_NAMES = _calls.PATHS


# ----------------------------------------------------------------------------------------------
# Validation: every message names the argument and the expected form. The common cases (an int
# or one-element tuple shape, a float eps) are checked first and cheaply: a decoding step calls a
# norm per layer, and each check here costs as much as the kernel at that size.
# ----------------------------------------------------------------------------------------------
def _check_float_tensor(t: object, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be a floating-point tensor (float32, bfloat16, float16 or float64), "
            f"got dtype {t.dtype}"
        )


def _dim(d: object) -> int:
    """One dim of normalized_shape: an int, a NumPy integer or a 0-d integer tensor (as torch)."""
    if isinstance(d, bool) or isinstance(d, float):
        raise TypeError
    if isinstance(d, torch.SymInt):
        return d  # type: ignore[return-value]
    return operator.index(d)


def _shape_tuple(normalized_shape: object) -> tuple:
    try:
        if isinstance(normalized_shape, (Sequence, torch.Size)) and not isinstance(
            normalized_shape, str
        ):
            return tuple(_dim(d) for d in normalized_shape)
        return (_dim(normalized_shape),)
    except TypeError:
        raise TypeError(
            f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}"
        ) from None


def _normalized(input: torch.Tensor, normalized_shape: ShapeLike) -> tuple[int, int]:
    """(norm_dims, N): how many trailing dims of input are normalized, and their element count."""
    if input.dtype not in _FLOAT_DTYPES:
        _check_float_tensor(input, "input")
    shape = input.shape
    if type(normalized_shape) is int and shape and shape[-1] == normalized_shape > 0:
        return 1, normalized_shape
    if (
        (type(normalized_shape) is tuple or type(normalized_shape) is torch.Size)
        and len(normalized_shape) == 1
        and type(normalized_shape[0]) is int
        and shape
        and shape[-1] == normalized_shape[0] > 0
    ):
        return 1, normalized_shape[0]
    dims = _shape_tuple(normalized_shape)
    if len(dims) == 0:
        raise ValueError("normalized_shape must name at least one dimension, got ()")
    if len(shape) < len(dims) or tuple(shape[len(shape) - len(dims) :]) != dims:
        raise ValueError(
            f"normalized_shape {list(dims)} must match the trailing dimensions of input, "
            f"whose shape is {list(shape)}"
        )
    n = math.prod(dims)
    if n == 0:
        raise ValueError(f"normalized_shape {list(dims)} has no elements to normalize over")
    return len(dims), n


def _check_param(
    p: torch.Tensor | None, name: str, input: torch.Tensor, norm_dims: int, n: int
) -> None:
    if p is None:
        return
    if not isinstance(p, torch.Tensor) or p.dtype not in _FLOAT_DTYPES:
        _check_float_tensor(p, name)
    if p.dim() != norm_dims or (
        p.shape[0] != n if norm_dims == 1 else p.shape != input.shape[input.dim() - norm_dims :]
    ):
        shape = list(input.shape[input.dim() - norm_dims :])
        raise ValueError(
            f"{name} must have shape {shape} (the normalized_shape), got {list(p.shape)}"
        )
    if not (p.is_cpu and input.is_cpu) and p.device != input.device:
        raise ValueError(f"{name} is on {p.device} but input is on {input.device}")


def _check_eps(eps: object, input: torch.Tensor) -> float:
    if eps is None:
        return _default_eps[input.dtype]
    if type(eps) is not float:
        if isinstance(eps, torch.Tensor) and eps.dim() == 0 and eps.is_floating_point():
            eps = eps.item()
        elif isinstance(eps, numbers.Real) and not isinstance(eps, bool):
            eps = float(eps)
        else:
            raise TypeError(f"eps must be a float or None, got {type(eps).__name__}")
    # Comparisons (unlike math.isfinite) stay traceable under torch.compile; NaN fails them too.
    if not (0.0 <= eps < math.inf):
        raise ValueError(f"eps must be a finite number >= 0, got {eps}")
    return eps


def _real(value: object) -> float | None:
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    return None


def check_rms_options(opts: RMSOptions, partial: float | None, weight) -> RMSOptions:
    """The checks of a call's options: ``opts`` as the call gives them (its eps checked on its
    own, its k the size of a row or group), ``partial`` and whether there is a ``weight``.
    Returns ``opts`` completed: offset a float, k the ⌊p·k⌋ of ``partial``
    (:func:`rmsnorm.reference.partial_size`); ``opts`` itself where that changes nothing."""
    check_eps_mode(opts.eps_mode)
    check_casting_mode(opts.casting_mode)
    offset = given = opts.offset
    if type(offset) is not float:
        real = _real(offset)
        if real is None:
            raise ValueError(f"offset must be a finite float, got {offset!r}")
        offset = real
    if not (-math.inf < offset < math.inf):
        raise ValueError(f"offset must be a finite float, got {offset!r}")
    if offset != 0.0 and weight is None:
        raise ValueError(
            f"offset={offset} scales the weight (offset + weight) and needs a weight, "
            "got weight=None"
        )
    if partial is None:
        return opts if offset is given else opts._replace(offset=offset)
    p = _real(partial)
    if p is None or not (0.0 < p <= 1.0):
        raise ValueError(f"partial must be a float in (0, 1] or None, got {partial!r}")
    return opts._replace(offset=offset, k=partial_size(opts.k, p))


# ----------------------------------------------------------------------------------------------
# Paths
# ----------------------------------------------------------------------------------------------
def _served(op: str, path: int, x: torch.Tensor) -> None:
    """Record the call (:func:`rmsnorm.set_debug`) with the backend that serves it."""
    name = _PATH_NAMES[path]
    if name == "spec":
        backend = "reference (the spec as torch operations)"
    else:
        local = x.to_local() if _dtensor.is_dtensor(x) else x
        try:
            backend = _backend.describe("cpu" if local.is_cpu else local.device.type)
        except RuntimeError as exc:  # a forced backend that cannot run there
            backend = f"none ({exc})"
    _calls.served(op, name, x, backend)


def _path(x: torch.Tensor, p=None, q=None, r=None) -> int:
    """Which of the four paths (module docstring) a call on x and the tensors p, q, r (or None)
    takes. Written out rather than looped: at decoding sizes every step here is a visible part of
    the call."""
    if _functorch_active() or _fwAD._current_level >= 0:
        return _SPEC
    if _is_compiling() or _dispatch_modes() or _function_modes() or _tracing() is not None:
        return _OP
    kind = type(x)
    if kind is not _Tensor and kind is not _Parameter:
        return _subclass()
    grad = x.requires_grad
    if p is not None:
        kind = type(p)
        if kind is not _Tensor and kind is not _Parameter:
            return _subclass()
        grad = grad or p.requires_grad
    if q is not None:
        kind = type(q)
        if kind is not _Tensor and kind is not _Parameter:
            return _subclass()
        grad = grad or q.requires_grad
    if r is not None:
        kind = type(r)
        if kind is not _Tensor and kind is not _Parameter:
            return _subclass()
        grad = grad or r.requires_grad
    if not (x.is_cpu or x.is_cuda):
        return _OP
    return _FUNCTION if grad and torch.is_grad_enabled() else _LAUNCH


def _subclass() -> int:
    _dtensor.ensure()  # a DTensor, maybe: its sharding rules must be in place
    return _OP


class _Launch:
    """Path 1: the launchers, called directly through :mod:`rmsnorm._launch` (contiguous rows of
    one normalized dim go to the backend as they are); no statistics are kept (no backward will
    ask)."""

    @staticmethod
    def rms_norm(x, norm_dims, n, weight, bias, opts):
        return _launch.rms_norm_fwd(x, norm_dims, weight, bias, opts, False)[0]

    @staticmethod
    def add_rms_norm(x, residual, norm_dims, n, weight, bias, opts):
        return _launch.add_rms_norm_fwd(x, residual, norm_dims, weight, bias, opts, False)[:2]

    @staticmethod
    def gated_rms_norm(x, gate, norm_dims, n, weight, bias, opts, gating, in_dtype):
        return _launch.gated_rms_norm_fwd(
            x, gate, norm_dims, weight, bias, opts, gating, in_dtype, False
        )[0]

    @staticmethod
    def layer_norm(x, norm_dims, n, weight, bias, eps):
        return _launch.layer_norm_fwd(x, norm_dims, weight, bias, eps, False)[0]


class _Function:
    """Path 2: eager with gradients, the ``autograd.Function`` classes of :mod:`rmsnorm._autograd`
    calling the launchers."""

    @staticmethod
    def rms_norm(x, norm_dims, n, weight, bias, opts):
        return _autograd.rms_norm_apply(x, weight, bias, norm_dims, opts)

    @staticmethod
    def add_rms_norm(x, residual, norm_dims, n, weight, bias, opts):
        return _autograd.add_rms_norm_apply(x, residual, weight, bias, norm_dims, opts)

    @staticmethod
    def gated_rms_norm(x, gate, norm_dims, n, weight, bias, opts, gating, in_dtype):
        return _autograd.gated_rms_norm_apply(
            x, gate, weight, bias, norm_dims, opts, gating, in_dtype
        )

    @staticmethod
    def layer_norm(x, norm_dims, n, weight, bias, eps):
        return _autograd.layer_norm_apply(x, weight, bias, norm_dims, eps)


class _Op:
    """Path 3: the custom ops ``torch.ops.rmsnorm.*``; DTensors (plain parameters, sharded
    normalized dims) through :mod:`rmsnorm._dtensor`, which runs the ops where it can."""

    @staticmethod
    def rms_norm(x, norm_dims, n, weight, bias, opts):
        if _dtensor.is_dtensor(x):
            return _dtensor.rms_norm(x, norm_dims, weight, bias, opts)
        return _opcall.call.rms_norm_fwd(x, norm_dims, weight, bias, opts)[0]

    @staticmethod
    def add_rms_norm(x, residual, norm_dims, n, weight, bias, opts):
        if _dtensor.is_dtensor(x) or _dtensor.is_dtensor(residual):
            return _dtensor.add_rms_norm(x, residual, norm_dims, weight, bias, opts)
        return _opcall.call.add_rms_norm_fwd(x, residual, norm_dims, weight, bias, opts)[:2]

    @staticmethod
    def gated_rms_norm(x, gate, norm_dims, n, weight, bias, opts, gating, in_dtype):
        args = (x, gate, norm_dims, weight, bias, opts, gating, in_dtype)
        if _dtensor.is_dtensor(x) or _dtensor.is_dtensor(gate):
            return _dtensor.gated_rms_norm(*args)
        return _opcall.call.gated_rms_norm_fwd(*args)[0]

    @staticmethod
    def layer_norm(x, norm_dims, n, weight, bias, eps):
        if _dtensor.is_dtensor(x):
            return _dtensor.layer_norm(x, norm_dims, weight, bias, eps)
        return _opcall.call.layer_norm_fwd(x, norm_dims, weight, bias, eps)[0]


class _Spec:
    """Path 4: the spec itself (:mod:`rmsnorm.reference`) as torch operations, which every
    transform (forward AD, ``torch.func``) differentiates."""

    @staticmethod
    def rms_norm(x, norm_dims, n, weight, bias, opts):
        w, b = ref.param_vector(weight), ref.param_vector(bias)
        return ref.rms_norm_fwd(_rows(x, n), w, b, opts)[0].reshape(x.shape)

    @staticmethod
    def add_rms_norm(x, residual, norm_dims, n, weight, bias, opts):
        w, b = ref.param_vector(weight), ref.param_vector(bias)
        y, h, _ = ref.add_rms_norm_fwd(_rows(x, n), _rows(residual, n), w, b, opts)
        return y.reshape(x.shape), h.reshape(x.shape)

    @staticmethod
    def gated_rms_norm(x, gate, norm_dims, n, weight, bias, opts, gating, in_dtype):
        xr, zr = ref.row_matrix(x, n), ref.row_matrix(gate, n)
        w, b = ref.param_vector(weight), ref.param_vector(bias)
        y, _ = ref.gated_rms_norm_fwd(xr, zr, w, b, opts, gating, input_dtype=in_dtype)
        # contiguous, or channels_last for a channels_last input, as rms_norm (the spec's
        # elementwise operations would keep a permuted input's strides)
        return y.reshape(x.shape).contiguous()

    @staticmethod
    def layer_norm(x, norm_dims, n, weight, bias, eps):
        w, b = ref.param_vector(weight), ref.param_vector(bias)
        return ref.layer_norm_fwd(ref.row_matrix(x, n), w, b, eps)[0].reshape(x.shape)


# Indexed by the path numbers.
_PATHS = (_Launch, _Function, _Op, _Spec)


def _like(out: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
    """out (computed contiguous) in the memory format torch's rms_norm gives it: an input laid
    out as channels_last (or channels_last_3d), gaps allowed, gets a channels_last output; any
    other layout a contiguous one."""
    if input.is_contiguous() or input.dim() not in (4, 5):
        return out
    fmt = _layout.channels_last_format(input)
    return out if fmt is None else out.contiguous(memory_format=fmt)


def _like_sum(h: torch.Tensor, input: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """add_rms_norm's residual_out (computed contiguous) with the strides ``input + residual``
    has in torch: input's order of dims, residual's where input's strides do not tell."""
    if input.is_contiguous():
        return h
    order = _layout.iteration_order(h.shape, [input.stride(), residual.stride()])
    return _layout.in_order(h, order)


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """t as rows of n elements for the spec: t itself when only its last dim is normalized (the
    spec's operations then keep a channels_last t's layout, in the output and its gradient, as
    torch's do), else (M, n)."""
    return t if t.dim() and t.shape[-1] == n else ref.row_matrix(t, n)


def _autocast_to_fp32(input: torch.Tensor, devices: tuple[str, ...]) -> bool:
    if input.is_cpu:
        return False
    device_type = input.device.type
    return device_type in devices and torch.is_autocast_enabled(device_type)


def _fp32(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None or t.dtype in (torch.float32, torch.float64):
        return t
    return t.float()


def _rms_arguments(
    input, normalized_shape, weight, eps, eps_mode, casting_mode, offset, bias, partial
):
    """The checks rms_norm and add_rms_norm share; returns what the op needs:
    (norm_dims, N, options). The common case (one normalized dim given as an int, a plain
    (N,) weight on the input's device, default or float eps and offset) is checked inline."""
    if _tracing() is not None:
        return _untraced(
            _rms_arguments,
            input,
            normalized_shape,
            weight,
            eps,
            eps_mode,
            casting_mode,
            offset,
            bias,
            partial,
        )
    shape = input.shape
    if type(normalized_shape) is int and shape and shape[-1] == normalized_shape > 0:
        norm_dims, n = 1, normalized_shape
        if input.dtype not in _FLOAT_SET:
            _check_float_tensor(input, "input")
    else:
        norm_dims, n = _normalized(input, normalized_shape)
    if weight is not None and not (
        isinstance(weight, torch.Tensor)
        and weight.dtype in _FLOAT_SET
        and weight.dim() == 1 == norm_dims
        and weight.shape[0] == n
        and weight.is_cpu == input.is_cpu
        and (input.is_cpu or weight.device == input.device)
    ):
        _check_param(weight, "weight", input, norm_dims, n)
    if bias is not None:
        _check_param(bias, "bias", input, norm_dims, n)
    eps = _default_eps[input.dtype] if eps is None else _check_eps(eps, input)
    opts = _new(RMSOptions, (eps, eps_mode, casting_mode, offset, n))
    if (
        type(offset) is not float
        or offset != 0.0
        or partial is not None
        or eps_mode != "mean_square"
        or casting_mode != "gemma"
    ):
        opts = check_rms_options(opts, partial, weight)
    return norm_dims, n, opts


def _check_like_input(t, name: str, input: torch.Tensor) -> None:
    """The checks of a tensor read elementwise with input (add_rms_norm's residual,
    gated_rms_norm's gate): a float tensor of input's shape, on its device."""
    if not isinstance(t, torch.Tensor) or t.dtype not in _FLOAT_SET:
        _check_float_tensor(t, name)
    if t.shape != input.shape:
        raise ValueError(
            f"{name} must have the shape of input {list(input.shape)}, got {list(t.shape)}"
        )
    if not (t.is_cpu and input.is_cpu) and t.device != input.device:
        raise ValueError(f"{name} is on {t.device} but input is on {input.device}")


def _ln_arguments(input, normalized_shape, weight, bias, eps):
    """layer_norm's checks; returns (norm_dims, N, eps)."""
    if _tracing() is not None:
        return _untraced(_ln_arguments, input, normalized_shape, weight, bias, eps)
    norm_dims, n = _normalized(input, normalized_shape)
    _check_param(weight, "weight", input, norm_dims, n)
    _check_param(bias, "bias", input, norm_dims, n)
    return norm_dims, n, _check_eps(eps, input)


def _group_arguments(group_size: object, n: int, partial) -> tuple[int | None, int]:
    """(g, k): group_size checked against N (``None`` when it is N: one group, the plain norm)
    and k, the elements of each group the RMS is estimated from (⌊p·g⌋ with ``partial``)."""
    if _tracing() is not None:
        return _untraced(_group_arguments, group_size, n, partial)
    try:
        g = _dim(group_size)
    except TypeError:
        raise TypeError(
            f"group_size must be an int or None, got {type(group_size).__name__}"
        ) from None
    if g < 1:
        raise ValueError(f"group_size must be a positive int, got {g}")
    if n % g:
        raise ValueError(
            f"group_size ({g}) must divide the normalized size N = {n} (the product of "
            "normalized_shape) into groups of equal size"
        )
    if g == n:
        g = None
    return g, partial_size(n if g is None else g, None if partial is None else float(partial))


def _check_gating(gate, input, norm_before_gate, activation) -> None:
    """gate's checks (a float tensor of input's shape, on its device) and the gating options'."""
    if gate is not None:
        _check_like_input(gate, "gate", input)
    if type(norm_before_gate) is not bool:
        raise TypeError(f"norm_before_gate must be True or False, got {norm_before_gate!r}")
    check_activation(activation)


def _untraced(check, *args):
    """check(*args) with torch.jit.trace paused: while tracing, sizes are tensors and every shape
    comparison would warn that the trace takes it as a constant, which is what it should do."""
    state = _tracing()
    torch._C._set_tracing_state(None)
    try:
        return check(*args)
    finally:
        torch._C._set_tracing_state(state)


# ----------------------------------------------------------------------------------------------
# The grouped and gated forms
# ----------------------------------------------------------------------------------------------
def _grouped_gated(input, gate, residual, norm_dims, n, weight, bias, opts, gating):
    """The forward of every grouped or gated call (checked arguments; ``gating`` is (group_size,
    norm_before_gate, activation) with ``group_size`` None or a proper divisor of N; ``gate`` and
    ``residual`` None or of input's shape): (y, h), h = input + residual for the residual form,
    else None. The residual form sums h as torch operations
    (:func:`rmsnorm.reference.residual_sum`, which autograd and the tracers follow) and
    normalizes h with ``input``'s dtype as the casting mode's input dtype."""
    path = _path(input, gate if residual is None else residual, weight, bias)
    if _calls.recording:
        _served("gated_rms_norm", path, input)
    x, h = input, None
    if residual is not None:
        x = h = _like_sum(ref.residual_sum(input, residual), input, residual)
    y = _PATHS[path].gated_rms_norm(x, gate, norm_dims, n, weight, bias, opts, gating, input.dtype)
    return _like(y, input), h


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
    group_size: int | None = None,
) -> torch.Tensor:
    """Root Mean Square Layer Normalization over the trailing ``normalized_shape`` dims.

    y = (offset + weight) ⊙ x / RMS(x) + bias, with the ε placement of ``eps_mode``
    (``"mean_square"``: x·rsqrt(mean(x²) + ε), torch's and most models'; ``"rms"``: x/(RMS(x) + ε),
    the paper's chapter formula), the rounding order of ``casting_mode`` (``"gemma"``, torch's
    default; ``"llama"``; ``"none"``) and, with ``partial=p``, the RMS estimated from the first k =
    ⌊p·N⌋ elements. With ``group_size=g`` each group of g consecutive elements of the N is
    normalized on its own (grouped RMSNorm, as the Mamba2 family and Qwen4-Exp). Positional
    arguments and defaults match ``torch.nn.functional.rms_norm``; ``eps=None`` is the machine
    epsilon of the compute dtype, as there.

    Args:
        input (Tensor): a float32, bfloat16, float16 or float64 tensor.
        normalized_shape (int or sequence of int): its trailing dims, normalized together (N is
            their product).
        weight (Tensor, optional): the scale γ, of shape ``normalized_shape``. Default: ``None``
            (γ = 1).
        eps (float, optional): ε. Default: ``None``, the machine epsilon of the compute dtype
            (float32's for half and float32 inputs, float64's for float64 ones).
        eps_mode (str): ``"mean_square"`` or ``"rms"``, as above. Default: ``"mean_square"``.
        casting_mode (str): ``"gemma"``, ``"llama"`` or ``"none"``; :mod:`rmsnorm.reference`
            states where each rounds. Default: ``"gemma"``.
        offset (float): the scale is offset + weight (1 for Gemma); needs a weight when not 0.
            Default: ``0.0``.
        bias (Tensor, optional): added last, of shape ``normalized_shape``. Default: ``None``.
        partial (float, optional): p in (0, 1]: the RMS of the first ⌊p·N⌋ elements only
            (partial RMSNorm; of the first ⌊p·g⌋ of each group with ``group_size``).
            Default: ``None`` (all N).
        group_size (int, optional): g, a divisor of N: every g consecutive elements (of the
            flattened normalized dims) are normalized on their own, each group scaled by its slice
            of the weight. Default: ``None`` (one group of N).

    Keywords from ``eps_mode`` on are keyword-only.

    Returns:
        Tensor: y, in ``input``'s dtype (promote(input, weight) in ``"llama"`` mode; float32 under
        CUDA autocast, as torch), shape and memory format (a channels_last input gives a
        channels_last output).

    Shape:
        - input: (*, normalized_shape)
        - weight, bias: normalized_shape
        - output: same shape as input

    Example::

        >>> x = torch.randn(2, 5, 8)
        >>> weight = torch.rand(8) + 0.5
        >>> y = rmsnorm.rms_norm(x, 8, weight)
        >>> y.shape
        torch.Size([2, 5, 8])
        >>> torch.allclose(y, torch.nn.functional.rms_norm(x, (8,), weight), atol=1e-6)
        True
        >>> y = rmsnorm.rms_norm(x, 8, weight, 1e-6, offset=1.0, casting_mode="llama")
        >>> y = rmsnorm.rms_norm(x, 8, weight, group_size=4)  # two groups of 4 channels
        >>> torch.allclose(y[..., 4:], rmsnorm.rms_norm(x[..., 4:], 4, weight[4:]), atol=1e-6)
        True
    """
    if _has_torch_function(input, weight, bias):
        return _torch_function(rms_norm, (input, weight, bias), locals())
    if not isinstance(input, torch.Tensor):
        _check_float_tensor(input, "input")
    norm_dims, n, opts = _rms_arguments(
        input, normalized_shape, weight, eps, eps_mode, casting_mode, offset, bias, partial
    )
    if not input.is_cpu and _autocast_to_fp32(input, _AUTOCAST_FP32_RMS):
        input, weight, bias = _fp32(input), _fp32(weight), _fp32(bias)
    if group_size is not None:
        group_size, k = _group_arguments(group_size, n, partial)
        if group_size is not None:
            opts, gating = opts._replace(k=k), ref.GateOptions(group_size, True, "silu")
            return _grouped_gated(input, None, None, norm_dims, n, weight, bias, opts, gating)[0]
    path = _path(input, weight, bias)
    if _calls.recording:
        _served("rms_norm", path, input)
    return _like(_PATHS[path].rms_norm(input, norm_dims, n, weight, bias, opts), input)


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
    group_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused residual add + RMSNorm: returns ``(out, residual_out)``.

    residual_out = input + residual, summed in fp32 and stored in ``residual``'s dtype (an fp32
    residual stream with bf16 inputs is allowed); out = rms_norm(residual_out) with ``input``'s
    dtype as the input dtype of the casting mode. Keywords as :func:`rms_norm`.

    Args:
        input (Tensor): what a block adds to the residual stream.
        residual (Tensor): the residual stream, of ``input``'s shape and device.
        normalized_shape (int or sequence of int): as :func:`rms_norm`.
        weight (Tensor, optional): as :func:`rms_norm`. Default: ``None``.
        eps (float, optional): as :func:`rms_norm`. Default: ``None``.
        eps_mode, casting_mode, offset, bias, partial, group_size: keyword-only, as
            :func:`rms_norm`.

    Returns:
        (Tensor, Tensor): ``out`` in ``input``'s dtype and ``residual_out`` in ``residual``'s.

    Shape:
        - input, residual: (*, normalized_shape)
        - out, residual_out: same shape as input

    Example::

        >>> x, h = torch.randn(4, 8), torch.randn(4, 8)
        >>> out, h = rmsnorm.add_rms_norm(x, h, 8)  # the next block reads out, adds to h
        >>> out.shape, h.shape
        (torch.Size([4, 8]), torch.Size([4, 8]))
        >>> torch.allclose(out, rmsnorm.rms_norm(h, 8), atol=1e-6)
        True
    """
    if _has_torch_function(input, residual, weight, bias):
        return _torch_function(add_rms_norm, (input, residual, weight, bias), locals())
    if not isinstance(input, torch.Tensor) or input.dtype not in _FLOAT_SET:
        _check_float_tensor(input, "input")
    _check_like_input(residual, "residual", input)
    norm_dims, n, opts = _rms_arguments(
        input, normalized_shape, weight, eps, eps_mode, casting_mode, offset, bias, partial
    )
    if not input.is_cpu and _autocast_to_fp32(input, _AUTOCAST_FP32_RMS):
        input, weight, bias = _fp32(input), _fp32(weight), _fp32(bias)
    if group_size is not None:
        group_size, k = _group_arguments(group_size, n, partial)
        if group_size is not None:
            opts, gating = opts._replace(k=k), ref.GateOptions(group_size, True, "silu")
            return _grouped_gated(input, None, residual, norm_dims, n, weight, bias, opts, gating)
    path = _path(input, residual, weight, bias)
    if _calls.recording:
        _served("add_rms_norm", path, input)
    y, h = _PATHS[path].add_rms_norm(input, residual, norm_dims, n, weight, bias, opts)
    return _like(y, input), _like_sum(h, input, residual)


def gated_rms_norm(
    input: torch.Tensor,
    gate: torch.Tensor | None,
    normalized_shape: ShapeLike,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    group_size: int | None = None,
    norm_before_gate: bool = True,
    activation: str = "silu",
    eps_mode: str = "mean_square",
    casting_mode: str = "gemma",
    offset: float = 0.0,
    bias: torch.Tensor | None = None,
    partial: float | None = None,
) -> torch.Tensor:
    """Gated RMSNorm, the norm of the hybrid linear-attention and state-space models.

    With n(v) = (offset + weight) ⊙ v / RMS(v) + bias, the :func:`rms_norm` of v, and act = SiLU
    (or the sigmoid):

    - ``norm_before_gate=True``: y = n(input) ⊙ act(gate)  (Qwen3-Next, Kimi-Linear, Falcon-H1);
    - ``norm_before_gate=False``: y = n(input ⊙ act(gate))  (Mamba2, Bamba, Zamba2, Nemotron-H).

    ``group_size=g`` normalizes every g consecutive elements on their own (Mamba2's ``n_groups``
    groups are g = N / n_groups). The gate product is computed in float32 (float64 for float64
    inputs) in ``"gemma"`` and ``"llama"`` mode and in the input dtype in ``"none"`` mode; the
    rest of each mode's rounding is :func:`rms_norm`'s. ``gate=None`` is :func:`rms_norm` (as the
    Mamba2 family's classes with no gate).

    Args:
        input (Tensor): x, a float32, bfloat16, float16 or float64 tensor.
        gate (Tensor or None): z, of ``input``'s shape and device, any of the four float dtypes
            (read in ``input``'s compute dtype); ``None`` for no gate.
        normalized_shape (int or sequence of int): the trailing dims of input normalized together
            (N is their product).
        weight (Tensor, optional): the scale γ, of shape ``normalized_shape``. Default: ``None``.
        eps (float, optional): ε. Default: ``None``, the machine epsilon of the compute dtype.
        group_size (int, optional): g, a divisor of N. Default: ``None`` (one group of N).
        norm_before_gate (bool): the order, as above. Default: ``True``.
        activation (str): ``"silu"`` or ``"sigmoid"``. Default: ``"silu"``.
        eps_mode, casting_mode, offset, bias, partial: as :func:`rms_norm` (``partial`` takes the
            first ⌊p·g⌋ elements of each group). ``"llama"`` rounds x̂ to the input dtype before the
            weight product; norm-then-gate then rounds the gated product to the input dtype.

    Keywords from ``group_size`` on are keyword-only.

    Returns:
        Tensor: y, of ``input``'s shape and memory format, in ``input``'s dtype (in ``"llama"``
        mode without a gate after the norm: promote(input, weight), as :func:`rms_norm`; float32
        under CUDA autocast).

    Shape:
        - input, gate: (*, normalized_shape)
        - weight, bias: normalized_shape
        - output: same shape as input

    Example::

        >>> x, z = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
        >>> weight = torch.rand(8) + 0.5
        >>> y = rmsnorm.gated_rms_norm(x, z, 8, weight, 1e-6)  # norm, then gate
        >>> silu = torch.nn.functional.silu
        >>> torch.allclose(y, rmsnorm.rms_norm(x, 8, weight, 1e-6) * silu(z), atol=1e-6)
        True
        >>> y = rmsnorm.gated_rms_norm(x, z, 8, weight, 1e-6, group_size=4, norm_before_gate=False)
        >>> u = x * silu(z)  # gate, then norm, two groups of 4
        >>> torch.allclose(y, rmsnorm.rms_norm(u, 8, weight, 1e-6, group_size=4), atol=1e-6)
        True
    """
    if _has_torch_function(input, gate, weight, bias):
        return _torch_function(gated_rms_norm, (input, gate, weight, bias), locals())
    # gated_rms_norm's checks: those of rms_norm, the gate's and the gating options', and the
    # groups' (the options' k is then that of a group)
    if not isinstance(input, torch.Tensor):
        _check_float_tensor(input, "input")
    norm_dims, n, opts = _rms_arguments(
        input, normalized_shape, weight, eps, eps_mode, casting_mode, offset, bias, partial
    )
    if _tracing() is None:
        _check_gating(gate, input, norm_before_gate, activation)
    else:
        _untraced(_check_gating, gate, input, norm_before_gate, activation)
    if group_size is not None:
        group_size, k = _group_arguments(group_size, n, partial)
        opts = opts._replace(k=k)
    if not input.is_cpu and _autocast_to_fp32(input, _AUTOCAST_FP32_RMS):
        input, gate, weight, bias = _fp32(input), _fp32(gate), _fp32(weight), _fp32(bias)
    if gate is None and group_size is None:  # rms_norm, its arguments checked above
        path = _path(input, weight, bias)
        if _calls.recording:
            _served("rms_norm", path, input)
        return _like(_PATHS[path].rms_norm(input, norm_dims, n, weight, bias, opts), input)
    gating = ref.GateOptions(group_size, norm_before_gate, activation)
    return _grouped_gated(input, gate, None, norm_dims, n, weight, bias, opts, gating)[0]


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

    Args:
        input (Tensor): a float32, bfloat16, float16 or float64 tensor.
        normalized_shape (int or sequence of int): its trailing dims, normalized together.
        weight (Tensor, optional): the scale, of shape ``normalized_shape``. Default: ``None``.
        bias (Tensor, optional): the shift, of shape ``normalized_shape``. Default: ``None``.
        eps (float): ε. Default: ``1e-5``.

    Returns:
        Tensor: y, in ``input``'s dtype and shape, contiguous whatever the input's layout.

    Shape:
        - input: (*, normalized_shape)
        - weight, bias: normalized_shape
        - output: same shape as input

    Example::

        >>> x = torch.randn(2, 5, 8)
        >>> weight, bias = torch.rand(8) + 0.5, torch.randn(8)
        >>> y = rmsnorm.layer_norm(x, 8, weight, bias)
        >>> torch.allclose(y, torch.nn.functional.layer_norm(x, (8,), weight, bias), atol=1e-5)
        True
    """
    if _has_torch_function(input, weight, bias):
        return _torch_function(layer_norm, (input, weight, bias), locals())
    if not isinstance(input, torch.Tensor):
        _check_float_tensor(input, "input")
    norm_dims, n, eps = _ln_arguments(input, normalized_shape, weight, bias, eps)
    if not input.is_cpu and _autocast_to_fp32(input, _AUTOCAST_FP32_LN):
        input, weight, bias = _fp32(input), _fp32(weight), _fp32(bias)
    path = _path(input, weight, bias)
    if _calls.recording:
        _served("layer_norm", path, input)
    # contiguous whatever the input layout, as torch.nn.functional.layer_norm
    return _PATHS[path].layer_norm(input, norm_dims, n, weight, bias, eps)
