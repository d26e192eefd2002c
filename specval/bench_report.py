"""Compatibility re-export: the code of `specval.bench_report` lives in `specval.performance.report` now."""

from specval.performance.report import *  # noqa: F401,F403
