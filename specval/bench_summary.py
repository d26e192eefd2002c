"""Compatibility re-export: the code of `specval.bench_summary` lives in `specval.performance.summary` now."""

from specval.performance.summary import *  # noqa: F401,F403
