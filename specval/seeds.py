"""Seed ledger: every group of every run of a protocol gets its own seed range.

The ledger is one JSON file per output root (`<output>/ledger.json`). Each entry records a
half-open range [start, stop) of request seeds owned by one group of one run (bundle).

Two seed spaces per protocol, so that trying a protocol never looks at the seeds its frozen run
will be judged on: a confirmatory run (the default) draws from
[seed_base, seed_base + EXPLORATORY_OFFSET), an exploratory run (`--exploratory`) from
[seed_base + EXPLORATORY_OFFSET, PROBE_SEED_START). Which space a range is in follows from its
start alone (`space_of`), so the ledger format is unchanged.

Guarantees:
- `allocate` gives the groups of a new run consecutive disjoint ranges in the run's space, starting
  at the space's first seed (`space_start`) or after the highest range that any earlier run of the
  same protocol took in that space; a later stage of a run (`<run>:<stage>`) stays in the space of
  the run's earlier ranges. An exploratory run in a fresh output root therefore never draws a seed
  that a confirmatory run in another fresh root draws, and a confirmatory run draws the same seeds
  whether or not exploratory runs came before it in its root. A confirmatory allocation that would
  reach the exploratory space is refused (SeedOverlapError). An explicit `offset` is taken as given.
- `claim` refuses (SeedOverlapError) any range that intersects a range already held by another
  group or another run of the same protocol, before anything is written or sampled.
- The ledger file is replaced atomically (temp file + rename), so a crash never leaves half a file.
- `claim_next` allocates and claims under an exclusive lock of the ledger (`ledger.lock`, flock), so
  runs started at the same moment on one output root get disjoint ranges.
- Seeds from PROBE_SEED_START on are reserved for the adapter probe: no range may reach them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from specval.bundle import atomic_write

LEDGER_FILE_NAME = "ledger.json"
LOCK_FILE_NAME = "ledger.lock"
PROBE_SEED_START = 2**32 - 16  # seeds [PROBE_SEED_START, 2**32) belong to the adapter probe, never to a run
PROBE_SEEDS = (PROBE_SEED_START, PROBE_SEED_START + 1)
# First seed of the exploratory space, above `seed_base`: half of the 32-bit seeds, so that either
# space holds far more seeds than any protocol takes (at most 2**32 seeds a range, per protocol's
# integer bound; the shipped protocols' seed_base are below 5e8).
EXPLORATORY_OFFSET = 2**31
CONFIRMATORY, EXPLORATORY = "confirmatory", "exploratory"
STAGE_SEPARATOR = ":"  # a later stage of run R claims as "R:<stage>" (the distribution kind's stage 2)


class SeedOverlapError(ValueError):
    """A requested seed range intersects one already in the ledger."""


class LedgerError(ValueError):
    """The ledger file exists but cannot be read as a ledger (not JSON, or not its schema)."""


@dataclass(frozen=True)
class SeedRange:
    """Seeds [start, stop) owned by one group of one run."""

    protocol: str
    run: str
    group: str
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start

    def overlaps(self, other: SeedRange) -> bool:
        return self.start < other.stop and other.start < self.stop

    def to_dict(self) -> dict:
        return asdict(self)


def ledger_path(output: str | Path) -> Path:
    return Path(output) / LEDGER_FILE_NAME


def read_ledger(output: str | Path) -> list[SeedRange]:
    path = ledger_path(output)
    if not path.exists():
        return []
    try:
        entries = json.loads(path.read_text())["ranges"]
        return [SeedRange(**entry) for entry in entries]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise LedgerError(f"{path}: corrupt seed ledger ({err})") from err


def _write_ledger(output: str | Path, ranges: Sequence[SeedRange]) -> None:
    path = ledger_path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"ranges": [r.to_dict() for r in ranges]}, indent=1) + "\n"
    atomic_write(path, lambda tmp: tmp.write_text(text))  # created with the umask, not mkstemp's 0600


def space_start(base: int, exploratory: bool) -> int:
    """First seed of a run's space: `base` (the protocol's seed_base) for a confirmatory run,
    `base + EXPLORATORY_OFFSET` for an exploratory one."""
    return base + EXPLORATORY_OFFSET if exploratory else base


def space_of(start: int, base: int) -> str:
    """EXPLORATORY or CONFIRMATORY: the space of a range that starts at `start`, for a protocol of
    seed_base `base`."""
    return EXPLORATORY if start >= base + EXPLORATORY_OFFSET else CONFIRMATORY


def _space_bounds(base: int, exploratory: bool) -> tuple[int, int]:
    low = space_start(base, exploratory)
    return low, PROBE_SEED_START if exploratory else low + EXPLORATORY_OFFSET


def _continues_exploratory(ledger: Sequence[SeedRange], protocol: str, run: str, base: int) -> bool:
    """Whether `run` is a later stage ("R:<stage>") of a run R whose ranges are in the exploratory space."""
    first, separator, _ = run.partition(STAGE_SEPARATOR)
    return bool(separator) and any(
        r.protocol == protocol and r.run == first and space_of(r.start, base) == EXPLORATORY for r in ledger
    )


def allocate(
    ledger: Iterable[SeedRange],
    protocol: str,
    run: str,
    groups: Sequence[str],
    size: int,
    base: int,
    offset: int | None = None,
    exploratory: bool = False,
) -> list[SeedRange]:
    """Plan one run's ranges: `size` seeds per group, consecutive, after every earlier range of the
    protocol in the run's seed space (exploratory: from `base + EXPLORATORY_OFFSET`; a later stage
    "R:<stage>" of an exploratory run R is exploratory too).

    `offset` forces the first seed (for replication on a chosen range); `claim` still checks it.
    SeedOverlapError when a confirmatory run's ranges would reach the exploratory space.
    """
    ledger = list(ledger)
    start = offset
    if start is None:
        exploratory = exploratory or _continues_exploratory(ledger, protocol, run, base)
        low, high = _space_bounds(base, exploratory)
        taken = [r.stop for r in ledger if r.protocol == protocol and r.stop > low and r.start < high]
        start = max([low, *taken])
        if start + len(groups) * size > high:
            raise SeedOverlapError(
                f"seed ranges of {len(groups)} group(s) x {size} from {start} do not fit the "
                f"{EXPLORATORY if exploratory else CONFIRMATORY} seed space [{low}, {high}) of protocol "
                f"{protocol!r}; give --seed-offset or a smaller seed_base"
            )
    return [SeedRange(protocol, run, g, start + i * size, start + (i + 1) * size) for i, g in enumerate(groups)]


def check_disjoint(ledger: Iterable[SeedRange], ranges: Sequence[SeedRange]) -> None:
    """Raise SeedOverlapError if `ranges` intersect each other or another run's ranges, or reach
    the probe's reserved seeds."""
    ledger = [r for r in ledger if r.protocol in {n.protocol for n in ranges}]
    for new in ranges:
        if new.stop > PROBE_SEED_START:
            raise SeedOverlapError(
                f"seed range [{new.start}, {new.stop}) of group {new.group!r} reaches the seeds "
                f"reserved for the adapter probe (>= {PROBE_SEED_START})"
            )
    for i, new in enumerate(ranges):
        for other in ranges[i + 1 :]:
            if new.size and other.size and new.overlaps(other):
                raise SeedOverlapError(
                    f"seed ranges of groups {new.group!r} and {other.group!r} overlap: "
                    f"[{new.start}, {new.stop}) and [{other.start}, {other.stop})"
                )
        for old in ledger:
            same_owner = (old.run, old.group) == (new.run, new.group)
            if new.size and old.size and new.overlaps(old) and not same_owner:
                raise SeedOverlapError(
                    f"seed range [{new.start}, {new.stop}) of group {new.group!r} overlaps "
                    f"[{old.start}, {old.stop}) held by group {old.group!r} of run {old.run!r} "
                    f"of protocol {old.protocol!r}"
                )


@contextlib.contextmanager
def ledger_lock(output: str | Path) -> Iterator[None]:
    """Hold an exclusive lock of the output root's ledger (blocks until other holders release it)."""
    path = Path(output) / LOCK_FILE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _claim_unlocked(output: str | Path, ranges: Sequence[SeedRange]) -> None:
    ledger = read_ledger(output)
    check_disjoint(ledger, ranges)
    known = set(ledger)
    _write_ledger(output, ledger + [r for r in ranges if r not in known])


def claim(output: str | Path, ranges: Sequence[SeedRange]) -> None:
    """Check `ranges` against the ledger, then record them (idempotent for the same run); under the lock."""
    with ledger_lock(output):
        _claim_unlocked(output, ranges)


def claim_next(
    output: str | Path,
    protocol: str,
    groups: Sequence[str],
    size: int,
    base: int,
    offset: int | None,
    name_run: Callable[[], str],
    exploratory: bool = False,
) -> list[SeedRange]:
    """Allocate the next ranges of `protocol` in the run's seed space (`exploratory`) and claim them
    for the run `name_run()` names, all under the ledger lock: concurrent runs on one output root
    never take the same seeds. `name_run` is called only once the ranges are known to be free (it
    may create the bundle)."""
    with ledger_lock(output):
        ledger = read_ledger(output)
        planned = allocate(ledger, protocol, "", groups, size, base, offset, exploratory)
        check_disjoint(ledger, planned)
        run = name_run()
        ranges = [SeedRange(r.protocol, run, r.group, r.start, r.stop) for r in planned]
        _claim_unlocked(output, ranges)
    return ranges
