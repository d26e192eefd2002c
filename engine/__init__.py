"""engine: a small but complete speculative-decoding engine, the system under test of specval.

The engine never imports specval.
"""
