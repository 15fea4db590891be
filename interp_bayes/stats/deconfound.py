"""Is it uncertainty, or position? A correlation raw and deconfounded, each against a null that keeps the confound.

For a reading x (a PC1 score, an axis projection) and an entropy y, ``deconfounded_correlation`` reports:

- ``raw``: the plain correlation;
- ``partial``: the correlation of x and y after both are residualised (OLS with an intercept) on the covariates'
  basis (``regression.covariate_basis``: one indicator per level of a discrete covariate, a spline of a
  continuous one);
- ``within``: the pooled within-stratum correlation: x and y centred on their stratum's means (a stratum is one
  value of k, one query position, a fine bin of length), then correlated; strata of one row add nothing.

Each comes with a permutation null that **keeps the confound**: y is shuffled only within strata, so whatever the
stratum variable explains survives every permutation. The permutations are drawn in batches until each test's
decision is settled with bounded resampling risk (``sequential``; the recipe's count is the cap), its p-value is
computed against the null as drawn (``permutation.p_value``'s rule) and the claim comes from
``verdicts.claim_from``, the partial and within readings cleared by closed testing; a test undecided at the cap
that could change the claim makes it "borderline". Each kind also reports its residual confounding: the share of
its (residualised) x's or y's variance, whichever is larger, that lies between strata.

Pearson and Spearman are both given (Spearman: the same on the ranks of x and y; the covariate basis is already
flexible, so it is not ranked).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..core.errors import ConfigError
from .arrays import CONSTANT_RTOL, as_float64, ranks, snap
from .permutation import permutations
from .regression import centre_within, residual_confounding, residualizer
from .sequential import REJECT, UNDECIDED, sequential_tests
from .verdicts import DECONFOUNDED, claim_from, closed_pair

KINDS = ("raw", "partial", "within")
NULL_BATCH = 200  # permutations between two looks: also the fewest a null range is drawn from


def corr_columns(x: np.ndarray, ys: np.ndarray, scale_x: float, scale_y: float) -> np.ndarray:
    """Pearson r of x [n] with every column of ys [n, m]; NaN where x or a column varies by no more than rounding
    noise relative to the scale of the data it was derived from (a residual of a constant is noise, not signal)."""
    xc = x - x.mean()
    yc = ys - ys.mean(axis=0)
    flat_x = np.abs(xc).max() <= CONSTANT_RTOL * max(scale_x, 1e-300)
    flat_y = np.abs(yc).max(axis=0) <= CONSTANT_RTOL * max(scale_y, 1e-300)
    denom = np.sqrt((xc**2).sum() * (yc**2).sum(axis=0))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = xc @ yc / np.where(denom > 0, denom, 1.0)
    return np.where(flat_x | flat_y | (denom <= 0), np.nan, r)


@dataclass
class Deconfounded:
    """One reading against one entropy: per kind (raw, partial, within) and statistic (pearson, spearman), the
    value, the null's 95% range, the p-value against the within-stratum null (each from the draws its sequential
    test used, ``tests``), the residual confounding, and a verdict."""

    values: dict[str, dict[str, float]]  # kind -> stat -> value
    null: dict[str, dict[str, list[float]]]  # kind -> stat -> [low, high]
    p: dict[str, dict[str, float]]  # kind -> stat -> p-value against the within-stratum null
    p_plain: dict[str, float]  # stat -> p-value of the raw correlation against a plain (unrestricted) permutation
    n: int
    n_strata: int
    n_perm: int  # the cap on permutations of every test
    covariates: list[str]
    strata: str
    residual_confounding: dict[str, dict[str, float]]  # kind -> stat -> share of variance between strata
    # kind -> stat -> the sequential test (``Decision.as_dict``); "plain" -> stat -> the raw correlation against the
    # plain null; "either" -> stat -> max(|partial|, |within|) against the within-stratum null (closed testing)
    tests: dict = field(default_factory=dict)

    def verdict(self, stat: str = "spearman") -> str:
        """``verdicts.claim_from`` of this reading's ``stat``, the partial and within readings cleared by closed
        testing from their sequential tests (``verdicts.closed_pair``): one of ``verdicts.VERDICTS``."""
        def state(test, upper: bool = False) -> bool | None:  # an untestable reading (NaN) never clears
            if test["decision"] == UNDECIDED:
                return None if np.isfinite(test["p"]) else False
            return test["decision"] == REJECT and (not upper or test["upper"])

        each = {k: state(self.tests[k][stat]) for k in DECONFOUNDED}
        return claim_from(self.values["raw"][stat], state(self.tests["plain"][stat]),
                          {k: self.values[k][stat] for k in KINDS},
                          closed_pair(each, state(self.tests["either"][stat], upper=True)))


def _larger(a, b):
    """max(|a|, |b|) elementwise, NaN only where both are (a reading with nothing within strata drops out)."""
    with np.errstate(invalid="ignore"):
        return np.fmax(np.abs(a), np.abs(b))


def deconfounded_correlation(x, y, covariates: np.ndarray, strata, *, covariate_names=(), strata_name: str = "",
                             n_perm: int = 1000, seed: int = 0) -> Deconfounded:
    """Raw, partial and within-stratum correlations of ``x`` with ``y`` given the covariate design ``covariates``
    ([n, c], e.g. ``covariate_basis``) and ``strata`` labels (see the module docstring), each tested against a
    within-stratum permutation null drawn sequentially (``sequential.sequential_tests``: batches of ``NULL_BATCH``
    permutations until the decision is settled, at most ``n_perm``); the null's range and the p-value are those of
    the draws each test used."""
    x, y = snap(as_float64(x)), snap(as_float64(y))
    cov = as_float64(covariates).reshape(len(x), -1)
    strata = np.asarray(strata)
    if not (len(x) == len(y) == len(cov) == len(strata)):
        raise ConfigError(f"x, y, covariates and strata need one row per prompt; got {len(x)}, {len(y)}, {len(cov)} "
                          f"and {len(strata)}.")
    rng = np.random.default_rng(seed)
    residualize = residualizer(cov)  # one least-squares operator for the observed reading and every permutation
    prepared, between = {}, {}
    for stat in ("pearson", "spearman"):
        xs = ranks(x) if stat == "spearman" else x
        ys = ranks(y) if stat == "spearman" else y
        prepared[stat] = (xs, ys, residualize(xs), centre_within(xs, strata), np.abs(xs).max(), np.abs(ys).max())
        readings = dict(raw=(xs, ys), partial=(residualize(xs), residualize(ys)),
                        within=(centre_within(xs, strata), centre_within(ys, strata)))
        for kind in KINDS:
            shares = [residual_confounding(v, strata) for v in readings[kind]]
            between.setdefault(kind, {})[stat] = float(np.nanmax(shares)) if np.isfinite(shares).any() else \
                float("nan")

    def columns(perms: np.ndarray, plain: np.ndarray) -> np.ndarray:
        """[1 + b, 10]: the observed reading, then one per permutation; per statistic raw, partial, within, their
        larger magnitude (within-stratum permutations) and raw (plain ones). The observed one is column 0 of the
        same products as the permuted ones; all are rounded to 12 decimals, so a permutation that changes nothing
        ties with it exactly (products of other widths differ from it by ~1e-15, which would put an equal value
        "outside" its null's range while the p-value, tie-tolerant, counts it as a tie)."""
        cols = []
        for xs, ys, x_partial, x_within, sx, sy in prepared.values():
            y_all = np.column_stack([ys, ys[perms].T])  # [n, 1 + b]
            partial = corr_columns(x_partial, residualize(y_all), sx, sy)
            within = corr_columns(x_within, centre_within(y_all, strata), sx, sy)
            cols += [corr_columns(xs, y_all, sx, sy), partial, within, _larger(partial, within),
                     corr_columns(xs, np.column_stack([ys, ys[plain].T]), sx, sy)]
        return np.round(np.stack(cols, axis=1), 12)

    identity = np.arange(len(x))[None, :]
    observed = columns(identity, identity)[0]

    def draw(b: int) -> np.ndarray:
        return columns(permutations(len(x), b, rng, strata), permutations(len(x), b, rng))[1:]

    decided = sequential_tests(draw, observed, cap=n_perm, batch=min(NULL_BATCH, n_perm))
    values, null, p, p_plain = {}, {}, {}, {}
    tests: dict = {"plain": {}, "either": {}}
    for i, stat in enumerate(("pearson", "spearman")):
        raw, partial, within, either, plain = decided[5 * i: 5 * i + 5]
        for kind, d, o in zip(KINDS, (raw, partial, within), observed[5 * i: 5 * i + 3]):
            values.setdefault(kind, {})[stat] = o
            null.setdefault(kind, {})[stat] = list(d.null)
            p.setdefault(kind, {})[stat] = d.p
            tests.setdefault(kind, {})[stat] = d.as_dict()
        p_plain[stat], tests["plain"][stat] = plain.p, plain.as_dict()
        # two-sided as every test here; only its upper tail (both magnitudes large) is evidence
        tests["either"][stat] = dict(either.as_dict(), upper=bool(observed[5 * i + 3] > sum(either.null) / 2))
    return Deconfounded(values, null, p, p_plain, len(x), int(len(np.unique(strata))), n_perm,
                        list(covariate_names), strata_name, between, tests)
