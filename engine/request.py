"""A request's lifecycle state and the output handed back to the caller."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine.params import SamplingParams

SOURCES = ("plain", "accepted", "correction", "bonus")
FINISH_REASONS = ("stop", "length", "abort", "error")


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True)
class RequestOutput:
    """A finished request.

    `token_ids` are the generated tokens (a stop token, when one ends the request, is included);
    `token_sources[i]` says how token i was produced: "plain" (nospec), "accepted" (a draft that
    passed its accept test), "correction" (drawn at the stop point after a rejection) or "bonus"
    (drawn from the target after every draft was accepted, also the only token of a K_r = 0 round).
    `seed` is the request's RNG stream (None for greedy requests without a seed).
    """

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    token_sources: list[str]
    finish_reason: str
    seed: int | None
    num_rounds: int
    num_draft_tokens: int
    num_accepted_tokens: int


@dataclass(eq=False)
class Request:
    """Mutable engine-side state of one request (owned by the scheduler).

    Invariant between steps: every depth holds valid KV for positions 0..len(token_ids)-2; the
    last committed token is the input of the request's next step.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int | None
    num_depths: int
    token_ids: list[int] = field(default_factory=list)  # prompt + committed generated tokens
    token_sources: list[str] = field(default_factory=list)
    block_tables: list[list[int]] = field(default_factory=list)  # one per depth
    num_reserved_blocks: int = 0
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    num_rounds: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)
        self.block_tables = [[] for _ in range(self.num_depths)]

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def num_remaining(self) -> int:
        return self.params.max_tokens - self.num_generated

    @property
    def num_computed(self) -> int:
        """Positions whose KV is valid at every depth (all committed tokens but the last)."""
        return len(self.token_ids) - 1

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def to_output(self) -> RequestOutput:
        return RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=list(self.prompt_token_ids),
            token_ids=self.token_ids[len(self.prompt_token_ids) :],
            token_sources=list(self.token_sources),
            finish_reason=self.finish_reason,
            seed=self.seed,
            num_rounds=self.num_rounds,
            num_draft_tokens=self.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens,
        )
