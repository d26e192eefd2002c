"""Byte-level BPE tokenizer and chat template read from a GGUF file's `tokenizer.*` metadata.

Supported: `tokenizer.ggml.model == "gpt2"` (GPT-2 style byte-level BPE with a merges list) with
the pre-tokenizers named by `tokenizer.ggml.pre` in `PRE_TOKENIZERS`. Encoding, in order:

1. control and user-defined tokens (token types 3 and 4, e.g. `<|im_start|>`) are cut out of the
   text whole, leftmost-longest, when `allow_special` is true;
2. the pre-tokenizer splits each remaining span: for "smollm" every numeric character (Unicode
   categories Nd, Nl, No) is its own piece, then GPT-2's regex
   `'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+` splits the rest;
3. each piece is UTF-8 encoded, its bytes spelled with GPT-2's printable byte alphabet, and merged
   by BPE in merge-rank order (lowest rank first, all occurrences of a pair at once).

The regex needs Unicode property classes that Python's `re` lacks; they are built exactly from
`unicodedata` categories (L*, N*) and the Unicode White_Space set, so no third-party regex engine
is needed. Decoding inverts the byte alphabet and decodes UTF-8 with replacement characters.

The chat template (`tokenizer.chat_template`, a Jinja2 string) is rendered with jinja2's sandboxed
environment using trim_blocks / lstrip_blocks, the settings the template authors target.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
SPECIAL_TOKEN_TYPES = (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)
PRE_TOKENIZERS = ("smollm", "gpt2")  # pre-tokenizers with individual digits ("smollm") or without
# Unicode White_Space property (what \s means for Unicode-aware regex engines).
WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


@dataclass(frozen=True)
class TokenizerSpec:
    """The tokenizer part of a GGUF file's metadata."""

    tokens: tuple[str, ...]  # id -> token, spelled in the byte alphabet
    token_types: tuple[int, ...]  # id -> TOKEN_TYPE_*
    merges: tuple[str, ...]  # "left right", best (lowest rank) first
    pre: str  # tokenizer.ggml.pre
    bos_token_id: int
    eos_token_id: int
    add_bos: bool
    chat_template: str | None

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any], source: str) -> TokenizerSpec:
        """Validate and collect `tokenizer.*` keys; unsupported model/pre -> ValueError naming `source`."""
        model = metadata.get("tokenizer.ggml.model")
        pre = metadata.get("tokenizer.ggml.pre", "gpt2")
        if model != "gpt2" or pre not in PRE_TOKENIZERS:
            raise ValueError(
                f"{source}: tokenizer.ggml.model={model!r} / tokenizer.ggml.pre={pre!r} is not "
                f"supported (need model 'gpt2' and pre one of {PRE_TOKENIZERS})"
            )
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.eos_token_id"):
            if key not in metadata:
                raise ValueError(f"{source}: metadata key {key!r} is missing")
        tokens = tuple(metadata["tokenizer.ggml.tokens"])
        types = tuple(metadata.get("tokenizer.ggml.token_type", [TOKEN_TYPE_NORMAL] * len(tokens)))
        eos = int(metadata["tokenizer.ggml.eos_token_id"])
        return cls(
            tokens=tokens,
            token_types=types,
            merges=tuple(metadata["tokenizer.ggml.merges"]),
            pre=pre,
            bos_token_id=int(metadata.get("tokenizer.ggml.bos_token_id", eos)),
            eos_token_id=eos,
            add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
            chat_template=metadata.get("tokenizer.chat_template"),
        )


@functools.cache
def byte_alphabet() -> tuple[str, ...]:
    """GPT-2's byte -> printable character map: printable Latin-1 bytes map to themselves,
    the other 68 bytes to code points 256, 257, ... in byte order."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    spelled, extra = [], 0
    for byte in range(256):
        if byte in printable:
            spelled.append(chr(byte))
        else:
            spelled.append(chr(256 + extra))
            extra += 1
    return tuple(spelled)


def _category_class(prefix: str) -> str:
    """Regex character-class body for every code point whose Unicode category starts with `prefix`."""
    ranges, start, previous = [], None, None
    for code in range(sys.maxunicode + 1):
        if unicodedata.category(chr(code)).startswith(prefix):
            if start is None:
                start = code
            previous = code
        elif start is not None:
            ranges.append((start, previous))
            start = None
    if start is not None:
        ranges.append((start, previous))
    return "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges)


@functools.cache
def pretokenizer_patterns() -> tuple[re.Pattern, re.Pattern]:
    """(isolate-each-numeric-character, GPT-2 split) patterns with exact \\p{L}, \\p{N} and \\s classes."""
    letters, numbers, space = _category_class("L"), _category_class("N"), WHITE_SPACE
    split = (
        rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{letters}]+| ?[{numbers}]+| ?[^{space}{letters}{numbers}]+"
        rf"|[{space}]+(?![^{space}])|[{space}]+"
    )
    return re.compile(f"([{numbers}])"), re.compile(split)


class GGUFTokenizer:
    """encode / decode / apply_chat_template for a `TokenizerSpec` (see the module docstring)."""

    def __init__(self, spec: TokenizerSpec):
        self.spec = spec
        self._ids = {token: index for index, token in enumerate(spec.tokens)}
        self._ranks = {tuple(merge.split(" ")): rank for rank, merge in enumerate(spec.merges)}
        self._byte_of = {char: byte for byte, char in enumerate(byte_alphabet())}
        specials = [t for t, kind in zip(spec.tokens, spec.token_types) if kind in SPECIAL_TOKEN_TYPES]
        self.special_ids = frozenset(self._ids[t] for t in specials)
        longest_first = sorted(specials, key=len, reverse=True)
        self._special_split = re.compile("|".join(map(re.escape, longest_first))) if specials else None
        self._digit, self._split = pretokenizer_patterns()
        self._cache: dict[str, tuple[int, ...]] = {}

    @classmethod
    def from_gguf(cls, path: str | Path) -> GGUFTokenizer:
        from engine.models.gguf import read_gguf

        contents = read_gguf(path)
        return cls(TokenizerSpec.from_metadata(contents.metadata, str(contents.path)))

    @property
    def vocab_size(self) -> int:
        return len(self.spec.tokens)

    @property
    def eos_token_id(self) -> int:
        return self.spec.eos_token_id

    def encode(self, text: str, allow_special: bool = True, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`. add_bos=None follows the file's tokenizer.ggml.add_bos_token."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        ids = [self.spec.bos_token_id] if (self.spec.add_bos if add_bos is None else add_bos) else []
        for span, is_special in self._special_spans(text, allow_special):
            if is_special:
                ids.append(self._ids[span])
            else:
                for piece in self.pre_tokenize(span):
                    ids.extend(self._bpe(piece))
        return ids

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Text of token ids; byte sequences that are not valid UTF-8 decode to U+FFFD."""
        data = bytearray()
        for index in ids:
            if not 0 <= index < self.vocab_size:
                raise ValueError(f"token id {index} is outside [0, {self.vocab_size})")
            if index in self.special_ids:
                if not skip_special:
                    data.extend(self.spec.tokens[index].encode("utf-8"))
                continue
            data.extend(self._byte_of[char] for char in self.spec.tokens[index])
        return data.decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Render the file's chat template. Each message needs str 'role' and 'content'."""
        if self.spec.chat_template is None:
            raise ValueError("this GGUF file has no tokenizer.chat_template")
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or not all(isinstance(message.get(k), str) for k in ("role", "content")):
                raise ValueError(f"messages[{index}] must be a dict with str 'role' and 'content', got {message!r}")
        return _compiled_template(self.spec.chat_template).render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=self.spec.tokens[self.spec.bos_token_id],
            eos_token=self.spec.tokens[self.spec.eos_token_id],
        )

    def _special_spans(self, text: str, allow_special: bool) -> list[tuple[str, bool]]:
        if not allow_special or self._special_split is None:
            return [(text, False)]
        spans, start = [], 0
        for match in self._special_split.finditer(text):
            if match.start() > start:
                spans.append((text[start : match.start()], False))
            spans.append((match.group(), True))
            start = match.end()
        if start < len(text):
            spans.append((text[start:], False))
        return spans

    def pre_tokenize(self, text: str) -> list[str]:
        """The pieces BPE sees for `text` (no special-token handling): step 2 of the module docstring."""
        parts = [text]
        if self.spec.pre == "smollm":
            parts = [part for part in self._digit.split(text) if part]
        return [piece for part in parts for piece in self._split.findall(part)]

    def _bpe(self, piece: str) -> tuple[int, ...]:
        cached = self._cache.get(piece)
        if cached is None:
            alphabet = byte_alphabet()
            symbols = [alphabet[byte] for byte in piece.encode("utf-8")]
            cached = tuple(self._ids[symbol] for symbol in self._merge(symbols))
            self._cache[piece] = cached
        return cached

    def _merge(self, symbols: list[str]) -> list[str]:
        while len(symbols) > 1:
            pairs = [(self._ranks.get(pair, len(self._ranks)), i) for i, pair in enumerate(zip(symbols, symbols[1:]))]
            rank, at = min(pairs)
            if rank == len(self._ranks):
                break
            best, merged, i = (symbols[at], symbols[at + 1]), [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        return symbols


@functools.cache
def _compiled_template(source: str) -> Any:
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as error:
        raise ModuleNotFoundError("rendering a chat template needs the 'jinja2' package") from error
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return environment.from_string(source)
