"""Checks: validation of the numpy inputs of the statistics functions.

Bad input raises ValueError naming the field and the bad value, never a numpy error from deep inside.
"""

from __future__ import annotations

import math

import numpy as np


def as_counts(name: str, values: object) -> np.ndarray:
    """A 1-D int64 array of non-negative integer counts, or ValueError naming `name`."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    if array.dtype == np.bool_ or not (
        np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)
    ):
        raise ValueError(f"{name} must hold integer counts, got dtype {array.dtype}")
    if array.size and not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite, got {array[~np.isfinite(array)][:3]}")
    if np.any(array < 0):
        raise ValueError(f"{name} must be non-negative, got {array[array < 0][:3]}")
    if np.any(array != np.round(array)):
        raise ValueError(f"{name} must hold integers, got {array[array != np.round(array)][:3]}")
    return array.astype(np.int64)


def as_weights(name: str, values: object) -> np.ndarray:
    """A 1-D float64 array of finite non-negative weights with a positive total."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"{name} must be numeric, got dtype {array.dtype}")
    array = array.astype(np.float64)
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite, got {array[~np.isfinite(array)][:3]}")
    if np.any(array < 0):
        raise ValueError(f"{name} must be non-negative, got {array[array < 0][:3]}")
    if not array.sum() > 0:
        raise ValueError(f"{name} must have a positive total, got {array.sum()}")
    return array


def same_length(name_a: str, a: np.ndarray, name_b: str, b: np.ndarray) -> None:
    """ValueError unless two 1-D arrays have the same length."""
    if a.shape != b.shape:
        raise ValueError(f"{name_a} and {name_b} must have the same shape, got {a.shape} and {b.shape}")


def probability(name: str, value: float, *, allow_zero: bool = False, allow_one: bool = False) -> float:
    """A float in (0, 1) (endpoints optionally allowed), or ValueError naming `name`."""
    number = float(value)
    low_ok = number > 0 or (allow_zero and number == 0)
    high_ok = number < 1 or (allow_one and number == 1)
    if math.isnan(number) or not (low_ok and high_ok):
        interval = ("[" if allow_zero else "(") + "0, 1" + ("]" if allow_one else ")")
        raise ValueError(f"{name} must be a probability in {interval}, got {value!r}")
    return number


def non_negative(name: str, value: float) -> float:
    """A finite float >= 0, or ValueError naming `name`."""
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return number


def count(name: str, value: int, *, minimum: int = 0) -> int:
    """An integer >= minimum (bools refused), or ValueError naming `name`."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)
