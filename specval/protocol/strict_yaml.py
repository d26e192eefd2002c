"""Strict YAML: the reader of protocol files, refusing a key given twice and remembering lines.

Guarantee: `read_yaml` returns the parsed document or raises ProtocolError naming the file
(unreadable, not text, invalid YAML, or a key given twice in one mapping: both lines named);
`line_of` points an error at the line of a key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from specval.protocol.readers import ProtocolError


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML's default keeps the last)
    and remembers the line of every mapping key (`_KeyLines`), so errors can point at the file."""


class _DuplicateKey(yaml.YAMLError):
    """A mapping key given twice; the message names both lines."""


class _KeyLines(dict):
    """A parsed mapping with `lines`: key -> 1-based line of the key in the file."""

    lines: dict[Any, int]


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> _KeyLines:
    loader.flatten_mapping(node)
    out, lines = _KeyLines(), {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        if key in lines:
            raise _DuplicateKey(f"key {key!r} given twice (lines {lines[key]} and {line}); "
                                "a pre-registered protocol must say each thing once")
        lines[key] = line
        out[key] = loader.construct_object(value_node, deep=deep)
    out.lines = lines
    return out


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path: str | Path) -> Any:
    """The parsed YAML of a protocol file; unreadable files, YAML syntax errors and keys given
    twice in one mapping become ProtocolError naming the file (and both lines of a duplicate)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ProtocolError(f"{path}: cannot read protocol ({err.strerror})") from err
    except UnicodeDecodeError as err:
        raise ProtocolError(f"{path}: not a text file ({err.reason})") from err
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except _DuplicateKey as err:
        raise ProtocolError(f"{path}: {err}") from err
    except yaml.YAMLError as err:
        raise ProtocolError(f"{path}: invalid YAML: {err}") from err


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
