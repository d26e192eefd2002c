"""Quality runs: paired quality protocols (`kind: quality`), scored per item, compared by exact McNemar.

    protocol  the schema (`QualityProtocol`, `load_quality_protocol`)
    runner    the run: items -> completions per group -> scores -> paired comparisons -> bundle
    report    report.md / report.html of a quality bundle

The names of the former module `specval.quality` (`run`, `verify`, `finish`, ...) are
compatibility re-exports of `specval.quality.runner`, loaded by name on first use.
"""

import importlib

RUNNER = "specval.quality.runner"


def __getattr__(name: str):
    """A public name of `specval.quality.runner` by its former path `specval.quality.<name>`."""
    if not name.startswith("_"):
        runner = importlib.import_module(RUNNER)
        if hasattr(runner, name):
            return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
