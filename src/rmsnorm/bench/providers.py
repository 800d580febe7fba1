"""The providers both benchmark modes time: this library and its peers as functions of one op's
tensors (:func:`providers_for`, the one provider table: the throughput mode times every provider it
lists, the latency mode every one for the ops its grid covers), the random inputs they take, and
the forward / backward / both callables that are timed. Device-independent; the GPU and CPU modes
(``gpu.py``, ``cpu.py``) choose shapes and timers."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

import rmsnorm

from .. import reference as R

EPS = 1e-6  # ε of every provider in both modes
# The tensors a provider of each op takes, in order (x the input, r the residual, z the gate,
# w the weight, b the bias): what random_inputs returns, and what a backward differentiates.
OP_ARGS = {
    "rms_norm": "xw",
    "add_rms_norm": "xrw",
    "layer_norm": "xwb",
    "gated_rms_norm": "xzw",
    "gated_rms_norm_grouped": "xzw",
}


# ----------------------------------------------------------------------------------------------
# Providers: name -> function of the op's tensors, or None where unavailable
# ----------------------------------------------------------------------------------------------
def _hf_llama_rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Hugging Face LlamaRMSNorm.forward, written out: normalize in fp32, cast, × weight."""
    dtype = x.dtype
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + EPS)
    return w * h.to(dtype)


def hf_qwen3_next_gated(x: torch.Tensor, z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Hugging Face Qwen3NextRMSNormGated.forward, written out: normalize in fp32, cast, × weight,
    × silu(gate) in fp32, cast (norm, then gate)."""
    dtype = x.dtype
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + EPS)
    h = w * h.to(dtype)
    h = h * F.silu(z.to(torch.float32))
    return h.to(dtype)


GROUPS = 8  # the grouped gated op: Mamba2's n_groups


def hf_mamba2_gated(x: torch.Tensor, z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Hugging Face MambaRMSNormGated.forward, written out: x × silu(gate) in fp32, normalized
    per group of N / GROUPS, cast, × weight (gate, then norm)."""
    dtype = x.dtype
    h = x.to(torch.float32) * F.silu(z.to(torch.float32))
    *lead, n = h.shape
    hg = h.view(*lead, GROUPS, n // GROUPS)
    var = hg.pow(2).mean(-1, keepdim=True)
    h = (hg * torch.rsqrt(var + EPS)).view(*lead, n)
    return w * h.to(dtype)


def liger_functions():
    """Liger-Kernel's autograd Functions, or the reason they are unavailable."""
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except Exception as exc:  # ImportError, or a version that fails at import
        return None, f"{type(exc).__name__}: {exc}"
    return (LigerRMSNormFunction, LigerFusedAddRMSNormFunction, LigerLayerNormFunction), None


def _compile(fn: Callable) -> Callable:
    # A fresh static compile per shape (the reference baseline as inductor compiles it), and a
    # backward that may be replayed (retain_graph) for backward-only timing.
    torch._dynamo.config.cache_size_limit = 512
    torch._dynamo.config.accumulated_cache_size_limit = 4096
    # Compiled graphs on disk, so warm-up processes (gpu_check.sh) save the timed run the
    # compile; both are torch's defaults in recent releases, set here in case they are not.
    for module, name, value in (
        (torch._functorch.config, "donated_buffer", False),
        (torch._functorch.config, "enable_autograd_cache", True),
        (torch._inductor.config, "fx_graph_cache", True),
    ):
        if hasattr(module, name):
            setattr(module, name, value)
    return torch.compile(fn, dynamic=False)


def providers_for(op: str, liger, compile: bool = True) -> dict[str, Callable]:
    """{provider name: function of ``op``'s tensors (:data:`OP_ARGS`)} for this library and its
    peers: the provider table of both modes. ``liger`` is :func:`liger_functions`' first value
    (None: no Liger), ``compile`` adds the reference as ``torch.compile`` compiles it. A provider
    that cannot run here is left out (as Liger without its package)."""
    if op == "rms_norm":
        p = {
            "rmsnorm": lambda x, w: rmsnorm.rms_norm(x, (x.shape[-1],), w, EPS),
            "torch": lambda x, w: F.rms_norm(x, (x.shape[-1],), w, EPS),
        }
        if compile:
            p["torch_compile_reference"] = _compile(lambda x, w: R.rms_norm(x, w, EPS))
        p["hf_llama_eager"] = _hf_llama_rms_norm
        if liger:
            p["liger"] = lambda x, w: liger[0].apply(x, w, EPS, 0.0, "gemma", False)
        return p
    if op == "add_rms_norm":

        def torch_add(x, r, w):
            h = x + r
            return F.rms_norm(h, (h.shape[-1],), w, EPS), h

        p = {
            "rmsnorm": lambda x, r, w: rmsnorm.add_rms_norm(x, r, (x.shape[-1],), w, EPS),
            "torch_add": torch_add,
        }
        if compile:
            p["torch_compile_reference"] = _compile(lambda x, r, w: R.add_rms_norm(x, r, w, EPS))
        if liger:
            p["liger"] = lambda x, r, w: liger[1].apply(x, r, w, EPS, 0.0, "gemma", False)
        return p
    if op in ("gated_rms_norm", "gated_rms_norm_grouped"):
        # Each gated op's peer is the Hugging Face forward of the family whose convention it
        # takes: Qwen3-Next (norm, then gate) and Mamba2 (gate, then norm, GROUPS groups).
        if op == "gated_rms_norm":
            peer, hf = "hf_qwen3_next_eager", hf_qwen3_next_gated

            def ours(x, z, w):
                return rmsnorm.gated_rms_norm(x, z, (x.shape[-1],), w, EPS, casting_mode="llama")

        else:
            peer, hf = "hf_mamba2_eager", hf_mamba2_gated

            def ours(x, z, w):
                n = x.shape[-1]
                return rmsnorm.gated_rms_norm(
                    x,
                    z,
                    (n,),
                    w,
                    EPS,
                    group_size=n // GROUPS,
                    norm_before_gate=False,
                    casting_mode="llama",
                )

        p = {"rmsnorm": ours, peer: hf}
        if compile:
            p["torch_compile_hf"] = _compile(hf)
        return p
    if op == "layer_norm":
        p = {
            "rmsnorm": lambda x, w, b: rmsnorm.layer_norm(x, (x.shape[-1],), w, b, EPS),
            "torch": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, EPS),
        }
        if liger:
            p["liger"] = lambda x, w, b: liger[2].apply(x, w, b, EPS)
        return p
    raise ValueError(op)


def random_inputs(
    op: str, m: int, n: int, dtype: torch.dtype, grad: bool, dev: str = "cuda"
) -> list[torch.Tensor]:
    """Random inputs (never zeros): x, [residual], weight, [bias]."""

    def t(*shape, scale=1.0, shift=0.0):
        return (torch.randn(*shape, device=dev, dtype=dtype) * scale + shift).requires_grad_(grad)

    if op == "rms_norm":
        return [t(m, n), t(n, scale=0.1, shift=1.0)]
    if op == "add_rms_norm":
        return [t(m, n), t(m, n), t(n, scale=0.1, shift=1.0)]
    if op in ("gated_rms_norm", "gated_rms_norm_grouped"):  # x, the gate (silu from −0.3 to ~6)
        return [t(m, n), t(m, n, scale=2.0), t(n, scale=0.1, shift=1.0)]
    return [t(m, n), t(n, scale=0.1, shift=1.0), t(n, scale=0.1)]


def _as_tuple(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def timed_fn(fn: Callable, inputs: list, mode: str) -> Callable:
    """The timed callable: forward only, backward only (graph kept), or both."""
    if mode == "forward":
        return lambda: fn(*inputs)
    grads_of = [t for t in inputs if t.requires_grad]
    if mode == "backward":
        outs = _as_tuple(fn(*inputs))
        gouts = [torch.randn_like(o) for o in outs]
        return lambda: torch.autograd.grad(outs, grads_of, gouts, retain_graph=True)
    outs0 = _as_tuple(fn(*inputs))
    gouts = [torch.randn_like(o) for o in outs0]
    del outs0
    return lambda: torch.autograd.grad(_as_tuple(fn(*inputs)), grads_of, gouts)
