"""Is it uncertainty, or position? The nuisance covariates of a prompt set, and tidy rows of a deconfounded
correlation.

Predictive entropy moves with things that are not uncertainty: the final token's position, the prompt's length, k
(the number of in-context examples). The statistics (``stats.deconfound``: raw, partial and within-stratum
correlations, each against a null that keeps the confound, a p-value against that null as drawn, a verdict from
``stats.verdicts``) are pure arrays; this module names the covariates and writes the rows.

Covariates enter through ``covariate_matrix``: one indicator per level of a discrete covariate (k, log k, a query
position: any function of it is removed, not only a linear one) and a cubic spline basis of prompt length.
"""

from __future__ import annotations

import numpy as np

from ..core.errors import ConfigError
from . import KINDS, Deconfounded, as_float64, covariate_basis, deconfounded_correlation, fine_strata, residualize
from ..core.results import Row

CONTINUOUS = ("length",)  # covariates that enter through a spline basis; every other one has one indicator per level

__all__ = ["CONTINUOUS", "Deconfounded", "covariate_matrix", "deconfounded_correlation", "deconfounded_rows",
           "fine_strata", "nuisance_columns", "residualize", "select_covariates"]


def covariate_matrix(columns: dict[str, np.ndarray]) -> np.ndarray:
    """[n, p] design of named covariate columns (``stats.covariate_basis``): a spline basis for the ``CONTINUOUS``
    ones, one indicator per level for the rest; constant and repeated columns dropped."""
    return covariate_basis(columns, continuous=CONTINUOUS)


def nuisance_columns(token_lengths, k=None, position=None, extra: dict | None = None) -> dict[str, np.ndarray]:
    """The standard nuisance covariates by name: ``length`` (prompt length in tokens; the final token's position is
    length - 1, the same covariate), ``k`` and ``log_k`` = log(1 + k) where a k exists (the same indicators: kept
    so that recipes naming either work), a within-sequence ``position`` where given (wind tunnels), plus any a probe
    declares."""
    out = {"length": as_float64(token_lengths)}
    if k is not None:
        k = as_float64(k)
        out["k"], out["log_k"] = k, np.log1p(k)
    if position is not None:
        out["position"] = as_float64(position)
    out.update({name: as_float64(v) for name, v in (extra or {}).items()})
    return out


def select_covariates(columns: dict[str, np.ndarray], names) -> np.ndarray:
    """The covariate design of the named columns (a probe's declared ``covariates``)."""
    unknown = sorted(set(names) - set(columns))
    if unknown:
        raise ConfigError(f"Unknown covariate(s) {', '.join(unknown)}; available here: {', '.join(columns)}.")
    return covariate_matrix({name: columns[name] for name in names})


def deconfounded_rows(dec: Deconfounded, metric: str, scope: dict, *, stat: str = "spearman") -> list:
    """Tidy rows of a ``Deconfounded``: one per kind (raw, partial, within), each with its null's range, its
    p-value, its residual confounding and the verdict of the claim in the note."""
    unit = "rho" if stat == "spearman" else "r"
    verdict = dec.verdict(stat)
    detail = {"raw": "plain correlation", "partial": f"given {', '.join(dec.covariates) or 'no covariate'}",
              "within": f"within {dec.n_strata} strata of {dec.strata}"}
    return [Row(metric, dec.values[kind][stat], unit, dict(scope, deconfounded=kind), null_low=dec.null[kind][stat][0],
                null_high=dec.null[kind][stat][1],
                null=f"within-{dec.strata} permutation ({dec.tests[kind][stat]['draws']} of at most {dec.n_perm})",
                n=dec.n, note=f"{detail[kind]}; p = {dec.p[kind][stat]:.3g}; between-strata share "
                              f"{dec.residual_confounding[kind][stat]:.3f}; claim {verdict}",
                test=dec.tests[kind][stat]) for kind in KINDS]
