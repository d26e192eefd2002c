"""Compatibility re-export: the code of `specval.mutate` lives in `specval.distribution.mutate` now."""

from specval.distribution.mutate import *  # noqa: F401,F403
