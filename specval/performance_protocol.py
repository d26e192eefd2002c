"""Compatibility re-export: the code of `specval.performance_protocol` lives in `specval.performance.protocol` now."""

from specval.performance.protocol import *  # noqa: F401,F403
