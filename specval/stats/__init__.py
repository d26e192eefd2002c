"""specval.stats: the statistics of the harness (numpy in, frozen result dataclasses out).

Every result has `to_dict()` giving JSON-safe plain types. Modules, one noun each: pooling
(chi-square cells from expected counts), gof (goodness of fit), homogeneity (two-sample),
aggregate (sum over strata), strata (stratified criteria with small strata tested jointly),
montecarlo (exact-size sequential Monte Carlo p-values), power (minimum detectable TV, sample
sizes), multiplicity (Holm), quadrature (exact single-draft law) with adversarial (synthetic p, q
pairs), mcnemar (paired correctness), median (exact order-statistic interval of a median), rates
(failure-rate intervals, p-value uniformity), confirmation (two-stage error rates).
"""

from specval.stats.adversarial import ProbPair, adversarial_pairs
from specval.stats.aggregate import AggregateResult, aggregate_chi2
from specval.stats.confirmation import TwoStageRates, two_stage
from specval.stats.gof import GofResult, aggregate_gof, goodness_of_fit
from specval.stats.homogeneity import HomogeneityResult, aggregate_homogeneity, homogeneity
from specval.stats.mcnemar import McNemarResult, paired_comparison
from specval.stats.median import MedianInterval, median_interval
from specval.stats.montecarlo import McPValue, criterion_rng, sequential_pvalue
from specval.stats.multiplicity import HolmResult, adjust, bonferroni, holm
from specval.stats.pooling import OUT_OF_SUPPORT, CellPooling, pool_cells
from specval.stats.power import (
    NOTHING_DETECTABLE,
    SimulatedPower,
    criterion_mde,
    mde_tv,
    mde_tv_two_sample,
    samples_for_tv,
    samples_for_tv_two_sample,
    simulate_power,
    stage_power,
)
from specval.stats.quadrature import (
    QuadratureResult,
    draft_quadrature_check,
    quadrature_check,
    sweep_law,
)
from specval.stats.rates import UniformityResult, pvalue_uniformity, rate_ci
from specval.stats.strata import StratifiedResult, stratified_gof, stratified_homogeneity

__all__ = [
    "AggregateResult",
    "CellPooling",
    "GofResult",
    "HolmResult",
    "HomogeneityResult",
    "McNemarResult",
    "MedianInterval",
    "NOTHING_DETECTABLE",
    "OUT_OF_SUPPORT",
    "ProbPair",
    "QuadratureResult",
    "SimulatedPower",
    "UniformityResult",
    "adjust",
    "adversarial_pairs",
    "aggregate_chi2",
    "aggregate_gof",
    "aggregate_homogeneity",
    "bonferroni",
    "draft_quadrature_check",
    "goodness_of_fit",
    "holm",
    "homogeneity",
    "mde_tv",
    "mde_tv_two_sample",
    "median_interval",
    "paired_comparison",
    "pool_cells",
    "pvalue_uniformity",
    "quadrature_check",
    "rate_ci",
    "samples_for_tv",
    "simulate_power",
    "sweep_law",
    "TwoStageRates",
    "two_stage",
    "samples_for_tv_two_sample",
    "McPValue",
    "criterion_rng",
    "sequential_pvalue",
    "StratifiedResult",
    "stratified_gof",
    "stratified_homogeneity",
    "criterion_mde",
    "stage_power",
]
