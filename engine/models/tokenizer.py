"""Byte-level tokenizer: token id = UTF-8 byte value, so the vocabulary is 256 ids."""

from __future__ import annotations

BYTE_VOCAB_SIZE = 256


class ByteTokenizer:
    """encode: UTF-8 bytes of the text; decode: the bytes back, invalid sequences replaced."""

    vocab_size = BYTE_VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"text={text!r} is invalid: expected a str")
        return list(text.encode("utf-8"))

    def decode(self, token_ids: list[int]) -> str:
        bad = [t for t in token_ids if not 0 <= t < BYTE_VOCAB_SIZE]
        if bad:
            raise ValueError(f"token_ids contains ids outside [0, {BYTE_VOCAB_SIZE}): {bad[:5]}")
        return bytes(token_ids).decode("utf-8", errors="replace")
