"""The exit statuses of specval's commands, one meaning each, and the hint that names a kept bundle.

Standard library only: the supervisor (`specval.supervisor`) decides a command's status from these
without importing the harness it supervises.

    0  PASS                 a PASS verdict, written and sealed by this run
    1  FAIL                 the verdict (or a bundle that does not verify)
    2  input or usage error nothing was claimed
    3  the system under test raised, exited or crashed (signal) without a verdict
    4  INCONCLUSIVE         the verdict: it could not decide
    5  environment error    the operating system refused the harness (disk full, permissions...)
    130 interrupted         SIGINT or SIGTERM

Guarantee: `verdict_exit` is the only map from a verdict to an exit status, and gives 0 for
"PASS" alone.
"""

from __future__ import annotations

from pathlib import Path

EXIT_PASS, EXIT_FAIL, EXIT_INPUT, EXIT_SUT, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_INCONCLUSIVE, EXIT_ENVIRONMENT = 4, 5
PASS_VERDICT = "PASS"
VERDICT_EXITS = {PASS_VERDICT: EXIT_PASS, "FAIL": EXIT_FAIL, "INCONCLUSIVE": EXIT_INCONCLUSIVE}


def verdict_exit(verdict: object) -> int:
    """The exit code of a written verdict: 0 PASS, 1 FAIL, 4 INCONCLUSIVE; anything else (a harness
    bug) exits 1, never 0."""
    return VERDICT_EXITS.get(verdict, EXIT_FAIL) if isinstance(verdict, str) else EXIT_FAIL


def resume_command(path: Path) -> str:
    """The command that continues the unsealed bundle at `path`."""
    return f"specval run --resume {path}"
