"""Adapters that misbehave on purpose, for the fault tests (tests/specval/test_faults_run.py).

Each is the exact FakeSUT with one fault. Faults that must go away for a resume to succeed are
switched by environment variables, read when the adapter is built (no module-level state):
- FAULT_RAISE_AT_CALL=N: `RaisingSUT.sample` raises at its N-th call (the probe makes one call per
  group first);
- FAULT_SLEEP_S=x: `SlowSUT.sample` sleeps x seconds per call (a run long enough to interrupt);
- FAULT_RAISE_ON_RANK=r with FAULT_RAISE_AT_CALL=N: `RankRaisingSUT.sample` raises at its N-th call
  in the process of rank r of a multi-rank run (RANK, set by torchrun) only.
"""

from __future__ import annotations

import os
import time

import numpy as np
from fake_sut import FakeSUT

from specval.sut import Capabilities, SampleBatch


class RaisingSUT(FakeSUT):
    def __init__(self, spec, num_speculative_tokens):
        super().__init__(spec, num_speculative_tokens)
        self.raise_at = int(os.environ.get("FAULT_RAISE_AT_CALL", "0"))

    def sample(self, *args, **kwargs) -> SampleBatch:
        if self.num_sample_calls + 1 == self.raise_at:
            self.num_sample_calls += 1
            raise RuntimeError("planted failure inside the adapter")
        return super().sample(*args, **kwargs)


class RankRaisingSUT(RaisingSUT):
    def __init__(self, spec, num_speculative_tokens):
        super().__init__(spec, num_speculative_tokens)
        if os.environ.get("RANK", "0") != os.environ.get("FAULT_RAISE_ON_RANK"):
            self.raise_at = 0


class SlowSUT(FakeSUT):
    def __init__(self, spec, num_speculative_tokens):
        super().__init__(spec, num_speculative_tokens)
        self.sleep_s = float(os.environ.get("FAULT_SLEEP_S", "0"))

    def sample(self, *args, **kwargs) -> SampleBatch:
        time.sleep(self.sleep_s)
        return super().sample(*args, **kwargs)


class WrongShapeSUT(FakeSUT):
    """Returns one token too few per request."""

    def sample(self, group, prompt_ids, sampling, seeds, num_tokens, max_tokens) -> SampleBatch:
        batch = super().sample(group, prompt_ids, sampling, seeds, num_tokens, max_tokens)
        return SampleBatch(batch.tokens[:, :-1], batch.sources[:, :-1], batch.num_rounds, batch.num_draft_tokens,
                           batch.num_accepted_tokens)


class FloatTokensSUT(FakeSUT):
    """Returns tokens as floats."""

    def sample(self, group, prompt_ids, sampling, seeds, num_tokens, max_tokens) -> SampleBatch:
        batch = super().sample(group, prompt_ids, sampling, seeds, num_tokens, max_tokens)
        return SampleBatch(batch.tokens.astype(np.float64), batch.sources, batch.num_rounds, batch.num_draft_tokens,
                           batch.num_accepted_tokens)


class BrokenConstructorSUT(FakeSUT):
    def __init__(self, spec, num_speculative_tokens):
        raise OSError("planted failure: the model file cannot be opened")


class NoQuadratureSUT(FakeSUT):
    """Declares that it cannot map caller-supplied uniforms to a token."""

    capabilities = Capabilities(modes=("nospec", "sync"), accept_single=False)


class NoTopPSUT(FakeSUT):
    """Declares that it does not honour top-p."""

    capabilities = Capabilities(modes=("nospec", "sync"), sampling=("temperature", "top_k"))
