"""Strict YAML: the reader of protocol files, refusing a key given twice and remembering lines.

Guarantees: `read_yaml` returns the parsed document or raises ProtocolError naming the file
(unreadable, not a regular file, not text, invalid YAML, or a key given twice in one mapping: both
lines named); `line_of` points an error at the line of a key.

Bounded work: a protocol file is refused, never parsed at length, when it is larger than
MAX_PROTOCOL_BYTES, nests mappings and lists deeper than MAX_DEPTH, or holds more than MAX_NODES
nodes once every alias is expanded (a few KB of nested aliases, the "billion laughs", expand
exponentially), or an alias that contains itself. The composer stops at the first node over a
bound, so a refused file costs at most MAX_NODES nodes of parsing: well under a second.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

from specval.protocol.readers import ProtocolError

# The shipped protocols are below 2.5 KB, 5 levels and 200 nodes; these bounds leave room for long
# prompts and descriptions while keeping the pure-Python parse of any accepted file short.
MAX_PROTOCOL_BYTES = 256 * 1024  # a scalar-heavy file of this size parses in ~0.1 s
MAX_DEPTH = 32  # nesting of mappings and lists, aliases expanded (Python's recursion limit is 1000)
MAX_NODES = 5_000  # nodes, aliases expanded; ~0.2 s of token-dense YAML on one loaded core
# what PyYAML's constructors raise on an explicitly tagged value they cannot read (`!!float x`:
# ValueError, `!!timestamp x`: AttributeError, `!!binary` of bad base64: binascii.Error, a ValueError)
TAG_ERRORS = (ValueError, TypeError, AttributeError, OverflowError)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML's default keeps the last)
    and remembers the line of every mapping key (`_KeyLines`), so errors can point at the file.
    It stops composing at the first node past MAX_DEPTH or MAX_NODES (`_TooLarge`), and checks the
    document with its aliases expanded before constructing anything (`_check_expansion`)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self._depth, self._nodes = self._depth + 1, self._nodes + 1
        try:
            if self._depth > MAX_DEPTH or self._nodes > MAX_NODES:
                line = self.peek_event().start_mark.line + 1
                raise _TooLarge(f"line {line}: {_bound_broken(self._depth, self._nodes)}")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            _check_expansion(node)
        return node


class _TooLarge(yaml.YAMLError):
    """The document is deeper, larger or more aliased than a protocol may be."""


def _bound_broken(depth: int, nodes: int) -> str:
    if depth > MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH} levels"
    return f"more than {MAX_NODES} YAML nodes (aliases expanded)"


def _check_expansion(root: yaml.Node) -> None:
    """_TooLarge unless `root` with every alias expanded stays within MAX_DEPTH and MAX_NODES and
    no alias contains itself. Linear in the distinct nodes: each one's expanded size and height
    are computed once (`memo`), however many aliases point at it."""
    memo: dict[int, tuple[int, int]] = {}
    size, _ = _expanded(root, 1, memo, set())
    if size > MAX_NODES:
        raise _TooLarge(f"{size} YAML nodes once its aliases are expanded (at most {MAX_NODES})")


def _expanded(node: yaml.Node, depth: int, memo: dict[int, tuple[int, int]], open_: set[int]) -> tuple[int, int]:
    """(expanded size, height) of `node`, found at `depth`; _TooLarge past MAX_DEPTH or on a cycle."""
    key = id(node)
    if key in open_:
        raise _TooLarge(f"line {node.start_mark.line + 1}: an alias refers to a node that contains it")
    if key not in memo:
        open_.add(key)
        children = _children(node)
        sizes = [_expanded(child, depth + 1, memo, open_) for child in children]
        open_.discard(key)
        memo[key] = (1 + sum(s for s, _ in sizes), 1 + max((h for _, h in sizes), default=0))
    size, height = memo[key]
    if depth - 1 + height > MAX_DEPTH:
        raise _TooLarge(
            f"line {node.start_mark.line + 1}: nested deeper than {MAX_DEPTH} levels once its aliases are expanded"
        )
    return size, height


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


class _DuplicateKey(yaml.YAMLError):
    """A mapping key given twice; the message names both lines."""


class _KeyLines(dict[Any, Any]):
    """A parsed mapping with `lines`: key -> 1-based line of the key in the file."""

    lines: dict[Any, int]


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> _KeyLines:
    loader.flatten_mapping(node)
    out = _KeyLines()
    lines: dict[Any, int] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        if not isinstance(key, Hashable):
            raise yaml.constructor.ConstructorError(
                None, None, f"line {line}: a key must be a scalar, not a {type(key).__name__}", key_node.start_mark
            )
        if key in lines:
            raise _DuplicateKey(
                f"key {key!r} given twice (lines {lines[key]} and {line}); "
                "a pre-registered protocol must say each thing once"
            )
        lines[key] = line
        out[key] = loader.construct_object(value_node, deep=deep)
    out.lines = lines
    return out


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path: str | Path) -> Any:
    """The parsed YAML of a protocol file; unreadable files, anything but a regular file (a FIFO
    would block), files over the bounds of this module, YAML syntax errors and keys given twice in
    one mapping become ProtocolError naming the file (and both lines of a duplicate)."""
    path = Path(path)
    text = _read_text(path)
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except (_DuplicateKey, _TooLarge) as err:
        raise ProtocolError(f"{path}: {err}") from err
    except yaml.YAMLError as err:
        raise ProtocolError(f"{path}: invalid YAML: {_one_line(err)}") from err
    except TAG_ERRORS as err:  # a constructor of an explicit tag: `!!float x`, `!!timestamp x`
        raise ProtocolError(f"{path}: invalid YAML: a tagged value cannot be read ({err})") from err


def _one_line(err: yaml.YAMLError) -> str:
    """PyYAML's error in one line: what is wrong and where ("line L, column C"), without the
    quoted source lines its own message spreads over several lines."""
    if isinstance(err, yaml.MarkedYAMLError) and err.problem:
        mark = err.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        context = f"{err.context}: " if err.context else ""
        return f"{context}{err.problem}{where}"
    return " ".join(str(err).split())


def _read_text(path: Path) -> str:
    """The text of a regular file of at most MAX_PROTOCOL_BYTES (never more is read)."""
    try:
        if not path.is_file():
            raise ProtocolError(f"{path}: cannot read protocol (not a regular file)")
        with path.open("rb") as handle:
            data = handle.read(MAX_PROTOCOL_BYTES + 1)
    except OSError as err:
        raise ProtocolError(f"{path}: cannot read protocol ({err.strerror or err})") from err
    if len(data) > MAX_PROTOCOL_BYTES:
        raise ProtocolError(f"{path}: larger than {MAX_PROTOCOL_BYTES} bytes; a protocol is a short file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ProtocolError(f"{path}: not a text file ({err.reason})") from err


def line_of(raw: Any, key_path: tuple[Any, ...]) -> int | None:
    """1-based line of the key at `key_path` (e.g. ("groups", 2, "mode")) in a mapping returned by
    `read_yaml`; the deepest key found on the way when the full path is absent; None if none."""
    line, node = None, raw
    for key in key_path:
        if isinstance(node, _KeyLines) and key in node:
            line, node = node.lines[key], node[key]
        elif isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
            node = node[key]
        else:
            break
    return line
