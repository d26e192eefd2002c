"""specval: pre-registered statistical conformance tests for speculative-decoding samplers.

The public Python API (semver'd, CHANGELOG.md; docs/harness.md section 12) is importable from here:
`specval.run`, `specval.resume`, `specval.verify`, `specval.Result`, `specval.Criterion`,
`specval.Verification` and the exceptions a run raises. They live in `specval.api`, imported on first
use, so that `import specval` stays cheap. `__version__` lives in `specval.version`, below every
module: a module that records the version imports it from there, not from this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from specval.version import __version__

API_MODULE = "specval.api"
_API_NAMES = (
    "BundleError",
    "Criterion",
    "ENVIRONMENT_ERRORS",
    "EnvironmentFailed",
    "INPUT_ERRORS",
    "LedgerError",
    "ProtocolError",
    "Result",
    "RunFailed",
    "RunInterrupted",
    "SUTError",
    "SUTRaised",
    "SeedOverlapError",
    "Verification",
    "WorkerDied",
    "resume",
    "run",
    "verify",
)
__all__ = ["__version__", *_API_NAMES]

if TYPE_CHECKING:  # for type checkers and editors; at run time the names load lazily below
    from specval.api import (  # noqa: F401
        ENVIRONMENT_ERRORS,
        INPUT_ERRORS,
        BundleError,
        Criterion,
        EnvironmentFailed,
        LedgerError,
        ProtocolError,
        Result,
        RunFailed,
        RunInterrupted,
        SeedOverlapError,
        SUTError,
        SUTRaised,
        Verification,
        WorkerDied,
        resume,
        run,
        verify,
    )


def __getattr__(name: str) -> Any:
    """The public API names, imported from `specval.api` on first use (PEP 562)."""
    if name in _API_NAMES:
        return getattr(importlib.import_module(API_MODULE), name)
    raise AttributeError(f"module 'specval' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API_NAMES))
