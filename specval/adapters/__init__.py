"""SUT adapters for engines other than this project's own (see `specval.sut`).

Each module imports its engine lazily, so importing `specval.adapters` costs nothing and a missing
engine is reported as a `SUTError` that names the package to install.
"""
