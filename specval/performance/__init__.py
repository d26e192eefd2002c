"""Performance runs: a protocol of `kind: performance` times two engine configurations in ABBA order.

protocol  the schema (`PerformanceProtocol`, `load_performance_protocol`)
bench     the run: engines (through specval.adapters.engine) -> timed pairs -> bundle
summary   ratios, median and its exact interval, the verdict
report    report.md / report.html of a performance bundle
"""
