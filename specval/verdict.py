"""Compatibility re-export: the code of `specval.verdict` lives in `specval.distribution.verdict` now."""

from specval.distribution.verdict import *  # noqa: F401,F403
