"""Checks of user-facing arguments (sizes, counts, choices) shared by the library's configs and the
``rmsnorm`` command, and the error they raise: an :class:`ArgumentError` that names the argument, so
a caller that spells it differently (the command line's ``--options``) can say it its own way."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from typing import TypeVar

__all__ = [
    "ArgumentError",
    "positive_int",
    "non_negative_int",
    "positive_number",
    "finite_number",
    "one_of",
    "divisible",
]

T = TypeVar("T")


class _Spelled(dict):
    """``str.format_map`` mapping: every field is an argument name, spelled by ``spell``."""

    def __init__(self, spell: Callable[[str], str]) -> None:
        super().__init__()
        self._spell = spell

    def __missing__(self, name: str) -> str:
        return self._spell(name)


def _escaped(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


class ArgumentError(ValueError):
    """A bad argument: ``param`` names it, ``detail`` says what was expected and what came.

    The message is ``template`` with each ``{name}`` field the name of an argument (by default
    ``"{param}: detail"``); ``str(exc)`` spells the names as the library does, ``exc.render(spell)``
    as a caller does: ``render(lambda name: "--" + name.replace("_", "-"))`` for a command line.
    """

    def __init__(self, param: str, detail: str, *, template: str | None = None) -> None:
        self.param = param
        self.detail = detail
        self.template = "{" + param + "}: " + _escaped(detail) if template is None else template
        super().__init__(self.render())

    def render(self, spell: Callable[[str], str] = str) -> str:
        """The message with every argument name replaced by ``spell(name)``."""
        return self.template.format_map(_Spelled(spell))


def _fail(name: str, detail: str) -> ArgumentError:
    return ArgumentError(name, detail, template="{" + name + "} " + _escaped(detail))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(name: str, value: object) -> int:
    """``value`` if it is an int >= 1 (a bool is not), else :class:`ArgumentError`."""
    if not _is_int(value) or value < 1:
        raise _fail(name, f"must be a positive integer, got {value!r}")
    return value


def non_negative_int(name: str, value: object) -> int:
    """``value`` if it is an int >= 0 (a bool is not), else :class:`ArgumentError`."""
    if not _is_int(value) or value < 0:
        raise _fail(name, f"must be an integer >= 0, got {value!r}")
    return value


def _real(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def finite_number(name: str, value: object) -> float:
    """``value`` as a float if it is a finite real number, else :class:`ArgumentError`."""
    real = _real(value)
    if real is None or not math.isfinite(real):
        raise _fail(name, f"must be a finite number, got {value!r}")
    return real


def positive_number(name: str, value: object) -> float:
    """``value`` as a float if it is a finite real number > 0, else :class:`ArgumentError`."""
    real = _real(value)
    if real is None or not (0 < real < math.inf):
        raise _fail(name, f"must be a number > 0, got {value!r}")
    return real


def one_of(name: str, value: T, choices: Collection[T]) -> T:
    """``value`` if it is one of ``choices``, else :class:`ArgumentError` listing them."""
    if value not in choices:
        raise _fail(name, f"must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def divisible(name: str, value: int, by: str, by_value: int) -> None:
    """:class:`ArgumentError` on ``name`` unless ``value`` is a multiple of the argument ``by``."""
    if value % by_value:
        detail = f"({value}) must be divisible by {by} ({by_value})"
        template = "{" + name + "} " + f"({value}) must be divisible by " + "{" + by + "}"
        raise ArgumentError(name, detail, template=template + f" ({by_value})")
