"""Compatibility re-export: the code of `specval.quality_protocol` lives in `specval.quality.protocol` now."""

from specval.quality.protocol import *  # noqa: F401,F403
