"""Compatibility re-export: the code of `specval.calibrate` lives in `specval.distribution.calibrate` now."""

from specval.distribution.calibrate import *  # noqa: F401,F403
