"""The codes and the bit fields of the CPU kernels' ``flags`` argument, shared by the launchers
(which build a flags word with a layout's :meth:`Layout.pack`, by field name) and the kernels
(which decode it with :func:`.rows.field` and the ``(shift, width)`` constants below).

A kernel takes its dtypes and options as one int64 of bit fields, so that each entry point has
exactly one compiled specialisation whatever the dtypes and options of a call; the launchers build
the word once per combination (their plans).
"""

from __future__ import annotations

# dtype codes; F64 only for weights and biases and their gradients (and a float32 input's gate)
F32, BF16, F16, F64 = 0, 1, 2, 3
# what a row is normalized by
RMS_NORM, LAYER_NORM = 0, 1
# where ε goes in RMSNorm: 1/√(ms + ε), or 1/(√ms + ε)
MEAN_SQUARE, RMS = 0, 1
# casting modes, as the grouped and gated kernels take them (docs/spec.md, "Casting modes"); the
# plain kernels take the dtype each step rounds to instead
GEMMA, LLAMA, NONE = 0, 1, 2
CASTING_MODES = {"gemma": GEMMA, "llama": LLAMA, "none": NONE}


class Layout:
    """The named bit fields of one kernel's flags word, ``name=(shift, width)``; fields may not
    overlap, and stay within bits 0–62 (the word is an int64)."""

    def __init__(self, kernel: str, **fields: tuple[int, int]) -> None:
        self.kernel = kernel
        self.fields = fields
        taken = 0
        for name, (shift, width) in fields.items():
            bits = ((1 << width) - 1) << shift
            if width < 1 or shift < 0 or shift + width > 63 or bits & taken:
                raise ValueError(
                    f"{kernel} flags: field {name}={(shift, width)} overlaps another or leaves "
                    "bits 0-62"
                )
            taken |= bits
        self.bits = taken  # every bit some field uses

    def pack(self, **values: int) -> int:
        """The flags word with each named field set to its value (a bool is 0 or 1; fields not
        named are 0). An unknown name raises TypeError, a value that does not fit its field
        ValueError."""
        out = 0
        for name, value in values.items():
            try:
                shift, width = self.fields[name]
            except KeyError:
                raise TypeError(
                    f"{self.kernel} flags have no field {name!r}; fields: {', '.join(self.fields)}"
                ) from None
            value = int(value)
            if not 0 <= value < 1 << width:
                raise ValueError(
                    f"{self.kernel} flag {name}={value} does not fit in its {width} bit(s)"
                )
            out |= value << shift
        return out

    def unpack(self, flags: int) -> dict[str, int]:
        """{name: value} of every field of a flags word (what the kernels decode)."""
        return {name: (flags >> s) & ((1 << w) - 1) for name, (s, w) in self.fields.items()}


# The plain forward's fields (kernels.forward): the dtypes of x, the residual and y; whether there
# is a residual; the norm; the ε form; the dtypes the casting mode rounds each step to (the input
# before the product, r, x·r, the result); the weight's and bias's dtypes and presence and the
# dtype they are rounded to; whether y (and h) are written with non-temporal stores
# (runtime.stream_rule).
FX, FR, FY, FHAS_RES, FNORM, FEPS = (0, 2), (2, 2), (4, 2), (6, 1), (7, 1), (8, 1)
FC_PRE, FC_R, FC_MUL, FC_OUT = (9, 2), (11, 2), (13, 2), (15, 2)
FW, FHAS_W, FB, FHAS_B, FC_PARAM = (17, 2), (19, 1), (20, 2), (22, 1), (23, 2)
FSTREAM = (25, 1)
FORWARD = Layout(
    "forward", x=FX, r=FR, y=FY, has_res=FHAS_RES, norm=FNORM, eps=FEPS,
    c_pre=FC_PRE, c_r=FC_R, c_mul=FC_MUL, c_out=FC_OUT,
    w=FW, has_w=FHAS_W, b=FB, has_b=FHAS_B, c_param=FC_PARAM, stream=FSTREAM,
)  # fmt: skip

# The plain backward's (kernels.backward): the dtypes of dy, x and the residual's gradient; its
# presence; the norm; the ε form; the dtype x̂ is rounded to for d weight ("llama"); the weight's
# dtype and presence; whether d weight / d bias are wanted and their dtypes; dx streamed out.
BDY, BX, BDR, BHAS_DR, BNORM, BEPS = (0, 2), (2, 2), (4, 2), (6, 1), (7, 1), (8, 1)
BC_XHAT, BW, BHAS_W, BNEED_DW, BDW, BNEED_DB, BDB = (
    (9, 2), (11, 2), (13, 1), (14, 1), (15, 2), (17, 1), (18, 2),
)  # fmt: skip
BSTREAM = (20, 1)
BACKWARD = Layout(
    "backward", dy=BDY, x=BX, dr=BDR, has_dr=BHAS_DR, norm=BNORM, eps=BEPS, c_xhat=BC_XHAT,
    w=BW, has_w=BHAS_W, need_dw=BNEED_DW, dw=BDW, need_db=BNEED_DB, db=BDB, stream=BSTREAM,
)  # fmt: skip

# The grouped and gated kernels' (gated.forward and gated.backward share one layout): the dtypes
# of x, the gate and y; the input dtype the casting mode rounds to and the norm's output dtype;
# the casting mode; the gate's presence, its order (first: the gate before the norm) and
# activation; the ε form; the parameters' presence, dtypes and the dtype they are rounded to; the
# backward's dy, residual gradient and d gate dtypes and which parameter gradients are wanted;
# the forward's fused loops (1 + gated.out_variant, 1 + gated.in_variant; 0: none) and whether the
# output loop reads the raw gate.
GX, GZ, GY, GIN, GOUT, GCAST = (0, 2), (2, 2), (4, 2), (6, 2), (8, 2), (10, 2)
GHAS_GATE, GFIRST, GSIGMOID, GEPS = (12, 1), (13, 1), (14, 1), (15, 1)
GHAS_W, GHAS_B = (16, 1), (17, 1)
GW, GB, GPARAM = (18, 2), (20, 2), (22, 2)
GDY, GDR, GHAS_DR, GNEED_DW, GNEED_DB, GDZ = (24, 2), (26, 2), (28, 1), (29, 1), (30, 1), (31, 2)
GOUTV, GINV, GRAW = (33, 6), (39, 4), (43, 1)
# ("gated", bit 45: set in every word of these kernels, above every bit of the plain layouts, so
# that no gated flags word equals a plain one; no kernel reads it)
GATED = Layout(
    "gated", x=GX, z=GZ, y=GY, c_in=GIN, c_out=GOUT, cast=GCAST,
    has_gate=GHAS_GATE, first=GFIRST, sigmoid=GSIGMOID, eps=GEPS,
    has_w=GHAS_W, has_b=GHAS_B, w=GW, b=GB, c_param=GPARAM,
    dy=GDY, dr=GDR, has_dr=GHAS_DR, need_dw=GNEED_DW, need_db=GNEED_DB, dz=GDZ,
    out_variant=GOUTV, in_variant=GINV, raw=GRAW, gated=(45, 1),
)  # fmt: skip
