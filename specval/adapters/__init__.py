"""SUT adapters (see `specval.sut`): the only modules of specval that import an engine.

`engine` drives this project's own engine (it imports `engine` when loaded, which `specval.sut`
does by name, only for a protocol that selects it); `transformers` drives Hugging Face
transformers and imports it lazily, so a missing package is reported as a `SUTError` that names
the package to install. Importing `specval.adapters` itself costs nothing.
"""
