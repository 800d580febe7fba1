"""What a short fine-tune recovers of the cost of changing the norm of a pretrained model, measured
as the real-model study measures the unrecovered cost (:mod:`~rmsnorm.lab.experiments.centering`).

MiniLM (a post-LN encoder): every LayerNorm made an RMSNorm naively (the same γ, β, ε:
:func:`~rmsnorm.lab.experiments.centering.rms_instead`), then distilled to the original model's
sentence embeddings (loss 1 − cos of the unit-length mean-pooled states) on sentences of the
text's held-in part; evaluated by the 1 − cos of each of the report's held-out sentences. SmolLM2
(an RMSNorm decoder): the centering added at every norm
(:func:`~rmsnorm.lab.experiments.centering.centered`), then distilled to the original model's
next-token distributions (loss KL(original ‖ student) per token) on held-in windows; evaluated by
KL and Δ cross-entropy on the report's held-out windows, the head at the same positions. Step 0
of each is the report's unrecovered cost, computed by the same code.

Each change has its control: the same fine-tuning (steps, data, learning rate, seed) of the
unchanged model, whose distance to the original is 0 at step 0 and moves only by what the
fine-tuning itself does. Dropout is off (the models run in eval mode), so a seed sets only the
order of the training data (one permutation per pass over it); given a seed and the torch
threads, a run is deterministic. The optimizer is AdamW without weight decay and at a constant
learning rate. The per-sequence values of every checkpoint are kept; :func:`summarize` draws the
intervals from them: over seeds at each checkpoint (Student's t, n = seeds) and over sequences at
the last one (:func:`~rmsnorm.lab.stats.intervals.mean_interval`, each sequence's value averaged
over seeds).
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from ..._progress import ensure
from ..._validate import ArgumentError, finite_number, one_of, positive_int
from .realmodels import RealConfig

__all__ = [
    "RecoveryConfig",
    "TRAINABLE",
    "METRICS",
    "checkpoint_steps",
    "recover_encoder",
    "recover_causal",
    "summarize",
    "run_recovery",
]

# Which parameters train: every one, or only the norms' γ (and β where the norm has one).
TRAINABLE = ("all", "norms")
# The evaluated costs: an encoder's per sentence, a causal model's per sequence.
METRICS = {"encoder": ("one_minus_cosine",), "causal": ("kl", "delta_ce")}
ARMS = ("swapped", "control")
_REAL = RealConfig()


@dataclass(frozen=True)
class RecoveryConfig:
    """What the recovery runs: ``models`` (built-in names, or any source
    :func:`~rmsnorm.lab.models.pretrained.load_pretrained` takes) on the built-in ``text``, at
    ``seeds`` seeds (data orders) per arm (swapped, control). An encoder trains
    ``encoder_steps`` steps of ``encoder_batch`` sentences at learning rate ``encoder_lr`` from
    ``encoder_train_sentences`` held-in sentences; a causal model ``causal_steps`` steps of
    ``causal_batch`` windows of ``train_seq_len`` tokens at ``causal_lr`` from
    ``causal_train_windows`` held-in windows. ``trainable``: :data:`TRAINABLE`. Evaluated at step 0
    and at ``checkpoints`` evenly spaced steps after it (the last one the final step) on the
    report's held-out data: ``sentences`` sentences, ``cost_sequences`` windows of
    ``cost_seq_len`` tokens with the head at every ``head_stride``-th position (the defaults are
    :class:`~rmsnorm.lab.experiments.realmodels.RealConfig`'s). ``threads``: torch threads for the
    run (None: one per core), restored after.

    The defaults fit about 15 minutes on a 2-core machine shared with other work (measured:
    benchmarks/results/recovery/README.md)."""

    models: tuple[str, ...] = ("minilm-l6", "smollm2-135m")
    text: str = "docstrings"
    seeds: int = 3
    trainable: str = "all"
    encoder_steps: int = 30
    encoder_batch: int = 16
    encoder_lr: float = 5e-5
    encoder_train_sentences: int = 512
    causal_steps: int = 8
    causal_batch: int = 4
    causal_lr: float = 2e-5
    causal_train_windows: int = 32
    train_seq_len: int = 64
    checkpoints: int = 2
    sentences: int = _REAL.sentences
    cost_sequences: int = _REAL.cost_sequences
    cost_seq_len: int = _REAL.cost_seq_len
    head_stride: int = _REAL.head_stride
    # One thread: on the 2-core machine shared with other work (load average 6-7) a SmolLM2 step
    # (8 windows of 64 tokens) took 15-25 s with one torch thread and 50-70 s with two.
    threads: int | None = 1

    def __post_init__(self) -> None:
        for name in (
            "seeds",
            "encoder_steps",
            "encoder_batch",
            "encoder_train_sentences",
            "causal_steps",
            "causal_batch",
            "causal_train_windows",
            "train_seq_len",
            "checkpoints",
            "sentences",
            "cost_sequences",
            "cost_seq_len",
            "head_stride",
        ):
            positive_int(name, getattr(self, name))
        for name in ("seeds", "sentences", "cost_sequences"):
            if getattr(self, name) < 2:
                raise ArgumentError(
                    name, f"at least 2 (intervals over them), got {getattr(self, name)!r}"
                )
        if self.train_seq_len < 4 or self.cost_seq_len < 4:
            name = "train_seq_len" if self.train_seq_len < 4 else "cost_seq_len"
            raise ArgumentError(name, f"at least 4 tokens, got {getattr(self, name)!r}")
        for name in ("encoder_lr", "causal_lr"):  # 0 is allowed: a check that nothing moves
            if finite_number(name, getattr(self, name)) < 0:
                raise ArgumentError(name, f"a learning rate ≥ 0, got {getattr(self, name)!r}")
        one_of("trainable", self.trainable, TRAINABLE)
        if self.threads is not None:
            positive_int("threads", self.threads)
        if not self.models or not all(isinstance(m, str) and m for m in self.models):
            raise ArgumentError("models", f"at least one model name, got {self.models!r}")
        for kind, steps in (("encoder", self.encoder_steps), ("causal", self.causal_steps)):
            if self.checkpoints > steps:
                raise ArgumentError(
                    "checkpoints",
                    f"at most the {kind} steps ({steps}), got {self.checkpoints!r}",
                )

    @classmethod
    def quick(cls, **overrides) -> RecoveryConfig:
        """Tiny sizes (a smoke test of the whole command in about a minute): 2 seeds, 4 steps,
        32 sentences and 4 windows evaluated, so step 0 is not the report's number."""
        base = dict(
            seeds=2,
            encoder_steps=4,
            encoder_batch=8,
            encoder_train_sentences=64,
            causal_steps=4,
            causal_batch=2,
            causal_train_windows=8,
            checkpoints=2,
            sentences=32,
            cost_sequences=4,
        )
        return cls(**{**base, **overrides})


def checkpoint_steps(steps: int, checkpoints: int) -> list[int]:
    """Step 0 and ``checkpoints`` evenly spaced steps after it, the last one ``steps``."""
    return [0] + sorted({max(1, round(k * steps / checkpoints)) for k in range(1, checkpoints + 1)})


def _trainable(model: torch.nn.Module, which: str, norms: list) -> list[torch.nn.Parameter]:
    """The parameters that train (:data:`TRAINABLE`); the others are frozen."""
    if which == "all":
        chosen = list(model.parameters())
    else:
        ids = {id(p) for s in norms for p in s.module.parameters(recurse=False)}
        chosen = [p for p in model.parameters() if id(p) in ids]
    keep = {id(p) for p in chosen}
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)
    return chosen


def _order(count: int, batch: int, steps: int, seed: int) -> list[torch.Tensor]:
    """Each step's indices into the ``count`` training items: consecutive slices of one seeded
    permutation per pass over them (a pass's last partial batch is dropped)."""
    if batch > count:
        raise ValueError(f"a batch of {batch} needs at least {batch} training items, got {count}")
    g = torch.Generator().manual_seed(seed)
    per_pass = count // batch
    out: list[torch.Tensor] = []
    while len(out) < steps:
        perm = torch.randperm(count, generator=g)
        out.extend(perm[i * batch : (i + 1) * batch] for i in range(per_pass))
    return out[:steps]


def _optimizer(params, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, foreach=True)


def _run_info(arm: str, seed: int, params: list, steps: int, lr: float, batch: int) -> dict:
    return {
        "arm": arm,
        "seed": seed,
        "parameters_trained": sum(p.numel() for p in params),
        "steps": steps,
        "lr": lr,
        "batch": batch,
    }


# ----------------------------------------------------------------------------------------------
# An encoder: the naive swap, distilled to the original's sentence embeddings
# ----------------------------------------------------------------------------------------------
def _tokenized(loaded, texts: list[str]) -> dict:
    batch = loaded.tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    return {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask")}


class EncoderData:
    """What every run on one encoder shares: the held-out sentences (the report's) with the
    original model's embeddings, and the held-in training sentences with theirs (the targets)."""

    def __init__(self, loaded, source, cfg: RecoveryConfig) -> None:
        from ..models.text import sentences
        from .centering import _embed

        if not loaded.encoder:
            raise ValueError(f"{loaded.name} is not an encoder")
        self.eval_batch = _tokenized(loaded, sentences(source, cfg.sentences))
        train = sentences(source, cfg.encoder_train_sentences, part="stats")
        self.train_batch = _tokenized(loaded, train)
        with torch.no_grad():
            self.reference = _embed(loaded.model, self.eval_batch)
            self.targets = _embed(loaded.model, self.train_batch).to(torch.float32)
        self.train_count = len(train)


def recover_encoder(
    loaded, data: EncoderData, cfg: RecoveryConfig, arm: str, seed: int, progress=None
) -> dict:
    """One run on an encoder (``arm`` "swapped": every LayerNorm made an RMSNorm; "control":
    unchanged): per checkpoint the 1 − cos of each held-out sentence's embedding to the
    original's, the nearest-neighbour agreement and the similarity rank correlation; the
    training loss of every step; the wall time."""
    from .centering import _agreement, _embed, mean_pooled, rms_instead
    from .sites import find_sites

    one_of("arm", arm, ARMS)
    torch.manual_seed(seed)
    student = copy.deepcopy(loaded.model).eval()
    norms = [s for s in find_sites(student) if s.norm == "layernorm"]
    params = _trainable(student, cfg.trainable, norms)
    opt = _optimizer(params, cfg.encoder_lr)
    checks = checkpoint_steps(cfg.encoder_steps, cfg.checkpoints)
    order = _order(data.train_count, cfg.encoder_batch, cfg.encoder_steps, seed)
    lengths = data.train_batch["attention_mask"].sum(1)
    evals, losses = {}, []

    def evaluate(step: int) -> None:
        with torch.no_grad():
            a = _agreement(data.reference, _embed(student, data.eval_batch))
        evals[str(step)] = {
            "one_minus_cosine": a["one_minus_cosine"],
            "nearest_neighbour_agreement": a["nearest_neighbour_agreement"],
            "similarity_rank_correlation": a["similarity_rank_correlation"],
        }

    t0 = time.perf_counter()
    label = f"recovery: {loaded.name}, {arm}, seed {seed}"
    with (
        rms_instead(norms if arm == "swapped" else []),
        ensure(progress).task(label, cfg.encoder_steps) as tick,
    ):
        evaluate(0)
        for step, idx in enumerate(order, 1):
            width = int(lengths[idx].max())
            part = {k: v[idx, :width] for k, v in data.train_batch.items()}
            emb = F.normalize(mean_pooled(student, part), dim=-1)
            loss = (1 - (emb * data.targets[idx]).sum(-1)).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            if step in checks:
                evaluate(step)
            tick()
    out = _run_info(arm, seed, params, cfg.encoder_steps, cfg.encoder_lr, cfg.encoder_batch)
    return out | {"seconds": time.perf_counter() - t0, "train_loss": losses, "evals": evals}


# ----------------------------------------------------------------------------------------------
# A causal model: the centering, distilled to the original's next-token distributions
# ----------------------------------------------------------------------------------------------
class CausalData:
    """What every run on one causal model shares: the report's held-out windows with the original
    model's logits at the head's positions and the next tokens there, and the held-in training
    windows."""

    def __init__(self, loaded, source, cfg: RecoveryConfig) -> None:
        from ..models.text import token_windows
        from .centering import _LOGIT_ELEMENTS, head_positions

        if loaded.encoder:
            raise ValueError(f"{loaded.name} is an encoder")
        seq_len = cfg.cost_seq_len
        self.windows, self.text = token_windows(
            source, loaded.tokenizer, part="heldout", sequences=cfg.cost_sequences, seq_len=seq_len
        )
        self.positions = head_positions(seq_len, cfg.head_stride)
        self.seq_len = seq_len
        targets = torch.full((cfg.cost_sequences, self.positions.numel()), -1, dtype=torch.int64)
        scored = self.positions < seq_len - 1
        targets[:, scored] = self.windows[:, self.positions[scored] + 1]
        self.targets = targets
        # the study's batches (centering.causal_swap_study), so step 0 is its number
        self.batch = max(1, _LOGIT_ELEMENTS // (self.positions.numel() * loaded.vocab_size))
        with torch.no_grad():
            self.reference = [self._logits(loaded.model, ids) for ids in self._batches()]
        self.train, _ = token_windows(
            source,
            loaded.tokenizer,
            part="stats",
            sequences=cfg.causal_train_windows,
            seq_len=cfg.train_seq_len,
        )

    def _batches(self):
        for start in range(0, self.windows.shape[0], self.batch):
            yield self.windows[start : start + self.batch]

    def _logits(self, model, ids: torch.Tensor) -> torch.Tensor:
        out = model(input_ids=ids, use_cache=False, logits_to_keep=self.positions).logits
        return out.float()

    @torch.no_grad()
    def costs(self, model) -> dict:
        """Per held-out sequence: KL(original ‖ model) per token and Δ cross-entropy."""
        from .centering import _per_sequence, _token_costs

        kl, dce = [], []
        for i, ids in enumerate(self._batches()):
            start = i * self.batch
            tgt = self.targets[start : start + ids.shape[0]]
            costs = _token_costs(self.reference[i], self._logits(model, ids), tgt)
            per = _per_sequence(costs, self.positions, self.seq_len)
            kl += per["kl"]
            dce += per["delta_ce"]
        return {"kl": kl, "delta_ce": dce}


def _kl_loss(teacher: torch.Tensor, student: torch.Tensor) -> torch.Tensor:
    """KL(teacher ‖ student) of the next-token distributions, mean over tokens (nats)."""
    log_p = F.log_softmax(teacher.float(), -1)
    log_q = F.log_softmax(student.float(), -1)
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean()


def recover_causal(
    loaded, data: CausalData, cfg: RecoveryConfig, arm: str, seed: int, progress=None
) -> dict:
    """One run on a causal model (``arm`` "swapped": the centering added at every RMSNorm;
    "control": unchanged): per checkpoint each held-out sequence's KL(original ‖ model) and Δ
    cross-entropy; the training loss of every step; the wall time."""
    from .centering import centered
    from .sites import find_sites

    one_of("arm", arm, ARMS)
    torch.manual_seed(seed)
    teacher = loaded.model
    student = copy.deepcopy(teacher).eval()
    norms = [s for s in find_sites(student) if s.norm == "rmsnorm"]
    if arm == "swapped" and not norms:
        raise ValueError(f"{loaded.name} has no RMSNorm to add the centering to")
    params = _trainable(student, cfg.trainable, norms)
    opt = _optimizer(params, cfg.causal_lr)
    checks = checkpoint_steps(cfg.causal_steps, cfg.checkpoints)
    order = _order(data.train.shape[0], cfg.causal_batch, cfg.causal_steps, seed)
    evals, losses = {}, []
    t0 = time.perf_counter()
    label = f"recovery: {loaded.name}, {arm}, seed {seed}"
    with (
        centered(norms if arm == "swapped" else []),
        ensure(progress).task(label, cfg.causal_steps) as tick,
    ):
        evals["0"] = data.costs(student)
        for step, idx in enumerate(order, 1):
            ids = data.train[idx]
            with torch.no_grad():
                target = teacher(input_ids=ids, use_cache=False).logits
            loss = _kl_loss(target, student(input_ids=ids, use_cache=False).logits)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            if step in checks:
                evals[str(step)] = data.costs(student)
            tick()
    out = _run_info(arm, seed, params, cfg.causal_steps, cfg.causal_lr, cfg.causal_batch)
    return out | {"seconds": time.perf_counter() - t0, "train_loss": losses, "evals": evals}


# ----------------------------------------------------------------------------------------------
# Summaries drawn from the per-sequence values
# ----------------------------------------------------------------------------------------------
def _over_seeds(values: list[float]) -> dict:
    from ..stats.intervals import mean_interval

    finite = [v for v in values if v is not None and math.isfinite(v)]
    if len(finite) < 2:
        v = finite[0] if finite else math.nan
        return {"value": v, "lo": math.nan, "hi": math.nan, "n": len(finite), "method": "t"}
    return mean_interval(finite, method="t")


def _over_sequences(values: list[float]) -> dict:
    from ..stats.intervals import mean_interval

    finite = [v for v in values if v is not None and math.isfinite(v)]
    if len(finite) < 2:
        return {"value": math.nan, "lo": math.nan, "hi": math.nan, "n": len(finite)}
    return mean_interval(finite)


def _mean(values: list[float]) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def summarize(model: dict) -> dict:
    """One model's runs summarized per arm and metric: ``curve`` (per checkpoint, the mean over
    seeds of the per-sequence mean, a t interval over seeds, n = seeds), ``start`` (step 0, the
    unrecovered cost: the same in every seed), ``final`` (the last checkpoint over seeds) and
    ``final_sequences`` (each sequence's last value averaged over seeds, an interval over
    sequences, n = sequences); for the swapped arm ``recovered_fraction`` (1 − final / start, per
    seed and of the means) and ``beyond_control`` (final swapped − final control)."""
    out = {}
    for arm in ARMS:
        runs = model["runs"][arm]
        steps = sorted({int(s) for r in runs for s in r["evals"]})
        last = str(steps[-1])
        per_arm = {}
        for metric in model["metrics"]:
            curve = []
            for step in steps:
                means = [_mean(r["evals"][str(step)][metric]) for r in runs]
                curve.append({"step": step, **_over_seeds(means), "per_seed": means})
            finals = [r["evals"][last][metric] for r in runs]
            per_seq = [_mean(list(vals)) for vals in zip(*finals, strict=True)]
            starts = [_mean(r["evals"]["0"][metric]) for r in runs]
            per_arm[metric] = {
                "curve": curve,
                "start": starts[0],
                "start_equal_over_seeds": max(starts) == min(starts),
                "final": curve[-1],
                "final_sequences": _over_sequences(per_seq),
            }
        per_arm["seconds_per_run"] = [r["seconds"] for r in runs]
        per_arm["train_loss_first"] = [r["train_loss"][0] for r in runs]
        per_arm["train_loss_last"] = [r["train_loss"][-1] for r in runs]
        out[arm] = per_arm
    for metric in model["metrics"]:
        sw, ctl = out["swapped"][metric], out["control"][metric]
        start = sw["start"]
        per_seed = [
            1 - v / start if start and math.isfinite(start) else math.nan
            for v in sw["final"]["per_seed"]
        ]
        sw["recovered_fraction"] = {
            "value": 1 - sw["final"]["value"] / start if start else math.nan,
            "per_seed": per_seed,
            "min": min(per_seed),
            "max": max(per_seed),
        }
        sw["beyond_control"] = sw["final"]["value"] - ctl["final"]["value"]
    return out


# ----------------------------------------------------------------------------------------------
# The whole run
# ----------------------------------------------------------------------------------------------
def _portable(provenance: dict | None) -> dict | None:
    """The model's provenance with the dequantized copy named by its folder under the lab's
    cache (``cache_dir()/dequantized/``) rather than this machine's absolute path."""
    if not provenance or not provenance.get("dequantized_cache"):
        return provenance
    from pathlib import Path

    return provenance | {"dequantized_cache": Path(provenance["dequantized_cache"]).name}


def recover_model(loaded, source, cfg: RecoveryConfig, progress=None) -> dict:
    """Every seed of both arms on one loaded model, and their summary."""
    encoder = bool(loaded.encoder)
    kind = "encoder" if encoder else "causal"
    t0 = time.perf_counter()
    if encoder:
        data = EncoderData(loaded, source, cfg)
        run, steps, lr, batch = (
            recover_encoder,
            cfg.encoder_steps,
            cfg.encoder_lr,
            cfg.encoder_batch,
        )
        held_in = {"sentences": data.train_count, "part": "stats"}
        held_out = {"sentences": cfg.sentences, "part": "heldout"}
        change = "every LayerNorm made an RMSNorm naively (same γ, β, ε)"
        loss = "1 − cos of unit-length mean-pooled sentence embeddings, to the original's"
    else:
        data = CausalData(loaded, source, cfg)
        run, steps, lr, batch = recover_causal, cfg.causal_steps, cfg.causal_lr, cfg.causal_batch
        held_in = {
            "windows": int(data.train.shape[0]),
            "seq_len": cfg.train_seq_len,
            "part": "stats",
        }
        held_out = data.text | {"head_stride": cfg.head_stride}
        change = "the centering added at every RMSNorm (its input minus its mean)"
        loss = "KL(original ‖ student) of the next-token distributions, mean per token (nats)"
    setup = time.perf_counter() - t0
    runs = {arm: [] for arm in ARMS}
    for arm in ARMS:
        for seed in range(cfg.seeds):
            runs[arm].append(run(loaded, data, cfg, arm, seed, progress))
    model = {
        "model": loaded.name,
        "encoder": encoder,
        "kind": kind,
        "metrics": list(METRICS[kind]),
        "change": change,
        "loss": loss,
        "trainable": cfg.trainable,
        "parameters": sum(p.numel() for p in loaded.model.parameters()),
        "parameters_trained": runs["swapped"][0]["parameters_trained"],
        "steps": steps,
        "lr": lr,
        "batch": batch,
        "checkpoints": checkpoint_steps(steps, cfg.checkpoints),
        "held_in": held_in,
        "held_out": held_out,
        "provenance": _portable(loaded.provenance),
        "setup_seconds": setup,
        "runs": runs,
    }
    model["summary"] = summarize(model)
    return model


def run_recovery(cfg: RecoveryConfig, progress=None, *, sources=None, models=None) -> dict:
    """Every model of ``cfg`` (see the module docstring); JSON-able. ``sources``: a
    :class:`~rmsnorm.lab.models.text.TextSource` instead of the built-in ``cfg.text``;
    ``models``: {name: loaded model} instead of loading ``cfg.models`` (tests). A built-in
    model whose weights are not installed is an entry saying so, not an error."""
    from ... import __version__, info
    from ..models.text import builtin_text

    source = sources if sources is not None else builtin_text(cfg.text)
    load = info.load_average()
    before = torch.get_num_threads()
    torch.set_num_threads(cfg.threads or info.cpu_cores() or 1)
    t0 = time.perf_counter()
    machine = info.machine_description()  # with the run's thread count
    results = []
    try:
        for name in cfg.models:
            if models is not None:
                loaded = models[name]
            else:
                from ..models.pretrained import load_pretrained
                from ..models.weights import WeightsMissingError

                try:
                    loaded = load_pretrained(name, progress=progress)
                except WeightsMissingError as exc:
                    results.append(
                        {
                            "model": name,
                            "missing": str(exc),
                            "install": f"rmsnorm weights install {name}",
                        }
                    )
                    continue
            results.append(recover_model(loaded, source, cfg, progress))
    finally:
        threads = torch.get_num_threads()
        torch.set_num_threads(before)
    end = info.load_average()
    return {
        "config": asdict(cfg),
        "text": source.describe(),
        "rmsnorm": __version__,
        "torch": torch.__version__,
        "machine": machine,
        "cores": info.cpu_cores(),
        "threads": threads,
        "load_average": load[0] if load else math.nan,
        "load_average_end": end[0] if end else math.nan,
        "seconds": time.perf_counter() - t0,
        "models": results,
    }
