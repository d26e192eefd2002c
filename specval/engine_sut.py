"""Compatibility re-export: the code of `specval.engine_sut` lives in `specval.adapters.engine` now."""

from specval.adapters.engine import *  # noqa: F401,F403
