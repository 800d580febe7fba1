"""The GGUF re-rounding: the Q4_K and Q6_K quantizers byte for byte against llama.cpp's reference
quantizer on a fixed input, their bytes decoded by gguf's own decoder, the shifted round trip,
the grid spacings, the GGUF-to-parameter map and :func:`requantize` on a small Llama-named model
written to a GGUF file here, and, where the weights are installed, the real files."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from rmsnorm.lab.experiments import quantization as Q

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType


def weights_like(rows: int, n: int, seed: int) -> np.ndarray:
    """Heavy-tailed values of about 0.02 RMS from an integer hash: the same float32 bits on every
    platform (no random generator's stream, no libm)."""
    i = np.arange(rows * n, dtype=np.uint64)
    h = (i * np.uint64(2654435761) + np.uint64(seed)) % np.uint64(2**32)
    h = (h ^ (h >> np.uint64(13))) * np.uint64(2246822519) % np.uint64(2**32)
    v = (h >> np.uint64(8)).astype(np.float32) / np.float32(2**24) - np.float32(0.5)
    return (np.float32(0.02) * v / (np.float32(0.55) - np.abs(v))).reshape(rows, n)


def fixture() -> np.ndarray:
    x = weights_like(12, 512, 7)
    x[1] = 0  # all-zero super-blocks
    x[2, :256] = np.float32(-0.01)  # a constant super-block: every sub-block flat
    x[3, 100] = np.float32(0.5)  # one outlier, 25× the RMS
    x[4] = np.abs(x[4])  # all positive: the Q4_K min clamps to 0
    x[5, 16:48] = 0  # zero groups inside a block
    x[6, :256] *= np.float32(1e-3)  # a tiny super-block beside a normal one
    return x


# sha256 of the bytes that llama.cpp's quantize_row_q4_K_ref / quantize_row_q6_K_ref (ggml's
# ggml-quants.c, built with gcc -O2 for x86-64, no FMA contraction) write for fixture()
REFERENCE = {
    "input": "67ff639b0f68fa5262c771148bce7cf29d75bdeb9bcc3374e6995c3975343b0a",
    "Q4_K": "6b283806cda799cab6cbf3cb40c513f83c13355772db1da9e97905e30388cc3b",
    "Q6_K": "7cabce675be12bf67e06a85d4781b1bd63ab10d25d62fe252a6ee3506ec7080a",
}


def _rel(a, b) -> float:
    return float(np.sqrt(((a - b) ** 2).sum() / (b**2).sum()))


def test_fixture_is_the_reference_input():
    assert hashlib.sha256(fixture().tobytes()).hexdigest() == REFERENCE["input"]


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
def test_k_quants_write_llama_cpp_reference_bytes(name):
    packed = Q.quantize(fixture(), name)
    size = gguf.GGML_QUANT_SIZES[T[name]][1]
    assert packed.dtype == np.uint8 and packed.shape == (12, 2 * size)
    assert hashlib.sha256(packed.tobytes()).hexdigest() == REFERENCE[name]


# the round trip's RMS error relative to the RMS of weights_like's heavy-tailed rows, measured
# (0.100, 0.057, 0.0071, 0.089–0.092, 0.023–0.024), with 10% to spare: Q4_K's searched 4-bit
# grid beats Q4_1's min/max one with fewer bits per weight (4.5 against 5)
ERROR = {"Q4_1": 0.11, "Q5_0": 0.063, "Q8_0": 0.008, "Q4_K": 0.1, "Q6_K": 0.027}


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
def test_k_quants_decode_with_gguf(name):
    x = weights_like(16, 1024, 3)
    back = gguf.quants.dequantize(Q.quantize(x, name), T[name])
    assert back.shape == x.shape and back.dtype == np.float32
    assert 0.5 * ERROR[name] < _rel(back, x) < ERROR[name]
    zeros = gguf.quants.dequantize(Q.quantize(np.zeros((1, 256), np.float32), name), T[name])
    assert not zeros.any()


def test_k_quants_refuse_rows_off_the_super_block():
    with pytest.raises(ValueError, match="multiple of 256"):
        Q.quantize_q4_k(np.zeros((2, 320), np.float32))


def test_every_type_of_the_two_files_round_trips():
    x = weights_like(4, 512, 11)
    for name, error in ERROR.items():
        assert 0.5 * error < _rel(Q.round_trip(x, name), x) < error, name
    with pytest.raises(ValueError, match="GGUF type name"):
        Q.round_trip(x, "Q4_Z")


def test_shift_rolls_the_blocks_along_the_row():
    x = weights_like(3, 512, 5)
    for name in ("Q4_1", "Q4_K"):
        shifted = Q.round_trip(x, name, shift=16)
        by_hand = np.roll(Q.round_trip(np.roll(x, 16, axis=1), name), -16, axis=1)
        assert np.array_equal(shifted, by_hand)
        assert np.array_equal(Q.round_trip(x, name, shift=512), Q.round_trip(x, name))
    with pytest.raises(ValueError, match="non-negative"):
        Q.round_trip(x, "Q4_1", shift=-1)


def test_rounding_decoded_values_again_is_nearly_idempotent():
    x = weights_like(8, 512, 9)
    for name in ("Q4_1", "Q5_0", "Q8_0"):  # min/max grids: the same bytes exactly
        once = Q.quantize(x, name)
        assert np.array_equal(Q.quantize(Q.dequantize(once, name), name), once)
    for name in ("Q4_K", "Q6_K"):  # searched grids: the same values to a small fraction
        once = Q.round_trip(x, name)
        assert _rel(Q.round_trip(once, name), once) < 0.01 * _rel(once, x)
        # half a scale group over, the second rounding costs about as much as the first
        shifted = Q.round_trip(once, name, shift=Q.HALF_GROUP[name])
        assert 0.4 * _rel(once, x) < _rel(shifted, once) < 1.2 * _rel(once, x)


@pytest.mark.parametrize("name", ["Q4_1", "Q8_0", "Q4_K", "Q6_K"])
def test_grid_steps_are_the_spacing_of_the_decoded_values(name):
    data = Q.quantize(weights_like(2, 512, 13), name)
    steps, group = Q.grid_steps(data, name)
    values = Q.dequantize(data, name).reshape(-1, group)
    assert steps.shape == (values.shape[0],) and (steps > 0).all()
    codes = (values - values[:, :1]) / steps[:, None]  # whole numbers of steps apart
    assert np.abs(codes - np.rint(codes)).max() < 1e-3
