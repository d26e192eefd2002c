"""Generated arithmetic task: determinism, difficulty knobs, prompt format and scoring.

Deterministic (fixed seeds); no false-fail rate.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from specval.tasks import arith
from specval.tasks.arith import ArithConfig, ArithItem


def test_generation_is_deterministic_and_seed_dependent():
    config = ArithConfig(num_items=50, seed=3)
    assert arith.generate(config) == arith.generate(ArithConfig(num_items=50, seed=3))
    assert arith.generate(config) != arith.generate(replace(config, seed=4))
    assert arith.generate(replace(config, num_items=10)) == arith.generate(config)[:10]  # prefix-stable


def test_answers_are_exact_and_difficulty_knobs_apply():
    config = ArithConfig(num_items=200, num_digits=3, num_operands=4, operators=("+", "-"), seed=1)
    for item in arith.generate(config):
        numbers = [int(n) for n in item.expression.split()[::2]]
        assert len(numbers) == 4 and all(0 <= n < 1000 for n in numbers)
        assert item.answer == eval(item.expression)  # independent check of `evaluate` (trusted input)
        assert item.answer >= 0
    negative = ArithConfig(num_items=200, operators=("-",), allow_negative=True)
    assert any(item.answer < 0 for item in arith.generate(negative))
    assert all("+" not in item.expression for item in arith.generate(negative))


def test_shots_are_a_separate_stream():
    config = ArithConfig(num_items=5, num_shots=3)
    items, shots = arith.generate(config), arith.shots(config)
    assert len(shots) == 3 and [s.expression for s in shots] != [i.expression for i in items[:3]]


def test_prompt_format():
    config = ArithConfig(num_items=2, num_shots=2)
    item = arith.generate(config)[1]
    text = arith.prompt(item, config)
    shot = arith.shots(config)[0]
    assert text.startswith(f"Q: What is {shot.expression}?\nA: {shot.answer}\n\n")
    assert text.endswith(f"Q: What is {item.expression}?\nA:") and text.count("Q:") == 3
    messages = arith.chat_messages(item, config)
    assert [m["role"] for m in messages] == ["user", "assistant"] * 2 + ["user"]
    assert messages[1]["content"] == str(shot.answer)


@pytest.mark.parametrize(
    "completion, expected",
    [
        (" 42", 42),
        (" 42\n\nQ: What is 1 + 1?\nA: 2", 42),
        (" -7 is the answer", -7),
        ("The answer is 1,234.", 1234),
        (" \n\n42", None),
        ("forty-two", None),
        (" 4 2", 4),
    ],
)
def test_extract_answer(completion, expected):
    assert arith.extract_answer(completion) == expected


def test_score():
    item = ArithItem(index=0, expression="47 + 18 - 23", answer=42)
    assert arith.evaluate(item.expression) == 42
    assert arith.score(" 42", item) and not arith.score(" 41", item) and not arith.score("", item)


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_items", 0),
        ("num_digits", 10),
        ("num_operands", 1),
        ("operators", ("*",)),
        ("seed", -1),
        ("num_shots", True),
    ],
)
def test_bad_config_names_field(field, value):
    with pytest.raises(ValueError, match=field):
        ArithConfig(**{field: value})


def test_evaluate_rejects_malformed_expressions():
    with pytest.raises(ValueError, match="expression"):
        arith.evaluate("1 * 2")
