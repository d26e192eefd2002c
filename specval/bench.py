"""Compatibility re-export: the code of `specval.bench` lives in `specval.performance.bench` now."""

from specval.performance.bench import *  # noqa: F401,F403
