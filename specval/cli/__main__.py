"""`python -m specval.cli ...`: the command line without the console script's guard for a missing
dependency (`python -m specval` has it)."""

from specval.cli import main

if __name__ == "__main__":  # pragma: no cover
    main()
