"""Quality runs: paired quality protocols (`kind: quality`), scored per item, compared by exact McNemar.

protocol  the schema (`QualityProtocol`, `load_quality_protocol`)
runner    the run: items -> completions per group -> scores -> paired comparisons -> bundle
report    report.md / report.html of a quality bundle
"""
