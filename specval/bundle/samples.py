"""Sample bounds: the most rows, cells and bytes a bundle's parquet sample chunks may hold.

Every consumer of a bundle's samples (verify's recomputation, report's re-rendering, a resumed
run's analysis) decodes whole chunks into memory. A hostile chunk of a few MB can declare hundreds
of millions of rows (a run of one value compresses to nothing), so `check_sample_bounds` reads
each chunk's parquet footer alone, never its data pages, and refuses the bundle before any
sample is decoded.

Guarantees:
- `check_sample_bounds` opens only regular files (a link or a FIFO is reported by the entry checks
  and skipped here), reads at most each file's footer, and returns one line per bound broken,
  naming the file, the bound and what was found; an unreadable footer is one line too. It never
  raises for what a file holds (OSError only if the directory itself cannot be listed).
- The bounds: each file at most MAX_CHUNK_FILE_BYTES on disk; over all chunks at most
  `planned seeds x MAX_ROWS_PER_SEED` rows, where the planned seeds are the seed ranges run.json
  records (signed and sealed with the bundle), at most MAX_SAMPLE_CELLS cells (rows x columns) and
  at most MAX_SAMPLE_BYTES of uncompressed column data as the footers declare it.

Limit: the footers' counts are what is checked; pyarrow refuses a data page that decodes to
other sizes than its header declares, so a footer cannot understate a chunk that is then decoded
in full.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specval.bundle.files import RUN_FILE, SAMPLES_DIR, STAGE2_DIR, _files, read_typed
from specval.bundle.plan import RunPlan

# The sequence kind writes the most rows per seed: one per token of a sequence (at most 1,024
# tokens and K = 8 drafts) for the main sampling and each of at most 8 companion samplings, so
# 1,032 x 9 = 9,288; a re-run samples at most 8 seeds of a group again. 20,000 covers both twice
# over. The distribution kind writes one row per seed.
MAX_ROWS_PER_SEED = 20_000
# 64 Mi cells are 512 MiB as 8-byte values, the widest a sample column holds: about 13 times the
# 5 M cells of the largest kept bundle (618 k rows x 8 columns of a sequence run), and a bound
# under which verify's decode stays within 1 GB.
MAX_SAMPLE_CELLS = 1 << 26
MAX_SAMPLE_BYTES = 512 << 20  # uncompressed column data over all chunks, as the footers declare it
# a kept chunk is at most a few hundred KB; 256 MiB bounds the footer read of one hostile file
MAX_CHUNK_FILE_BYTES = 256 << 20
SAMPLE_SUFFIX = ".parquet"


@dataclass(frozen=True)
class ChunkSize:
    """What one chunk's footer declares: rows, columns and uncompressed bytes."""

    rows: int
    columns: int
    uncompressed: int

    @property
    def cells(self) -> int:
        return self.rows * self.columns


def planned_seeds(path: Path) -> int:
    """The seeds run.json plans, stage 2 included (BundleError or a read error when unreadable)."""
    plan = RunPlan.from_dict(read_typed(path / RUN_FILE, dict))
    return sum(max(0, stop - start) for _, start, stop in (*plan.ranges, *plan.stage2_ranges))


def sample_files(path: Path) -> list[str]:
    """The regular parquet files under samples/ and stage2/samples/, in name order."""
    folders = (f"{SAMPLES_DIR}/", f"{STAGE2_DIR}/{SAMPLES_DIR}/")
    return [name for name in _files(path) if name.startswith(folders) and name.endswith(SAMPLE_SUFFIX)]


def chunk_size(file: Path) -> ChunkSize:
    """The sizes `file`'s parquet footer declares (ValueError or OSError when it has none)."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(file).metadata
    uncompressed = sum(
        meta.row_group(g).column(c).total_uncompressed_size
        for g in range(meta.num_row_groups)
        for c in range(meta.num_columns)
    )
    return ChunkSize(meta.num_rows, meta.num_columns, uncompressed)


def check_sample_bounds(path: Path) -> list[str]:
    """One line per sample bound the bundle breaks (module docstring); empty when within them.
    Stops at the first file that breaks a bound: nothing after it is read."""
    try:
        seeds = planned_seeds(path)
    except Exception as err:  # noqa: BLE001 - any unreadable run.json is one line, never a traceback
        return [f"{RUN_FILE}: cannot read the planned seeds that bound the samples ({err})"]
    rows, cells, uncompressed = 0, 0, 0
    for name in sample_files(path):
        size = _measure(path / name, name)
        if isinstance(size, str):
            return [size]
        rows, cells, uncompressed = rows + size.rows, cells + size.cells, uncompressed + size.uncompressed
        broken = _over(rows, seeds * MAX_ROWS_PER_SEED, f"rows ({seeds} planned seeds x {MAX_ROWS_PER_SEED})")
        broken = broken or _over(cells, MAX_SAMPLE_CELLS, "cells (rows x columns)")
        broken = broken or _over(uncompressed, MAX_SAMPLE_BYTES, "bytes of uncompressed column data")
        if broken:
            return [f"{name}: the samples reach {broken} with this chunk; nothing was decoded"]
    return []


def _over(found: int, limit: int, what: str) -> str | None:
    """The words "FOUND WHAT, over the bound of LIMIT" when `found` exceeds `limit`; None otherwise."""
    return f"{found} {what}, over the bound of {limit}" if found > limit else None


def _measure(file: Path, name: str) -> ChunkSize | str:
    """One chunk's declared sizes, or the line saying why it cannot be measured: too large on
    disk, or no readable parquet footer."""
    found = file.lstat().st_size
    if found > MAX_CHUNK_FILE_BYTES:
        return f"{name}: {found} bytes, over the bound of {MAX_CHUNK_FILE_BYTES} bytes for one sample chunk"
    try:
        return chunk_size(file)
    except Exception as err:  # noqa: BLE001 - pyarrow's errors on a corrupt footer are many kinds
        return f"{name}: not a readable parquet file ({' '.join(str(err).split())})"
