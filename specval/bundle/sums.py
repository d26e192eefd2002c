"""Checksums: the sha256 of one bundle file, and SHA256SUMS, the seal over all of them.

Guarantees:
- `sha256_file` hashes regular files only: a symbolic link is never followed and a FIFO never
  blocks (BundleError naming the entry).
- `write_sums` lists every regular file but itself, the signature and the sealing process's lock
  file, dotfiles and subdirectories included, and writes SHA256SUMS atomically: a fault while
  sealing leaves no SHA256SUMS, never a partial one.
- `check_sums` reports every file added, removed or changed since SHA256SUMS was written, and a
  SHA256SUMS with a malformed line or a file listed twice.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path

from specval.bundle.files import (
    LOCK_FILE,
    SUMS_FILE,
    UNLISTED_FILES,
    BundleError,
    _files,
    atomic_write,
    entry_kind,
    regular_file,
)

NO_FOLLOW = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)  # a FIFO does not block


def sha256_file(path: Path) -> str:
    """SHA-256 of the regular file `path` (BundleError for a symbolic link or any other entry)."""
    try:
        handle = os.fdopen(os.open(path, NO_FOLLOW), "rb")
    except OSError as err:
        if path.is_symlink():
            raise BundleError(f"{path}: a symbolic link, not a regular file") from err
        raise
    with handle:
        mode = os.fstat(handle.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise BundleError(f"{path}: {entry_kind(mode)}, not a regular file")
        digest = hashlib.sha256()
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_sums(bundle: Path) -> None:
    """SHA256SUMS over every regular file but itself and the lock file of the sealing process,
    written atomically: a fault while sealing (disk full) leaves no SHA256SUMS, never a partial
    one, so the bundle still completes (`check_completable`)."""
    text = "".join(f"{sha256_file(bundle / name)}  {name}\n" for name in _files(bundle, (*UNLISTED_FILES, LOCK_FILE)))
    atomic_write(bundle / SUMS_FILE, lambda tmp: tmp.write_text(text))


SUMS_LINE = re.compile(r"([0-9a-f]{64})  (.+)")  # one line as `write_sums` writes it (and `sha256sum -c` reads)


def read_sums(bundle: Path) -> dict[str, str]:
    """{file: sha256} of SHA256SUMS (BundleError if it is missing, not a regular file, or holds a
    line that is not `<sha256>  <path>` or a file listed twice: `sha256sum -c` fails on either, so
    verify never lets the last of two lines win)."""
    path = bundle / SUMS_FILE
    try:
        text = regular_file(path).read_text(errors="replace")
    except FileNotFoundError as err:
        raise BundleError(f"{SUMS_FILE} is missing") from err
    listed: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        match = SUMS_LINE.fullmatch(line)
        if not match:
            raise BundleError(f"{SUMS_FILE}: line {number} is not `<sha256>  <path>` (64 lowercase hex digits)")
        digest, name = match.groups()
        if name in listed:
            raise BundleError(f"{SUMS_FILE}: line {number} lists {name} again; each file is listed once")
        listed[name] = digest
    return listed


def check_sums(bundle: Path) -> list[str]:
    """Differences between SHA256SUMS and the files on disk (empty list: all match)."""
    try:
        listed = read_sums(bundle)
    except BundleError as err:
        return [str(err)]
    problems = []
    on_disk = set(_files(bundle))
    for name in sorted(set(listed) - on_disk):
        problems.append(f"{name}: listed in {SUMS_FILE} but missing")
    for name in sorted(on_disk - set(listed)):
        problems.append(f"{name}: present but not listed in {SUMS_FILE}")
    for name in sorted(on_disk & set(listed)):
        if sha256_file(bundle / name) != listed[name]:
            problems.append(f"{name}: sha256 differs from {SUMS_FILE}")
    return problems
