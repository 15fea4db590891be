"""P4b, "decodable but inert", on a bijection wind tunnel (``analyses.p4b``): the exact entropy decoded at the
embedding output and after every block (raw, beyond position, within position; the position beside it), the entropy,
position and (with replacement) within-position axes and the hypothesis frames cut at every position against
isotropic and variance-matched random subspaces (cost in KL to the exact posterior and in entropy MAE, bits), and the
final layer's PC1 share and clusters. Sequences fitted on one sample (``n_fit``) and scored on another (``n_eval``);
any architecture, read at its residual stream."""

from __future__ import annotations

# plotly is imported inside the functions that draw: a run that only computes rows does not load it
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from ..core.plugin import Claim, Kind, Line, Result
from ..core.registry import register
from ..core.results import Row, find, select
from .common import check_folds, figure_per_probe
from .windtunnel import TunnelParams, tunnel_plan, tunnel_subject
from ..analyses import p4b as P
from ..analyses.p4b import AUTHORS, answer, best_layer, cut_verdicts, decoding_verdict
from ..analyses.subspaces import ablation_costs, every_position, fit_subspaces, sequence_losses, top_rows
from ..core.figures import COLOURS, axis_titles, error_bars
from ..model.edits import intervene
from ..stats import as_float64, info
from ..windtunnel.discrete import restricted_log_probs
from ..windtunnel.tunnels import open_tunnel


@dataclass(frozen=True)
class P4bParams(TunnelParams):
    tunnel_tasks: ClassVar[tuple[str, ...]] = ("bijection",)
    tunnel: str = "bijection-repl-cpu"  # a packaged bijection checkpoint's name or a trained folder
    n_fit: int = 400  # sequences the decoders and subspaces are fitted on
    n_eval: int = 300  # sequences the cuts are scored on
    n_controls: int = 20  # isotropic and as many variance-matched random subspaces per cut subspace
    folds: int = 5
    n_null: int = 1000  # shuffled-target decoders of a decodability null, at most (drawn until settled)
    n_boot: int = 500
    frames: bool = True  # cut the hypothesis frames too (frame-embed and fit_subspaces's)
    geometry: bool = True  # the final layer's PC1 share and clusters
    seed: int = 2024  # the sequence draws, folds, nulls and controls

    def check(self, ctx, probe: str) -> None:
        check_folds(probe, self.folds, self.n_fit, "sequences", "n_fit")


def run(ctx, p: P4bParams) -> Result:
    tunnel = open_tunnel(p.tunnel)
    model, task = tunnel.model, tunnel.task
    fit, ev = task.sample(p.n_fit, seed=[p.seed, 0]), task.sample(p.n_eval, seed=[p.seed, 1])
    hyp, H, Q = task.hypothesis_ids, len(task.hypothesis_ids), len(fit.query_pos)
    post_fit = fit.posterior.double().reshape(-1, H).numpy()
    entropy = info.entropy(torch.from_numpy(post_fit)).numpy()  # [n * Q] exact entropy, bits
    position = np.tile(np.arange(Q, dtype=np.float64), p.n_fit)  # the query index of each row
    groups = np.repeat(np.arange(p.n_fit), Q)  # the sequence: the unit of independence

    def score(site: str, layer: int, op=None) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad(), intervene(model, {layer: op} if op is not None else {}, site=site):
            return sequence_losses(restricted_log_probs(model, ev, hyp).cpu(), ev.posterior)

    base = score("resid", 0)
    sites = P.readout_sites(model)
    readings = P.residual_readings(model, fit, sites)
    rows = P.decoding_rows(readings, sites, entropy, position, groups, list(P.TESTS), n_layers=model.cfg.n_layers,
                           folds=p.folds, n_null=p.n_null, n_boot=p.n_boot, seed=p.seed)
    rows += [Row("cost_tolerance", P.cost_tolerance(H), "bits", n=H,
                 note=f"{P.COST_ULPS} float32 ulps of log2 H: a cut costing less is rounding, never load-bearing"),
             Row("unedited_kl_bits", float(base[1].mean()), "bits", n=p.n_eval,
                 note="KL(exact posterior || model), the unedited model"),
             Row("unedited_mae_bits", float(base[0].mean()), "bits", n=p.n_eval,
                 note="|H(model) - H(exact posterior)|, the unedited model")]
    every = {label: every_position(model, fit, layer, site) for label, site, layer in sites}
    embed_x, embed_tokens = every[P.EMBED]
    means = [embed_x[embed_tokens == h].mean(0) for h in hyp if (embed_tokens == h).any()]
    frame_embed = top_rows(np.stack(means), len(means))  # the authors' frame: k = H hypothesis embeddings
    draws = []
    for label, site, layer in sites:
        xq = as_float64(readings[label])
        named = P.p4b_subspaces(xq, entropy, position)
        if p.frames:
            x_all, tokens = every[label]
            named["frame-embed"] = frame_embed
            named |= {k: v for k, v in fit_subspaces(xq, post_fit, x_all, tokens, hyp).items() if k != "entropy-axis"}
        got, summary = ablation_costs(lambda op, site=site, layer=layer: score(site, layer, op), every[label][0],
                                      named, base, layer=layer, ops=("cut",), n_isotropic=p.n_controls,
                                      n_matched=p.n_controls, seed=p.seed, scope=dict(reading=label, site=site))
        draws += got
        rows += P.ablation_rows(summary, label, p.n_eval)
    if p.geometry:
        final = sites[-1][0]
        rows += P.geometry_rows(readings[final], entropy, groups, label=final, seed=p.seed)
    return Result(rows, dict(draws=draws, entropy_varies_within_position=P.entropy_varies_within_position(
        entropy, position), arch=tunnel.config.arch, authors=P.AUTHORS))


def summary(rows: list[Row], p: P4bParams) -> list[Line]:
    where, tol = tunnel_subject(p), find(rows, "cost_tolerance").value
    out = []
    for r in select(rows, "decoding_r2"):
        at = r.scope
        out.append(Line(f"{where}: P4b {at['target']} R² at {at['layer']} ({at['test']})",
                        f"{r.value:.4f} ({r.low:.4f}, {r.high:.4f}); null {r.null_low:.4f} to {r.null_high:.4f}"
                        if np.isfinite(r.value) else f"n/a ({r.note})", decoding_verdict(r)))
    for r in select(rows, "cut_kl_bits"):
        inert, _ = cut_verdicts(r, tol)
        at = r.scope
        out.append(Line(f"{where}: P4b cut {at['subspace']} (k = {at['k']}) at {at['layer']}: KL cost",
                        f"{r.value:+.4f} bits; matched {r.null_low:+.4f} to {r.null_high:+.4f}",
                        "inert" if inert == "holds" else "not inert"))
    return out + [Line(f"{where}: P4b answer", answer(rows, where)["line"])]


@figure_per_probe("p4b", tunnel_subject, rows=1, cols=2,
                  subplot_titles=["held-out R² per reading", "cut: KL cost per reading"])
def figures(fig, pr, where):
    for test in dict.fromkeys(r.scope["test"] for r in select(pr.rows, "decoding_r2")):
        rs = select(pr.rows, "decoding_r2", test=test)
        fig.add_scatter(x=[r.scope["layer"] for r in rs], y=[r.value for r in rs], mode="lines+markers",
                        name=f"{rs[0].scope['target']} R², {test}", row=1, col=1)
    for sub in dict.fromkeys(r.scope["subspace"] for r in select(pr.rows, "cut_kl_bits")):
        rs = select(pr.rows, "cut_kl_bits", subspace=sub)
        fig.add_scatter(x=[r.scope["layer"] for r in rs], y=[r.value for r in rs], mode="lines+markers",
                        name=f"cut {sub}", error_y=error_bars(rs), row=1, col=2)
        fig.add_scatter(x=[r.scope["layer"] for r in rs], y=[r.null_high for r in rs], mode="lines",
                        line=dict(dash="dot", color=COLOURS["permuted"]), showlegend=False, row=1, col=2)
    axis_titles(fig, "reading (embedding output, then after each block)", None, xaxis=dict(type="category"))
    for col, y in enumerate(("R²", "bits over the unedited model"), 1):
        axis_titles(fig, None, y, row=1, col=col)
    return (f"P4b on {where}: decodable, and inert?",
            "The entropy decoded per reading, and what cutting each axis or frame costs",
            "Left: held-out R² of the exact entropy (and of the position), raw, beyond position and within position. "
            "Right: the cut's KL cost with its paired bootstrap interval; dotted: the top of its matched "
            "random-subspace controls.")


def plan(ctx, p: P4bParams) -> list:
    return tunnel_plan(p, f"decodability at every reading, cuts against {p.n_controls} + {p.n_controls} random "
                       f"subspaces each ({p.n_fit} fitted, {p.n_eval} scored sequences; a small model: minutes)")


def ledger(probes) -> list:
    """Per probe, at the reading where the entropy decodes best (the authors' choice): cutting the entropy axis is
    inert (the authors' P4b), and the axis that decodes the entropy reads it beyond position (a rival reading: the
    entropy of keys drawn without replacement is a function of position)."""
    out = []
    for pr in probes:
        where = tunnel_subject(pr.params_object())
        if not select(pr.rows, "decoding_r2", test="decodable"):
            continue
        said, best = answer(pr.rows, where), best_layer(pr.rows)
        axis = find(pr.rows, "cut_kl_bits", layer=best, subspace="entropy-axis")
        within = find(pr.rows, "decoding_r2", layer=best, test="within position")
        section = f"fig-p4b-{pr.name}"
        out.append(Claim("p4b-inert", "Cutting the decodable entropy axis is inert (P4b)", said["axis_inert"],
                         f"{axis.value:+.4f} bits vs matched [{axis.null_low:+.4f}, {axis.null_high:+.4f}] (at "
                         f"{best})", subject=where, section=section,
                         paper=f"authors: axis cut {AUTHORS['axis_delta_mae_bits']:+.3f} bits, frame cut "
                               f"{AUTHORS['frame_delta_mae_bits']:+.2f} bits (entropy MAE)"))
        out.append(Claim("p4b-beyond-position", "The axis that decodes the entropy reads it beyond position",
                         decoding_verdict(within), f"within-position R² {within.value:.4f} vs null "
                         f"[{within.null_low:.4f}, {within.null_high:.4f}] (at {best})" if np.isfinite(within.value)
                         else f"n/a: {within.note} (at {best})", subject=where, section=section, rival=True))
    return out


KIND = register(Kind("p4b", P4bParams, run, summary, figures, plan, doc=__doc__, ledger=ledger,
                     subject=tunnel_subject))
