"""Compatibility re-export: the code of `specval.sharding` lives in `specval.distribution.sharding` now."""

from specval.distribution.sharding import *  # noqa: F401,F403
