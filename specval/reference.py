"""Compatibility re-export: the code of `specval.reference` lives in `specval.distribution.reference` now."""

from specval.distribution.reference import *  # noqa: F401,F403
