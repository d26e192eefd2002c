"""Readers: typed values of a protocol mapping, each failing with a ProtocolError that names the
file, the key, the value and (where one is close) a suggestion.

Every protocol kind (distribution, quality, performance) parses its YAML with these; they are the
one place where a protocol's error messages are worded. Guarantee: a reader returns the value in
the type it names or raises ProtocolError; it never coerces (an integer is not a bool, a string
is not a number).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Mapping
from typing import Any, NoReturn

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")
# Every integer of a protocol (sizes, counts, seeds) fits in the 32-bit seed space; a larger one is
# a typo or an attack, and would overflow the int64 arithmetic of seed ranges and sample tables.
MAX_INT = 2**32


class ProtocolError(ValueError):
    """Bad protocol input: the message names the file, the key, the value and a suggestion."""


def fail(file: str, key: str, message: str, value: Any = None, suggestion: str | None = None) -> NoReturn:
    """Raise ProtocolError "FILE: KEY: MESSAGE (got VALUE); did you mean SUGGESTION?"."""
    text = f"{file}: {key}: {message}"
    if value is not None:
        text += f" (got {value!r})"
    if suggestion:
        text += f"; did you mean {suggestion!r}?"
    raise ProtocolError(text)


def check_keys(raw: Mapping[Any, Any], cls: type, file: str, where: str) -> None:
    """Refuse keys of `raw` (at `where`) that are not fields of the dataclass `cls` (naming the
    closest field) and required fields that are missing."""
    names = [f.name for f in dataclasses.fields(cls) if f.name not in ("profile", "file_hash")]
    for key in raw:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            fail(file, _join(where, key), "unknown key", suggestion=close[0] if close else None)
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and f.name not in raw:
            fail(file, _join(where, f.name), "missing required key")


def _join(where: str, key: Any) -> str:
    return f"{where}.{key}" if where else str(key)


def read_mapping(raw: Any, file: str, where: str) -> Mapping[Any, Any]:
    """`raw` if it is a mapping."""
    if not isinstance(raw, Mapping):
        fail(file, where or "<top level>", "expected a mapping", raw)
    return raw


def read_int(value: Any, file: str, key: str, minimum: int | None = None, maximum: int = MAX_INT) -> int:
    """`value` if it is an integer (not a bool) in [`minimum`, `maximum`]."""
    if isinstance(value, bool) or not isinstance(value, int):
        fail(file, key, "expected an integer", value)
    if minimum is not None and value < minimum:
        fail(file, key, f"must be >= {minimum}", value)
    if value > maximum:
        fail(file, key, f"must be <= {maximum}", value)
    return value


def read_float(value: Any, file: str, key: str) -> float:
    """`value` as a float if it is a finite number (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(file, key, "expected a number", value)
    if not math.isfinite(value):
        fail(file, key, "expected a finite number", value)
    return float(value)


def read_str(value: Any, file: str, key: str, choices: tuple[str, ...] | None = None) -> str:
    """`value` if it is a non-empty string (one of `choices`, when given)."""
    if not isinstance(value, str) or not value:
        fail(file, key, "expected a non-empty string", value)
    if choices is not None and value not in choices:
        close = difflib.get_close_matches(value, choices, n=1)
        fail(file, key, f"must be one of {list(choices)}", value, close[0] if close else None)
    return value


def read_name(value: Any, file: str, key: str) -> str:
    """`value` if it is a name: [a-z][a-z0-9_]*."""
    name = read_str(value, file, key)
    if not NAME_PATTERN.match(name):
        fail(file, key, "must match [a-z][a-z0-9_]*", value)
    return name


def read_unit(value: Any, file: str, key: str, upper_closed: bool = False) -> float:
    """`value` if it is a number in (0, 1), or (0, 1] when `upper_closed`."""
    number = read_float(value, file, key)
    ok = 0.0 < number < 1.0 or (upper_closed and number == 1.0)
    if not ok:
        fail(file, key, "must lie in (0, 1]" if upper_closed else "must lie in (0, 1)", value)
    return number


def read_bounded(value: Any, file: str, key: str, low: float, high: float, why: str) -> float:
    """`value` if it is a finite number in [`low`, `high`]; `why` says what the bounds protect."""
    number = read_float(value, file, key)
    if not low <= number <= high:
        fail(file, key, f"must lie in [{low:g}, {high:g}] ({why})", value)
    return number


def read_bool(value: Any, file: str, key: str) -> bool:
    """`value` if it is true or false."""
    if not isinstance(value, bool):
        fail(file, key, "expected true or false", value)
    return value


def read_draft_loops(raw: Mapping[Any, Any], file: str, where: str) -> int | None:
    """`where.draft_loops` of a group or an arm: absent (the engine's default) or an integer >= 1."""
    value = raw.get("draft_loops")
    return None if value is None else read_int(value, file, f"{where}.draft_loops", minimum=1)
