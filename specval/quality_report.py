"""Compatibility re-export: the code of `specval.quality_report` lives in `specval.quality.report` now."""

from specval.quality.report import *  # noqa: F401,F403
