"""Reading the headers of weight files that may come from anyone (safetensors, GGUF) before any
library parses them, and the one error every problem with such a file raises:
:class:`WeightFileError`, which names the file and what is wrong with it.

The checks are those of a reader that trusts nothing in the file: no number read from a header is
used to size an allocation before it has been compared with the file's size (a header length, a
count of tensors or metadata entries, a string or array length); every tensor must lie inside the
file's data, and in a safetensors file the tensors must tile the data exactly (no overlap, no
gap); dtypes and GGUF tensor types must be known ones; tensor names are only ever used as keys,
never as paths. Nothing here unpickles anything: the lab reads safetensors and GGUF only
(:mod:`.pretrained` refuses a directory of pickles).
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "WeightFileError",
    "SAFETENSORS_DTYPES",
    "SafetensorsTensor",
    "read_safetensors_header",
    "GGUFTensorInfo",
    "GGUFHeader",
    "read_gguf_header",
    "gguf_architectures",
    "check_gguf_architecture",
    "check_shapes",
]


class WeightFileError(ValueError):
    """A weight file that cannot be read as what it claims to be: ``path`` is the file,
    ``problem`` what is wrong with it; the message says both in one line."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"weight file {self.path}: {problem}")


# bytes per element of each safetensors dtype (the format's list; 4-bit and 6-bit types, which
# pack two or more elements a byte, are refused by the size check as no model here uses them)
SAFETENSORS_DTYPES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "C64": 8,
    "F64": 8,
    "I64": 8,
    "U64": 8,
}
# The safetensors format's own limit on a header (100 MB): more than any real checkpoint needs.
MAX_SAFETENSORS_HEADER = 100_000_000


@dataclass(frozen=True)
class SafetensorsTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def _shape(path: Path, name: str, shape) -> tuple[int, ...]:
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise WeightFileError(
            path, f"tensor {name!r} has shape {shape!r}; a list of integers >= 0 is expected"
        )
    return tuple(shape)


def read_safetensors_header(path: str | Path) -> dict[str, SafetensorsTensor]:
    """The tensors a safetensors file declares, each checked against the file: its header length
    within the file, the header a JSON object, every dtype known, every shape a list of sizes,
    every tensor's bytes (``data_offsets``) the size its shape and dtype give and inside the data,
    the tensors covering the data without overlap or gap. :class:`WeightFileError` otherwise."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weight file {path} does not exist")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise WeightFileError(
                path, f"truncated: {size} bytes, fewer than the 8 of a header length"
            )
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise WeightFileError(
                path,
                f"its header length is {n:,} bytes, larger than the file ({size:,} bytes): a "
                "truncated or corrupt file, or not safetensors",
            )
        if n > MAX_SAFETENSORS_HEADER:
            raise WeightFileError(
                path, f"its header length is {n:,} bytes, over the format's 100 MB limit"
            )
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WeightFileError(path, f"its header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise WeightFileError(
            path, f"its header is JSON but a {type(header).__name__}, not an object"
        )
    meta = header.pop("__metadata__", None)
    if meta is not None and not (
        isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())
    ):
        raise WeightFileError(path, "its __metadata__ is not an object of strings")
    data = size - 8 - n
    tensors = {}
    for name, info in header.items():
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
            raise WeightFileError(
                path, f"tensor {name!r} lacks dtype, shape or data_offsets in the header"
            )
        dtype = info["dtype"]
        if dtype not in SAFETENSORS_DTYPES:
            raise WeightFileError(
                path,
                f"tensor {name!r} has dtype {dtype!r}, which is not one of "
                f"{', '.join(SAFETENSORS_DTYPES)}",
            )
        shape = _shape(path, name, info["shape"])
        offsets = info["data_offsets"]
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            and 0 <= offsets[0] <= offsets[1]
        ):
            raise WeightFileError(
                path,
                f"tensor {name!r} has data_offsets {offsets!r}; [begin, end] with "
                "0 <= begin <= end is expected",
            )
        begin, end = offsets
        if end > data:
            raise WeightFileError(
                path,
                f"tensor {name!r} ends at byte {end:,} of the data, which holds only {data:,} "
                "bytes: the file is truncated or its offsets are out of range",
            )
        expected = math.prod(shape) * SAFETENSORS_DTYPES[dtype]
        if end - begin != expected:
            raise WeightFileError(
                path,
                f"tensor {name!r} ({dtype}, shape {list(shape)}) needs {expected:,} bytes but its "
                f"data_offsets span {end - begin:,}",
            )
        tensors[name] = SafetensorsTensor(name, dtype, shape, begin, end)
    at = 0
    for t in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if t.begin < at:
            raise WeightFileError(
                path, f"tensor {t.name!r} (bytes {t.begin:,}-{t.end:,}) overlaps another tensor"
            )
        if t.begin > at:
            raise WeightFileError(
                path, f"bytes {at:,}-{t.begin:,} of the data belong to no tensor (a gap)"
            )
        at = t.end
    if at != data:
        raise WeightFileError(
            path, f"the tensors cover {at:,} of the data's {data:,} bytes; the rest is unaccounted"
        )
    return tensors


# --- GGUF ---
# GGUF metadata value types: their struct codes (8 string, 9 array)
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q"}
_GGUF_SCALARS[12] = "d"
_GGUF_VERSIONS = (2, 3)
GGML_MAX_DIMS = 4
# the least bytes one metadata entry (key length, an empty key, type, a one-byte value) and one
# tensor's info (name length, dims count, one dim, type, offset) take in a file
_MIN_KV, _MIN_TENSOR = 8 + 4 + 1, 8 + 4 + 8 + 4 + 8
_KEEP_STRING = 1 << 16  # longer string values are checked and skipped, not kept


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    kind: int  # the ggml type's number
    type_name: str
    dims: tuple[int, ...]  # ne[0] first, as the file has them
    offset: int  # from the start of the data
    n_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    version: int
    fields: dict  # scalar and (short) string metadata; arrays are checked and skipped
    array_lengths: dict  # key -> element count of each array field
    tensors: list[GGUFTensorInfo]
    data_start: int
    size: int

    @property
    def architecture(self) -> str | None:
        return self.fields.get("general.architecture")


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """The metadata and tensor table of a GGUF file, each length and count checked against the
    file's size before it is used, every tensor type a known ggml type whose block divides the
    row, every tensor's data inside the file. :class:`WeightFileError` otherwise (bad magic, an
    unsupported version, counts or string lengths larger than the file, an unknown value or
    tensor type, tensor data past the end)."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    size = path.stat().st_size
    if size < 4:
        raise WeightFileError(path, f"not a GGUF file: {size} bytes, fewer than its magic")
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _parse_gguf(path, buf, size, gguf)
    finally:
        buf.close()


def _parse_gguf(path: Path, buf, size: int, gguf) -> GGUFHeader:
    pos = 0

    def fail(problem: str) -> WeightFileError:
        return WeightFileError(path, problem)

    def unpack(fmt: str):
        nonlocal pos
        width = struct.calcsize("<" + fmt)
        if pos + width > size:
            raise fail(f"truncated: its header runs past its {size:,} bytes (at byte {pos:,})")
        out = struct.unpack_from("<" + fmt, buf, pos)
        pos += width
        return out[0] if len(out) == 1 else out

    def skip(n: int, what: str) -> int:
        nonlocal pos
        if n > size - pos:
            raise fail(f"{what} of {n:,} bytes at byte {pos:,} runs past the file's {size:,} bytes")
        start, pos = pos, pos + n
        return start

    def string(what: str, keep: bool = True) -> str | None:
        n = unpack("Q")
        start = skip(n, what)
        if not keep or n > _KEEP_STRING:
            return None
        try:
            return bytes(buf[start : start + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise fail(f"{what} at byte {start:,} is not UTF-8") from None

    def value(kind: int, key: str):
        if kind == 8:
            return string(f"the string value of {key!r}")
        if kind == 9:
            inner, count = unpack("IQ")
            if inner == 8:
                if count * 8 > size - pos:
                    raise fail(f"array {key!r} claims {count:,} strings, more than the file holds")
                for _ in range(count):
                    string(f"a string in array {key!r}", keep=False)
            elif inner in _GGUF_SCALARS:
                skip(count * struct.calcsize(_GGUF_SCALARS[inner]), f"array {key!r}")
            else:
                raise fail(f"array {key!r} has element type {inner}, which GGUF does not have")
            return ("array", count)
        if kind not in _GGUF_SCALARS:
            raise fail(f"metadata {key!r} has value type {kind}, which GGUF does not have")
        return unpack(_GGUF_SCALARS[kind])

    magic = bytes(buf[:4])
    if magic != b"GGUF":
        raise fail(f"not a GGUF file: it starts with {magic!r}, not b'GGUF'")
    pos = 4
    version = unpack("I")
    if version not in _GGUF_VERSIONS:
        hint = " (a big-endian file?)" if version > 0xFFFF else ""
        raise fail(f"GGUF version {version}{hint} is not supported; versions 2 and 3 are read")
    n_tensors, n_kv = unpack("QQ")
    room = size - pos
    if (
        n_tensors > room // _MIN_TENSOR
        or n_kv > room // _MIN_KV
        or (n_tensors * _MIN_TENSOR + n_kv * _MIN_KV > room)
    ):
        raise fail(
            f"corrupt or truncated: it claims {n_tensors:,} tensors and {n_kv:,} metadata "
            f"entries, more than its {size:,} bytes can hold"
        )
    fields: dict = {}
    arrays: dict = {}
    for _ in range(n_kv):
        key = string("a metadata key")
        if key is None:
            raise fail("a metadata key longer than 64 KiB")
        found = value(unpack("I"), key)
        if isinstance(found, tuple) and found and found[0] == "array":
            arrays[key] = found[1]
        elif found is not None:
            fields[key] = found
    align = fields.get("general.alignment", 32)
    if not isinstance(align, int) or isinstance(align, bool) or align <= 0 or align & (align - 1):
        raise fail(f"general.alignment is {align!r}; a power of two is expected")
    if n_tensors > (size - pos) // _MIN_TENSOR:
        raise fail(
            f"corrupt or truncated: it claims {n_tensors:,} tensors, more than its {size:,} bytes "
            "can hold"
        )
    infos = []
    seen = set()
    for _ in range(n_tensors):
        name = string("a tensor name")
        if name is None:
            raise fail("a tensor name longer than 64 KiB")
        if name in seen:
            raise fail(f"tensor {name!r} is declared twice")
        seen.add(name)
        n_dims = unpack("I")
        if not 1 <= n_dims <= GGML_MAX_DIMS:
            raise fail(f"tensor {name!r} has {n_dims} dimensions; 1 to {GGML_MAX_DIMS} are read")
        dims = tuple(unpack("Q") for _ in range(n_dims))
        kind, offset = unpack("IQ")
        infos.append((name, dims, kind, offset))
    data_start = -(-pos // align) * align
    tensors = []
    for name, dims, kind, offset in infos:
        try:
            qtype = gguf.GGMLQuantizationType(kind)
            block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise fail(
                f"tensor {name!r} has type {kind}, which is no ggml type known here"
            ) from None
        if any(d < 1 for d in dims):
            raise fail(f"tensor {name!r} has dimensions {list(dims)}; each must be >= 1")
        if math.prod(dims) // block * type_size > size:
            raise fail(
                f"truncated or corrupt: tensor {name!r} ({qtype.name}, dimensions {list(dims)}) "
                f"needs more bytes than the whole file's {size:,}"
            )
        if dims[0] % block:
            raise fail(
                f"tensor {name!r} ({qtype.name}) has rows of {dims[0]} elements, not a multiple "
                f"of its block of {block}"
            )
        n_bytes = math.prod(dims) // block * type_size
        if offset % align:
            raise fail(f"tensor {name!r} starts at offset {offset:,}, not a multiple of {align}")
        end = data_start + offset + n_bytes
        if end > size:
            raise fail(
                f"truncated: tensor {name!r} ends at byte {end:,}, past the file's {size:,} bytes"
            )
        tensors.append(GGUFTensorInfo(name, kind, qtype.name, dims, offset, n_bytes))
    at = 0
    for t in sorted(tensors, key=lambda t: t.offset):
        if t.offset < at:
            raise fail(f"tensor {t.name!r} overlaps the tensor before it in the data")
        at = t.offset + t.n_bytes
    return GGUFHeader(path, version, fields, arrays, tensors, data_start, size)


# transformers' names for llama.cpp's architectures where the two differ
_ARCH_ALIASES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss"}
_ARCH_ALIASES |= {"minimax-m2": "minimax_m2", "t5encoder": "t5"}


def gguf_architectures() -> list[str]:
    """The GGUF architectures the installed transformers loads."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer")]


def check_gguf_architecture(header: GGUFHeader) -> str:
    """The file's ``general.architecture`` if the installed transformers loads it;
    :class:`WeightFileError` naming it and the supported ones otherwise."""
    arch = header.architecture
    if not isinstance(arch, str) or not arch:
        raise WeightFileError(header.path, "it has no general.architecture field")
    supported = gguf_architectures()
    if arch not in supported and _ARCH_ALIASES.get(arch, arch.replace("-", "_")) not in supported:
        raise WeightFileError(
            header.path,
            f"GGUF architecture {arch!r} is not supported; supported: {', '.join(supported)}",
        )
    return arch


def check_shapes(directory: str | Path, config, model_shapes: dict[str, tuple[int, ...]]) -> None:
    """Every tensor of the directory's safetensors files against the shape the model built from
    ``config.json`` gives it (``model_shapes``: parameter name -> shape). A file's tensor names
    may carry a prefix the model lacks (``bert.``) or lack one it has; names the model does not
    have are left to the loader. :class:`WeightFileError` naming the file, the tensor and both
    shapes otherwise."""
    directory = Path(directory)
    model_type = getattr(config, "model_type", "the model")
    for file in sorted(directory.glob("*.safetensors")):
        for name, t in read_safetensors_header(file).items():
            key = _model_key(name, model_shapes)
            if key is None:
                continue
            want = tuple(model_shapes[key])
            if want != t.shape:
                raise WeightFileError(
                    file,
                    f"tensor {name!r} has shape {list(t.shape)}, but config.json makes "
                    f"{model_type}'s {key} {list(want)}",
                )


def _model_key(name: str, model_shapes: dict) -> str | None:
    """The model's parameter that the file's tensor ``name`` loads into: the same name, the name
    without leading parts (a ``bert.`` prefix on a bare encoder's file), or the one model name
    that ends with it (a file without the model's prefix); None if none or several."""
    parts = name.split(".")
    for i in range(len(parts)):
        if ".".join(parts[i:]) in model_shapes:
            return ".".join(parts[i:])
    hits = [k for k in model_shapes if k.endswith("." + name)]
    return hits[0] if len(hits) == 1 else None
