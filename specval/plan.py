"""Compatibility re-export: the code of `specval.plan` lives in `specval.distribution.plan` now."""

from specval.distribution.plan import *  # noqa: F401,F403
