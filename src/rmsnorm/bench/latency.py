"""The latency mode of ``rmsnorm bench``: time per call of this library's norms and of their torch
and Hugging Face peers over M × N × dtype × pass at default options, plus greedy ``generate()`` per
token of small HF Llama models with and without :func:`rmsnorm.integrations.hf.patch`, judged
against the "never slower than torch" targets and written as ``<device>_latency.{csv,md,png}``."""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

import rmsnorm

from .._files import write_text
from .._timing import sync
from . import harness, providers
from .harness import Item, Setup, Timer
from .providers import EPS, OP_ARGS
from .rows import Row, check_device, machine, make_row, run_header, save_plot

__all__ = [
    "MS",
    "NS",
    "LARGE",
    "LABELS",
    "OURS",
    "Verdict",
    "judge",
    "run",
    "write_markdown",
    "write_plot",
    "summary",
]

MS = (1, 8, 128, 1024, 8192)
NS = (128, 768, 4096)
DTYPES = (torch.float32, torch.bfloat16)
# "forward" is timed under torch.no_grad(); "forward_backward" takes torch.autograd.grad of the
# inputs and parameters, "forward_backward_leaf" calls .backward() into their .grad (a training
# step's form: autograd's AccumulateGrad nodes run too), the latter in launch-bound cells only.
PASSES = ("forward", "forward_backward", "forward_backward_leaf")
LARGE = 2**16  # M·N from which a call carries real work (the targets change there)
DECODE_M = 128  # M up to which a call is a decoding-size call (Liger, CUDA graphs on a GPU)
GRAPH_CALLS = 20  # calls captured per CUDA graph; a replay is timed and divided by this
# Greedy generate(): (hidden size, layers, attention heads) of the tiny and the small Llama.
GENERATE_MODELS = ((64, 2, 4), (512, 8, 8))
GENERATE_PROMPT, GENERATE_TOKENS = 8, 32
GENERATE_ROUNDS = (9, 0.3)  # samples per model, and the least seconds of calls in each

# Who computes each (op, provider), as a person reads it.
LABELS = {
    ("rms_norm", "rmsnorm"): "rmsnorm.rms_norm",
    ("rms_norm", "rmsnorm_module"): "rmsnorm.RMSNorm",
    ("rms_norm", "hf_patched"): "hf.patch(LlamaRMSNorm)",
    ("rms_norm", "torch"): "F.rms_norm",
    ("rms_norm", "hf_llama_eager"): "HF LlamaRMSNorm",
    ("rms_norm", "torch_nn_rmsnorm"): "torch.nn.RMSNorm",
    ("rms_norm", "liger"): "Liger",
    ("layer_norm", "rmsnorm"): "rmsnorm.layer_norm",
    ("layer_norm", "torch"): "F.layer_norm",
    ("layer_norm", "liger"): "Liger",
    ("add_rms_norm", "rmsnorm"): "rmsnorm.add_rms_norm",
    ("add_rms_norm", "torch_add"): "x + r, F.rms_norm",
    ("add_rms_norm", "liger"): "Liger",
    ("generate", "hf_patched"): "hf.patch(model)",
    ("generate", "hf_eager"): "unpatched",
    ("copy", "torch"): "copy_",
}
# This library's paths: each is judged against the peers of its op.
OURS = {
    "rms_norm": ("rmsnorm", "rmsnorm_module", "hf_patched"),
    "layer_norm": ("rmsnorm",),
    "add_rms_norm": ("rmsnorm",),
    "generate": ("hf_patched",),
}


# ----------------------------------------------------------------------------------------------
# What is timed
# ----------------------------------------------------------------------------------------------
@dataclass
class _Modules:
    """The module providers of one (N, dtype): this library's, HF's (patched and not), torch's."""

    ours: torch.nn.Module
    torch_nn: torch.nn.Module
    hf_eager: torch.nn.Module | None
    hf_patched: torch.nn.Module | None


def _hf_norm_class():
    """transformers' LlamaRMSNorm, or None where transformers is not installed."""
    try:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
    except ImportError:
        return None
    return LlamaRMSNorm


def _modules(n: int, dtype: torch.dtype, dev: str) -> _Modules:
    from ..integrations import hf

    ours = rmsnorm.RMSNorm(n, eps=EPS, device=dev, dtype=dtype)
    torch_nn = torch.nn.RMSNorm(n, eps=EPS, device=dev, dtype=dtype)
    cls = _hf_norm_class()
    hf_eager = hf_patched = None
    if cls is not None:
        hf_eager = cls(n, eps=EPS).to(device=dev, dtype=dtype)
        hf_patched = cls(n, eps=EPS).to(device=dev, dtype=dtype)
        hf.patch(hf_patched)
    return _Modules(ours, torch_nn, hf_eager, hf_patched)


# The ops of the grid. Their function providers are the throughput mode's, from the one table
# (providers.providers_for; no torch.compile peer: a compile per shape would take most of the
# run); this mode adds the module providers, which need an instance per (N, dtype).
OPS = ("rms_norm", "layer_norm", "add_rms_norm")

# A provider: the callable timed, the letters of the tensors it is called with (of "xrwb", in
# order: providers.OP_ARGS) and what its backward differentiates: the same letters, or a module
# (the input x and the module's weight).
_Spec = tuple[Callable, str, "str | torch.nn.Module"]
# The order a cell's providers are timed in and the markdown's columns: op by op, this library's
# paths beside their peers, then HF's classes, then Liger; any other provider of the table after.
_ORDER = {
    key: i
    for i, key in enumerate(
        [
            ("rms_norm", "rmsnorm"),
            ("rms_norm", "rmsnorm_module"),
            ("rms_norm", "torch"),
            ("rms_norm", "torch_nn_rmsnorm"),
            ("layer_norm", "rmsnorm"),
            ("layer_norm", "torch"),
            ("add_rms_norm", "rmsnorm"),
            ("add_rms_norm", "torch_add"),
            ("rms_norm", "hf_patched"),
            ("rms_norm", "hf_llama_eager"),
            ("rms_norm", "liger"),
            ("add_rms_norm", "liger"),
            ("layer_norm", "liger"),
        ]
    )
}


def _specs(n: int, mods: _Modules, liger, decode: bool) -> dict[tuple[str, str], _Spec]:
    """Every provider of a cell: the table's for each op (Liger at decoding sizes only), then
    this library's module, torch's and, where transformers is installed, HF's LlamaRMSNorm
    unpatched (the class itself, in place of the table's written-out forward) and patched."""
    s: dict[tuple[str, str], _Spec] = {}
    for op in OPS:
        args = OP_ARGS[op]
        table = providers.providers_for(op, liger if decode else None, compile=False)
        for name, fn in table.items():
            s[(op, name)] = (fn, args, args)
    s[("rms_norm", "rmsnorm_module")] = (mods.ours, "x", mods.ours)
    s[("rms_norm", "torch_nn_rmsnorm")] = (mods.torch_nn, "x", mods.torch_nn)
    if mods.hf_patched is None:
        s.pop(("rms_norm", "hf_llama_eager"), None)  # the HF providers need transformers
    else:
        s[("rms_norm", "hf_patched")] = (mods.hf_patched, "x", mods.hf_patched)
        s[("rms_norm", "hf_llama_eager")] = (mods.hf_eager, "x", mods.hf_eager)
    return dict(sorted(s.items(), key=lambda item: _ORDER.get(item[0], len(_ORDER))))


def _calls(
    specs: dict, tensors: tuple, grad: bool, dy, dh, leaf: bool = False
) -> dict[tuple[str, str], Callable]:
    """The timed callables: forward only, or forward then torch.autograd.grad of every output
    with respect to the input(s) and the parameters (`leaf`: .backward() into their .grad, reset
    to None after each call, so that every call's AccumulateGrad takes a fresh gradient), in one
    call."""
    named = dict(zip("xrwb", tensors, strict=True))
    out = {}
    for key, (fwd, letters, wrt) in specs.items():
        args = tuple(named[c] for c in letters)
        if not grad:
            out[key] = lambda fwd=fwd, args=args: fwd(*args)
            continue
        if isinstance(wrt, torch.nn.Module):
            inputs = [named["x"], wrt.weight]
        else:
            inputs = [named[c] for c in wrt]
        gouts = (dy, dh) if key[0] == "add_rms_norm" else dy

        def fwd_bwd(fwd=fwd, args=args, inputs=inputs, gouts=gouts):
            return torch.autograd.grad(fwd(*args), inputs, gouts)

        def fwd_bwd_leaf(fwd=fwd, args=args, inputs=inputs, gouts=gouts):
            torch.autograd.backward(fwd(*args), gouts)
            for t in inputs:
                t.grad = None

        out[key] = fwd_bwd_leaf if leaf else fwd_bwd
    return out


def _schedule(probe_s: float, quick: bool) -> tuple[int, float, int]:
    """(rounds, min_run_time, warm-up calls) for a cell whose F.rms_norm call took `probe_s`.

    Launch-bound cells get five interleaved rounds of ≥ 30 ms of calls (hundreds of calls each):
    on a shared machine one round of a tiny call can be disturbed, and a median of three would
    follow it more often than a median of five.
    Past 0.2 s a call (8192 × 4096 forward + backward: 0.3–4 s on two cores, the slowest peers
    the most), one round and no separate warm-up: ``blocked_autorange`` times one call to choose
    its block size and discards it, which warms up, then times one more — two calls per provider
    instead of five keep the largest cells from taking most of the run."""
    if quick:
        return 1, 0.002, 1
    if probe_s < 1e-3:
        return 5, 0.03, 1
    if probe_s < 20e-3:
        return 2, 0.08, 1
    if probe_s < 0.2:
        return 2, 0.05, 1  # blocks of one call
    return 1, 0.05, 0


# ----------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------
def _device_meta(device: str, quick: bool = False) -> dict:
    meta = machine(device)
    if device == "cpu":
        from .cpu import device_name, keep_freed_memory

        # As the throughput mode: without it a cell's large outputs are unmapped when freed and
        # faulted in again, by an amount that depends on what the providers before it left in the
        # heap (F.layer_norm forward + backward at 1024 x 4096 fp32 measured 2.9 to 8.6 ms).
        kept = False if quick else keep_freed_memory()
        meta["device_name"] = device_name(kept)
    return meta


def _grid(quick: bool) -> list[tuple[int, int, torch.dtype]]:
    """(M, N, dtype) in the order timed: smallest calls first."""
    if quick:  # one launch-bound cell and one past 2^16 elements, both dtypes
        return [(m, 768, dt) for m in (1, 128) for dt in DTYPES]
    return [(m, n, dt) for m in MS for n in NS for dt in DTYPES]


def setup(
    device: str = "cpu", quick: bool = False, budget_s: float | None = None, generate: bool = True
) -> Setup:
    """The latency run on `device` as a plan for the harness: a ``"cell"`` item per (M, N, dtype)
    of the grid (or, `quick`, a tiny one), smallest calls first, then a ``"generate"`` item per
    model (`generate`, where transformers is installed)."""
    check_device(device)
    budget_s = (120.0 if quick else 900.0) if budget_s is None else budget_s
    meta = _device_meta(device, quick)
    notes = [f"{meta['device_name']}; torch {meta['torch']}; commit {meta['commit']}"]
    liger = None
    if device == "cuda":
        liger, why = providers.liger_functions()
        if liger is None:
            notes.append(f"liger: not available ({why}); its columns are left out")
    if _hf_norm_class() is None:
        notes.append(
            "transformers: not installed; the Hugging Face providers and generate() are left out"
        )
        generate = False
    plan = [Item("cell", dtype, m, n, PASSES, kind="cell") for m, n, dtype in _grid(quick)]
    models = {hidden: (layers, heads) for hidden, layers, heads in GENERATE_MODELS}
    for hidden in list(models)[:1] if quick else models:
        if generate:
            plan.append(Item("generate", torch.float32, 1, hidden, ("forward",), kind="generate"))
    gen = torch.Generator(device=device).manual_seed(0)

    def time_item(setup: Setup, item: Item, log) -> list[Row]:
        if item.kind == "generate":
            return _generate(meta, device, item.n, *models[item.n], quick, log)
        return _cell(meta, device, item.m, item.n, item.dtype, liger, gen, quick, log)

    def item_line(rows: list[Row], item: Item, elapsed: float) -> str | None:
        if item.kind == "generate":  # _generate logs its own line
            return None
        return _cell_line(rows, item.m, item.n, item.dtype, elapsed)

    return Setup(
        meta=meta,
        timer=Timer(device),
        plan=plan,
        budget_s=budget_s,
        notes=notes,
        title=f"latency ({device})",
        time_item=time_item,
        item_line=item_line,
    )


def run(
    device: str = "cpu",
    quick: bool = False,
    budget_s: float | None = None,
    log=print,
    progress=None,
    generate: bool = True,
) -> list[Row]:
    """Time the grid (or, `quick`, a tiny one) on `device` ("cpu" or "cuda") and return the rows:
    one per (op, pass, provider, dtype, M, N, variant), the copy of each cell's elements, and
    greedy ``generate()`` per token (`generate`). `budget_s` bounds the wall time: cells that do
    not fit are skipped and logged. `progress`: an :mod:`rmsnorm._progress` object."""
    start = time.monotonic()
    rows = harness.run(setup(device, quick, budget_s, generate), log=log, progress=progress)
    log(f"latency: {len(rows)} measurements in {time.monotonic() - start:.0f} s")
    return rows


def _cell(meta, device, m, n, dtype, liger, gen, quick, log) -> list[Row]:
    """Every provider of one (M, N, dtype), every pass, interleaved within each pass; the copy
    of the cell's elements is timed with the forward pass."""

    def rand(*shape, scale=1.0, shift=0.0):
        return torch.randn(*shape, generator=gen, device=device).mul_(scale).add_(shift).to(dtype)

    def failed(key, exc):
        what = f"{LABELS.get(key, key)} ({m}, {n}) {_dt(dtype)}"
        log(f"{what}: failed: {type(exc).__name__}: {exc}"[:300])

    base = (rand(m, n), rand(m, n), rand(n, scale=0.1, shift=1.0), rand(n, scale=0.1))
    dy, dh = rand(m, n), rand(m, n)
    decode = m <= DECODE_M
    specs = _specs(n, _modules(n, dtype, device), liger, decode)
    out: list[Row] = []
    copy_gbps = 0.0
    for mode in PASSES:
        if mode == "forward_backward_leaf" and m * n >= LARGE:
            continue
        grad = mode != "forward"
        # Inference inputs do not require grad (module weights still do, as in a model).
        tensors = tuple(t.detach().requires_grad_(grad) for t in base)
        calls = _calls(specs, tensors, grad, dy, dh, leaf=mode == "forward_backward_leaf")
        if not grad:
            dst, src = torch.empty_like(base[0]), base[0]
            calls[("copy", "torch")] = lambda dst=dst, src=src: dst.copy_(src)
        graphs = device == "cuda" and decode and not grad
        eager, graph = _time_pass(calls, device, graphs, quick, grad, failed)
        if ("copy", "torch") in eager:
            copy_ms = eager.pop(("copy", "torch"))
            copy_gbps = 2 * m * n * dtype.itemsize / (copy_ms * 1e-3) / 1e9
            out.append(
                make_row(meta, "copy", "forward", "torch", dtype, m, n, "eager", copy_ms, copy_gbps)
            )
        for variant, times in (("eager", eager), ("cuda_graph", graph)):
            for (op, prov), ms in times.items():
                out.append(make_row(meta, op, mode, prov, dtype, m, n, variant, ms, copy_gbps))
    return out


def _time_pass(calls, device, graphs, quick, grad, failed) -> tuple[dict, dict]:
    """({key: ms} eager, {key: ms} per call replayed in a CUDA graph when `graphs`) for one
    pass, the callables interleaved; the schedule follows the time of one F.rms_norm call."""
    probe = calls[("rms_norm", "torch")]
    with torch.set_grad_enabled(grad):
        probe()
        sync(device)
        t0 = time.perf_counter()
        probe()
        sync(device)
        rounds, min_run_time, warmup = _schedule(time.perf_counter() - t0, quick)
        timing = dict(rounds=rounds, min_run_time=min_run_time, on_error=failed)
        eager = harness.time_interleaved(calls, warmup=warmup, **timing)
        if not graphs:
            return eager, {}
        kernels = {key: fn for key, fn in calls.items() if key[0] != "copy"}
        replays = harness.graph_replays(kernels, GRAPH_CALLS, on_error=failed)
        graph = harness.time_interleaved(replays, **timing)
    return eager, {k: ms / GRAPH_CALLS for k, ms in graph.items()}


def _generate(meta, device, hidden, layers, heads, quick, log) -> list[Row]:
    """Greedy generate() per token of a small random Llama, unpatched and after hf.patch, in
    float32: one prompt of GENERATE_PROMPT tokens, exactly GENERATE_TOKENS new tokens (4 with
    `quick`), the two models timed in turns."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from ..integrations import hf

    cfg = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        vocab_size=1024,
        max_position_embeddings=256,
        rms_norm_eps=EPS,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        eager = LlamaForCausalLM(cfg).eval().to(device)
    eager.generation_config.eos_token_id = None  # never stop early: always `tokens` new tokens
    patched = copy.deepcopy(eager)
    hf.patch(patched)
    tokens = 4 if quick else GENERATE_TOKENS
    ids = torch.arange(GENERATE_PROMPT, device=device).unsqueeze(0) * 7 % cfg.vocab_size
    mask = torch.ones_like(ids)

    def call(model):
        kw = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0)
        return lambda: model.generate(ids, attention_mask=mask, **kw)

    # A call (32 tokens) takes ~0.03 s (hidden 64) to ~0.3 s (hidden 512 × 8 layers) on two
    # idle cores, of which the norm calls (17 a token in the larger model) are a small part. On a
    # shared machine, three samples of 0.1 s read the patched ÷ unpatched ratio anywhere in
    # 0.94-1.07x for the same code over four runs, nine samples of ≥ 0.3 s 0.90x and 0.97x.
    # Nine it is (~30 s a run).
    rounds, min_run_time = (1, 0.002) if quick else GENERATE_ROUNDS
    with torch.no_grad():
        per_call = harness.time_interleaved(
            {"hf_eager": call(eager), "hf_patched": call(patched)},
            rounds=rounds,
            min_run_time=min_run_time,
        )
    ms = {prov: t / tokens for prov, t in per_call.items()}
    log(
        f"generate, hidden {hidden} × {layers} layers, ms per token: {ms['hf_eager']:.2f} "
        f"unpatched, {ms['hf_patched']:.2f} patched ({ms['hf_patched'] / ms['hf_eager']:.2f}×)"
    )
    return [
        make_row(meta, "generate", "forward", prov, torch.float32, 1, hidden, "eager", t, 0.0)
        for prov, t in ms.items()
    ]


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _cell_line(rows, m, n, dtype, elapsed) -> str:
    """One progress line (≤ 80 columns): our function's time ÷ F.rms_norm's, per pass."""
    parts = []
    for mode in PASSES:
        key = (m, n, _dt(dtype), mode, "eager")
        t = {
            (r.op, r.provider): r.ms for r in rows if (r.M, r.N, r.dtype, r.mode, r.variant) == key
        }
        ours, ref = t.get(("rms_norm", "rmsnorm")), t.get(("rms_norm", "torch"))
        if ours and ref:
            parts.append(f"{_SHORT[mode]} {ours / ref:.2f}")
    cell = f"{_dt(dtype)} {m} × {n}"
    return f"[{elapsed:4.0f}s] {cell:20} rms_norm ÷ F.rms_norm: " + ", ".join(parts)


# ----------------------------------------------------------------------------------------------
# The targets
# ----------------------------------------------------------------------------------------------
@dataclass
class Verdict:
    """One of this library's measurements against the targets of its cell: ``checks`` holds
    (what, value, limit) and the cell is met when every value is at most its limit."""

    op: str
    provider: str
    mode: str
    variant: str
    dtype: str
    M: int
    N: int
    ms: float
    checks: list[tuple[str, float, float]] = field(default_factory=list)

    @property
    def met(self) -> bool:
        return all(v <= limit for _, v, limit in self.checks)

    @property
    def worst(self) -> float:
        """The largest value ÷ limit: ≤ 1 meets every target."""
        return max(v / limit for _, v, limit in self.checks)


def _cells(rows: Sequence[Row]) -> dict[tuple, dict[tuple[str, str], Row]]:
    """{(mode, variant, dtype, M, N): {(op, provider): row}} in first-seen order."""
    cells: dict[tuple, dict[tuple[str, str], Row]] = {}
    for r in rows:
        cells.setdefault((r.mode, r.variant, r.dtype, r.M, r.N), {})[(r.op, r.provider)] = r
    return cells


def _checks(op: str, r: Row, t: dict) -> list[tuple[str, float, float]]:
    """(what, value, limit) of the targets for one measurement `r` of this library, its cell's
    times `t` = {(op, provider): ms}."""
    large = r.M * r.N >= LARGE
    rms, ln = t.get(("rms_norm", "torch")), t.get(("layer_norm", "torch"))
    checks = []
    if op == "rms_norm":
        if rms:
            checks.append(("÷ F.rms_norm", r.ms / rms, 1.0))
        if large and rms and ln:
            checks.append(("÷ min(F.rms_norm, F.layer_norm)", r.ms / min(rms, ln), 1.0))
        elif not large and ln:
            checks.append(("÷ F.layer_norm", r.ms / ln, 2.0))
    elif op == "layer_norm" and ln:
        checks.append(("÷ F.layer_norm", r.ms / ln, 1.0 if large else 2.0))
    elif op == "add_rms_norm" and t.get((op, "torch_add")):
        checks.append(("÷ x + r, F.rms_norm", r.ms / t[(op, "torch_add")], 1.0))
    elif op == "generate" and t.get((op, "hf_eager")):
        checks.append(("÷ unpatched", r.ms / t[(op, "hf_eager")], 1.0))
    if r.device == "cuda" and r.M <= DECODE_M and op != "generate":
        if t.get((op, "liger")):
            checks.append(("÷ Liger", r.ms / t[(op, "liger")], 1.0))
        if r.mode == "forward":
            limit = 2.0 if r.variant == "cuda_graph" else 20.0
            checks.append(("µs per call", r.ms * 1e3, limit))
    return checks


def judge(rows: Sequence[Row]) -> list[Verdict]:
    """The targets, cell by cell, for every measurement of this library in `rows`:

    - ``rms_norm`` (function, module, patched HF norm): ÷ F.rms_norm ≤ 1; where M·N ≥ 2^16,
      ÷ min(F.rms_norm, F.layer_norm) ≤ 1, below ÷ F.layer_norm ≤ 2;
    - ``layer_norm``: ÷ F.layer_norm ≤ 1 where M·N ≥ 2^16, ≤ 2 below;
    - ``add_rms_norm``: ÷ (x + r, F.rms_norm) ≤ 1;
    - ``generate``: ÷ unpatched ≤ 1 per token;
    - on CUDA at decoding sizes (M ≤ 128) also ÷ Liger ≤ 1 where measured, and a forward of at
      most 20 µs per eager call and 2 µs per call replayed in a CUDA graph.

    A measurement whose peers are missing has no check and no verdict.
    """
    out = []
    for (mode, variant, dtype, m, n), cell in _cells(rows).items():
        t = {k: r.ms for k, r in cell.items()}
        for op, ours in OURS.items():
            for prov in ours:
                r = cell.get((op, prov))
                checks = _checks(op, r, t) if r is not None else []
                if checks:
                    out.append(Verdict(op, prov, mode, variant, dtype, m, n, r.ms, checks))
    return out


# ----------------------------------------------------------------------------------------------
# Writers
# ----------------------------------------------------------------------------------------------
_PASS_TITLE = {
    "forward": "forward under no_grad",
    "forward_backward": "forward + backward",
    "forward_backward_leaf": "forward + .backward() into leaves",
}
_SHORT = {"forward": "fwd", "forward_backward": "fwd+bwd", "forward_backward_leaf": "leaf"}


def _fmt_ms(ms: float) -> str:
    if ms < 1:
        return f"{ms * 1e3:.3g} µs"
    return f"{ms:.3g} ms" if ms < 1000 else f"{ms / 1e3:.3g} s"


def _groups(verdicts: Sequence[Verdict]) -> dict[tuple, list[Verdict]]:
    """{(op, provider, mode, variant): verdicts} in first-seen order."""
    groups: dict[tuple, list[Verdict]] = {}
    for v in verdicts:
        groups.setdefault((v.op, v.provider, v.mode, v.variant), []).append(v)
    return groups


def summary(rows: Sequence[Row]) -> str:
    """Met / judged per (path, pass, variant) and the worst cell of each, as ≤ 80-column text."""
    lines = [f"{'path':23} {'pass':7} {'variant':10} {'met':>5}  worst cell: time ÷ allowed"]
    for (op, prov, mode, variant), vs in _groups(judge(rows)).items():
        w = max(vs, key=lambda v: v.worst)
        met = f"{sum(v.met for v in vs)}/{len(vs)}"
        lines.append(
            f"{LABELS.get((op, prov), prov):23} {_SHORT[mode]:7} {variant:10} {met:>5}  "
            f"{w.dtype} {w.M} × {w.N}: {w.worst:.2f}"
        )
    return "\n".join(lines)


def _intro(device: str, note: str) -> list[str]:
    how = (
        "Median time per call, measured with `torch.utils.benchmark`'s `blocked_autorange` at the "
        "process's torch thread count, every provider of a cell taking turns in each round "
        "(five rounds for calls under 1 ms, two up to 0.2 s, one above), so a change in the "
        "machine's load hits all alike; default options, ε = 1e-6, random inputs, "
        "`F.layer_norm` with weight and bias (as `nn.LayerNorm`); on the CPU, glibc's malloc "
        "keeps freed memory for every provider alike (as the throughput mode), so that large "
        "outputs are not faulted in again on each call by an amount that depends on the cells "
        "timed before. *Forward under no_grad*: one call inside `torch.no_grad()` (inputs do not "
        "require grad, module weights do). *Forward + backward*: one call doing the forward and "
        "`torch.autograd.grad` with respect to the input(s) and the parameters. *Forward + "
        "`.backward()` into leaves* (cells below 2^16 elements): the same with `.backward()`, "
        "which accumulates into the inputs' and parameters' `.grad` (reset to `None` after each "
        "call), as a training step does." + (f" {note}" if note else "")
    )
    targets = (
        "`rmsnorm.rms_norm`, the `rmsnorm.RMSNorm` module and Hugging Face's `LlamaRMSNorm` after "
        "`rmsnorm.integrations.hf.patch`: never slower than `F.rms_norm` (first ratio ≤ 1); where "
        f"M·N ≥ 2^16 = {LARGE:,}, not slower than the faster of `F.rms_norm` and `F.layer_norm` "
        "(second ratio ≤ 1), below that at most 2× `F.layer_norm` (second ratio ≤ 2). "
        "`rmsnorm.layer_norm`: ÷ `F.layer_norm` ≤ 1 where M·N ≥ 2^16, ≤ 2 below. "
        "`rmsnorm.add_rms_norm`: ÷ (`x + r` then `F.rms_norm`) ≤ 1. Greedy `generate()` per token "
        "after `hf.patch`: ÷ unpatched ≤ 1."
    )
    if device == "cuda":
        targets += (
            " On CUDA at decoding sizes (M ≤ 128) also ÷ Liger ≤ 1 (the last ratio, where Liger "
            "is installed), and a forward of ≤ 20 µs per eager call, ≤ 2 µs per call replayed in "
            f"a CUDA graph ({GRAPH_CALLS} calls captured per graph)."
        )
    return [how, "", "## Targets", "", targets]


def _summary_table(verdicts: Sequence[Verdict]) -> list[str]:
    met = sum(v.met for v in verdicts)
    lines = [f"**{met} of {len(verdicts)} met.**", ""]
    lines.append("| path | pass | variant | met | worst cell | time ÷ allowed |")
    lines.append("|---|---|---|---|---|---|")
    for (op, prov, mode, variant), vs in _groups(verdicts).items():
        w = max(vs, key=lambda v: v.worst)
        lines.append(
            f"| {LABELS.get((op, prov), prov)} | {_PASS_TITLE[mode]} | {variant} | "
            f"{sum(v.met for v in vs)}/{len(vs)} | {w.dtype} {w.M} × {w.N} | {w.worst:.2f} |"
        )
    return lines


def _target_text(op: str, m: int, n: int) -> str:
    if op == "rms_norm":
        return "≤ 1× min(F.rms_norm, F.layer_norm)" if m * n >= LARGE else "≤ 2× F.layer_norm"
    return "≤ 1×" if m * n >= LARGE or op == "add_rms_norm" else "≤ 2×"


def _ours_text(v: Verdict | None) -> str:
    if v is None:
        return "–"
    ratios = " / ".join(f"{val:.3g}×" for what, val, _ in v.checks if what.startswith("÷"))
    return f"{_fmt_ms(v.ms)} · {ratios} · " + ("met" if v.met else "**not met**")


def _op_table(op, mode, variant, cells, by_key) -> list[str]:
    """A line per cell: the target, each peer's time, each of our paths' time, ratios, verdict."""
    keys = [k for k in cells if k[:2] == (mode, variant) and any(o == op for o, _ in cells[k])]
    if not keys:
        return []
    provs = list(dict.fromkeys(p for k in keys for o, p in cells[k] if o == op))
    peers = [(op, p) for p in provs if p not in OURS[op]]
    if op == "rms_norm":  # F.layer_norm is timed once per cell, as the layer_norm op's peer
        peers.insert(1, ("layer_norm", "torch"))
    ours = [p for p in provs if p in OURS[op]]
    title = f"{op}, {_PASS_TITLE[mode]}" + (", CUDA graph" if variant == "cuda_graph" else "")
    head = ["dtype", "M", "N", "target", *(LABELS.get(k, k[1]) for k in peers)]
    head += [LABELS.get((op, p), p) for p in ours]
    lines = ["", f"## {title}", "", "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for k in keys:
        dtype, m, n = k[2:]
        line = [dtype, str(m), str(n), _target_text(op, m, n)]
        line += [_fmt_ms(cells[k][p].ms) if p in cells[k] else "–" for p in peers]
        line += [_ours_text(by_key.get((op, p, *k))) for p in ours]
        lines.append("| " + " | ".join(line) + " |")
    return lines


def _generate_table(verdicts, cells) -> list[str]:
    gen = [v for v in verdicts if v.op == "generate"]
    if not gen:
        return []
    layers = {h: n_layers for h, n_layers, _ in GENERATE_MODELS}
    lines = ["", "## Greedy generate(), per token", ""]
    lines.append(
        "A randomly initialised `LlamaForCausalLM` in float32 (vocabulary 1024, MLP 4× hidden), a "
        f"prompt of {GENERATE_PROMPT} tokens, greedy decoding of a fixed number of new tokens "
        f"({GENERATE_TOKENS} in a full run); time per call ÷ new tokens (the prompt's forward "
        f"included), the two models timed in turns (in a full run, medians of {GENERATE_ROUNDS[0]} "
        f"samples of at least {GENERATE_ROUNDS[1]} s of calls each)."
    )
    lines += ["", "| hidden | layers | unpatched | hf.patch | ratio | target ≤ 1× |"]
    lines.append("|---|---|---|---|---|---|")
    for v in gen:
        base = cells[(v.mode, v.variant, v.dtype, v.M, v.N)][("generate", "hf_eager")]
        lines.append(
            f"| {v.N} | {layers.get(v.N, '?')} | {base.ms:.3f} ms | {v.ms:.3f} ms | "
            f"{v.checks[0][1]:.2f}× | " + ("met" if v.met else "**not met**") + " |"
        )
    return lines


def write_markdown(rows: Sequence[Row], path: str | os.PathLike, note: str = "") -> None:
    """How it was measured and the targets; a summary (met / not met per path and pass, with the
    worst cell); per (op, pass, variant) a table with a line per cell: each peer's time and, for
    each of this library's paths, its time, the ratios the targets use and met / not met; greedy
    generate() per token; the copy bandwidth of the large cells. `note` (the machine's load, say)
    follows the description of the method."""
    if not rows:
        write_text("No measurements.\n", path)
        return
    verdicts = judge(rows)
    by_key = {(v.op, v.provider, v.mode, v.variant, v.dtype, v.M, v.N): v for v in verdicts}
    cells = _cells(rows)
    lines = [f"# Latency: {run_header(rows)}", "", *_intro(rows[0].device, note), ""]
    lines += _summary_table(verdicts)
    for op in ("rms_norm", "layer_norm", "add_rms_norm"):
        for mode in PASSES:
            for variant in ("eager", "cuda_graph"):
                lines += _op_table(op, mode, variant, cells, by_key)
    lines += _generate_table(verdicts, cells)
    copies = sorted(
        (r for r in rows if r.op == "copy" and r.M * r.N >= LARGE),
        key=lambda r: (r.dtype, r.M * r.N),
    )
    if copies:
        lines += ["", "Copy (`dst.copy_(src)`) of each large cell's elements, same process: "]
        lines[-1] += "; ".join(
            f"{r.dtype} {r.M} × {r.N}: {_fmt_ms(r.ms)} ({r.gbps:.1f} GB/s)" for r in copies
        )
    write_text("\n".join(lines) + "\n", path)


def write_plot(rows: Sequence[Row], path: str | os.PathLike) -> bool:
    """Time ÷ the time the targets allow against M·N, one panel per (pass, variant), a line per
    path of this library and dtype. Returns False (writing nothing) without matplotlib or
    without a judged cell."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FormatStrFormatter
    except ImportError:
        return False
    verdicts = [v for v in judge(rows) if v.op != "generate"]
    if not verdicts:
        return False
    panels = list(dict.fromkeys((v.mode, v.variant) for v in verdicts))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 5.0), squeeze=False)
    paths = list(dict.fromkeys((v.op, v.provider) for v in verdicts))
    styles = {"float32": ("o", "-"), "bfloat16": ("^", ":")}
    for ax, (mode, variant) in zip(axes.flat, panels, strict=True):
        for i, (op, prov) in enumerate(paths):
            for dtype, (marker, ls) in styles.items():
                vs = [
                    v
                    for v in verdicts
                    if (v.op, v.provider, v.mode, v.variant, v.dtype)
                    == (op, prov, mode, variant, dtype)
                ]
                if not vs:
                    continue
                vs.sort(key=lambda v: v.M * v.N)
                label = f"{LABELS.get((op, prov), prov)}, {dtype}"
                xs, ys = [v.M * v.N for v in vs], [v.worst for v in vs]
                ax.plot(xs, ys, marker=marker, ls=ls, color=f"C{i}", label=label, ms=4, lw=1)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.axvline(LARGE, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))
        ax.set_xlabel("elements per call, M·N (log scale)")
        ax.set_ylabel("time ÷ time the targets allow (ratio, ≤ 1 = met)")
        ax.set_title(_PASS_TITLE[mode] + (", CUDA graph" if variant == "cuda_graph" else ""))
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6, ncol=2)
    return save_plot(fig, f"Per-call latency against the targets — {run_header(rows)}", path)
