"""Result: the common base of every statistics result, and its JSON-safe conversion.

Every result type in `specval.stats` is a frozen dataclass that derives from `StatResult`, so the
verdict, report and bundle layers can serialise any of them with `result.to_dict()`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np


def to_plain(value: Any) -> Any:
    """Convert numpy scalars/arrays, tuples and mappings into JSON-safe Python types.

    Guarantee: the output contains only dict (str keys), list, str, int, float, bool and None.
    Non-finite floats (inf, nan) become None, because strict JSON has no representation for them.
    """
    if isinstance(value, StatResult):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {str(key): to_plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(item) for item in value]
    if isinstance(value, np.ndarray):
        return [to_plain(item) for item in value.tolist()]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        number = float(value)
        return number if math.isfinite(number) else None
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"cannot convert {type(value).__name__} to a JSON-safe value")


class StatResult:
    """Mixin for frozen result dataclasses: `to_dict()` gives JSON-safe plain types.

    Fields listed in the class attribute `_UNSERIALISED` (large per-token arrays) are left out.
    """

    _UNSERIALISED: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """All fields except `_UNSERIALISED` ones, converted with `to_plain`."""
        return {
            field.name: to_plain(getattr(self, field.name))
            for field in dataclasses.fields(self)  # type: ignore[arg-type]
            if field.name not in self._UNSERIALISED
        }
