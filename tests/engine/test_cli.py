"""`python -m engine generate`: prints generations and acceptance stats; bad input exits 2."""

from __future__ import annotations

import re

from engine.__main__ import main


def test_generate_prints_text_and_stats(capsys):
    code = main(
        [
            "generate",
            "--prompt",
            "Return the",
            "--mode",
            "sync",
            "--temperature",
            "1",
            "--top-k",
            "20",
            "--max-tokens",
            "8",
            "--seed",
            "3",
            "-n",
            "2",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("--- seed=") == 2 and "seed=3 " in out and "seed=4 " in out
    stats = re.search(r"tokens=(\d+) rounds=(\d+) drafts=(\d+) accepted=(\d+) acceptance_rate=", out)
    tokens, rounds, drafts, accepted = map(int, stats.groups())
    assert tokens == 16 and 0 <= accepted <= drafts <= 3 * rounds


def test_bad_input_exits_2(capsys):
    assert main(["generate", "--prompt", "x", "--mode", "sync", "--draft-loops", "4"]) == 2
    assert "draft_loops" in capsys.readouterr().err
    assert main(["generate", "--prompt", "", "--mode", "nospec"]) == 2
