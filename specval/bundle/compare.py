"""The comparison of a stored JSON value with its recomputation (`diff`), as verify makes it.

Guarantee: verdicts, reasons, counts and every other non-float compare exactly; floats agree
within FLOAT_RTOL (FLOAT_ATOL near 0), so a bundle made on one machine verifies on another, and a
deliberate edit of a statistic is far outside that. It reads no bundle.
"""

from __future__ import annotations

import json
import math
from typing import Any

FLOAT_RTOL = 1e-9  # relative agreement of a recomputed float (rounding of another machine)
FLOAT_ATOL = 1e-12  # absolute agreement near 0 (p-values far below any alpha)


def diff(stored: Any, recomputed: Any, path: str = "") -> list[str]:
    """Paths where two JSON values differ, with both values.

    Verdicts, reasons, counts and every other non-float are compared exactly. Two floats agree
    when they are within a relative FLOAT_RTOL (or FLOAT_ATOL near 0): a chi-square summed in
    another order (another numpy or BLAS build, another machine) moves the last bits, and a
    bundle made on a GPU machine must verify anywhere. A deliberate edit of a statistic is far
    outside that."""
    if isinstance(stored, dict) and isinstance(recomputed, dict):
        out = []
        for key in sorted(set(stored) | set(recomputed), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in stored or key not in recomputed:
                out.append(f"{sub}: {'missing in stored' if key not in stored else 'not recomputed'}")
            else:
                out.extend(diff(stored[key], recomputed[key], sub))
        return out
    if isinstance(stored, list) and isinstance(recomputed, list) and len(stored) == len(recomputed):
        return [d for i, (a, b) in enumerate(zip(stored, recomputed)) for d in diff(a, b, f"{path}[{i}]")]
    if isinstance(stored, float) and isinstance(recomputed, float):
        same = math.isclose(stored, recomputed, rel_tol=FLOAT_RTOL, abs_tol=FLOAT_ATOL) or (
            math.isnan(stored) and math.isnan(recomputed)
        )
    else:
        same = stored == recomputed and type(stored) is type(recomputed)
    return [] if same else [f"{path}: stored {_short(stored)}, recomputed {_short(recomputed)}"]


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."
