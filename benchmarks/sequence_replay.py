"""Seconds to rebuild a sequence bundle's reference: every group's replays and parts, as a run does.

`specval.sequence.reference.build_group` (and `build_companions` for groups with companions) on the
bundle's own samples, with the adapter its protocol names: the target's batched replays, the draft's
for groups under a `source` test, and the float64 parts. Nothing is written.

    python -m benchmarks.sequence_replay BUNDLE

Prints the wall and process CPU seconds.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from specval.sequence import collect, reference, runner
from specval.sut import capabilities_of, open_sut


def rebuild(path: Path) -> None:
    """Replay every group of the bundle at `path` and compute its parts (discarded)."""
    protocol, _ = runner.load_bundle_protocol(path)
    sut = open_sut(protocol.sut, protocol.num_speculative_tokens)
    try:
        prompt_ids = [sut.encode(text) for text in protocol.prompts]
        semantics, white_box = capabilities_of(sut).semantics, reference.source_groups(protocol)
        for group in protocol.groups:
            main, companions, _ = collect.load_tables(path, protocol, group.name)
            reference.build_group(sut, protocol, prompt_ids, main, semantics, group.name, group.name in white_box)
            if group.companions:
                reference.build_companions(sut, protocol, prompt_ids, companions, group.name, semantics)
    finally:
        sut.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path)
    args = parser.parse_args()
    wall, cpu = time.perf_counter(), time.process_time()
    rebuild(args.bundle)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"reference of {args.bundle.name}: {wall:.1f} s wall, {cpu:.1f} s CPU")


if __name__ == "__main__":
    main()
