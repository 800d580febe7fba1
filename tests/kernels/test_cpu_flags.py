"""The CPU kernels' flag layouts (``rmsnorm.kernels.cpu.flags``): the launchers build a flags word
by field name, an unknown name or a value that does not fit its field is refused, and every field
comes back as the kernels decode it (``rows.field`` with the layout's ``(shift, width)``)."""

from __future__ import annotations

import pytest

from rmsnorm.kernels.cpu import flags as flag

LAYOUTS = {"forward": flag.FORWARD, "backward": flag.BACKWARD, "gated": flag.GATED}


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_an_unknown_field_name_is_refused(layout):
    with pytest.raises(TypeError, match=r"no field 'has_bias'; fields: .*\bx\b"):
        layout.pack(has_bias=1)
    # a name of another layout is unknown here too: ``res`` was never a field of the forward
    with pytest.raises(TypeError, match="'res'"):
        layout.pack(res=True)


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_a_value_that_does_not_fit_its_field_is_refused(layout):
    for name, (_, width) in layout.fields.items():
        with pytest.raises(ValueError, match=f"{name}={1 << width}"):
            layout.pack(**{name: 1 << width})
        with pytest.raises(ValueError, match=f"{name}=-1"):
            layout.pack(**{name: -1})


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_each_field_round_trips(layout):
    pytest.importorskip("numba")
    from rmsnorm.kernels.cpu import rows

    decode = rows.field.py_func  # the kernels' decoding, run as Python
    for name, (shift, width) in layout.fields.items():
        for value in sorted({0, 1, (1 << width) - 1, 1 << (width - 1)}):
            word = layout.pack(**{name: value})
            assert layout.unpack(word) == {n: value if n == name else 0 for n in layout.fields}
            assert decode(word, (shift, width)) == value
    # all fields at once: each keeps its own value
    values = {n: (i * 5 + 1) % (1 << w) for i, (n, (_, w)) in enumerate(layout.fields.items())}
    word = layout.pack(**values)
    assert layout.unpack(word) == values
    assert all(decode(word, layout.fields[n]) == v for n, v in values.items())
    assert word < 1 << 63  # an int64 argument


def test_bools_pack_as_one_and_zero():
    assert flag.FORWARD.pack(has_res=True, has_b=False) == flag.FORWARD.pack(has_res=1)


def test_every_field_constant_the_kernels_decode_is_a_named_field():
    """The (shift, width) constants of the module (FX, BDY, GX, ...: what the kernels pass to
    ``rows.field``) are exactly the fields of the three layouts, each under one name."""
    constants = {
        name: value
        for name, value in vars(flag).items()
        if name[:1] in "FBG" and isinstance(value, tuple) and len(value) == 2
    }
    prefix = {"F": flag.FORWARD, "B": flag.BACKWARD, "G": flag.GATED}
    for name, value in constants.items():
        fields = prefix[name[0]].fields
        assert list(fields.values()).count(value) == 1, name
    named = sum(len(layout.fields) for layout in LAYOUTS.values())
    assert len(constants) == named - 1  # every field but "gated", which no kernel reads


def test_the_gated_bit_is_above_every_bit_of_the_plain_layouts():
    gated = flag.GATED.pack(gated=1)
    assert gated > flag.FORWARD.bits and gated > flag.BACKWARD.bits


def test_overlapping_fields_are_refused():
    with pytest.raises(ValueError, match="b="):
        flag.Layout("test", a=(0, 2), b=(1, 1))
    with pytest.raises(ValueError, match="a="):
        flag.Layout("test", a=(62, 2))
