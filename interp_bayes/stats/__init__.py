"""Pure statistics on arrays, the one place where the toolkit resamples, cross-fits, permutes and judges.

- ``resample``: bootstraps over groups (the unit of independence) and percentile intervals at one ``CI_LEVEL``;
- ``crossfit``: folds of whole groups, one R² (NaN for a target with no variance), one ridge with one penalty grid;
- ``permutation``: permutations within strata or of whole groups, and the p-value against the null as drawn;
- ``regression``: covariate bases (indicators per level, splines), residualising, fine strata and the share of
  variance left between strata;
- ``sequential``: Monte-Carlo decisions drawn in batches until settled with bounded resampling risk (or a cap);
- ``verdicts``: the claim a deconfounded correlation supports, from a fixed vocabulary;
- ``deconfound``: raw, partial and within-stratum correlations with confound-keeping nulls.

Nothing here knows a model, a prompt or a probe: arrays in, numbers out.
"""

from .arrays import CONSTANT_RTOL, as_float64, is_constant, snap
from .crossfit import ALPHAS, COVARIATE_SCALE, RidgeBasis, RidgeFit, cross_fitted_ridge, fit_ridge, group_folds, r2
from .deconfound import KINDS, Deconfounded, corr_columns, deconfounded_correlation
from .permutation import donors_within, group_permutations, holm, p_value, permutations, significant
from .regression import (MAX_LEVELS, SPLINE_KNOTS, STRATUM_SIZE, centre_within, covariate_basis, fine_strata,
    residual_confounding, residualize)
from .resample import (CI_LEVEL, bootstrap, bootstrap_mean_draws, bootstrap_means, bootstrap_pearson, bootstrap_r2,
    bootstrap_ratio, bounds, group_ids, interval, paired_excess_draws, percentile_of, resample_counts,
    resampled_sums)
from .sequential import Decision, beyond, beyond_each, sequential_rate, sequential_test, sequential_tests, stream_test
from .verdicts import VERDICTS, claim

__all__ = [
    "ALPHAS", "CI_LEVEL", "CONSTANT_RTOL", "COVARIATE_SCALE", "KINDS", "MAX_LEVELS", "SPLINE_KNOTS", "STRATUM_SIZE",
    "VERDICTS", "Decision", "Deconfounded", "RidgeBasis", "RidgeFit", "as_float64", "beyond", "beyond_each",
    "bootstrap", "bootstrap_mean_draws", "bootstrap_means", "bootstrap_pearson", "bootstrap_r2", "bootstrap_ratio",
    "bounds", "centre_within", "claim", "corr_columns", "covariate_basis", "cross_fitted_ridge",
    "deconfounded_correlation", "donors_within", "fine_strata", "fit_ridge", "group_folds", "group_ids",
    "group_permutations", "holm", "interval", "is_constant", "p_value", "paired_excess_draws", "percentile_of",
    "permutations", "r2", "resample_counts", "resampled_sums", "residual_confounding", "residualize",
    "sequential_rate", "sequential_test", "sequential_tests", "significant", "snap", "stream_test",
]
