"""Distribution runs: a protocol without `kind` tests that speculative decoding keeps the target's
output law (goodness of fit, homogeneity, quadrature of the accept rule).

    runner     the run: seeds -> collect -> reference -> quadrature -> verdict -> report -> bundle
    collect    samples in chunks (parquet) from the SUT
    looks      sequential looks: a stage collected and decided look by look
    reference  exact float64 laws of the occurring prefixes
    verdict    criteria, Holm, two-stage confirmation: the summary
    plan       sample sizes and MDEs of a protocol
    sharding   a run spread over several processes (torchrun)
    calibrate  A/A calibration of the false-FAIL rates
    mutate     the kill table of planted bugs
"""
