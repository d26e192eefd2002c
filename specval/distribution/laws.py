"""Laws: what the analysis asks of the SUT beside its samples, exact laws replayed through it.

- the reference (reference.json): the exact float64 target law of every prefix that occurs in a
  stage's samples, from the SUT's target logits under its declared filter semantics
  (`specval.distribution.reference`);
- the quadrature laws (quadrature.json): the swept single-draft output law of the SUT's accept
  kernel on p and q from the model at the prompt, on synthetic adversarial pairs and on the
  stop-point case (`specval.stats.quadrature`), judged by `specval.distribution.checks`.

Both run on the SUT's device; `specval verify` reads the stored files instead.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from specval import bundle as bundles
from specval.distribution import collect
from specval.distribution.checks import STOP_POINT
from specval.distribution.criteria import applicable_groups
from specval.distribution.reference import Reference, build_reference, draft_law, needed_prefixes, point_mass, transform
from specval.protocol import Protocol
from specval.stats import quadrature
from specval.stats.quadrature import adversarial_pairs
from specval.sut import DRAFT_GREEDY, SUT, capabilities_of

ADVERSARIAL_VOCAB = 16  # vocabulary of the synthetic adversarial (p, q) pairs
ADVERSARIAL_SEED = 0  # fixed: the adversarial pairs are part of the protocol, not of the run
QUADRATURE_GRID_SIZE = quadrature.GRID_SIZE  # rows per sweep: resolution 1/G per token
QUADRATURE_ZERO_TOKENS = 2  # zero-mass tokens kept next to the supports (zeros stay exercised)


# ---------------------------------------------------------------- quadrature


def quadrature_laws(sut: SUT, protocol: Protocol, prompt_ids: list[int]) -> dict[str, list[dict]]:
    """Swept single-draft laws of the SUT's accept kernel: p, q from the model at the prompt (per
    speculative group's draft depth; groups with equal q share one sweep), the synthetic
    adversarial pairs, and the stop-point case (key STOP_POINT). q is built as the SUT drafts
    (`Capabilities.draft_kind`, `reference.draft_law`); for a greedy SUT every q, the synthetic
    ones included, is a point mass at its argmax, and the sweep then checks that the kernel emits
    exactly p from a point-mass draft."""
    tests = [t for t in protocol.tests if t.kind == "quadrature"]
    if not tests:
        return {}
    laws, swept = {}, {}
    capabilities = capabilities_of(sut)
    semantics, kind = capabilities.semantics, capabilities.draft_kind
    p = transform(sut.target_logits(prompt_ids), protocol.sampling, semantics).astype(sut.prob_dtype)
    for name in applicable_groups(protocol, tests[0]):
        q = draft_law(sut.draft_logits(protocol.group(name), prompt_ids), protocol.sampling, semantics, kind).astype(
            sut.prob_dtype
        )
        if q.tobytes() not in swept:
            swept[q.tobytes()] = _law("model_prompt", p, q, sut, tests[0].tol)
        laws[name] = [swept[q.tobytes()]]
    rng = np.random.default_rng(ADVERSARIAL_SEED)
    laws["adversarial"] = [
        _law(pair.name, pair.p.astype(sut.prob_dtype), _drafted(pair.q, kind).astype(sut.prob_dtype), sut, tests[0].tol)
        for pair in adversarial_pairs(ADVERSARIAL_VOCAB, rng)
    ]
    stop_p, stop_q = quadrature.stop_point_case(sut.prob_dtype)
    laws[STOP_POINT] = [
        {
            "name": "p_zero_at_u_accept_0",
            "kind": STOP_POINT,
            "p": stop_p.astype(np.float64).tolist(),
            "q": stop_q.astype(np.float64).tolist(),
            "first_token": quadrature.stop_point_token(sut.accept_single, sut.prob_dtype),
        }
    ]
    return laws


def _drafted(q: np.ndarray, kind: str) -> np.ndarray:
    """A synthetic q as a SUT of draft kind `kind` drafts: greedy SUTs draft the argmax (a point mass);
    the others draw from q itself."""
    return point_mass(int(np.argmax(q)), q.size) if kind == DRAFT_GREEDY else q


def _law(name: str, p: np.ndarray, q: np.ndarray, sut: SUT, tol: float) -> dict:
    """One sweep on p, q cut to their supports (plus QUADRATURE_ZERO_TOKENS zero-mass tokens)."""
    p_cut, q_cut, tokens = quadrature.restrict_to_support(p, q, QUADRATURE_ZERO_TOKENS)
    result = quadrature.quadrature_check(p_cut, q_cut, sut.accept_single, tol, grid_size=QUADRATURE_GRID_SIZE)
    return {
        "name": name,
        "tokens": tokens.tolist(),
        "prob_dtype": np.dtype(sut.prob_dtype).name,
        "grid_size": result.grid_size,
        "p": np.asarray(p_cut, dtype=np.float64).tolist(),
        "q": np.asarray(q_cut, dtype=np.float64).tolist(),
        "law": result.law.tolist(),
        "error_mass": result.error_mass,
        "num_rows": result.num_rows,
    }


# ---------------------------------------------------------------- reference


def reference_for(sut: SUT, protocol: Protocol, prompt_ids: list[int], tokens: np.ndarray) -> Reference:
    """The reference laws of every prefix that occurs in `tokens` (int64[N, positions]), replayed
    through the SUT's target logits under its declared filter semantics."""
    return build_reference(
        sut.target_logits,
        prompt_ids,
        needed_prefixes(tokens, sut.vocab_size),
        protocol.sampling,
        sut.vocab_size,
        capabilities_of(sut).semantics,
    )


def token_matrix(frame, positions: int) -> np.ndarray:
    """The sampled tokens of a samples table as int64[N, positions]."""
    return frame[collect.token_columns(positions)].to_numpy(dtype=np.int64)


def write_reference(
    directory: Path, sut: SUT, protocol: Protocol, prompt_ids: list[int], samples: pd.DataFrame
) -> None:
    """reference.json of one stage, from the prefixes that occur in its `samples`."""
    reference = reference_for(sut, protocol, prompt_ids, token_matrix(samples, protocol.positions))
    bundles.write_json(directory / bundles.REFERENCE_FILE, reference.to_dict())
