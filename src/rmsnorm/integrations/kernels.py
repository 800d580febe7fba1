"""This library on transformers' own kernel route: layers for the hub names transformers decorates
its norm classes with (``@use_kernel_forward_from_hub("RMSNorm")``, ``"RMSNormGated"``,
``"RMSNormZeroCentered"``) and :func:`kernel_mapping`, the mapping the ``kernels`` package's
``kernelize`` takes. Neither ``kernels`` nor transformers is imported here.

A hub name stands for many classes, and ``kernelize`` hands the mapped layer every one of them, so
each layer runs, per class, the convention :func:`rmsnorm.integrations.hf.convention_of` finds
for it (casting order, ε attribute, offset, gate), with that module's own attributes; a class or an
instance it does not recognise keeps its own forward, with a warning saying why, rather than being
computed another way. :func:`routes` says it for every module of a model."""

from __future__ import annotations

import inspect
import warnings
import weakref
from collections.abc import Callable, Iterable

import torch
from torch import nn

from .hf.conventions import Convention, instance_problem
from .hf.registry import decide, qualname
from .hf.replacements import base_of, forward_for

__all__ = [
    "HUB_NAMES",
    "DEVICE_TYPES",
    "RMSNormLayer",
    "RMSNormGatedLayer",
    "RMSNormZeroCenteredLayer",
    "LAYERS",
    "Repository",
    "kernel_mapping",
    "routes",
]

# The device types of the ``kernels`` package this library's ops serve: "cpu" runs the CPU
# kernels, "cuda" and "rocm" the Triton kernels (the reference where triton is not installed).
DEVICE_TYPES = ("cpu", "cuda", "rocm")


# The layers. ``kernels`` checks that a layer is a stateless nn.Module subclass (no __init__, no
# member beyond nn.Module's but ``has_backward`` and ``can_torch_compile``) whose forward takes as
# many arguments, of the same kinds, as the forward it replaces; ``kernelize`` then binds the
# layer's forward to the model's module, so ``self`` below is a transformers norm layer.


class RMSNormLayer(nn.Module):
    """For ``"RMSNorm"``: ``forward(hidden_states)`` of the Llama-style norms (133 classes of
    transformers 5.25, all in Llama's convention), run by this library's ``rms_norm`` with each
    class's convention."""

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        fn = _route(self, "RMSNorm")
        if fn is None:
            return type(self).forward(self, hidden_states)
        return fn(self, hidden_states)


class RMSNormGatedLayer(nn.Module):
    """For ``"RMSNormGated"``: ``forward(hidden_states, gate)`` of the gated norms of the hybrid
    linear-attention models (Qwen3-Next's order in Llama's casting, Kimi-Linear's in fp32 with
    SiLU or the sigmoid), run by this library's ``gated_rms_norm`` with each class's convention."""

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor, gate: torch.Tensor | None = None):
        fn = _route(self, "RMSNormGated")
        if fn is None:
            own = type(self).forward
            # without a gate, as called: a class that needs one then fails as it would unmapped
            return own(self, hidden_states) if gate is None else own(self, hidden_states, gate)
        return fn(self, hidden_states, gate)


class RMSNormZeroCenteredLayer(nn.Module):
    """For ``"RMSNormZeroCentered"``: ``forward(x)`` of the norms scaling by (1 + weight) (2 classes
    of transformers 5.25, Qwen3.5's, in Gemma's convention), run by this library's ``rms_norm``
    with each class's convention (there ``offset=1``)."""

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fn = _route(self, "RMSNormZeroCentered")
        if fn is None:
            return type(self).forward(self, x)
        return fn(self, x)


# hub name -> the layer for it
LAYERS: dict[str, type[nn.Module]] = {
    "RMSNorm": RMSNormLayer,
    "RMSNormGated": RMSNormGatedLayer,
    "RMSNormZeroCentered": RMSNormZeroCenteredLayer,
}
HUB_NAMES = tuple(LAYERS)
# hub name -> whether its classes take a gate (the second input of the gated conventions)
_GATED = {"RMSNorm": False, "RMSNormGated": True, "RMSNormZeroCentered": False}


class Repository:
    """A repository of the ``kernels`` package that holds this library's layer for one hub name,
    in process: :meth:`load` returns the layer class, nothing is downloaded or read from disk.

    Args:
        layer_name (str): the hub name, one of :data:`HUB_NAMES`.

    Example::

        >>> from rmsnorm.integrations.kernels import Repository, RMSNormLayer
        >>> Repository("RMSNorm").load() is RMSNormLayer
        True
    """

    def __init__(self, layer_name: str):
        if layer_name not in LAYERS:
            raise ValueError(f"layer_name must be one of {list(HUB_NAMES)}, got {layer_name!r}")
        self.layer_name = layer_name

    def load(self) -> type[nn.Module]:
        _mark_for_compile()
        return LAYERS[self.layer_name]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Repository) and other.layer_name == self.layer_name

    def __hash__(self) -> int:
        return hash((Repository, self.layer_name))

    def __repr__(self) -> str:
        return f"Repository({self.layer_name!r})"

    def __str__(self) -> str:
        from .. import __version__

        return f"rmsnorm {__version__} (in process), layer `{self.layer_name}`"


def kernel_mapping(
    devices: Iterable[str] = ("cpu", "cuda"), hub_names: Iterable[str] = HUB_NAMES
) -> dict:
    """The mapping to hand to the ``kernels`` package's ``use_kernel_mapping`` or
    ``register_kernel_mapping``: each hub name to this library's layer on each device type, for
    every mode the layer supports (inference and training, each with and without
    ``torch.compile``: the layers have a backward and compile without graph breaks).

    Args:
        devices (iterable of str): device types of ``kernels``, among :data:`DEVICE_TYPES`
            (``"cpu"``, ``"cuda"``, ``"rocm"``). Default: ``("cpu", "cuda")``.
        hub_names (iterable of str): which of :data:`HUB_NAMES` to map. Default: all three.

    Returns:
        dict: ``{hub name: {device type: {kernels.Mode: Repository}}}``.

    Example::

        >>> from kernels import Mode, kernelize, use_kernel_mapping
        >>> from rmsnorm.integrations.kernels import kernel_mapping
        >>> mapping = kernel_mapping()
        >>> sorted(mapping), sorted(mapping["RMSNorm"])
        (['RMSNorm', 'RMSNormGated', 'RMSNormZeroCentered'], ['cpu', 'cuda'])
        >>> Mode.TRAINING | Mode.TORCH_COMPILE in mapping["RMSNorm"]["cpu"]
        True
        >>> with use_kernel_mapping(mapping):  # doctest: +SKIP
        ...     kernelize(model, mode=Mode.TRAINING, device="cpu")  # a transformers model
    """
    try:
        from kernels import Mode
    except ImportError as exc:
        raise ImportError(
            "kernel_mapping needs the kernels package (pip install 'rmsnorm[kernels]'): the "
            "mapping's keys are its Mode values"
        ) from exc
    devices, hub_names = (
        _names(devices, DEVICE_TYPES, "devices"),
        _names(hub_names, HUB_NAMES, "hub_names"),
    )
    _mark_for_compile()
    mapping = {}
    for hub in hub_names:
        layer, repo = LAYERS[hub], Repository(hub)
        modes = [Mode.INFERENCE] + ([Mode.TRAINING] if layer.has_backward else [])
        if layer.can_torch_compile:
            modes += [mode | Mode.TORCH_COMPILE for mode in modes]
        mapping[hub] = {device: dict.fromkeys(modes, repo) for device in devices}
    return mapping


def _names(values: Iterable[str], allowed: tuple[str, ...], argument: str) -> list[str]:
    if isinstance(values, str):
        raise TypeError(f"{argument} must be a list of names, not one name ({values!r})")
    values = list(values)
    bad = [v for v in values if v not in allowed]
    if bad or not values or len(set(values)) != len(values):
        raise ValueError(f"{argument} must be distinct names among {list(allowed)}, got {values!r}")
    return values


def routes(model: nn.Module) -> dict[str, Convention | str]:
    """What each module of ``model`` whose class carries one of :data:`HUB_NAMES` runs once
    kernelized with :func:`kernel_mapping`: the :class:`~rmsnorm.integrations.hf.Convention` this
    library's op computes it with, or the reason it keeps its own forward. Decides and says, warns
    about nothing, changes nothing.

    Args:
        model (torch.nn.Module): any model (kernelized or not).

    Returns:
        dict[str, Convention or str]: by module name (as ``named_modules`` gives it).

    Example::

        >>> from rmsnorm.integrations.kernels import routes
        >>> routes(torch.nn.Linear(2, 2))  # no module carries a hub name
        {}
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    found = {}
    for name, module in model.named_modules():
        hub = getattr(type(module), "kernel_layer_name", None)
        if hub in LAYERS:
            found[name] = _instance_route(module, hub)[1]
    return found


# --- the route of a module --------------------------------------------------------------------
# Decided once per (class, hub name) and once per instance (the instance check costs ~7 µs, the
# size of a decoding-step norm, so a call looks its route up instead: ~0.3 µs). Under
# torch.compile the class's route comes from _class_key, which dynamo runs once at tracing time
# and takes as a constant, and the instance check is traced (its attribute reads become guards).

_UNDECIDED = object()
# module -> the forward it runs (None: its own); weak keys, so models can be garbage-collected
_instance_routes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# _class_key's key -> (weakref to the class, forward or None, Convention or reason)
_class_routes: dict[str, tuple[weakref.ref, Callable | None, Convention | str]] = {}
_warned: set[tuple[str, str]] = set()


def _route(module: nn.Module, hub: str) -> Callable | None:
    """The forward ``module`` runs in place of its own (None: its own)."""
    if torch.compiler.is_compiling():
        _, fn, conv = _class_routes[_class_key(type(module), hub)]
        if fn is not None and instance_problem(module, conv) is not None:
            return None
        return fn
    fn = _instance_routes.get(module, _UNDECIDED)
    if fn is _UNDECIDED:
        fn, why = _instance_route(module, hub)
        if fn is None:
            _warn(type(module), hub, why)
        _instance_routes[module] = fn
    return fn


def _instance_route(module: nn.Module, hub: str) -> tuple[Callable | None, Convention | str]:
    """(forward or None, the convention or why not) of one module."""
    _, fn, conv = _class_routes[_class_key(type(module), hub, warn=False)]
    if fn is None:
        return None, conv
    problem = instance_problem(module, conv)
    if problem is not None:
        return None, f"this instance: {problem}"
    return fn, conv


def _class_key(cls: type, hub: str, warn: bool = True) -> str:
    """Decide ``cls`` for ``hub`` (once) into ``_class_routes``; returns the entry's key."""
    key = f"{hub} {qualname(cls)} {id(cls)}"
    entry = _class_routes.get(key)
    if entry is None or entry[0]() is not cls:  # new, or another class at a reused address
        fn, conv = _decide_class(cls, hub)
        _class_routes[key] = (weakref.ref(cls), fn, conv)
        if fn is None and warn:
            _warn(cls, hub, conv)
    return key


def _decide_class(cls: type, hub: str) -> tuple[Callable | None, Convention | str]:
    conv = decide(base_of(cls) or cls)  # a class patched by hf.patch decides as its base
    if isinstance(conv, str):
        return None, conv
    if conv.model_types:
        return None, (
            "its convention is shared by every model and used only in models of type "
            f"{list(conv.model_types)}"
        )
    if (conv.gate is not None) != _GATED[hub]:
        return None, (
            f"its convention {'takes' if conv.gate else 'takes no'} gate, where the classes of "
            f"{hub!r} take {'one' if _GATED[hub] else 'none'}"
        )
    own, ours = _inputs(cls.forward), _inputs(LAYERS[hub].forward)
    if [p.kind for p in own] != [p.kind for p in ours]:
        return None, (
            f"its forward takes ({', '.join(map(str, own))}) where the layer for {hub!r} takes "
            f"({', '.join(map(str, ours))})"
        )
    return forward_for(conv), conv


def _inputs(forward: Callable) -> list[inspect.Parameter]:
    return list(inspect.signature(forward).parameters.values())[1:]


def _warn(cls: type, hub: str, why: Convention | str) -> None:
    if (qualname(cls), str(why)) in _warned:
        return
    _warned.add((qualname(cls), str(why)))
    warnings.warn(
        f"rmsnorm.integrations.kernels: {qualname(cls)} (hub name {hub!r}) keeps its own "
        f"forward: {why}",
        stacklevel=4,
    )


def _mark_for_compile() -> None:
    """Tell torch.compile to run _class_key at tracing time and take its result as a constant
    (it reads source code and caches, which dynamo cannot trace). Done when a mapping is made or
    a layer loaded rather than at import: the marking imports torch._dynamo (~2 s), which
    transformers' models import anyway."""
    torch.compiler.assume_constant_result(_class_key)
