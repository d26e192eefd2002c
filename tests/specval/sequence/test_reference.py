"""The reference replay in chunks: one batched call per chunk of a collected batch, every row checked.

Deterministic (ChainSUT's exact chain, fixed seeds): the parts of a group do not depend on how its
sequences are chunked, a batched answer of the wrong shape or with a bad row is SUTRaised naming the
call and the sequence, and the default batched call (per row) names the per-row method.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from specval.preflight import GuardedSUT, SUTRaised
from specval.protocol import SutSpec
from specval.protocol.sections import SamplingSpec
from specval.semantics import DEFAULT_SEMANTICS
from specval.sequence import reference, workers
from specval.sequence.protocol import load_sequence_protocol, resolve
from tests.fixtures.chain_sut import VOCAB, ChainSUT
from tests.fixtures.sequence_protocol import write_sequence_protocol

LENGTH, BATCH, SEQUENCES = 12, 4, 16
GROUPS = [{"name": "sync", "mode": "sync"}]
TESTS = [{"kind": "pit", "role": "primary"}, {"kind": "source", "role": "primary"}]


@pytest.fixture
def setting(tmp_path):
    path = write_sequence_protocol(
        tmp_path,
        prompts=["alpha", "beta"],
        groups=GROUPS,
        tests=TESTS,
        sequences_per_group=SEQUENCES,
        batch_size=BATCH,
        sequence_length=LENGTH,
        profiles={},
    )
    protocol = resolve(load_sequence_protocol(path), None)
    sut = ChainSUT(SutSpec(adapter="chain"), protocol.num_speculative_tokens)
    prompt_ids = [sut.encode(text) for text in protocol.prompts]
    rows = []
    for b in range(SEQUENCES // BATCH):
        seeds = np.arange(b * BATCH, (b + 1) * BATCH)
        batch = sut.sample(protocol.group("sync"), prompt_ids[b % 2], protocol.sampling, seeds, LENGTH, LENGTH)
        for slot, seed in enumerate(seeds):
            for i in range(LENGTH):
                rows.append((b, slot, seed, b % 2, i, batch.tokens[slot, i], batch.sources[slot, i]))
    samples = pd.DataFrame(rows, columns=["batch", "slot", "seed", "prompt", "index", "token", "source"])
    return protocol, sut, prompt_ids, samples


def test_chunks_keep_batches_apart_and_bound_every_call(monkeypatch, setting):
    protocol, sut, _, samples = setting
    whole = reference.chunks(samples, LENGTH, VOCAB)
    assert [c.rows.tolist() for c in whole] == [list(range(b * BATCH, (b + 1) * BATCH)) for b in range(4)]
    assert [c.prompt for c in whole] == [0, 1, 0, 1]
    monkeypatch.setattr(reference, "REPLAY_VALUES", 3 * LENGTH * VOCAB - 1)  # two rows a call
    split = reference.chunks(samples, LENGTH, VOCAB)
    assert [c.rows.tolist() for c in split] == [[r, r + 1] for r in range(0, SEQUENCES, 2)]
    assert [c.prompt for c in split] == [0, 0, 1, 1, 0, 0, 1, 1]


def test_parts_do_not_depend_on_the_chunking(monkeypatch, setting):
    protocol, sut, prompt_ids, samples = setting
    whole = reference.build_group(sut, protocol, prompt_ids, samples, DEFAULT_SEMANTICS, "sync", True)
    monkeypatch.setattr(reference, "REPLAY_VALUES", 1)  # one row a call
    single = reference.build_group(sut, protocol, prompt_ids, samples, DEFAULT_SEMANTICS, "sync", True)
    pd.testing.assert_frame_equal(whole, single)
    assert set(reference.SOURCE_COLUMNS) <= set(whole.columns) and len(whole) == SEQUENCES * LENGTH


def test_parts_do_not_depend_on_the_threads(monkeypatch, setting):
    protocol, sut, prompt_ids, samples = setting
    monkeypatch.setattr(reference, "REPLAY_VALUES", 1)  # one row a chunk: 16 jobs
    monkeypatch.setattr(workers, "count", lambda: 1)
    serial = reference.build_group(sut, protocol, prompt_ids, samples, DEFAULT_SEMANTICS, "sync", True)
    monkeypatch.setattr(workers, "count", lambda: 3)  # 6 jobs queued at most: the queue fills
    threaded = reference.build_group(sut, protocol, prompt_ids, samples, DEFAULT_SEMANTICS, "sync", True)
    pd.testing.assert_frame_equal(serial, threaded)


def test_companion_status_by_sampling_equals_the_per_row_status(setting):
    protocol, *_ = setting
    rng = np.random.default_rng(7)
    count, vocab = 9, 16
    logits = rng.normal(size=(count, LENGTH, vocab)).astype(np.float32)
    logits[1, 3, 5] = logits[1, 3].max() + 1e-7  # a near tie: BOUNDARY for a greedy row taking another token
    rows = rng.integers(0, vocab, size=(count, LENGTH))
    rows[1, 3] = int(np.argsort(logits[1, 3])[-2])
    samplings = (SamplingSpec(temperature=0.0), SamplingSpec(temperature=0.6, top_k=5))
    which = np.arange(count) % 2
    together = reference.chunk_companion_status(logits, rows, which, samplings, protocol, DEFAULT_SEMANTICS)["status"]
    single = np.concatenate(
        [
            reference.companion_status(
                logits[r], rows[r], samplings[which[r]], protocol.support_tolerance, DEFAULT_SEMANTICS
            )
            for r in range(count)
        ]
    )
    np.testing.assert_array_equal(together, single)
    assert {reference.IN_SUPPORT, reference.OUT_OF_SUPPORT} <= set(single.tolist())


class BatchedChain(ChainSUT):
    """ChainSUT answering the batched call itself, with one planted fault (`fault`)."""

    fault = ""

    def target_logits_along_batch(self, prompt_ids, token_rows):
        out = np.stack([self.target_logits_along(prompt_ids, list(row)) for row in token_rows])
        if self.fault == "shape":
            return out[:, :-1]
        if self.fault == "nan":
            out[2, 5, 7] = np.nan
        if self.fault == "rows":
            return list(out[:-1])
        return out


@pytest.mark.parametrize(
    ("fault", "words"),
    [
        ("shape", ["target_logits_along_batch (group 'sync', 4 sequences)", "expected float[4, 12, 24]"]),
        ("nan", ["target_logits_along_batch (group 'sync', sequence 2)", "position 5, token 7: nan"]),
        ("rows", ["returned 3 rows, expected 4"]),
    ],
)
def test_a_bad_batched_answer_names_the_call_and_the_sequence(setting, fault, words):
    protocol, _, prompt_ids, samples = setting
    sut = BatchedChain(SutSpec(adapter="chain"), protocol.num_speculative_tokens)
    sut.fault = fault
    with pytest.raises(SUTRaised) as caught:
        reference.build_group(GuardedSUT(sut), protocol, prompt_ids, samples, DEFAULT_SEMANTICS, "sync")
    assert all(word in str(caught.value) for word in words), str(caught.value)
    sut.fault = ""
    healthy = reference.build_group(GuardedSUT(sut), protocol, prompt_ids, samples, DEFAULT_SEMANTICS, "sync")
    assert (healthy["status"] == reference.IN_SUPPORT).all()
