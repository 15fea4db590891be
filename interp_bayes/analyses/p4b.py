"""P4b, "decodable but inert", reproduced and tested: is it a property of an entropy axis, or of a position axis?

The authors' test (``experiments/jlens/run_phase3.py`` of the reference code, methods.md §1.7): at every layer of a
bijection wind tunnel, fit the ridge direction of the exact entropy; it is perfectly decodable (R² = 1.00, at the
embedding layer already), yet projecting it out of the residual stream changes calibration by -0.001 bits, while
projecting out the hypothesis frame (the span of the hypothesis tokens' embeddings) costs +0.75 bits. Their keys are
drawn without replacement, so the exact entropy at the k-th key is log2(V - k + 1): a function of position. Here,
for any model whose residual stream the collector reads (``blocks.0.hook_resid_pre``, the embedding output, then
``blocks.L.hook_resid_post``), on sequences fitted on one sample and scored on another:

a. **decodability** of the exact entropy at each layer, held out with folds of whole sequences
   (``decoding.decoding_curve``): against rows shuffled freely (decodable at all, the authors' reading), against
   whole sequences shuffled with every row keeping its position (beyond what position gives), and within position
   (residualised on one indicator per position; "inseparable" where the entropy is a function of position); the
   position itself beside it;
b. **axis ablations**: the entropy axis, the position axis (the ridge direction of the position) and, where the
   entropy varies within a position, the within-position entropy axis (fitted on rows centred per position), each
   projected out at every position (``model.edits.SubspaceCut``), its cost in KL to the exact posterior (bits)
   beside equal-dimension isotropic and variance-matched random subspaces (``analyses.controls``), with the
   p-value against those draws as drawn;
c. **frame ablations**: ``frame-embed``, the authors' frame (the span of the mean embedding-layer reading of each
   hypothesis token, uncentred, k = H: for GPT-2 the token's embedding plus the mean position embedding), applied at
   every layer as they do; and ``analyses.subspaces.fit_subspaces``'s frames at each layer (belief readout, top
   PCs, hypothesis-token means), each against matched controls of its own dimension;
d. a verdict per row from the ledger's rules (``stats.ledger``): decodability ``beyond_null`` (never at R² <= 0);
   "inert" is ``not_beyond_null`` of the cost against the matched controls' range, "load-bearing" ``beyond_null``,
   a cost within float32 rounding of 0 (``cost_tolerance``) never load-bearing.

With replacement (``bijection-repl-cpu``) a repeated key makes the posterior a delta wherever it sits, so the
entropy varies within a position and the two readings separate. Geometry of the final layer (``geometry``): PC1
share (``manifold_report``), the number of clusters against a Gaussian null (``stats.clusters``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..core.errors import ConfigError
from ..core.results import Row
from ..model.collect import query_readings
from ..model.read import Activations
from ..model.edits import intervene
from ..stats import as_float64, centre_within, covariate_basis, info
from ..stats.clusters import cluster_alignment, cluster_count
from ..stats.pca import pca
from ..stats.ledger import FAILS, HOLDS, beyond_null, not_beyond_null
from ..windtunnel.discrete import restricted_log_probs
from .axis import fit_direction
from .decoding import decoding_curve
from .manifold import manifold_report
from .subspaces import ablation_costs, every_position, fit_subspaces, sequence_losses, top_rows

EMBED = "embed"
# a KL is a mean of differences of float32 log-probabilities: a cost within this many of their ulps (in bits) of 0
# is rounding (the per-position MLP's cuts move its KL by 1e-7..1e-5 bits, both ways)
COST_ULPS = 100
# the authors' numbers (phase3_summary.json of the reference code: bijection V = 20 without replacement, the
# embedding layer, the best-fitting axis): entropy-axis R², axis-ablation and frame-ablation calibration change
# (their calibration is the entropy MAE in bits, not a KL)
AUTHORS = dict(axis_r2=0.999999999167221, axis_delta_mae_bits=-0.001023277174681425,
               frame_delta_mae_bits=0.7452435633167624, layer=EMBED)


def readout_sites(model) -> list[tuple[str, str, int]]:
    """(label, site, layer) of every residual-stream reading: the embedding output, then each block's output."""
    return [(EMBED, "resid_pre", 0)] + [(str(layer), "resid", layer) for layer in range(model.cfg.n_layers)]


def load_tunnel(folder: Path, tasks: tuple[str, ...], what: str):
    """(config, task, model) of a trained wind-tunnel folder whose task is one of ``tasks`` and whose model has
    TransformerLens hook points (the residual stream is read through them); else one sentence naming the fix."""
    from ..windtunnel.tunnels import open_tunnel

    tunnel = open_tunnel(folder)
    cfg = tunnel.config
    if cfg.task not in tasks:
        names = " and ".join({"hmm": "HMM"}.get(t, t) for t in tasks)
        raise ConfigError(f"{what} is defined on the {names} tunnels; {folder} was trained on '{cfg.task}'.")
    model = tunnel.model
    if not hasattr(model, "hooks") or not hasattr(model, "cfg"):
        raise ConfigError(f"{folder} holds a {type(model).__name__} without TransformerLens hook points; {what} "
                          "reads the residual stream, so wrap the model in hook points (blocks.L.hook_resid_post).")
    return cfg, tunnel.task, model


def residual_readings(model, batch, sites) -> dict[str, torch.Tensor]:
    """label -> [n * Q, d] the residual stream at every query position, at each of ``readout_sites``."""
    return {label: query_readings(model, batch, layers=[layer], readings=(site,))[site][layer]
            for label, site, layer in sites}


def _activations(x: torch.Tensor, site: str, layer: int, n_layers: int, groups: np.ndarray) -> Activations:
    """One reading at one layer as the decoding curve takes it (its groups: the sequence of each row)."""
    n = len(x)
    return Activations({site: {layer: x}}, torch.zeros(n), [[0]] * n,
                       dict(layers=[layer], n_layers=n_layers)).with_groups(groups)


def _decodability(x, y, *, site, layer, n_layers, groups, covariates=None, shuffle="groups", target="", **kw) -> Row:
    acts = _activations(x, site, layer, n_layers, groups)
    curve = decoding_curve(acts, y, target_name=target, readings=[site], layers=[layer], covariates=covariates,
                           shuffle=shuffle, **kw)
    adjust = "deconfounded" if covariates is not None else "raw"
    return next(r for r in curve.rows() if r.metric == "decoding_r2" and r.scope["adjust"] == adjust)


@dataclass
class P4bResult:
    """``decoding``: one row per (layer, test) with its R², null and verdict; ``ablations``: one per (layer,
    subspace) with the cost in KL and entropy MAE, the controls' ranges and p-values and the verdicts;
    ``geometry``: the final layer's PC1 share and clusters; ``summary``: one line per (model) answering the
    question; ``meta``: the settings."""

    decoding: list[dict]
    ablations: list[dict]
    geometry: dict
    summary: dict
    meta: dict
    rows: list[dict] = field(default_factory=list, repr=False)  # every control draw (``ablation_costs``)


def p4b(folder: str | Path, *, n_fit: int = 400, n_eval: int = 300, n_controls: int = 20, folds: int = 5,
        n_null: int = 1000, n_boot: int = 500, frames: bool = True, geometry: bool = True, seed: int = 2024,
        progress: bool = True) -> P4bResult:
    """P4b on a trained wind-tunnel folder (see the module docstring); ``n_controls`` isotropic and as many
    variance-matched random subspaces per ablated subspace."""
    from ..core.progress import progress_bar

    folder = Path(folder)
    cfg, task, model = load_tunnel(folder, ("bijection",), "P4b")
    fit, ev = task.sample(n_fit, seed=[seed, 0]), task.sample(n_eval, seed=[seed, 1])
    hyp, H, Q = task.hypothesis_ids, len(task.hypothesis_ids), len(fit.query_pos)
    n_layers = model.cfg.n_layers
    post_fit = fit.posterior.double().reshape(-1, H).numpy()
    entropy = info.entropy(torch.from_numpy(post_fit)).numpy()  # [n * Q] exact entropy, bits
    position = np.tile(np.arange(Q, dtype=np.float64), n_fit)  # the query index of each row
    groups = np.repeat(np.arange(n_fit), Q)
    by_position = covariate_basis({"position": position})
    within_varies = np.ptp(centre_within(entropy, position)) > 1e-9 * np.abs(entropy).max()
    kw = dict(n_layers=n_layers, groups=groups, folds=folds, n_null=n_null, n_boot=n_boot, seed=seed)
    tol = cost_tolerance(H)

    def run(site: str, layer: int, op=None) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad(), intervene(model, {layer: op} if op is not None else {}, site=site):
            return sequence_losses(restricted_log_probs(model, ev, hyp).cpu(), ev.posterior)

    base = run("resid", 0)
    sites = readout_sites(model)
    readings = residual_readings(model, fit, sites)
    every = {label: every_position(model, fit, layer, site) for label, site, layer in sites}
    embed_x, embed_tokens = every[EMBED]
    means = [embed_x[embed_tokens == h].mean(0) for h in hyp if (embed_tokens == h).any()]
    frame_embed = top_rows(np.stack(means), len(means))  # the authors' frame: k = H hypothesis embeddings

    decoding, ablations, all_rows = [], [], []
    n_sub = 3 + (1 if within_varies else 0) + (4 if frames else 0)
    bar = progress_bar(total=len(sites) * n_sub * (1 + 2 * n_controls), desc=f"p4b {folder.name}",
                       disable=not progress)
    for label, site, layer in sites:
        x = readings[label]
        xq = as_float64(x)
        tests = {"decodable": _decodability(x, entropy, site=site, layer=layer, shuffle="rows", target="entropy",
                                            **kw),
                 "beyond position": _decodability(x, entropy, site=site, layer=layer, target="entropy", **kw),
                 "within position": _decodability(x, entropy, site=site, layer=layer, covariates=by_position,
                                                  target="entropy", **kw),
                 "position decodable": _decodability(x, position, site=site, layer=layer, shuffle="rows",
                                                     target="position", **kw)}
        for test, row in tests.items():
            decoding.append(decoding_entry(row, model=folder.name, layer=label, test=test))
        named = {"entropy-axis": fit_direction(xq, entropy, "ridge")[None],
                 "position-axis": fit_direction(xq, position, "ridge")[None]}
        if within_varies:
            named["entropy-within-position-axis"] = fit_direction(centre_within(xq, position),
                                                                  centre_within(entropy, position), "ridge")[None]
        if frames:
            x_all, tokens = every[label]
            named["frame-embed"] = frame_embed
            named |= {k: v for k, v in fit_subspaces(xq, post_fit, x_all, tokens, hyp).items() if k != "entropy-axis"}
        got_rows, summary = ablation_costs(lambda op, site=site, layer=layer: run(site, layer, op), every[label][0],
                                           named, base, layer=layer, ops=("cut",), n_isotropic=n_controls,
                                           n_matched=n_controls, seed=seed, scope=dict(model=folder.name,
                                                                                       site=site), bar=bar)
        all_rows += got_rows
        ablations += [ablation_row(s, folder.name, label, tol) for s in summary]
    bar.close()
    positions = cfg.positions if cfg.arch == "transformer" else f"the {cfg.arch}'s own"  # a transformer-only field
    meta = dict(folder=str(folder), task=task.name, task_kwargs=cfg.task_kwargs, arch=cfg.arch, positions=positions,
                n_layers=n_layers, n_fit=n_fit, n_eval=n_eval, n_controls=n_controls, folds=folds, n_null=n_null,
                n_boot=n_boot, seed=seed,
                entropy_varies_within_position=bool(within_varies), cost_tolerance_bits=tol,
                base=dict(mae_bits=float(base[0].mean()), kl_bits=float(base[1].mean())), authors=AUTHORS)
    geo = final_geometry(readings, entropy, groups, seed=seed) if geometry else {}
    return P4bResult(decoding, ablations, geo, answer(decoding, ablations, folder.name), meta, all_rows)


def decoding_verdict(d: dict) -> str:
    """A decodability row's verdict: ``beyond_null`` of its R², and never "holds" for an R² at or below 0 (a
    decoder worse than the mean decodes nothing, whatever its null; the decoding curve's own rule)."""
    row = Row("decoding_r2", d["r2"], null_low=d["null_range"][0], null_high=d["null_range"][1], note=d["note"])
    verdict = beyond_null(row)
    return FAILS if verdict == HOLDS and row.value <= 0 else verdict


def decoding_entry(row: Row, **scope) -> dict:
    """One decodability row as the tables read it (``scope``: model, layer, test), with its ``decoding_verdict``."""
    d = dict(scope, target=row.scope["target"], r2=row.value, r2_ci=[row.low, row.high], null=row.null,
             null_range=[row.null_low, row.null_high], note=row.note)
    return d | dict(verdict=decoding_verdict(d))


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


def ablation_row(s: dict, model: str, label: str, tol: float) -> dict:
    """One ablation summary (``subspaces.summarise_costs``) with its verdicts (``ablation_verdicts``)."""
    inert, load_bearing = ablation_verdicts(s["true_cost"], s.get("matched_range"), tol)
    return dict(model=model, layer=label, subspace=s["subspace"], k=s["k"], metric=s["metric"],
                cost=s["true_cost"], cost_ci=s["true_cost_ci"], matched_mean=s.get("matched_mean"),
                matched_range=s.get("matched_range"), matched_p=s.get("matched_p"),
                matched_percentile=s.get("matched_percentile"), isotropic_mean=s.get("isotropic_mean"),
                isotropic_range=s.get("isotropic_range"), isotropic_p=s.get("isotropic_p"),
                variance_ratio=s.get("matched_variance_ratio_mean"), inert=inert, load_bearing=load_bearing)


def answer(decoding: list[dict], ablations: list[dict], model: str) -> dict:
    """The question, answered for one model from its rows: at the layer where the entropy decodes best (the
    authors' choice of layer), is the decodable axis an entropy axis or a position axis, and is cutting it inert?"""
    def get(layer, test):
        return next(d for d in decoding if d["layer"] == layer and d["test"] == test)

    def cut(layer, subspace):
        return next((a for a in ablations if a["layer"] == layer and a["subspace"] == subspace
                     and a["metric"] == "kl_bits"), None)

    def said(a) -> str:
        return (f"{a['cost']:+.4f} bits vs matched {fmt_range(a['matched_range'])}: "
                f"{'inert' if a['inert'] == 'holds' else 'not inert'}")

    layers = list(dict.fromkeys(d["layer"] for d in decoding))
    best = max(layers, key=lambda la: np.nan_to_num(get(la, "decodable")["r2"], nan=-np.inf))
    within = get(best, "within position")
    axis, pos = cut(best, "entropy-axis"), cut(best, "position-axis")
    wax, frame = cut(best, "entropy-within-position-axis"), cut(best, "frame-embed")
    dec = get(best, "decodable")
    if within["verdict"] == "inseparable":
        reading = "position (the entropy is a function of position here: its axis is a position axis)"
    elif within["verdict"] == "holds":
        reading = "entropy beyond position" + (f" (its within-position axis cut {said(wax)})" if wax else "")
    else:
        reading = "position (within a position the entropy does not decode beyond its null)"
    line = (f"{model}, layer {best}: entropy R² {dec['r2']:.4f} (decodable: {dec['verdict']}; within position: "
            f"{within['verdict']}, R² {num(within['r2'])}); entropy axis cut {said(axis)}; position axis cut "
            f"{said(pos)}" + (f"; frame-embed cut {frame['cost']:+.4f} bits (load-bearing: {frame['load_bearing']})"
                              if frame else "") + f" -> the axis that decodes the entropy reads {reading}.")
    return dict(layer=best, line=line, reading=reading.split(" (")[0], within_position=within["verdict"],
                axis_inert=axis["inert"], position_axis_inert=pos["inert"],
                within_axis_inert=wax["inert"] if wax else None)


def num(x) -> str:
    return "n/a" if x is None or x != x else f"{x:.4f}"


def fmt_range(r) -> str:
    return "n/a" if r is None else f"[{r[0]:+.4f}, {r[1]:+.4f}]"


def final_geometry(readings: dict[str, torch.Tensor], entropy: np.ndarray, groups: np.ndarray, *,
                   seed: int) -> dict:
    """PC1 share of the standardised states (with its permuted null; ``pc1_share_raw``: of the raw ones, as the
    authors report it) and the number of clusters (with its Gaussian null) of the final
    layer's residual stream at the query positions."""
    final = list(readings)[-1]
    x = as_float64(readings[final])
    rep = manifold_report(x, entropy, groups=groups, n_boot=200, n_null=50, seed=seed)
    return dict(layer=final, pc1_share=rep["pc1_share"], pc1_share_raw=float(pca(x, standardize=False)[0][0]),
                pc1_ci=rep["bootstrap"].get("pc1_ci"),
                pc1_null=rep["nulls"]["permuted"], clusters=cluster_count(x, seed=seed))


def tunnel_geometry(folder: str | Path, *, n: int = 300, folds: int = 5, n_null: int = 1000, n_boot: int = 200,
                    seed: int = 2024) -> dict:
    """Issue 27 item 6 on the bijection and HMM tunnels (recall's exact entropy is 0 at every query: nothing to
    decode) and any architecture the collector reads at the residual stream: the exact posterior's entropy decoded
    at the embedding layer and after every block, held out with folds of whole sequences, raw (rows shuffled for the
    null) and within position (one indicator per query index); the final layer's PC1 share and cluster count against
    their nulls (``final_geometry``); and on the HMM, the question behind "one cluster per hidden state": the k-means
    partition into as many clusters as states against the MAP state, and against the last observation, which names
    the state under an identity emission map (``stats.clusters.cluster_alignment``)."""
    folder = Path(folder)
    cfg, task, model = load_tunnel(folder, ("bijection", "hmm"), "The tunnel geometry")
    batch = task.sample(n, seed=[seed, 0])
    post = batch.posterior.double()  # [n, Q, H]
    Q, H = post.shape[1:]
    entropy = info.entropy(post.reshape(-1, H)).numpy()
    position = np.tile(np.arange(Q, dtype=np.float64), n)
    groups = np.repeat(np.arange(n), Q)
    kw = dict(n_layers=model.cfg.n_layers, groups=groups, folds=folds, n_null=n_null, n_boot=n_boot, seed=seed,
              target="entropy")
    sites = readout_sites(model)
    readings = residual_readings(model, batch, sites)
    tests = (("decodable", dict(shuffle="rows")),
             ("within position", dict(covariates=covariate_basis({"position": position}))))
    decoding = []
    for label, site, layer in sites:
        for test, extra in tests:
            row = _decodability(readings[label], entropy, site=site, layer=layer, **extra, **kw)
            decoding.append(decoding_entry(row, layer=label, test=test))
    geometry = final_geometry(readings, entropy, groups, seed=seed)
    if cfg.task == "hmm":
        final = readings[sites[-1][0]]
        last_obs = batch.input_ids[:, batch.query_pos].reshape(-1).numpy()
        geometry["alignment"] = dict(k=H, **cluster_alignment(
            final, {"map_state": post.argmax(-1).reshape(-1).numpy(), "last_observation": last_obs}, H, seed=seed))
    return dict(folder=str(folder), checkpoint=folder.name, task=cfg.task, task_kwargs=cfg.task_kwargs, arch=cfg.arch,
                n=n, n_rows=len(entropy), decoding=decoding, geometry=geometry)
