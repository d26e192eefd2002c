"""The sequence kind: every committed token of long sequences against the target's conditional law.

protocol    the `kind: sequence` schema (prompts, sequence_length, groups with drafts, tests)
collect     whole sequences per batch (parquet chunks) and the reproducibility re-run
reference   per-token PIT parts from the SUT's target logits along each sequence
verdict     PIT uniformity (pooled, by round position, by round path), serial dependence,
            cross-request independence, reproducibility; Holm per role
looks       sequential looks: batches collected and decided look by look, alpha spent over them
report      report.md / report.html
runner      run, resume, verify, finish
"""
