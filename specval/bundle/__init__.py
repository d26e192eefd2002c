"""specval.bundle: the evidence directory of one run, its manifest, its checksums and its verification.

Layout of `results/<protocol>-<UTC timestamp>/`:

    protocol.yaml      the protocol file exactly as run
    protocol.json      its parsed canonical form (the input of the protocol hash)
    run.json           the run plan: bundle format, profile, seed ranges; written before sampling, used by
                       --resume (two-stage protocols: `stage2_ranges` is added when stage 2 is claimed)
    samples/*.parquet  raw samples, one file per seed chunk
    chunks.json        one record per sample chunk, appended as each chunk was written: its file, its
                       sha256 and the hash of the previous record (the first chains from the protocol
                       hash); manifest.json names the head, so the seal covers the chain
    sessions.json      one record per process that worked on the bundle (a resumed run has several)
    reference.json     exact reference distributions (sparse, float64 round-trip)
    stage2/            second stage of a two-stage protocol, only when stage 1 FAILed:
                       stage2/samples/*.parquet, stage2/chunks.json and stage2/reference.json
    quadrature.json    exact output laws of the accept kernel (when the protocol has a quadrature test)
    summary.json       every criterion's statistic, df, p, alpha, verdict, MDE; planned vs effective n
    report.md, report.html
    manifest.json      protocol hash, code version, sessions, command, versions, device, seeds, times
    SHA256SUMS         sha256 of every other file, dotfiles included

While a process works on the bundle it holds `.specval.lock` (its pid, host and start time);
`lifecycle.seal` removes it after writing SHA256SUMS.

Guarantees:
- A bundle is sealed once SHA256SUMS exists (written atomically); `check_resumable` refuses to
  re-open it, or one whose run recorded its verdict (`recorded_verdict`: summary.json, the manifest
  or a report present, or a session that ended with a verdict), or whose chunk records do not
  chain, or whose written sample chunks differ from the hashes recorded when they were written, or
  that holds anything but regular files and directories, or that another process holds
  (`lock_bundle`, naming the holder).
- An unsealed bundle whose run recorded its verdict can only be completed (`check_completable`,
  then `lifecycle.complete`): refused unless its chunk records are complete and chain, every
  session that ended with a verdict ended with summary.json's, on files (`verdict_files`)
  unchanged since.
- `verify_bundle` reports a difference if any byte of any file changed, if a file was added or
  removed, if an entry is a symbolic link, a FIFO, a device or a directory holding no file of
  SHA256SUMS (and then reads nothing more: no link is followed out of the bundle), if the chunk
  records do not chain to the head the manifest names, if a sample chunk differs from its
  recorded hash, if protocol.yaml does not parse to protocol.json, if any value of summary.json
  differs from a recomputation from the raw samples, or if report.md / report.html differ byte
  for byte from a re-rendering of the bundle.
- It cannot see a change that moves no statistic (two samples swapped within one stratum, with
  every hash recomputed), and the hashes prove that the bundle is self-consistent, not who made it.
- Every file is created with the process umask (0644 under the default umask 022).

Modules, one noun each, in layers (each imports only those above it in this list):

    files     names of the bundle's files, BundleError and the read errors, temp files and atomic
              writes, the JSON form, entry kinds and regular files
    sums      the sha256 of a file and SHA256SUMS (write, read, check)
    plan      run.json's RunPlan, the bundle formats, the protocol copies (`load_plan_protocol`)
    facts     what a bundle records of its making: code, packages, device, command line
    samples   the bounds of the sample chunks, checked from their parquet footers (`check_sample_bounds`)
    chain     the chained chunk records of each stage: genesis, heads, chunk writes and checks
    sessions  sessions.json's records and the bundle lock the working process holds
    resume    whether a bundle may be resumed or completed (`check_resumable`, `check_completable`)
    compare   `diff` of a stored JSON value and its recomputation
    verify    `verify_bundle` and its checks, the notes of `specval verify`, `check_pinned`, `check_profile`

This module is the package's public surface: callers use `from specval import bundle as bundles`
and `bundles.NAME` for the names of `__all__`; the modules of the package import each other
directly, never through it. A test that replaces a function patches it where it is looked up: in
the module that calls it, and here for the callers outside the package.
"""

from specval.bundle.chain import (
    chain_genesis,
    chain_head,
    chain_problems,
    chunk_heads,
    read_chunk_index,
    record_hash,
    write_chunk,
    write_json_chunk,
)
from specval.bundle.compare import (
    diff,
)
from specval.bundle.facts import (
    code_version,
    device_facts,
    git_state,
    invocation,
    package_versions,
    source_digest,
)
from specval.bundle.files import (
    CHUNKS_FILE,
    ERROR_LOG,
    LOCK_FILE,
    MANIFEST_FILE,
    PROTOCOL_JSON,
    PROTOCOL_YAML,
    QUADRATURE_FILE,
    READ_ERRORS,
    REFERENCE_FILE,
    REPORT_FILES,
    RUN_FILE,
    SAMPLES_DIR,
    SESSIONS_FILE,
    SHAPE_ERRORS,
    SIGNATURE_FILE,
    STAGE2_DIR,
    SUMMARY_FILE,
    SUMS_FILE,
    BundleError,
    atomic_write,
    entry_kind,
    json_text,
    parse_json,
    read_json,
    read_typed,
    regular_files,
    remove_stale_temps,
    temp_path,
    write_files,
    write_json,
)
from specval.bundle.plan import (
    BUNDLE_FORMAT,
    CHAINED_FORMAT,
    VERIFIABLE_FORMATS,
    RunPlan,
    load_plan_protocol,
)
from specval.bundle.resume import (
    check_completable,
    check_resumable,
    recorded_verdict,
)
from specval.bundle.samples import (
    check_sample_bounds,
)
from specval.bundle.sessions import (
    VERDICT_FILES_KEY,
    begin_session,
    end_session,
    lock_bundle,
    read_sessions,
    release_bundle,
)
from specval.bundle.sums import (
    check_sums,
    sha256_file,
    write_sums,
)
from specval.bundle.verify import (
    check_all_chunks,
    check_listed_entries,
    check_pinned,
    check_profile,
    code_note,
    format_note,
    ran_profile,
    verify_bundle,
)

__all__ = [
    "BUNDLE_FORMAT",
    "BundleError",
    "CHAINED_FORMAT",
    "CHUNKS_FILE",
    "ERROR_LOG",
    "LOCK_FILE",
    "MANIFEST_FILE",
    "PROTOCOL_JSON",
    "PROTOCOL_YAML",
    "QUADRATURE_FILE",
    "READ_ERRORS",
    "REFERENCE_FILE",
    "REPORT_FILES",
    "RUN_FILE",
    "RunPlan",
    "SAMPLES_DIR",
    "SESSIONS_FILE",
    "SHAPE_ERRORS",
    "SIGNATURE_FILE",
    "STAGE2_DIR",
    "SUMMARY_FILE",
    "SUMS_FILE",
    "VERDICT_FILES_KEY",
    "VERIFIABLE_FORMATS",
    "atomic_write",
    "begin_session",
    "chain_genesis",
    "chain_head",
    "chain_problems",
    "check_all_chunks",
    "check_completable",
    "check_listed_entries",
    "check_pinned",
    "check_profile",
    "check_resumable",
    "check_sample_bounds",
    "check_sums",
    "chunk_heads",
    "code_note",
    "code_version",
    "device_facts",
    "diff",
    "end_session",
    "entry_kind",
    "format_note",
    "git_state",
    "invocation",
    "json_text",
    "load_plan_protocol",
    "lock_bundle",
    "package_versions",
    "parse_json",
    "read_chunk_index",
    "read_json",
    "read_sessions",
    "ran_profile",
    "read_typed",
    "record_hash",
    "recorded_verdict",
    "regular_files",
    "release_bundle",
    "remove_stale_temps",
    "sha256_file",
    "source_digest",
    "temp_path",
    "verify_bundle",
    "write_chunk",
    "write_files",
    "write_json",
    "write_json_chunk",
    "write_sums",
]
