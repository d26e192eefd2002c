"""Sharding: one run spread over the processes that torchrun starts, on one host or several,
joined through torch.distributed.

`torchrun --nproc-per-node N -m specval run PROTOCOL ...` starts N copies of one command (and
`specval run --devices N ...` launches exactly that through `torch.distributed.run`); with
`--nnodes M --node-rank R --rdzv-backend static|c10d --rdzv-endpoint HOST:PORT` on each of M hosts,
the copies of every host join one group, with no file shared between the hosts. Each copy reads
RANK, WORLD_SIZE and LOCAL_RANK from its environment. Rank 0 must run on the host that holds the
protocol (or the bundle) and the output folder: torchrun's static rendezvous puts it on the host
of --node-rank 0; its c10d rendezvous ignores --node-rank and puts it on the host whose address
(--local-addr, else its name) sorts first. A rank 0 that lacks the file refuses the run (exit 2,
every rank dismissed with 2). Roles:

- rank 0 is the run: it alone reads the protocol file (or the bundle of --resume), the seed ledger
  and the output folder; it prepares, probes its adapter, claims the seed ranges in the ledger,
  creates the bundle, writes every chunk file, analyses, reports and seals, as a one-process run
  does.
- every other rank serves: it reads no file of the run (its host needs neither the protocol nor
  the output folder), waits for rank 0's commands, `Open` (check your adapter against rank 0's,
  build and probe it, before any seed is claimed), `Collect` (sample these chunks) or `Dismiss`
  (exit with this code), and sends its samples (or its failure) to rank 0.

Both run kinds that collect through chunk files share this machinery: the distribution kind's
chunks are `collect.Chunk`s made by `collect.collect_chunk`; the sequence kind's are its batches
(`specval.sequence.collect.Batch`, one chunk file each) made by `sample_batch`. `Open` carries the
kind's probe and `Collect` the kind's function that makes one chunk (each named by module and
function, so a rank runs its own installed copy of rank 0's code), and a serving rank calls them
as rank 0 does. The sequence kind shards its collection only: its reference replays and criteria
run on rank 0 (`specval.sequence.runner`).

The exchange, in order: every rank joins (`join`: the backend comes from its own host, not from
the protocol); `greet`: rank 0 sends its specval's name, version and digest
(`identity.harness_identity`) as plain strings, which any specval can read, and every rank
answers whether its own differ; `Open` carries the protocol as rank 0 parsed it (its hash
included: the other ranks never parse a file) and rank 0's adapter identity
(`lifecycle.sut_identity`, what the manifest records), which each rank compares with its own before
it builds its adapter; then `Collect`s carry the chunk plan.

How the seeds are split: by chunk (the unit of sealing: a `collect.Chunk`, or a sequence batch).
Rank 0 lists the chunks still missing from the bundle (in `collect.plan_chunks` order, or
`specval.sequence.collect.plan_batches` order up to the current look, chunks already on disk
skipped, so a resumed run shards only what is left, with any number of ranks), and chunk i of that
list goes to rank i mod N. The chunks are taken in rounds of N: in each round every rank collects at most one
chunk, the chunks reach rank 0 through `gather_object`, and a broadcast tells every rank whether
the run goes on (the collective error check after each chunk); rank 0 then writes the round's
chunks in a writer thread while every rank collects the next round.

Guarantees:
- The samples equal those of a one-process run of the same seed ranges wherever the SUT's output
  for a batch depends on its seeds alone, not on the process or on which of identical devices runs
  it (the engine's counter-based RNG, the fake SUT, the sequence tests' chain): each chunk is made
  by the function that makes it in one process (`collect.collect_chunk`, so split into the same
  batches; a sequence batch by `sample_batch`) and written by the kind's `collect`, as in one
  process.
- A rank whose specval or adapter code differs from rank 0's (name, version or digest,
  `identity.same_code`), or whose host lacks the GPU of a CUDA protocol, ends the run before any
  seed is claimed: rank 0 raises `RankRefused` naming the lowest such rank and the difference
  (exit 2), and dismisses every rank with 2. A differing specval is found before any specval
  object crosses between the ranks.
- An adapter that cannot be built or fails the probe on any rank ends the run before any seed is
  claimed (exit 3, as a failed probe of one process). An exception on any rank while it collects
  ends the round for all: rank 0 raises `SUTRaised` naming the rank, the run exits 3 with the
  traceback in the bundle's error.log and the bundle unsealed and resumable; every other rank is
  dismissed with the same exit code. Rank 0 joins before it reads anything and dismisses the other
  ranks with its own exit code whatever ends it (0, 1, 2, 3, 130; a refused protocol too), so no
  rank waits for a command that never comes.
- A rank that disappears (killed, its host gone) makes the next collective fail; rank 0 then ends
  as interrupted (exit 130, bundle kept for --resume with any number of ranks). Every collective
  carries the group timeout GROUP_TIMEOUT, so a rank stuck inside the SUT, or a host that vanished
  without closing its connections (power, network), ends the run after that time rather than
  never.

Backend: chosen by each rank from its own host, before any protocol is known: `cpu:gloo,cuda:nccl`
where CUDA is available, gloo otherwise (`host_backend`). Both register gloo for the CPU under the
same store prefix, so hosts that differ still join one group; NCCL is initialised lazily (at a
first CUDA collective, which the run never makes), so a host without CUDA never needs it. Samples
are host arrays once collected (the engine reads each batch back once), so they travel as pickled
frames, and torch's object collectives take the CPU backend (gloo) of every such group. A CUDA
protocol runs each rank on cuda:LOCAL_RANK (`place` rewrites the protocol's device per rank; its
hash is unchanged; `use_device` makes it the current device before the adapter is built).

torch is imported only inside the functions that use it: the harness installs without it
(`pip install specval`), and a multi-process run without torch is an input error (exit 2) whose
one line names the extra to install (`TorchMissing`), before anything is claimed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import sys
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from specval.distribution.collect import Keep, collect_chunk
from specval.execution import EXIT_INPUT, EXIT_INTERRUPTED
from specval.identity import brief_record, harness_identity, same_code
from specval.lifecycle import sut_identity
from specval.preflight import SUTRaised, open_guarded
from specval.preflight import probe as probe_distribution
from specval.protocol import Protocol, ProtocolError, SutSpec, read_yaml
from specval.sut import SUT, SUTError, SutFactory, open_sut

LEADER = 0  # the rank that claims seeds and writes the bundle
GROUP_TIMEOUT = dt.timedelta(minutes=60)  # longest wait of one collective (a chunk, or rank 0's analysis)
CUDA_PREFIX = "cuda"
CPU_BACKEND = "gloo"  # a host without CUDA
CUDA_BACKENDS = "cpu:gloo,cuda:nccl"  # a host with CUDA: gloo for the CPU (object collectives), NCCL lazily
INSTALL_TORCH = 'pip install "specval[engine]"'  # the extra that brings torch (and torch.distributed)

Probe = Callable[[SUT, Any], None]  # a kind's probe of a built adapter: raises what is wrong with it
Work = Callable[[SUT, Any, Any, Any], pd.DataFrame]  # makes one chunk: (sut, protocol, prompt ids, chunk)


@dataclass(frozen=True)
class ShardGroup:
    """This process's place among the ranks of a multi-rank run (as torchrun set it)."""

    rank: int
    size: int
    local_rank: int

    @property
    def is_leader(self) -> bool:
        return self.rank == LEADER


@dataclass(frozen=True)
class Open:
    """Rank 0's first command: check that your adapter's identity is `identity` (rank 0's, an
    `identity_of` record), then build your adapter for `protocol` (placed on your device) and probe
    it with `probe` (the kind's: the distribution kind's by default)."""

    protocol: Any  # a distribution Protocol, or a SequenceProtocol
    identity: dict[str, Any]
    probe: Probe = probe_distribution


@dataclass(frozen=True)
class Collect:
    """Rank 0's command: collect your share (chunks i with i mod N == rank) of `chunks`, each with
    `work(sut, protocol, prompt_ids, chunk)` (the kind's: `collect_chunk` of `Chunk`s by default,
    `sample_batch` of the sequence kind's batches)."""

    protocol: Any  # a distribution Protocol, or a SequenceProtocol
    prompt_ids: tuple[Any, ...]  # the prompt's ids (distribution), or every prompt's (sequence)
    chunks: tuple[Any, ...]
    work: Work = collect_chunk


@dataclass(frozen=True)
class Dismiss:
    """Rank 0's last command: exit with `code`."""

    code: int


@dataclass(frozen=True)
class Failure:
    """What a rank sends instead of its chunk when collecting it raised."""

    rank: int
    call: str
    message: str
    details: str
    interrupted: bool = False

    def raised(self) -> SUTRaised:
        return SUTRaised(f"{self.call} on rank {self.rank}", self.message, self.details)


@dataclass(frozen=True)
class Refusal:
    """What a rank sends at `Open` instead of building its adapter: its adapter differs from rank 0's,
    or its host lacks the protocol's device (`line` names the rank and the difference)."""

    rank: int
    line: str


class RankRefused(Exception):
    """A rank's specval or adapter differs from rank 0's, or its host lacks the protocol's device:
    the run ends before any seed is claimed, exit 2 (the hosts' installations disagree with the
    command), with the one line it carries."""


class TorchMissing(RuntimeError):
    """torch is not installed: a multi-process run cannot join its processes. A RuntimeError, as a
    group that cannot be joined is (the run exits 2 with one line, nothing claimed)."""


class RankLost(KeyboardInterrupt):
    """A collective failed: another rank is gone (killed, interrupted) or timed out. It ends the run
    as an interrupt (exit 130, the bundle kept for --resume)."""


# ---------------------------------------------------------------- the group


def from_environment(environ: dict[str, str]) -> ShardGroup | None:
    """The shard group torchrun describes in `environ` (RANK, WORLD_SIZE, LOCAL_RANK); None for a
    one-process run (WORLD_SIZE unset or 1)."""
    size = int(environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return None
    rank = int(environ["RANK"])
    return ShardGroup(rank, size, int(environ.get("LOCAL_RANK", str(rank))))


def protocol_device(protocol_file: Path) -> str:
    """The `sut.device` of a protocol file of any kind, as written (the default, "cpu", when it
    names none), read by rank 0 alone once the group exists (`use_device` before its adapter is
    built); "cpu" when the file does not read as YAML (rank 0 then reports the error and
    dismisses)."""
    try:
        raw = read_yaml(protocol_file)
    except (ProtocolError, OSError):
        return SutSpec.device
    sut = raw.get("sut") if isinstance(raw, dict) else None
    device = sut.get("device") if isinstance(sut, dict) else None
    return device if isinstance(device, str) else SutSpec.device


def require_torch() -> None:
    """TorchMissing unless torch.distributed can be imported (the `engine` extra)."""
    if _distributed() is None:
        raise TorchMissing(
            f"a multi-process run joins its processes through torch.distributed, and torch is not installed: "
            f"{INSTALL_TORCH}"
        )


def _distributed() -> Any:
    """The module torch.distributed, or None where torch is not installed (a lazy import:
    tests/test_layering.py, TORCH_LAZY)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist


def join(group: ShardGroup) -> None:
    """Initialise the default process group from torchrun's environment (env://) with this host's
    backend (`host_backend`), before any file is read; TorchMissing without torch."""
    require_torch()
    import torch.distributed as dist

    dist.init_process_group(host_backend(), rank=group.rank, world_size=group.size, timeout=GROUP_TIMEOUT)


def host_backend() -> str:
    """The backend of this host's ranks: CUDA_BACKENDS where torch sees CUDA, else CPU_BACKEND. Both
    serve a CPU and a CUDA protocol alike (the run's collectives move CPU objects through gloo)."""
    import torch

    return CUDA_BACKENDS if torch.cuda.is_available() else CPU_BACKEND


def use_device(device: str, group: ShardGroup) -> None:
    """For a protocol on `device` CUDA: make cuda:LOCAL_RANK this process's current device (captured
    graphs and Triton launch on the current device); nothing for the CPU. RankRefused naming the
    rank when this host has no such GPU (or torch without CUDA)."""
    if not device.startswith(CUDA_PREFIX):
        return
    import torch

    found = torch.cuda.device_count()  # 0 without CUDA (a CPU build of torch, no driver)
    if group.local_rank >= found:
        raise RankRefused(
            f"rank {group.rank}: the protocol runs on {device} and this host has {found} GPU(s), "
            f"no {CUDA_PREFIX}:{group.local_rank}"
        )
    torch.cuda.set_device(group.local_rank)


def leave() -> None:
    dist = _distributed()
    if dist is not None and dist.is_initialized():
        dist.destroy_process_group()


def place(protocol: Protocol, group: ShardGroup) -> Protocol:
    """The protocol as this rank runs it: a CUDA device becomes cuda:LOCAL_RANK. The hash is the
    protocol's own (pinned through `file_hash`), so run.json and the manifest record the protocol as
    written."""
    if not protocol.sut.device.startswith(CUDA_PREFIX):
        return protocol
    sut = dataclasses.replace(protocol.sut, device=f"{CUDA_PREFIX}:{group.local_rank}")
    return dataclasses.replace(protocol, sut=sut, file_hash=protocol.hash)


def _collective(operation: Callable[[], Any]) -> Any:
    """Run one collective; its failure (a rank gone, the timeout) becomes RankLost."""
    try:
        return operation()
    except RuntimeError as err:  # DistBackendError and DistNetworkError are RuntimeErrors
        leave()  # a broken group takes no further collective (`dismiss` then sends nothing)
        raise RankLost(f"a rank of the process group is gone: {err}") from err


def _broadcast(value: Any = None) -> Any:
    import torch.distributed as dist

    box = [value]
    _collective(lambda: dist.broadcast_object_list(box, src=LEADER))
    return box[0]


def _gather(value: Any, group: ShardGroup) -> list[Any] | None:
    import torch.distributed as dist

    out = [None] * group.size if group.is_leader else None
    _collective(lambda: dist.gather_object(value, out, dst=LEADER))
    return out


# ---------------------------------------------------------------- the same code on every rank


def greet(group: ShardGroup) -> str | None:
    """Every rank, right after `join`: rank 0 sends its specval's `harness_identity` (a dict of
    strings: readable whatever specval a rank runs) and every other rank answers with the line of
    its difference, or None. Rank 0 raises RankRefused naming the lowest differing rank; another
    rank returns its own line (None: the same specval) and waits for rank 0's commands, as every
    rank does (rank 0 dismisses them all with exit 2)."""
    theirs = _broadcast(harness_identity().to_dict() if group.is_leader else None)
    line = None if group.is_leader else _difference(group.rank, "", harness_identity().to_dict(), theirs)
    answers = _gather(line, group)
    if group.is_leader:
        _refuse(answers)
    return line


def _difference(rank: int, subject: str, mine: dict[str, Any], leaders: dict[str, Any]) -> str | None:
    """The line of a rank whose code (the identity record `mine`) differs from rank 0's, else None:
    `rank R: <subject>specval 0.9.1 (digest ab12cd34ef56) differs from rank 0's specval 0.9.2 (...)`."""
    if same_code(mine, leaders):
        return None
    return f"rank {rank}: {subject}{brief_record(mine)} differs from rank 0's {brief_record(leaders)}"


def _refuse(answers: list[Any]) -> None:
    """RankRefused with the lowest rank's line among `answers` (a line or a Refusal), if any."""
    lines = [a.line if isinstance(a, Refusal) else a for a in answers if isinstance(a, (str, Refusal))]
    if lines:
        raise RankRefused(lines[0])


# ---------------------------------------------------------------- one round of chunks


def _share(chunks: tuple[Any, ...] | list[Any], first: int, rank: int) -> Any:
    """The chunk of `rank` in the round that starts at index `first` (None: the list ran out)."""
    index = first + rank
    return chunks[index] if index < len(chunks) else None


def _attempt(
    sut: Any, command: Collect, prompt_ids: list[Any], chunk: Any, rank: int
) -> tuple[Any, pd.DataFrame] | Failure | None:
    """A serving rank collects one chunk of `command` (None: none this round); an exception
    becomes a Failure, so that every rank reaches the gather."""
    if chunk is None:
        return None
    try:
        return chunk, command.work(sut, command.protocol, prompt_ids, chunk)
    except SUTRaised as err:
        return Failure(rank, err.call, err.message, err.details)
    except KeyboardInterrupt:
        return Failure(rank, "collect", "interrupted", "", interrupted=True)
    except Exception as err:  # noqa: BLE001 - anything raised while collecting ends the run with exit 3
        return _failure(rank, "collect", err)


def _failure(rank: int, call: str, err: BaseException) -> Failure:
    details = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    return Failure(rank, call, f"{type(err).__name__}: {err}", details)


def sampler(group: ShardGroup, work: Work = collect_chunk) -> Callable[[SUT, Any, Any, list[Any], Keep], None]:
    """Rank 0's `collect.ChunkSampler` (with `work`: the sequence kind's `BatchSampler`): the chunks
    shared by every rank, round by round, each made by `work` on the rank it falls to. Rank 0
    keeps (writes) a round's chunks in a writer thread while every rank collects the next round,
    so the writes do not serialise the ranks. A round's first failure (rank 0's own exception, else
    the lowest failed rank's as SUTRaised or KeyboardInterrupt, else the failed write of the round
    before) is raised once every rank knows that the run stops; a write that fails in the last
    round is raised once the other ranks are back waiting for a command."""

    def sample(sut: SUT, protocol: Any, prompt_ids: Any, chunks: list[Any], keep: Keep) -> None:
        command = Collect(protocol, tuple(prompt_ids), tuple(chunks), work)
        _broadcast(command)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="specval-writer") as writer:
            written: Future | None = None
            for first in range(0, len(chunks), group.size):
                results, error = _lead_round(group, sut, command, _share(chunks, first, LEADER))
                if error is None and written is not None:
                    error = written.exception()  # waits for the round before, written while this one ran
                _broadcast(error is None)
                if error is not None:
                    raise error
                written = writer.submit(_keep_all, keep, results)
        if written is not None and written.exception() is not None:
            raise written.exception()

    return sample


def _lead_round(group: ShardGroup, sut: SUT, command: Collect, chunk: Any) -> tuple[list[Any], BaseException | None]:
    """Rank 0's part of one round of `command`: collect its chunk and gather every rank's; returns
    the gathered results and the round's failure (rank 0's own first, else the lowest failed
    rank's)."""
    error: BaseException | None = None
    try:
        prompt_ids = list(command.prompt_ids)
        mine = None if chunk is None else (chunk, command.work(sut, command.protocol, prompt_ids, chunk))
    except BaseException as err:  # noqa: BLE001 - told to every rank, then raised
        mine, error = None, err
    results = _gather(mine, group)
    failures = [r for r in results if isinstance(r, Failure)]
    if error is None and failures:
        error = KeyboardInterrupt() if failures[0].interrupted else failures[0].raised()
    return results, error


def _keep_all(keep: Keep, results: list[Any]) -> None:
    for result in results:
        if result is not None:
            keep(*result)


# ---------------------------------------------------------------- the other ranks


def open_ranks(group: ShardGroup, protocol: Any, probe: Probe = probe_distribution) -> None:
    """Rank 0, once its own adapter passed the preflight and before any seed is claimed: every other
    rank checks that its adapter's identity is rank 0's, then builds its adapter on its own device
    and probes it with `probe` (the kind's; `preflight.probe` by default). The lowest refusing rank
    (a different adapter, no such GPU) is raised as RankRefused (exit 2), else the lowest failed
    rank's exception as SUTRaised (exit 3); nothing is claimed either way."""
    _broadcast(Open(protocol, sut_identity(protocol.sut.adapter), probe))
    answers = _gather(None, group)
    _refuse(answers)
    failures = [r for r in answers if isinstance(r, Failure)]
    if failures:
        raise failures[0].raised()


def serve(group: ShardGroup, sut_factory: SutFactory | None = None) -> int:
    """The loop of a rank other than 0 (after `greet`): at `Open`, compare its adapter's identity
    with rank 0's and build and probe it; collect its share of each `Collect`, until `Dismiss`;
    returns the exit code rank 0 sent."""
    sut = None
    try:
        while True:
            command = _broadcast()
            if isinstance(command, Dismiss):
                return command.code
            protocol = place(command.protocol, group)
            if isinstance(command, Open):
                sut, answer = _open(protocol, command, sut_factory, group)
                _gather(answer, group)
            else:
                _serve_collect(group, sut, dataclasses.replace(command, protocol=protocol))
    finally:
        if sut is not None:
            sut.close()


def _open(
    protocol: Any, command: Open, sut_factory: SutFactory | None, group: ShardGroup
) -> tuple[Any, Failure | Refusal | None]:
    """This rank's adapter, checked against rank 0's identity (`command.identity`), on its device,
    built and probed with `command.probe`; or None and the refusal (nothing built) or the failure."""
    rank = group.rank
    mine = sut_identity(protocol.sut.adapter)
    line = _difference(rank, f"adapter {protocol.sut.adapter}: ", mine, command.identity)
    if line is not None:
        return None, Refusal(rank, line)
    try:
        use_device(protocol.sut.device, group)
    except RankRefused as err:
        return None, Refusal(rank, str(err))
    try:
        sut = open_guarded(sut_factory or open_sut, protocol)
    except SUTRaised as err:
        return None, Failure(rank, err.call, err.message, err.details)
    except SUTError as err:
        return None, _failure(rank, "the adapter's constructor", err)
    try:
        command.probe(sut, protocol)
    except SUTRaised as err:
        sut.close()
        return None, Failure(rank, err.call, err.message, err.details)
    except Exception as err:  # noqa: BLE001 - a probe's refusal on this rank ends the run before any claim
        sut.close()
        return None, _failure(rank, "the probe", err)
    return sut, None


def _serve_collect(group: ShardGroup, sut: Any, command: Collect) -> None:
    """Take part in every round of one `Collect` (its protocol placed on this rank's device)."""
    prompt_ids = list(command.prompt_ids)
    for first in range(0, len(command.chunks), group.size):
        _gather(_attempt(sut, command, prompt_ids, _share(command.chunks, first, group.rank), group.rank), group)
        if not _broadcast():
            return


def dismiss(code: int) -> None:
    """Rank 0, as it exits: send every other rank its exit code. A group already broken (a rank
    gone) is left as it is: torchrun ends the remaining ranks once rank 0 exits."""
    dist = _distributed()
    if dist is None or not dist.is_initialized():
        return
    with contextlib.suppress(RankLost):
        _broadcast(Dismiss(code))


# ---------------------------------------------------------------- the launcher


def launch(devices: int, argv: list[str]) -> int:
    """Run `torchrun --standalone --nproc-per-node DEVICES -m specval ARGV` through torch's own
    launcher (torch.distributed.run) in this process; returns rank 0's exit code (130 when the
    launcher itself is interrupted: it forwards the signal to every rank, and rank 0 keeps the
    bundle and prints how to resume it). Without torch: one line on stderr naming the extra to
    install, and EXIT_INPUT (nothing was launched or claimed)."""
    try:
        require_torch()
    except TorchMissing as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_INPUT
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = torchrun.parse_args(["--standalone", f"--nproc-per-node={devices}", "-m", "specval", *argv])
    try:
        torchrun.run(args)
    except ChildFailedError as err:
        return exit_code({rank: failure.exitcode for rank, failure in err.failures.items()})
    except (SignalException, KeyboardInterrupt):  # the launcher got SIGINT/SIGTERM and passed it to the ranks
        return EXIT_INTERRUPTED
    return 0


def exit_code(codes: dict[int, int]) -> int:
    """The run's exit code from the failed ranks' exit codes (negative: killed by that signal):
    rank 0's own; else another rank's (each exits with rank 0's code when dismissed); else, every
    failed rank killed by a signal, EXIT_INTERRUPTED."""
    if codes.get(LEADER, -1) >= 0:
        return codes[LEADER]
    exited = [code for _, code in sorted(codes.items()) if code >= 0]
    return exited[0] if exited else EXIT_INTERRUPTED
