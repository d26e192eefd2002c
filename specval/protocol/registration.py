"""Registration: pre-registering a protocol by its canonical hash in the lock file next to it.

`freeze` records the hash; `registration` compares a protocol with the lock (FROZEN, CHANGED,
NOT_FROZEN); `check_registered` refuses anything but FROZEN unless the run is exploratory.
Guarantee: a confirmatory run only starts from a protocol whose canonical hash is the frozen one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specval.protocol.readers import ProtocolError
from specval.protocol.schema import load_protocol

LOCK_FILE_NAME = "frozen.lock"


def lock_path(protocol_file: str | Path) -> Path:
    """The lock file kept in git next to the protocol files."""
    return Path(protocol_file).parent / LOCK_FILE_NAME


def read_lock(path: Path) -> dict[str, str]:
    """The lock file's protocol name -> hash ({} when there is no lock file yet)."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ProtocolError(f"{path}: lock file is not valid JSON: {err}") from err
    if not isinstance(data, dict):
        raise ProtocolError(f"{path}: lock file must map protocol name -> hash")
    return data


def freeze(protocol_file: str | Path, loader: Callable[[str | Path], Any] | None = None) -> tuple[Path, str]:
    """Record the protocol's canonical hash in the lock file; returns (lock file, hash).
    `loader` parses the file (default `load_protocol`; quality protocols pass their own)."""
    protocol = (loader or load_protocol)(protocol_file)
    path = lock_path(protocol_file)
    lock = read_lock(path)
    lock[protocol.name] = protocol.hash
    path.write_text(json.dumps(lock, indent=2, sort_keys=True) + "\n")
    return path, protocol.hash


FROZEN, CHANGED, NOT_FROZEN = "frozen", "changed since frozen", "not frozen"


def registration(protocol: Any, protocol_file: str | Path) -> str:
    """FROZEN if the lock next to the file holds the protocol's hash, CHANGED if it holds another
    hash for the same name, NOT_FROZEN if it holds none."""
    frozen = read_lock(lock_path(protocol_file)).get(protocol.name)
    if frozen is None:
        return NOT_FROZEN
    return FROZEN if frozen == protocol.hash else CHANGED


def check_registered(protocol: Any, protocol_file: str | Path, exploratory: bool) -> str:
    """The registration state; ProtocolError unless FROZEN or the run is declared `exploratory`."""
    state = registration(protocol, protocol_file)
    if state != FROZEN and not exploratory:
        raise ProtocolError(
            f"{protocol_file}: protocol {protocol.name!r} is {state} in {lock_path(protocol_file)}; "
            f"run `specval freeze {protocol_file}` to pre-register it, or pass --exploratory "
            "(the verdict is then marked EXPLORATORY)"
        )
    return state
