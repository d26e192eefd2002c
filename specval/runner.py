"""Compatibility re-export: the code of `specval.runner` lives in `specval.distribution.runner` now."""

from specval.distribution.runner import *  # noqa: F401,F403
from specval.lifecycle import claim_bundle, run_timing, write_manifest  # noqa: F401
