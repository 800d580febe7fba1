"""How sensitive the lab's numbers on a GGUF checkpoint are to the rounding it already carries:
every quantized tensor of the file goes through its own GGUF type once more, at its own block
boundaries or with them shifted along the row, and the loss and statistics are measured again.

The block formats are GGUF's: Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 through the gguf package's quantizers
(llama.cpp's reference rounding), Q4_K and Q6_K through :func:`quantize_q4_k` and
:func:`quantize_q6_k` here, which follow llama.cpp's reference scale searches step for step in
float32 and write the packed bytes that ``gguf.quants.dequantize`` reads.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "QK_K",
    "quantize",
    "dequantize",
    "quantize_q4_k",
    "quantize_q6_k",
    "round_trip",
    "grid_steps",
    "MappedTensor",
    "tensor_map",
    "unpermute_rows",
    "check_map",
    "HALF_GROUP",
    "requantize",
    "heldout_costs",
    "requantization_study",
]

QK_K = 256  # elements of a K-quant super-block
_UNQUANTIZED = ("F32", "F16", "BF16", "F64")
_F = np.float32


def _qtype(qtype):
    """``qtype`` (a GGMLQuantizationType or its name, "Q4_K") as a GGMLQuantizationType."""
    from gguf import GGMLQuantizationType

    if isinstance(qtype, GGMLQuantizationType):
        return qtype
    try:
        return GGMLQuantizationType[str(qtype)]
    except KeyError:
        raise ValueError(f"qtype must be a GGUF type name such as 'Q4_K', got {qtype!r}") from None


def _rows(x: np.ndarray, block: int, what: str) -> np.ndarray:
    """``x`` as contiguous float32 rows whose length is a multiple of ``block``."""
    x = np.ascontiguousarray(x, dtype=_F)
    if x.ndim == 0 or x.shape[-1] % block:
        raise ValueError(
            f"{what} quantizes rows whose length is a multiple of {block}; got shape {x.shape}"
        )
    return x


def _fp16(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``v`` rounded to float16 (to nearest, ties to even, as ggml's conversion): its bytes and
    its value back in float32."""
    h = v.astype(np.float16)
    return h.view(np.uint8).reshape(*v.shape, 2), h.astype(_F)


# ----------------------------------------------------------------------------------------------
# Q4_K: 256-element super-blocks of 8 sub-blocks of 32, x ≈ d·sc_j·q − dmin·m_j with q in 0..15
# and 6-bit sc_j, m_j: 144 bytes (d, dmin as float16, 12 bytes of packed scales, 128 of nibbles)
# ----------------------------------------------------------------------------------------------
def _fit_min_scale(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """llama.cpp's weighted search for an affine 4-bit grid (make_qkx2_quants with its Q4_K
    settings: 21 candidate inverse scales (15 − 1 + 0.1·k)/(max − min), each refined by weighted
    least squares, the one of least Σ w·err² kept, min clamped to ≤ 0), vectorized over the
    columns of ``x`` (32, n) with weights ``w`` (32, n). Sums run over axis 0 so that numpy adds
    in the reference's left-to-right order. Returns (scale (n,), -min (n,), q (32, n))."""
    nmax = _F(15)
    lo = np.minimum(x.min(0), _F(0))
    hi = x.max(0)
    flat = hi == lo  # all elements equal (and <= 0): q = 0, scale 0
    span = np.where(flat, _F(1), hi - lo)
    sum_w = w.sum(0)
    sum_x = (w * x).sum(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = nmax / span
        scale = _F(1) / iscale
        q = np.clip(np.rint(iscale * (x - lo)), 0, 15)
        diff = scale * q + lo - x
        best = (w * (diff * diff)).sum(0)
        for step in range(21):
            # the reference's (rmin + rdelta·is + nmax) in float32, over the current (max − min):
            # min moves when a candidate wins, and later candidates use the moved one
            iscale = (_F(-1) + _F(0.1) * _F(step) + nmax) / np.where(flat, _F(1), hi - lo)
            aux = np.clip(np.rint(iscale * (x - lo)), 0, 15)
            wl = w * aux
            sum_l = wl.sum(0)
            sum_l2 = (wl * aux).sum(0)
            sum_xl = (wl * x).sum(0)
            det = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
            positive = this_min > 0
            this_scale = np.where(positive, sum_xl / sum_l2, this_scale)
            this_min = np.where(positive, _F(0), this_min)
            diff = this_scale * aux + this_min - x
            err = (w * (diff * diff)).sum(0)
            better = (det > 0) & (err < best) & ~flat
            q = np.where(better, aux, q)
            best = np.where(better, err, best)
            scale = np.where(better, this_scale, scale)
            lo = np.where(better, this_min, lo)
    scale = np.where(flat, _F(0), scale)
    q = np.where(flat, _F(0), q)
    return scale.astype(_F), (-lo).astype(_F), q


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """``x`` (..., n) with n a multiple of 256 as Q4_K bytes (..., n // 256 · 144), by llama.cpp's
    reference quantizer (quantize_row_q4_K_ref: per sub-block weights √mean(x²) + |x|, the
    weighted grid search above, 6-bit sub-block scales and mins under float16 super-block ones,
    then every element rounded to its final grid)."""
    x = _rows(x, QK_K, "Q4_K")
    lead = x.shape[:-1]
    blocks = x.reshape(-1, 8, 32)  # (nb, 8, 32)
    nb = blocks.shape[0]
    sub = np.ascontiguousarray(blocks.reshape(-1, 32).T)  # (32, nb·8)
    av = np.sqrt((sub * sub).sum(0) / _F(32))
    scale, mins, q = _fit_min_scale(sub, av + np.abs(sub))
    scale, mins = scale.reshape(nb, 8), mins.reshape(nb, 8)
    max_scale = np.maximum(scale.max(1), _F(0))
    max_min = np.maximum(mins.max(1), _F(0))
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, _F(63) / max_scale, _F(0))
        inv_min = np.where(max_min > 0, _F(63) / max_min, _F(0))
    # the reference stores the rounded integer in a uint8 (wrapping), then caps it at 63
    ls = np.minimum(np.rint(inv_scale[:, None] * scale).astype(np.int64) & 0xFF, 63)
    lm = np.minimum(np.rint(inv_min[:, None] * mins).astype(np.int64) & 0xFF, 63)
    d_bytes, d = _fp16(max_scale / _F(63))
    m_bytes, dmin = _fp16(max_min / _F(63))
    step = (d[:, None] * ls.astype(_F)).reshape(-1)  # (nb·8,)
    offset = (dmin[:, None] * lm.astype(_F)).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        final = np.clip(np.rint((sub + offset) / step), 0, 15)
    # a sub-block whose scale rounds to 0 keeps the search's q (its values all decode to -dm)
    q = np.where(step != 0, final, q).T.reshape(nb, 4, 2, 32).astype(np.uint8)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(nb, 128)
    ls, lm = ls.astype(np.uint8), lm.astype(np.uint8)
    scales = np.concatenate(
        [
            ls[:, :4] | ((ls[:, 4:] >> 4) << 6),
            lm[:, :4] | ((lm[:, 4:] >> 4) << 6),
            (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4),
        ],
        axis=1,
    )
    out = np.concatenate([d_bytes, m_bytes, scales, qs], axis=1)  # (nb, 144)
    return out.reshape(*lead, -1)


# ----------------------------------------------------------------------------------------------
# Q6_K: 256-element super-blocks of 16 groups of 16, x ≈ d·sc_j·(q − 32) with q in 0..63 and
# signed 8-bit sc_j: 210 bytes (128 of low nibbles, 64 of high bit pairs, 16 scales, d float16)
# ----------------------------------------------------------------------------------------------
def _fit_scale(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's search for a symmetric 6-bit grid (make_qx_quants with Q6_K's settings:
    inverse scales −(32 + 0.1·k)/max for k in −9..9, where max is the element of largest |x|,
    the least-squares scale under weights x² kept when it explains more of Σ w·x²), vectorized
    over the columns of ``x`` (16, n). Returns (scale (n,), q + 32 (16, n))."""
    nmax = _F(32)
    at = np.abs(x).argmax(0)
    peak = np.take_along_axis(x, at[None], 0)[0]
    zero = np.abs(peak) < _F(1e-15)  # an all-zero group: scale 0, q = 0
    peak = np.where(zero, _F(1), peak)
    w = x * x

    def fit(iscale):
        q = np.clip(np.rint(iscale * x), -32, 31)
        return q, ((w * x) * q).sum(0), ((w * q) * q).sum(0)

    q, sum_lx, sum_l2 = fit(-nmax / peak)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(sum_l2 != 0, sum_lx / sum_l2, _F(0))
        best = scale * sum_lx
        for k in range(-9, 10):
            if k == 0:
                continue
            aux, sum_lx, sum_l2 = fit(-(nmax + _F(0.1) * _F(k)) / peak)
            better = (sum_l2 > 0) & (sum_lx * sum_lx > best * sum_l2)
            q = np.where(better, aux, q)
            scale = np.where(better, sum_lx / sum_l2, scale)
            best = np.where(better, scale * sum_lx, best)
    return np.where(zero, _F(0), scale).astype(_F), np.where(zero, _F(0), q + nmax)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """``x`` (..., n) with n a multiple of 256 as Q6_K bytes (..., n // 256 · 210), by llama.cpp's
    reference quantizer (quantize_row_q6_K_ref: the scale search above per group of 16, the
    groups' scales rounded to 8 bits against the one of largest |scale|, which maps to −128,
    then every element rounded to its final grid)."""
    x = _rows(x, QK_K, "Q6_K")
    lead = x.shape[:-1]
    nb = x.size // QK_K
    groups = np.ascontiguousarray(x.reshape(-1, 16).T)  # (16, nb·16)
    scale, first = _fit_scale(groups)
    scale = scale.reshape(nb, 16)
    at = np.abs(scale).argmax(1)
    max_scale = np.take_along_axis(scale, at[:, None], 1)[:, 0]
    empty = np.abs(max_scale) < _F(1e-15)  # an all-zero super-block: every byte 0
    with np.errstate(divide="ignore"):
        iscale = np.where(empty, _F(0), _F(-128) / np.where(empty, _F(1), max_scale))
        d_bytes, d = _fp16(np.where(empty, _F(0), _F(1) / iscale))
    sc = np.minimum(np.rint(iscale[:, None] * scale), 127).astype(np.int8)  # (nb, 16)
    step = (d[:, None] * sc.astype(_F)).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        final = np.clip(np.rint(groups / step), -32, 31) + 32
    # a group whose scale rounds to 0 keeps the search's q (its values all decode to 0)
    q = np.where(step != 0, final, first)
    q = np.where(np.repeat(empty, 16)[None], 0, q).T.reshape(nb, 2, 4, 32).astype(np.uint8)
    low = q & 0xF
    ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], 2)
    high = q >> 4
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    sc = np.where(empty[:, None], 0, sc).astype(np.int8).view(np.uint8)
    out = np.concatenate([ql.reshape(nb, 128), qh.reshape(nb, 64), sc, d_bytes], axis=1)
    return out.reshape(*lead, -1)


# ----------------------------------------------------------------------------------------------
# Every type of the two GGUF files, and the grid each block's bytes describe
# ----------------------------------------------------------------------------------------------
# elements rounded at once: 256 KiB of float32 stays in cache through the ~10 passes of a round
# trip (Gemma 3's Q8_0 embedding: 2.3 s of CPU against 3.9 s in chunks of 4M elements)
_CHUNK = 1 << 16
_GGUF_QUANTIZERS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")  # gguf's, llama.cpp's reference


def quantize(x: np.ndarray, qtype) -> np.ndarray:
    """``x`` (..., n) as GGUF ``qtype`` bytes (..., bytes per row), n a multiple of the type's
    block: Q4_K and Q6_K here, the other block types by the gguf package's quantizers."""
    import gguf

    qtype = _qtype(qtype)
    if qtype == gguf.GGMLQuantizationType.Q4_K:
        return quantize_q4_k(x)
    if qtype == gguf.GGMLQuantizationType.Q6_K:
        return quantize_q6_k(x)
    if qtype.name not in _GGUF_QUANTIZERS:
        raise ValueError(
            f"qtype {qtype.name} has no quantizer here (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K)"
        )
    x = _rows(x, gguf.GGML_QUANT_SIZES[qtype][0], qtype.name)
    # the type's own row function: gguf.quants.quantize splits arrays into groups of rows and
    # costs 3× as much on a 262,144-row embedding
    return getattr(gguf.quants, qtype.name).quantize_rows(x)


def dequantize(data: np.ndarray, qtype) -> np.ndarray:
    """GGUF ``qtype`` bytes (..., bytes per row) as float32 values (..., n), by gguf's decoder."""
    import gguf

    qtype = _qtype(qtype)
    data = np.asarray(data, dtype=np.uint8)
    if qtype.name in _GGUF_QUANTIZERS or qtype.name in ("Q4_K", "Q6_K"):
        return getattr(gguf.quants, qtype.name).dequantize_rows(data)
    return np.asarray(gguf.quants.dequantize(data, qtype))


def _roll_round(x: np.ndarray, qtype, shift: int) -> tuple[np.ndarray, np.ndarray]:
    """(bytes of ``x`` rolled by ``shift`` along its rows, the values they decode to, rolled
    back), a few million elements at a time."""
    x = np.ascontiguousarray(x, dtype=_F)
    rows = x.reshape(-1, x.shape[-1])
    step = max(1, _CHUNK // rows.shape[1])
    packed, values = [], []
    for start in range(0, rows.shape[0], step):
        part = (
            np.roll(rows[start : start + step], shift, axis=1)
            if shift
            else rows[start : start + step]
        )
        data = quantize(part, qtype)
        back = dequantize(data, qtype)
        packed.append(data)
        values.append(np.roll(back, -shift, axis=1) if shift else back)
    return (
        np.concatenate(packed).reshape(*x.shape[:-1], -1),
        np.concatenate(values).reshape(x.shape),
    )


# Half of each type's scale group (32 elements; Q6_K's 16): the shift at which every block
# straddles two of the file's groups, so that no group's grid survives. Whole groups keep most
# grids: on Gemma 3's file Q4_K moves by 0.063 of its RMS at 16 against 0.016 at 128, Q6_K by
# 0.015 at 8 against 0.0016 at 16 (0.084 and 0.021 for weights uniform within their cells)
HALF_GROUP = {"Q4_0": 16, "Q4_1": 16, "Q5_0": 16, "Q5_1": 16, "Q8_0": 16, "Q4_K": 16, "Q6_K": 8}


def round_trip(x: np.ndarray, qtype, *, shift: int = 0) -> np.ndarray:
    """``x`` (..., n) rounded through GGUF ``qtype`` and back to float32, each row rolled by
    ``shift`` elements first (so the blocks start ``shift`` elements later, wrapping round the
    row) and rolled back after."""
    if not isinstance(shift, (int, np.integer)) or shift < 0:
        raise ValueError(f"shift must be a non-negative number of elements, got {shift!r}")
    x = np.asarray(x)
    return _roll_round(x, qtype, int(shift) % max(1, x.shape[-1]))[1]


def grid_steps(data: np.ndarray, qtype) -> tuple[np.ndarray, int]:
    """The spacing of the rounding grid in each group of GGUF ``qtype`` bytes ``data`` (the unit
    its integer codes are multiplied by), and how many elements share one spacing: 32 for the
    32-element types and Q4_K's sub-blocks, 16 for Q6_K's groups. A value rounded to a grid of
    spacing s is off by s/√12 RMS when it falls uniformly within its cell."""
    import gguf

    qtype = _qtype(qtype)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    b = np.asarray(data, dtype=np.uint8).reshape(-1, size)
    half = lambda lo, hi: b[:, lo:hi].copy().view(np.float16).astype(_F)[:, 0]  # noqa: E731
    T = gguf.GGMLQuantizationType
    if qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
        return np.abs(half(0, 2)), block
    if qtype == T.Q4_K:
        sc, _ = gguf.quants.Q4_K.get_scale_min(b[:, 4:16])
        return (half(0, 2)[:, None] * sc.astype(_F)).reshape(-1), 32
    if qtype == T.Q6_K:
        sc = b[:, 192:208].view(np.int8).astype(_F)
        return np.abs(half(208, 210)[:, None] * sc).reshape(-1), 16
    raise ValueError(f"qtype {qtype.name}: no grid spacing known here")


# ----------------------------------------------------------------------------------------------
# Which model parameter each GGUF tensor became
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MappedTensor:
    """A GGUF tensor and the model parameter transformers loaded it into: ``heads`` is set for
    the Llama query/key projections, whose rows transformers reorders on loading (the pairs of
    rows of each of ``heads`` heads interleaved back, undoing llama.cpp's rotary layout);
    rows only, so each row's blocks are the same elements in the file and in the model."""

    gguf_name: str
    parameter: str
    qtype: str
    shape: tuple[int, ...]
    heads: int | None = None

    @property
    def quantized(self) -> bool:
        return self.qtype not in _UNQUANTIZED


@dataclass(frozen=True)
class _GGUFTensor:
    name: str
    qtype: str
    shape: tuple[int, ...]  # rows first, as numpy holds them: (ne[n-1], ..., ne[0])
    data: np.ndarray  # (rows, bytes per row) uint8, a view of the file


def _read_gguf(gguf_path) -> tuple[dict, list[_GGUFTensor]]:
    """The scalar and string metadata of a GGUF file and its tensors (names, types, shapes,
    bytes mapped from the file, not read), every length checked against the file
    (:func:`~rmsnorm.lab.models.weightfiles.read_gguf_header`). gguf's own reader turns each of a
    262,144-token vocabulary's strings into an array, which takes half a minute on Gemma 3's
    file; this walks past arrays without keeping them, in a fraction of a second."""
    import mmap

    from ..models.weightfiles import read_gguf_header

    header = read_gguf_header(gguf_path)
    with open(header.path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    raw = np.frombuffer(buf, dtype=np.uint8)
    tensors = []
    for t in header.tensors:
        rows = int(np.prod(t.dims[1:], dtype=np.int64))
        at = header.data_start + t.offset
        data = raw[at : at + t.n_bytes].reshape(rows, t.n_bytes // rows if rows else 0)
        tensors.append(_GGUFTensor(t.name, t.type_name, tuple(reversed(t.dims)), data))
    return dict(header.fields), tensors


def _field(fields: dict, key: str, path):
    if key not in fields:
        raise ValueError(f"GGUF file {path} has no {key} field")
    return fields[key]


def unpermute_rows(rows: np.ndarray, heads: int) -> np.ndarray:
    """The rows of a Llama query/key projection (or its bytes) in transformers' order: within
    each of ``heads`` heads, llama.cpp's two halves (rows 0..d/2 and d/2..d) interleaved."""
    n = rows.shape[0]
    return (
        rows.reshape(heads, n // heads // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)
    )


def tensor_map(model: torch.nn.Module, gguf_path) -> list[MappedTensor]:
    """Every tensor of the GGUF file at ``gguf_path`` with the parameter of ``model`` (loaded from
    that file) it became, by gguf's table of tensor names for the file's architecture; a tied
    embedding is one parameter, so it appears once. ValueError naming any quantized tensor that
    matches no parameter, or whose shape differs."""
    return _map(model, *_read_gguf(gguf_path), gguf_path)


def _map(model, fields: dict, tensors: list[_GGUFTensor], gguf_path) -> list[MappedTensor]:
    import gguf

    arch_name = str(_field(fields, "general.architecture", gguf_path))
    arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}.get(arch_name)
    if arch is None:
        raise ValueError(f"{gguf_path}: architecture {arch_name!r} is not in gguf's table")
    names = gguf.get_tensor_name_map(
        arch, int(_field(fields, f"{arch_name}.block_count", gguf_path))
    )
    params = dict(model.named_parameters())
    to_param = {}
    for name in params:
        base, _, suffix = name.rpartition(".")
        found = names.get_name(base)
        if found is not None:
            to_param.setdefault(f"{found}.{suffix}", name)
    heads = {}
    if arch_name == "llama":  # transformers' Llama loader reorders these rows, nothing else
        heads = {
            "attn_q": int(_field(fields, "llama.attention.head_count", gguf_path)),
            "attn_k": int(_field(fields, "llama.attention.head_count_kv", gguf_path)),
        }
    out, missing = [], []
    for t in tensors:
        qtype = t.qtype
        name = to_param.get(t.name)
        if name is None:
            if qtype not in _UNQUANTIZED:
                missing.append(t.name)
            continue
        shape = tuple(params[name].shape)
        if qtype not in _UNQUANTIZED and shape != t.shape:
            raise ValueError(
                f"{gguf_path}: tensor {t.name} is {t.shape} but parameter {name} is {shape}"
            )
        kind = t.name.split(".")[-2] if t.name.startswith("blk.") else ""
        out.append(MappedTensor(t.name, name, qtype, shape, heads.get(kind)))
    if missing:
        raise ValueError(
            f"{gguf_path}: quantized tensors with no parameter in the model: {', '.join(missing)}"
        )
    return out


def check_map(model: torch.nn.Module, gguf_path) -> dict[str, float]:
    """For each quantized tensor of the file, the largest |difference| between its dequantized
    values (rows reordered as transformers does) and the model's parameter: 0 everywhere when
    ``model`` holds exactly the file's weights and the map is right."""
    data = {t.name: t.data for t in _read_gguf(gguf_path)[1]}
    params = dict(model.named_parameters())
    out = {}
    for m in tensor_map(model, gguf_path):
        if not m.quantized:
            continue
        values = dequantize(data[m.gguf_name], m.qtype)
        if m.heads:
            values = unpermute_rows(values, m.heads)
        out[m.gguf_name] = float(np.abs(values - params[m.parameter].detach().numpy()).max())
    return out


# ----------------------------------------------------------------------------------------------
# The model re-rounded through its own file's formats
# ----------------------------------------------------------------------------------------------
def _shift_of(shift, qtype: str) -> int:
    if isinstance(shift, dict):
        for name in shift:
            _qtype(name)
    value = shift.get(qtype, 0) if isinstance(shift, dict) else shift
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(
            "shift must be a non-negative number of elements, or a dict of them by GGUF type "
            f"name ({{'Q4_K': 128}}); got {shift!r}"
        )
    return int(value)


def _block(qtype: str) -> int:
    import gguf

    return gguf.GGML_QUANT_SIZES[_qtype(qtype)][0]


def requantize(model: torch.nn.Module, gguf_path, *, shift: int | dict = 0):
    """A deep copy of ``model`` (loaded in float32 from the GGUF file at ``gguf_path``) with every
    parameter that came from a quantized tensor of the file rounded once more through that
    tensor's own type, along the same rows, and what changed. ``shift``: each row is rolled by
    that many elements before rounding and back after, so that the blocks straddle the file's
    (an int for every type, or a dict by type name, types not named 0); at the file's own
    boundaries (0) rounding the decoded values again mostly gives back the file's bytes.

    Returns ``(model, summary)``; ``summary`` = ``{"file", "model", "shift", "types": {qtype:
    {...}}, "all": {...}, "seconds"}``, each ``{...}`` = ``{"tensors", "parameters",
    "rel_rms_change"`` (√(Σ Δw² / Σ w²)), ``"max_abs_change", "unchanged"`` (the fraction of
    elements that kept their value), ``"expected_rel_rms"`` (√(Σ s²/12 / Σ w²), s the grid spacing
    the file gives each element: the RMS error of rounding to the file's grid a weight that falls
    uniformly within its cell, for comparison), ``"blocks_as_in_file"`` (the fraction of blocks
    whose bytes are the file's; None for a shifted type), ``"shift"}`` (None in ``"all"``)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            "model must be a torch.nn.Module (a RunnableModel's .model), not "
            + type(model).__name__
        )
    t0 = time.perf_counter()
    _shift_of(shift, "F32")
    fields, tensors = _read_gguf(gguf_path)
    mapped = [m for m in _map(model, fields, tensors, gguf_path) if m.quantized]
    data = {t.name: t.data for t in tensors}
    out = copy.deepcopy(model)
    params = dict(out.named_parameters())
    # per type: tensors, parameters, Σw², ΣΔw², unchanged, Σs²/12, max |Δw|, blocks as in the
    # file, blocks compared
    sums: dict[str, np.ndarray] = {}
    with torch.no_grad():
        for m in mapped:
            param = params[m.parameter]
            w = param.detach().numpy().reshape(-1, m.shape[-1])  # (rows, n)
            result = np.empty_like(w)
            s = _shift_of(shift, m.qtype) % w.shape[1]
            file_bytes = np.asarray(data[m.gguf_name])
            steps, group = grid_steps(file_bytes, m.qtype)
            if m.heads:
                file_bytes = unpermute_rows(file_bytes, m.heads)
            acc = sums.setdefault(m.qtype, np.zeros(9))
            acc[0] += 1
            acc[1] += w.size
            acc[5] += np.square(steps, dtype=np.float64).sum() * group / 12
            step = max(1, _CHUNK // w.shape[1])
            for start in range(0, w.shape[0], step):
                rows = w[start : start + step]
                packed, new = _roll_round(rows, m.qtype, s)
                delta = new.astype(np.float64) - rows
                acc[2] += np.square(rows, dtype=np.float64).sum()
                acc[3] += np.square(delta).sum()
                acc[4] += np.count_nonzero(delta == 0)
                acc[6] = max(acc[6], float(np.abs(delta).max()))
                if s == 0:
                    size = packed.shape[1] * _block(m.qtype) // w.shape[1]
                    same = packed.reshape(-1, size) == file_bytes[start : start + step].reshape(
                        -1, size
                    )
                    acc[7] += same.all(1).sum()
                    acc[8] += same.shape[0]
                result[start : start + step] = new
            param.copy_(torch.from_numpy(result).reshape(param.shape))

    def entry(acc: np.ndarray, shift_used) -> dict:
        return {
            "tensors": int(acc[0]),
            "parameters": int(acc[1]),
            "rel_rms_change": float(np.sqrt(acc[3] / acc[2])),
            "max_abs_change": float(acc[6]),
            "unchanged": float(acc[4] / acc[1]),
            "expected_rel_rms": float(np.sqrt(acc[5] / acc[2])),
            "blocks_as_in_file": float(acc[7] / acc[8]) if acc[8] else None,
            "shift": shift_used,
        }

    if not sums:
        raise ValueError(f"{gguf_path} has no quantized tensors to round again")
    total = np.sum(list(sums.values()), axis=0)
    total[6] = max(acc[6] for acc in sums.values())
    summary = {
        "file": Path(gguf_path).name,
        "model": type(model).__name__,
        "shift": dict(shift) if isinstance(shift, dict) else int(shift),
        "types": {q: entry(acc, _shift_of(shift, q)) for q, acc in sorted(sums.items())},
        "all": entry(total, None),
        "seconds": time.perf_counter() - t0,
    }
    return out, summary


# ----------------------------------------------------------------------------------------------
# What the second rounding does to the model's predictions
# ----------------------------------------------------------------------------------------------
@torch.no_grad()
def heldout_costs(model: torch.nn.Module, windows: torch.Tensor, reference: list[torch.Tensor]):
    """Per window of ``windows`` (S, T): the next-token cross-entropy of ``model`` (nats per token,
    over the T − 1 targets), and the mean KL(reference ‖ model) and top-1 agreement over the T
    positions, against ``reference``'s logits (one (T, vocab) tensor per window); log-softmax in
    float64, since at the file's own boundaries the two models' log-probabilities differ by ~1e-6,
    float32's resolution at a log-probability of −10."""
    ce, kl, top1 = [], [], []
    for ids, ref in zip(windows, reference, strict=True):
        logits = model(input_ids=ids[None], use_cache=False).logits[0]
        new = torch.log_softmax(logits.double(), -1)
        old = torch.log_softmax(ref.double(), -1)
        ce.append(-new[:-1].gather(-1, ids[1:, None]).mean())
        kl.append((old.exp() * (old - new)).sum(-1).clamp_min(0).mean())
        top1.append((old.argmax(-1) == new.argmax(-1)).double().mean())
    return {"ce": torch.stack(ce), "kl": torch.stack(kl), "top1": torch.stack(top1)}


def _mean(per_window: torch.Tensor) -> dict:
    """Mean over windows and its standard error (windows as independent samples)."""
    n = per_window.numel()
    sem = float(per_window.std() / n**0.5) if n > 1 else float("nan")
    return {"value": float(per_window.mean()), "sem": sem}


def requantization_study(
    name: str,
    source=None,
    *,
    shifts: tuple = (0, HALF_GROUP),
    sequences: int = 8,
    seq_len: int = 128,
    progress=None,
) -> dict:
    """The GGUF model ``name`` (:func:`~rmsnorm.lab.models.pretrained.locate`'s forms) rounded
    once more through its file's formats at each of ``shifts`` (see :func:`requantize`), and each
    form's held-out next-token loss, its change, KL from the loaded model and top-1 agreement on
    ``sequences`` windows of ``seq_len`` tokens of the held-out part of ``source`` (the standard
    library's docstrings by default): ``{"model", "file", "text", "loss", "forms": [{"shift",
    "weights" (the summary of :func:`requantize`), "loss", "delta_loss", "kl", "top1",
    "seconds"}]}``, each number ``{"value", "sem"}`` over windows."""
    from ..._progress import ensure
    from ..models.pretrained import load_pretrained, locate
    from ..models.text import stdlib_docstrings, token_windows

    progress = ensure(progress)
    located = locate(name)
    if located.gguf_file is None:
        raise ValueError(f"model {name!r} is not a GGUF file ({located.weights_format})")
    path = located.directory / located.gguf_file
    loaded = load_pretrained(name, progress=progress, located=located)
    if loaded.encoder or loaded.tokenizer is None:
        raise ValueError(f"model {name!r} needs a language-model head and a tokenizer")
    source = stdlib_docstrings() if source is None else source
    windows, info = token_windows(
        source, loaded.tokenizer, part="heldout", sequences=sequences, seq_len=seq_len
    )
    model = loaded.model.eval()
    with torch.no_grad(), progress.task("reference windows", sequences) as tick:
        reference = []
        for ids in windows:
            reference.append(model(input_ids=ids[None], use_cache=False).logits[0].float())
            tick()
    base = torch.stack(
        [
            -torch.log_softmax(ref.double(), -1)[:-1].gather(-1, ids[1:, None]).mean()
            for ids, ref in zip(windows, reference, strict=True)
        ]
    )
    forms = []
    for shift in shifts:
        t0 = time.perf_counter()
        with progress.task(f"rounding again, shift {shift}", 1) as tick:
            rounded, summary = requantize(model, path, shift=shift)
            tick()
        costs = heldout_costs(rounded.eval(), windows, reference)
        del rounded
        forms.append(
            {
                "shift": summary["shift"],
                "weights": summary,
                "loss": _mean(costs["ce"]),
                "delta_loss": _mean(costs["ce"] - base),
                "kl": _mean(costs["kl"]),
                "top1": _mean(costs["top1"]),
                "seconds": time.perf_counter() - t0,
            }
        )
    return {
        "model": name,
        "file": located.gguf_file,
        "format": located.weights_format,
        "text": source.describe() | info,
        "loss": _mean(base),
        "forms": forms,
    }
