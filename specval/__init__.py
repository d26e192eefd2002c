"""specval: pre-registered statistical conformance tests for speculative-decoding samplers."""

__version__ = "0.1.0"
