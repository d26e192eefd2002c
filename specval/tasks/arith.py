"""A generated, seeded arithmetic task with tunable difficulty, for paired quality comparisons.

Items are expressions like "47 + 18 - 23" over `num_operands` non-negative integers of up to
`num_digits` digits, joined by operators drawn from `operators`; the answer is the exact integer
value (negative results allowed unless `allow_negative` is false, in which case subtraction
operands are redrawn). Generation is a pure function of the config: numpy's PCG64 seeded with
(seed, stream), stream 0 for the test items and stream 1 for the few-shot examples, so the two
never share draws.

Prompt (few-shot, plain text): "Q: What is 12 + 7?\\nA: 19\\n\\n" repeated `num_shots` times, then
"Q: What is <item>?\\nA:". Scoring: the first integer (optional minus sign, commas allowed as
thousands separators) in the completion cut at the first blank line; no integer scores wrong.

Difficulty: the defaults (one-digit operands, + and -, two operands, three shots, plain prompt) put
SmolLM2-135M-Instruct in the 30-70% band that paired comparisons need (greedy, fp32: 21 of the
first 40 seed-0 items); two-digit addition drops it to ~18%, and its chat prompt scores lower than
the plain one. The table is in docs/real-model.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

OPERATORS = ("+", "-")
ITEM_STREAM, SHOT_STREAM = 0, 1
STOP_SEQUENCES = ("\n\n", "Q:")
ANSWER_PATTERN = re.compile(r"-?\d[\d,]*")


@dataclass(frozen=True)
class ArithConfig:
    """Task definition; every field changes the items, so protocols record all of them."""

    num_items: int = 100
    num_digits: int = 1  # operands are drawn uniformly from [0, 10**num_digits)
    num_operands: int = 2
    operators: tuple[str, ...] = ("+", "-")
    allow_negative: bool = False  # False: redraw until every prefix result is >= 0
    num_shots: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        limits = {
            "num_items": (1, 100_000),
            "num_digits": (1, 9),
            "num_operands": (2, 8),
            "num_shots": (0, 16),
            "seed": (0, 2**63 - 1),
        }
        for name, (low, high) in limits.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"ArithConfig.{name} must be an int in [{low}, {high}], got {value!r}")
        if not self.operators or any(op not in OPERATORS for op in self.operators):
            raise ValueError(f"ArithConfig.operators must be a non-empty subset of {OPERATORS}, got {self.operators!r}")


@dataclass(frozen=True)
class ArithItem:
    index: int
    expression: str  # e.g. "47 + 18 - 23"
    answer: int


def evaluate(expression: str) -> int:
    """Left-to-right value of "a op b op c ..." with op in OPERATORS (no eval)."""
    tokens = expression.split()
    if len(tokens) % 2 == 0 or any(op not in OPERATORS for op in tokens[1::2]):
        raise ValueError(f"expression must be 'n (op n)*' with op in {OPERATORS}, got {expression!r}")
    value = int(tokens[0])
    for op, operand in zip(tokens[1::2], tokens[2::2]):
        value = value + int(operand) if op == "+" else value - int(operand)
    return value


def _draw(rng: np.random.Generator, config: ArithConfig) -> str:
    while True:
        numbers = rng.integers(0, 10**config.num_digits, size=config.num_operands)
        ops = rng.choice(len(config.operators), size=config.num_operands - 1)
        parts = [str(int(numbers[0]))]
        for op_index, number in zip(ops, numbers[1:]):
            parts += [config.operators[int(op_index)], str(int(number))]
        expression = " ".join(parts)
        prefixes = [evaluate(" ".join(parts[:end])) for end in range(1, len(parts) + 1, 2)]
        if config.allow_negative or min(prefixes) >= 0:
            return expression


def _generate(config: ArithConfig, stream: int, count: int) -> tuple[ArithItem, ...]:
    rng = np.random.default_rng([config.seed, stream])
    expressions = [_draw(rng, config) for _ in range(count)]
    return tuple(ArithItem(index=i, expression=e, answer=evaluate(e)) for i, e in enumerate(expressions))


def generate(config: ArithConfig) -> tuple[ArithItem, ...]:
    """The test items (deterministic in `config`)."""
    return _generate(config, ITEM_STREAM, config.num_items)


def shots(config: ArithConfig) -> tuple[ArithItem, ...]:
    """The few-shot examples (a separate stream from the items)."""
    return _generate(config, SHOT_STREAM, config.num_shots)


def question(item: ArithItem) -> str:
    return f"Q: What is {item.expression}?\nA:"


def prompt(item: ArithItem, config: ArithConfig) -> str:
    """Few-shot plain-text prompt ending in 'A:'; the completion should start with ' <answer>'."""
    examples = "".join(f"{question(shot)} {shot.answer}\n\n" for shot in shots(config))
    return examples + question(item)


def chat_messages(item: ArithItem, config: ArithConfig) -> list[dict[str, str]]:
    """The same few shots as chat turns, then the item; the reply should be the number alone."""
    messages = []
    for shot in shots(config):
        messages += [
            {"role": "user", "content": f"What is {shot.expression}? Reply with the number only."},
            {"role": "assistant", "content": str(shot.answer)},
        ]
    return messages + [{"role": "user", "content": f"What is {item.expression}? Reply with the number only."}]


def extract_answer(completion: str) -> int | None:
    """The first integer in the completion before any stop sequence, or None."""
    cut = min((at for at in (completion.find(stop) for stop in STOP_SEQUENCES) if at >= 0), default=len(completion))
    match = ANSWER_PATTERN.search(completion[:cut])
    return int(match.group().replace(",", "")) if match else None


def score(completion: str, item: ArithItem) -> bool:
    return extract_answer(completion) == item.answer
