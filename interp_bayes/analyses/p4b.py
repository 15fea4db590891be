"""P4b, "decodable but inert", reproduced and tested: is it a property of an entropy axis, or of a position axis?

The authors' test (``experiments/jlens/run_phase3.py`` of the reference code, methods.md §1.7): at every layer of a
bijection wind tunnel, fit the ridge direction of the exact entropy; it is perfectly decodable (R² = 1.00, at the
embedding layer already), yet projecting it out of the residual stream changes calibration by -0.001 bits, while
projecting out the hypothesis frame (the span of the hypothesis tokens' embeddings) costs +0.75 bits. Their keys are
drawn without replacement, so the exact entropy at the k-th key is log2(V - k + 1): a function of position. Here,
for any model whose residual stream the collector reads (``blocks.0.hook_resid_pre``, the embedding output, then
``blocks.L.hook_resid_post``), on sequences fitted on one sample and scored on another (the kinds ``p4b`` and
``tunnel_geometry`` run these functions on a wind tunnel):

a. **decodability** of the exact entropy at each layer (``decoding_rows``), held out with folds of whole sequences
   (``decoding.decoding_curve``): against rows shuffled freely (decodable at all, the authors' reading), against
   whole sequences shuffled with every row keeping its position (beyond what position gives), and within position
   (residualised on one indicator per position; "inseparable" where the entropy is a function of position); the
   position itself beside it;
b. **axis ablations** (``p4b_subspaces``, ``ablation_rows``): the entropy axis, the position axis (the ridge
   direction of the position) and, where the entropy varies within a position, the within-position entropy axis
   (fitted on rows centred per position), each projected out at every position (``model.edits.SubspaceCut``), its
   cost in KL to the exact posterior (bits) beside equal-dimension isotropic and variance-matched random subspaces
   (``analyses.controls``), with the p-value against those draws as drawn;
c. **frame ablations**: ``frame-embed``, the authors' frame (the span of the mean embedding-layer reading of each
   hypothesis token, uncentred, k = H: for GPT-2 the token's embedding plus the mean position embedding), applied at
   every layer as they do; and ``analyses.subspaces.fit_subspaces``'s frames at each layer (belief readout, top
   PCs, hypothesis-token means), each against matched controls of its own dimension;
d. a verdict per row from the ledger's rules (``stats.ledger``): decodability ``beyond_null`` (never at R² <= 0);
   "inert" is ``not_beyond_null`` of the cost against the matched controls' range, "load-bearing" ``beyond_null``,
   a cost within float32 rounding of 0 (``cost_tolerance``) never load-bearing.

With replacement (``bijection-repl-cpu``) a repeated key makes the posterior a delta wherever it sits, so the
entropy varies within a position and the two readings separate. Geometry of the final layer (``geometry_rows``): PC1
share (``manifold_report``), the number of clusters against a Gaussian null (``stats.clusters``), and on the HMM
the clusters against the MAP state and the last observation (``alignment_rows``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..core.results import Row, find, select
from ..model.collect import query_readings
from ..model.read import Activations
from ..stats import as_float64, centre_within, covariate_basis
from ..stats.clusters import cluster_alignment, cluster_count
from ..stats.ledger import FAILS, HOLDS, beyond_null, not_beyond_null
from ..stats.pca import pca
from .axis import fit_direction
from .decoding import decoding_curve
from .manifold import manifold_report

EMBED = "embed"
# a KL is a mean of differences of float32 log-probabilities: a cost within this many of their ulps (in bits) of 0
# is rounding (the per-position MLP's cuts move its KL by 1e-7..1e-5 bits, both ways)
COST_ULPS = 100
# the authors' numbers (phase3_summary.json of the reference code: bijection V = 20 without replacement, the
# embedding layer, the best-fitting axis): entropy-axis R², axis-ablation and frame-ablation calibration change
# (their calibration is the entropy MAE in bits, not a KL)
AUTHORS = dict(axis_r2=0.999999999167221, axis_delta_mae_bits=-0.001023277174681425,
               frame_delta_mae_bits=0.7452435633167624, layer=EMBED)
# the decodability tests, in the order the rows come: (target, how the null shuffles, within position)
TESTS = {"decodable": ("entropy", "rows", False), "beyond position": ("entropy", "groups", False),
         "within position": ("entropy", "groups", True), "position decodable": ("position", "rows", False)}


def readout_sites(model) -> list[tuple[str, str, int]]:
    """(label, site, layer) of every residual-stream reading: the embedding output, then each block's output."""
    return [(EMBED, "resid_pre", 0)] + [(str(layer), "resid", layer) for layer in range(model.cfg.n_layers)]


def residual_readings(model, batch, sites) -> dict[str, torch.Tensor]:
    """label -> [n * Q, d] the residual stream at every query position, at each of ``readout_sites``."""
    return {label: query_readings(model, batch, layers=[layer], readings=(site,))[site][layer]
            for label, site, layer in sites}


def _decodability(x, y, *, site, layer, n_layers, groups, covariates=None, shuffle="groups", target="", **kw) -> Row:
    """The held-out R² of ``y`` from one reading ``x`` [n, d] (``decoding_curve``; its groups: the sequence of each
    row), raw or within ``covariates``."""
    n = len(x)
    acts = Activations({site: {layer: x}}, torch.zeros(n), [[0]] * n,
                       dict(layers=[layer], n_layers=n_layers)).with_groups(groups)
    curve = decoding_curve(acts, y, target_name=target, readings=[site], layers=[layer], covariates=covariates,
                           shuffle=shuffle, **kw)
    adjust = "deconfounded" if covariates is not None else "raw"
    return next(r for r in curve.rows() if r.metric == "decoding_r2" and r.scope["adjust"] == adjust)


def decoding_rows(readings: dict[str, torch.Tensor], sites, entropy: np.ndarray, position: np.ndarray,
                  groups: np.ndarray, tests, *, n_layers: int, folds: int, n_null: int, n_boot: int,
                  seed: int) -> list[Row]:
    """One ``decoding_r2`` row per (reading of ``sites``, test of ``tests``, names of ``TESTS``), scoped by the
    reading's label (``layer``), the test and the target: the exact ``entropy`` (or the query ``position``) per row
    [n * Q], folds and nulls over whole sequences (``groups``)."""
    ys = {"entropy": entropy, "position": position}
    by_position = covariate_basis({"position": position})
    out = []
    for label, site, layer in sites:
        for test in tests:
            target, shuffle, within = TESTS[test]
            row = _decodability(readings[label], ys[target], site=site, layer=layer, n_layers=n_layers, groups=groups,
                                covariates=by_position if within else None, shuffle=shuffle, target=target,
                                folds=folds, n_null=n_null, n_boot=n_boot, seed=seed)
            out.append(dataclasses.replace(row, scope=dict(layer=label, test=test, target=target)))
    return out


def decoding_verdict(row: Row) -> str:
    """A decodability row's verdict: ``beyond_null`` of its R² against its null's range (the rows' sequential test
    left aside, as P4b's tables have always read it), and never "holds" for an R² at or below 0 (a decoder worse
    than the mean decodes nothing, whatever its null; the decoding curve's own rule)."""
    verdict = beyond_null(dataclasses.replace(row, test=None))
    return FAILS if verdict == HOLDS and row.value <= 0 else verdict


def entropy_varies_within_position(entropy: np.ndarray, position: np.ndarray) -> bool:
    """Whether the exact entropy is more than a function of the query position (keys drawn with replacement)."""
    return bool(np.ptp(centre_within(entropy, position)) > 1e-9 * np.abs(entropy).max())


def p4b_subspaces(x: np.ndarray, entropy: np.ndarray, position: np.ndarray) -> dict[str, np.ndarray]:
    """name -> [1, d] the ridge axes of a reading ``x`` [n * Q, d] (float64): the entropy's, the position's, and
    where the entropy varies within a position, the within-position entropy's (fitted on rows centred per
    position)."""
    named = {"entropy-axis": fit_direction(x, entropy, "ridge")[None],
             "position-axis": fit_direction(x, position, "ridge")[None]}
    if entropy_varies_within_position(entropy, position):
        named["entropy-within-position-axis"] = fit_direction(centre_within(x, position),
                                                              centre_within(entropy, position), "ridge")[None]
    return named


def cost_tolerance(n_hypotheses: int) -> float:
    """Bits below which a change of mean KL is float32 rounding, not an effect: ``COST_ULPS`` float32 ulps of the
    largest log-probability in bits (log2 H); about 5e-5 bits for H = 20."""
    return COST_ULPS * float(torch.finfo(torch.float32).eps) * float(np.log2(n_hypotheses))


def ablation_verdicts(cost: float, matched_range, tol: float) -> tuple[str, str]:
    """(inert, load-bearing) of a cut costing ``cost`` bits beside its matched controls' 95% range: inert when the
    cost is not above the range (``not_beyond_null``), load-bearing when it is (``beyond_null``); a cost within
    ``tol`` of 0, or of the range, is rounding and never load-bearing."""
    low, high = (None, None) if matched_range is None else matched_range
    if abs(cost) <= tol:
        return HOLDS, FAILS
    row = Row("ablation_cost", cost, "bits", null_low=None if low is None else low - tol,
              null_high=None if high is None else high + tol)
    return not_beyond_null(row), beyond_null(row)


def cut_verdicts(row: Row, tol: float) -> tuple[str, str]:
    """``ablation_verdicts`` of a ``cut_*`` row (its null: the matched controls' range)."""
    matched = None if row.null_low is None else (row.null_low, row.null_high)
    return ablation_verdicts(row.value, matched, tol)


def ablation_rows(summary: list[dict], label: str | int, n: int) -> list[Row]:
    """Rows of ``subspaces.ablation_costs``'s summary at the reading ``label``, scored on ``n`` sequences: per
    (subspace, op, measure: ``kl_bits`` or ``mae_bits``) the edit's cost ``<op>_<measure>`` with its paired
    bootstrap interval and the matched controls' range as its null; each control family's mean cost (its 95% range
    as the interval), the p-value of the cost against its draws as drawn and the share of them at or below it; the
    matched subspaces' variance ratio once per subspace."""
    out, ratios = [], set()
    for s in summary:
        scope, metric = dict(layer=label, subspace=s["subspace"], k=s["k"]), f"{s['op']}_{s['metric']}"
        matched = s.get("matched_range") or (None, None)
        out.append(Row(metric, s["true_cost"], "bits", dict(scope), *s["true_cost_ci"], "paired bootstrap 95%",
                       *matched, f"matched random subspaces ({s.get('matched_n', 0)} draws)", n))
        for fam in ("matched", "isotropic"):
            if f"{fam}_mean" in s:
                at, draws = dict(scope, family=fam), s[f"{fam}_n"]
                out += [Row(f"{metric}_controls", s[f"{fam}_mean"], "bits", at, *s[f"{fam}_range"], "controls 95%",
                            n=draws),
                        Row(f"{metric}_p", s[f"{fam}_p"], "p", at, n=draws, note="two-sided, against the draws"),
                        Row(f"{metric}_percentile", s[f"{fam}_percentile"], "share", at, n=draws,
                            note="share of the draws at or below the edit's cost")]
        if s["metric"] == "kl_bits" and "matched_variance_ratio_mean" in s and s["subspace"] not in ratios:
            ratios.add(s["subspace"])  # every op of a subspace edits the same matched draws
            out.append(Row("matched_variance_ratio", s["matched_variance_ratio_mean"], "ratio", dict(scope),
                           n=s["matched_n"], note="the matched subspaces' variance over the edited subspace's, mean"))
    return out


def geometry_rows(x: torch.Tensor, entropy: np.ndarray, groups: np.ndarray, *, label: str, seed: int) -> list[Row]:
    """The final layer's geometry (reading ``label``, states ``x`` [n * Q, d]): the PC1 share of the standardised
    states with its bootstrap interval and permuted null (``pc1_share_raw``: of the raw ones, as the authors report
    it), and the number of clusters, the best silhouette against its Gaussian null (``stats.clusters``)."""
    x = as_float64(x)
    rep = manifold_report(x, entropy, groups=groups, n_boot=200, n_null=50, seed=seed)
    perm, ci, n = rep["nulls"]["permuted"], rep["bootstrap"].get("pc1_ci") or (None, None), len(x)
    c = cluster_count(x, seed=seed)
    scope = dict(layer=label)
    return [Row("pc1_share", rep["pc1_share"], "share", dict(scope), *ci, "bootstrap 95%", *perm["pc1_range"],
                f"permuted ({perm['pc1_test']['draws']} draws)", n, note="standardised states",
                test=perm["pc1_test"]),
            Row("pc1_share_raw", float(pca(x, standardize=False)[0][0]), "share", dict(scope), n=n),
            Row("n_clusters", c["n_clusters"], "clusters", dict(scope), n=n,
                note="the best k where its silhouette clears the Gaussian null, else 1"),
            Row("cluster_best_k", c["best_k"], "k", dict(scope), n=n),
            Row("cluster_silhouette", c["silhouette"], "silhouette", dict(scope), null_low=c["null_range"][0],
                null_high=c["null_range"][1], null=f"Gaussian ({c['n_null']} draws)", n=n),
            Row("cluster_silhouette_p", c["p"], "p", dict(scope), n=c["n_null"])]


def alignment_rows(x: torch.Tensor, labels: dict[str, np.ndarray], k: int, *, label: str, seed: int) -> list[Row]:
    """The adjusted Rand index of the k-means partition of ``x`` into ``k`` clusters with each of ``labels`` (name ->
    [n]; ``stats.clusters.cluster_alignment``): does the reading cluster by hidden state or by the last symbol?"""
    got = cluster_alignment(x, labels, k, seed=seed)
    return [Row("cluster_alignment", v, "ARI", dict(layer=label, label=name), n=len(x), note=f"k-means, k = {k}")
            for name, v in got.items()]


def num(x) -> str:
    return "n/a" if x is None or x != x else f"{x:.4f}"


def fmt_range(low, high) -> str:
    return "n/a" if low is None else f"[{low:+.4f}, {high:+.4f}]"


def best_layer(rows: list[Row]) -> str:
    """The reading where the entropy decodes best (the authors' choice of layer)."""
    decodable = select(rows, "decoding_r2", test="decodable")
    return max(decodable, key=lambda r: np.nan_to_num(r.value, nan=-np.inf)).scope["layer"]


def answer(rows: list[Row], model: str) -> dict:
    """The question, answered for one model from its P4b rows: at the layer where the entropy decodes best, is the
    decodable axis an entropy axis or a position axis, and is cutting it inert? ``line``: the answer in a sentence;
    ``reading``: "position" or "entropy beyond position"; the verdicts it rests on."""
    tol = find(rows, "cost_tolerance").value
    best = best_layer(rows)

    def cut(subspace):
        return find(rows, "cut_kl_bits", layer=best, subspace=subspace)

    def inert(row) -> str:
        return cut_verdicts(row, tol)[0]

    def said(row) -> str:
        return (f"{row.value:+.4f} bits vs matched {fmt_range(row.null_low, row.null_high)}: "
                f"{'inert' if inert(row) == HOLDS else 'not inert'}")

    dec, within = (find(rows, "decoding_r2", layer=best, test=t) for t in ("decodable", "within position"))
    within_verdict = decoding_verdict(within)
    axis, pos = cut("entropy-axis"), cut("position-axis")
    wax, frame = cut("entropy-within-position-axis"), cut("frame-embed")
    if within_verdict == "inseparable":
        reading = "position (the entropy is a function of position here: its axis is a position axis)"
    elif within_verdict == HOLDS:
        reading = "entropy beyond position" + (f" (its within-position axis cut {said(wax)})" if wax else "")
    else:
        reading = "position (within a position the entropy does not decode beyond its null)"
    line = (f"{model}, layer {best}: entropy R² {dec.value:.4f} (decodable: {decoding_verdict(dec)}; within "
            f"position: {within_verdict}, R² {num(within.value)}); entropy axis cut {said(axis)}; position axis cut "
            f"{said(pos)}" + (f"; frame-embed cut {frame.value:+.4f} bits (load-bearing: "
                              f"{cut_verdicts(frame, tol)[1]})" if frame else "")
            + f" -> the axis that decodes the entropy reads {reading}.")
    return dict(layer=best, line=line, reading=reading.split(" (")[0], within_position=within_verdict,
                axis_inert=inert(axis), position_axis_inert=inert(pos), within_axis_inert=inert(wax) if wax else None)
