"""`python -m specval ...` (and `torchrun ... -m specval run ...`): the specval command line."""

from specval.cli import main

main(prog_name="specval")
