"""Per-request sampling parameters of the engine.

`SamplingParams` is the one place where a request's sampling settings are checked. Every
value that reaches the sampling kernels has passed through its validation, so the kernels
never check per-row values themselves (they could not without reading the device).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

TOP_K_DISABLED = -1  # top_k of -1 (or 0) keeps every token
TOP_P_DISABLED = 1.0  # top_p of 1 keeps every token
GREEDY_TEMPERATURE = 0.0  # temperature 0 selects the argmax of the raw logits


def _reject(field: str, value: object, rule: str) -> ValueError:
    return ValueError(f"SamplingParams.{field}={value!r} is invalid: {rule}")


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples its tokens.

    Guarantees after construction (a violation raises ValueError naming the field and value):
    - temperature is a finite real >= 0; 0 means greedy (argmax of the raw logits).
    - top_k is an int >= -1; -1 and 0 both disable top-k.
    - top_p is a real in (0, 1]; 1 disables top-p.
    - seed is None or an int in [0, 2**63); None lets the engine pick one.
    - max_tokens is an int >= 1; stop_token_ids is a tuple of ints >= 0.
    """

    temperature: float = 1.0
    top_k: int = TOP_K_DISABLED
    top_p: float = TOP_P_DISABLED
    seed: int | None = None
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        self._check_temperature()
        self._check_top_k()
        self._check_top_p()
        self._check_seed()
        self._check_max_tokens()
        self._check_stop_token_ids()
        if not isinstance(self.ignore_eos, bool):
            raise _reject("ignore_eos", self.ignore_eos, "must be a bool")

    @property
    def is_greedy(self) -> bool:
        """True when the request takes the argmax and owns no random stream."""
        return self.temperature == GREEDY_TEMPERATURE

    def _check_temperature(self) -> None:
        t = self.temperature
        if not _is_real(t) or math.isnan(t) or math.isinf(t) or t < 0:
            raise _reject("temperature", t, "must be a finite number >= 0 (0 means greedy)")

    def _check_top_k(self) -> None:
        k = self.top_k
        if not _is_int(k) or k < TOP_K_DISABLED:
            raise _reject("top_k", k, "must be an int >= 1, or -1 / 0 to disable top-k")

    def _check_top_p(self) -> None:
        p = self.top_p
        if not _is_real(p) or math.isnan(p) or not 0.0 < p <= 1.0:
            raise _reject("top_p", p, "must be a number in (0, 1]; 1 disables top-p")

    def _check_seed(self) -> None:
        s = self.seed
        if s is not None and (not _is_int(s) or not 0 <= s < 2**63):
            raise _reject("seed", s, "must be None or an int in [0, 2**63)")

    def _check_max_tokens(self) -> None:
        m = self.max_tokens
        if not _is_int(m) or m < 1:
            raise _reject("max_tokens", m, "must be an int >= 1")

    def _check_stop_token_ids(self) -> None:
        ids = self.stop_token_ids
        if not isinstance(ids, tuple) or not all(_is_int(i) and i >= 0 for i in ids):
            raise _reject("stop_token_ids", ids, "must be a tuple of ints >= 0")
