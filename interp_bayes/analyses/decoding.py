"""Where uncertainty is decodable, layer by layer: a cross-fitted linear decoding curve beside the one-axis readout.

A single PCA axis is one narrow readout (Kossen et al. 2024, semantic-entropy probes, arXiv 2406.15927, decode
uncertainty linearly from the hidden states). For every reading (residual stream, values, attention output) and
layer, a ridge regression predicts the target entropy from the final-token reading, cross-fitted over K folds of
whole groups (``acts.groups``: a wind tunnel's sequence, whose prefixes are the prompts; each prompt predicted by a
model that saw no prompt of its group); the held-out R^2 says how much of the entropy is linearly
decodable there. Beside it, the PC1 axis of the same reading (the paper's readout, ``axis.py``), also fitted on
the training folds only: its held-out r^2 over the ridge R^2 is the share of the decodable uncertainty that the one
unsupervised direction carries.

Deconfounded: with ``covariates`` (``stats.confounds.covariate_matrix(confounds.nuisance_columns(...))``) the target and the axis projection are
residualised on them inside each training fold (the fit on the training rows, applied to the held-out rows), and
the ridge decodes that residual from the readings with the covariates beside them, unpenalised (Frisch-Waugh-Lovell;
see ``cross_fitted_decoding``). What remains is the entropy that position, length and k do not explain.

Each R^2 has a bootstrap interval over groups and a permutation null (the target shuffled, everything refitted:
the R^2 a decoder reaches on noise of the same distribution), drawn in batches until the R²'s place against it is
settled (``stats.sequential_test``, ``n_null`` the cap; each row records its draws).
"""

from __future__ import annotations

# plotly is imported inside the function that draws: the rows need no figure
from dataclasses import dataclass, field

import numpy as np

from .axis import fit_direction
from ..stats import as_float64
from ..stats.pca import correlations
from ..stats.sequential import ALPHA, REJECT, stream_test
from ..core.results import Row
from ..stats import (ALPHAS, RidgeBasis, bootstrap_pearson, bootstrap_r2, group_folds, group_permutations, interval,
    permutations, r2, residualize)

READINGS = ("resid", "v", "z")  # residual stream after the block, values (per KV head), attention output
# readings are stored in float32: a reading whose spread across prompts is below this fraction of its scale is one
# vector up to rounding (SmolLM2's layer-0 value of the final ':' varies by 3e-7 of its size with the batch shape)
READING_RTOL = 1e-5


def cross_fitted_decoding(x, y, *, covariates=None, groups=None, folds: int = 5, n_null: int = 1000, alphas=ALPHAS,
                          seed: int = 0, shuffle: str = "groups") -> dict:
    """Held-out ridge predictions and PC1-axis projections of ``y`` from ``x`` ([n, d]), cross-fitted over K folds
    of whole ``groups`` (``stats.group_folds``; None: every row its own group), and the decision of the held-out R²
    against shuffled targets.

    With ``covariates``, the target and the axis projection are residualised on them in each fold (fitted on the
    training rows, applied to the held-out rows), and the ridge sees the readings beside the covariates, whose
    coefficients are left practically unpenalised (``stats.RidgeBasis``'s ``free`` columns): by
    Frisch-Waugh-Lovell that is the ridge of the residualised target on the residualised readings, but with the
    penalty chosen by a leave-one-out that is right. Residualising the readings on the training rows themselves
    makes that choice degenerate: every training row becomes exactly predictable as the penalty goes to 0, the
    smallest penalty wins and held-out R^2 collapses (SmolLM2's layer-0 residuals: -3 to -15, its shuffled-target
    nulls as low). Returns ``y`` (the target, residualised per fold when ``covariates`` are given), ``ridge``
    (held-out predictions), ``axis`` (held-out projections on the training folds' PC1 axis, centred on the training
    mean), ``r2`` (the held-out R²) and ``test`` (``stats.sequential_test``, two-sided: the R² against the R² of
    shuffled targets, whole groups moved where they are of one size, the same folds and bases; ``shuffle="rows"``:
    rows shuffled freely, the null of "decodable at all", which keeps nothing of position), drawn in batches until
    settled, ``n_null`` the cap; its ``null`` is the range of the draws used. Shuffled target i is the same
    whatever the batches (and the same in every cell of one curve), and ``null_r2(stop)`` gives the R² of the first
    ``stop`` of them, each fitted once (``best_of`` reads them)."""
    x, y = as_float64(x), as_float64(y)
    # the null moves whole groups where it can (a wind tunnel's sequences, each row keeping its position), so the
    # shuffled target keeps the real one's structure within a group; otherwise it shuffles rows
    perms = group_permutations(groups, n_null, [seed, 1]) if groups is not None and shuffle == "groups" else None
    null = NULL_WHOLE_GROUPS if perms is not None else NULL_ROWS
    if perms is None:
        perms = permutations(len(y), n_null, seed)
    fits = []  # per fold: rows, the ridge basis and the covariates, shared by the target and every shuffled copy
    pred, y_out, axis = np.empty(len(y)), np.empty(len(y)), np.empty(len(y))
    for train, test in group_folds(groups, folds, seed=seed, n=len(x)):
        u = fit_direction(x[train], y[train], "pc1")  # the axis sees only the training folds
        p_tr, p_te = (x[train] - x[train].mean(0)) @ u, (x[test] - x[train].mean(0)) @ u
        c_tr = c_te = None
        if covariates is not None:
            c_tr, c_te = as_float64(covariates)[train], as_float64(covariates)[test]
            p_tr, p_te = residualize(p_tr, p_te, c_tr, c_te)
        fits.append((train, test, RidgeBasis(x[train], c_tr), c_tr, c_te, x[test]))
        axis[test] = p_te

    def held_out(targets):  # [n, m] targets -> (held-out targets, predictions), each residualised per fold
        t_out, p_out = np.empty_like(targets), np.empty_like(targets)
        for train, test, basis, c_tr, c_te, x_te in fits:
            t_tr, t_te = targets[train], targets[test]
            if c_tr is not None:
                t_tr, t_te = residualize(t_tr, t_te, c_tr, c_te)
            p_out[test] = basis.fit(t_tr, alphas, per_target=True).predict(x_te, c_te)
            t_out[test] = t_te
        return t_out, p_out

    real_y, real_pred = held_out(y[:, None])
    y_out[:], pred[:] = real_y[:, 0], real_pred[:, 0]
    held_r2 = float(r2(y_out, pred)[0])
    drawn, done = np.empty(n_null), [0]  # the null R² of shuffled target i, fitted once (the claim's max test
    #                                       reads the same draws: ``null_r2``)

    def null_r2(stop: int) -> np.ndarray:
        if stop > done[0]:
            drawn[done[0]:stop] = r2(*held_out(y[perms[done[0]:stop]].T))
            done[0] = stop
        return drawn[:stop]

    test = stream_test(lambda i, j: null_r2(j)[i:], held_r2, cap=n_null) if np.isfinite(held_r2) else None
    return dict(y=y_out, ridge=pred, axis=axis, r2=held_r2, test=test, null=null, null_r2=null_r2)


def axis_share(axis_r: float, ridge_r2: float, ridge_r2_ci, beyond_null: bool) -> float:
    """The share of the decodable entropy that the one axis carries, in [0, 1]: its held-out r² over the larger of
    the ridge R² and that r² (a single direction is one linear readout, so what is decodable is at least what it
    carries; the ridge, penalised and refitted per fold, can fall below it). NaN unless the entropy is decodable:
    the ridge R²'s whole interval above 0 and ``beyond_null`` (its test rejected the shuffled null, with the R²
    above it: ``above_null``; a share of noise means nothing, and a negative null alone let an R² of 0.005 give
    shares above 1)."""
    if not (ridge_r2_ci[0] > 0 and beyond_null and np.isfinite(axis_r)):
        return float("nan")
    return float(axis_r**2 / max(ridge_r2, axis_r**2))


def above_null(value: float, test) -> bool:
    """Whether ``test`` (a ``stats.Decision``) rejected its null with ``value`` above the null's centre."""
    return test is not None and test.decision == REJECT and value > np.mean(test.null)


# the two shuffled-target nulls: a wind tunnel's moves whole sequences, each row keeping its position, so what
# position alone explains decodes under the null too (the raw R² of the bijection's entropy is within it)
NULL_ROWS = "shuffled target"
NULL_WHOLE_GROUPS = "shuffled sequences (positions kept)"


@dataclass
class DecodingCurve:
    """Held-out decodability of one target at every (reading, layer), raw and (with covariates) deconfounded."""

    target: str
    points: list[dict]  # per (reading, layer, adjust): ridge_r2 (+ ci, null), axis_r (+ ci), axis_share
    #                     (``axis_share``: in [0, 1], NaN unless ridge_r2's interval clears 0 and the R² its null)
    folds: int
    n: int
    meta: dict = field(default_factory=dict)
    best: list[dict] = field(default_factory=list)  # per adjust: the largest R² and its family-wise test (``best_of``)

    def rows(self) -> list[Row]:
        """Tidy rows: ridge R^2 with its bootstrap interval and shuffled-target null, the axis r and its share.

        A decoding row carries two decisions of different kinds: ``test``, the sequential decision of the R² against
        its shuffled null (draws recorded), and the bootstrap interval (a fixed ``n_boot``), which
        ``ledger.decodable`` asks to clear 0; the one Monte-Carlo decision against a null is the test."""
        out = []
        for p in self.points:
            scope = dict(reading=p["reading"], layer=p["layer"], adjust=p["adjust"], target=self.target)
            out.append(Row("decoding_r2", p["ridge_r2"], "R^2 (held-out)", dict(scope), p["ridge_r2_ci"][0],
                           p["ridge_r2_ci"][1], "bootstrap 95%", p["null_r2_range"][0], p["null_r2_range"][1],
                           p.get("null", NULL_ROWS), self.n, note=p.get("reason"), test=p.get("test")))
            out.append(Row("axis_r", p["axis_r"], "Pearson r (held-out)", dict(scope), p["axis_r_ci"][0],
                           p["axis_r_ci"][1], "bootstrap 95%", n=self.n))
            out.append(Row("axis_share_of_decodable", p["axis_share"], "axis r^2 / ridge R^2", dict(scope), n=self.n))
        for b in self.best:
            out.append(Row("decoding_r2_best", b["ridge_r2"], "R^2 (held-out)",
                           dict(reading=b["reading"], layer=b["layer"], adjust=b["adjust"], target=self.target),
                           *b["ridge_r2_ci"], "bootstrap 95%", *b["test"]["null"],
                           f"largest over {b['cells']} cells, {b['null']}", self.n, test=b["test"]))
        return out

    def figure(self, adjust: str = "raw"):
        """Plotly: ridge R^2 per layer for each reading (with its null band) and the PC1 axis's r^2 beside it."""
        import plotly.graph_objects as go

        fig = go.Figure()
        for reading in dict.fromkeys(p["reading"] for p in self.points):
            pts = [p for p in self.points if p["reading"] == reading and p["adjust"] == adjust]
            layers = [p["layer"] for p in pts]
            fig.add_scatter(x=layers, y=[p["ridge_r2"] for p in pts], mode="lines+markers",
                            name=f"{reading}: ridge R²",
                            error_y=dict(type="data", symmetric=False,
                                         array=[p["ridge_r2_ci"][1] - p["ridge_r2"] for p in pts],
                                         arrayminus=[p["ridge_r2"] - p["ridge_r2_ci"][0] for p in pts]))
            fig.add_scatter(x=layers, y=[p["axis_r"] ** 2 for p in pts], mode="lines", line=dict(dash="dash"),
                            name=f"{reading}: PC1 axis r²")
            fig.add_scatter(x=layers, y=[p["null_r2_range"][1] for p in pts], mode="lines", line=dict(dash="dot"),
                            name=f"{reading}: null 97.5%", opacity=0.5)
        return fig.update_layout(template="plotly_white", xaxis_title="layer", yaxis_title="held-out R² / r²",
                                 title=f"Decodable {self.target} ({adjust}) vs one axis, "
                                       f"{self.folds}-fold cross-fitted")


def decoding_curve(acts, target=None, *, target_name: str = "model entropy", readings=None, layers=None,
                   covariates=None, folds: int = 5, n_null: int = 1000, n_boot: int = 1000, alphas=ALPHAS,
                   seed: int = 0, shuffle: str = "groups") -> DecodingCurve:
    """Cross-fitted linear decoding of ``target`` (default the model's entropy, bits) from every collected reading
    (``resid``, ``v``, ``z``) and layer of ``acts`` (``model.collect.collect``), beside the PC1 axis of each; raw, and
    deconfounded when ``covariates`` ([n, c]) are given. Folds and bootstraps take whole ``acts.groups``; the null
    moves whole groups, or rows with ``shuffle="rows"`` (``cross_fitted_decoding``), drawn until its decision is
    settled (``n_null``: the cap). A reading
    constant across prompts (layer 0's final-token value depends on that token alone) gives NaN with the reason."""
    y = as_float64(acts.entropy if target is None else target)
    groups = acts.groups
    readings = [r for r in (readings or READINGS) if r in acts.readings]
    layers = acts.layers if layers is None else [acts.layer_index(layer) for layer in layers]
    adjusts = [("raw", None)] + ([("deconfounded", covariates)] if covariates is not None else [])
    explained = (covariates is not None
                 and np.ptp(residualize(y, y, covariates, covariates)[0]) <= 1e-9 * np.abs(y).max())
    points, nulls = [], {}  # nulls: each cell's shuffled-target R² (``cross_fitted_decoding``'s ``null_r2``)
    for reading in readings:
        for layer in layers:
            x = as_float64(acts.reading(reading, layer))
            for adjust, cov in adjusts:
                point = dict(reading=reading, layer=int(layer), adjust=adjust)
                reason = ("the reading is the same for every prompt up to float32 rounding"
                          if np.ptp(x, axis=0).max() <= READING_RTOL * np.abs(x).max() else
                          "the target is a function of the covariates" if cov is not None and explained else None)
                if reason:
                    nan2 = [float("nan")] * 2
                    points.append(dict(point, ridge_r2=float("nan"), ridge_r2_ci=nan2, null_r2_range=nan2,
                                       axis_r=float("nan"), axis_r_ci=nan2, axis_share=float("nan"), reason=reason))
                    continue
                fit = cross_fitted_decoding(x, y, covariates=cov, groups=groups, folds=folds, n_null=n_null,
                                            alphas=alphas, seed=seed, shuffle=shuffle)
                axis_r = correlations(fit["axis"], fit["y"])["pearson"]
                r2_ci = interval(bootstrap_r2(fit["y"], fit["ridge"], groups, n_boot=n_boot, seed=seed))
                r_ci = interval(bootstrap_pearson(fit["axis"], fit["y"], groups, n_boot=n_boot, seed=seed))
                test = fit["test"]
                null_range = list(test.null) if test is not None else [float("nan")] * 2
                point.update(ridge_r2=fit["r2"], ridge_r2_ci=r2_ci, axis_r=axis_r, axis_r_ci=r_ci,
                             null_r2_range=null_range, null=fit["null"],
                             test=test.as_dict() if test is not None else None,
                             axis_share=axis_share(axis_r, fit["r2"], r2_ci, above_null(fit["r2"], test)))
                points.append(point)
                nulls[id(point)] = fit["null_r2"]
    best = [best_of(points, nulls, adjust, n_null) for adjust, _ in adjusts]
    return DecodingCurve(target=target_name, points=points, folds=folds, n=len(y),
                         meta=dict(n_null=n_null, n_boot=n_boot, seed=seed, readings=readings, layers=list(layers)),
                         best=[b for b in best if b is not None])


def best_of(points: list[dict], nulls: dict, adjust: str, n_null: int) -> dict | None:
    """One decision over every (reading, layer) of ``adjust``: the largest held-out R² against the largest R² of
    the same shuffled target over those cells (a max-statistic null, Westfall and Young 1993: shuffled target i is
    one permutation for every cell, so the null keeps the cells' dependence), drawn until settled, one-tailed at
    half the level (the tail a cell's two-sided test rejects in). The family's chance of naming a cell on noise is
    at most that level; the cell of the largest R² is named only when it survives. None without a finite R²."""
    cells = [p for p in points if p["adjust"] == adjust and id(p) in nulls]
    if not cells:
        return None
    top = max(cells, key=lambda p: p["ridge_r2"])
    test = stream_test(lambda i, j: np.max([nulls[id(p)](j)[i:] for p in cells], axis=0), top["ridge_r2"],
                       alpha=ALPHA / 2, alternative="greater", cap=n_null)
    return dict(adjust=adjust, reading=top["reading"], layer=top["layer"], ridge_r2=top["ridge_r2"],
                ridge_r2_ci=top["ridge_r2_ci"], null=top["null"], cells=len(cells), test=test.as_dict())
