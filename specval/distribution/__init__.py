"""Distribution runs: a protocol without `kind` tests that speculative decoding keeps the target's
output law (goodness of fit, homogeneity, quadrature of the accept rule).

    runner     the run: seeds -> collect -> reference -> quadrature -> verdict -> report -> bundle
    analysis   what the run makes of its samples: reference, quadrature, stage 2, summary.json
    laws       what the analysis asks of the SUT: reference laws, swept laws of its accept kernel
    stages     a bundle's summary from its files alone, stage by stage (`recompute`, for verify)
    collect    samples in chunks (parquet) from the SUT
    looks      sequential looks: a stage collected and decided look by look
    reference  exact float64 laws of the occurring prefixes
    verdict    one stage's summary: every criterion, decided
    strata     a group's samples as the statistics see them: valid rows, strata, supports
    criteria   the p-valued criteria (gof, homogeneity): levels, MDEs, coverage
    checks     the deterministic criteria: validity, the quadrature of the accept rule
    decision   Holm, the run verdict, two-stage confirmation
    plan       sample sizes and MDEs of a protocol
    sharding   a run spread over several processes (torchrun)
    calibrate  A/A calibration of the false-FAIL rates
    mutate     the kill table of planted bugs
"""
