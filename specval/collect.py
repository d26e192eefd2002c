"""Compatibility re-export: the code of `specval.collect` lives in `specval.distribution.collect` now."""

from specval.distribution.collect import *  # noqa: F401,F403
