"""The version of specval, in a module of its own below every other: the package exports it as
`specval.__version__`, and the modules that record it (the manifest's code facts, the signed
statement) import it from here rather than from the package, whose `__init__` names the public API.
"""

__version__ = "0.1.0"
