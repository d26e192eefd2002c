"""Evaluation tasks for quality protocols: item data, prompts and scoring as pure functions.

Tasks never import the engine: prompts are plain strings or chat message lists, and scoring takes
the generated text. `gsm8k` reads the GSM8K test split shipped in a package; `arith` generates a
seeded arithmetic task whose difficulty is tunable.
"""
