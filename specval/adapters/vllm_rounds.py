"""Token sources of one vLLM request, from its per-request speculative-decoding metrics.

vLLM (0.32, `per_request_spec_decode_metrics="detailed"`) reports, for each verify step of a request
that had drafts, the drafts it proposed and how many of them were accepted
(`RequestSpecDecodeMetrics.per_step_drafted` / `per_step_accepted`, in order); a step without drafts
is not recorded. The tokens of a request are then, in order:

- the first token, sampled from p by the prefill step (no draft exists yet): "plain";
- per step: if the step had d > 0 drafts of which a were accepted, a "accepted" tokens and then one
  token that is a "correction" (drawn from max(p - q, 0) after a rejection) when a < d, or a "bonus"
  (drawn from p after every draft was accepted) when a == d; a step without drafts samples one token
  from p: "plain".

Which steps had drafts is decided by the caller's `drafts_at(num_generated)`: for `ngram`, whether
vLLM's own proposer finds a match in the context at that length; None (a draft model, which drafts
at every step) means every step while recorded steps remain. The recorded steps must account for
every drafted step, and no more: anything else raises SUTError (sources are never guessed). vLLM
cuts a request's output at `max_tokens`, so only the last recorded step may produce more tokens
than the request kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from specval.adapters.rounds import ACCEPTED, BONUS, CORRECTION, PLAIN, RoundTrace
from specval.sut import SUTError


def spec_trace(
    tokens: Sequence[int],
    drafted: Sequence[int],
    accepted: Sequence[int],
    drafts_at: Callable[[int], bool] | None = None,
) -> RoundTrace:
    """Sources and counts of one request's `tokens` (prompt excluded) from its recorded steps."""
    if len(drafted) != len(accepted):
        raise SUTError(f"vLLM reported {len(drafted)} drafted but {len(accepted)} accepted step counts")
    sources, step = [PLAIN] if tokens else [], 0
    while len(sources) < len(tokens):
        if not (step < len(drafted) if drafts_at is None else drafts_at(len(sources))):
            sources.append(PLAIN)
            continue
        if step == len(drafted):
            raise SUTError(
                f"token {len(sources) + 1}: a drafting step that vLLM did not record ({len(drafted)} steps recorded)"
            )
        num_drafts, num_accepted = int(drafted[step]), int(accepted[step])
        if not 0 <= num_accepted <= num_drafts or num_drafts == 0:
            raise SUTError(f"step {step}: {num_accepted} accepted of {num_drafts} drafts")
        sources += [ACCEPTED] * num_accepted + [BONUS if num_accepted == num_drafts else CORRECTION]
        step += 1
    del sources[len(tokens) :]  # the last step's tokens past max_tokens
    if step != len(drafted):
        raise SUTError(
            f"vLLM's {len(drafted)} recorded steps do not account for the {len(tokens)} tokens "
            f"({step} steps used, {len(sources)} tokens attributed)"
        )
    return RoundTrace(
        tuple(int(t) for t in tokens), tuple(sources), len(drafted), int(sum(drafted)), int(sum(accepted))
    )
