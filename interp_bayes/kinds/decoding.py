"""Where is uncertainty decodable, layer by layer (after semantic-entropy probes, Kossen et al. 2024)? A cross-fitted
ridge decoder of the model's entropy and of the exact Bayes entropy from the residual stream, the values and the
attention output at each layer, raw and deconfounded (on position, length and k), beside the PC1 axis's held-out
correlation at the same layer: how much of the decodable uncertainty one direction captures (docs/rivals.md).

On SULA with the sweep's model (``tunnel: null``, the default); on a wind tunnel (``tunnel: <checkpoint>``) with it on
its query prefixes (``windtunnel_prompts``), the layers resolved against its own depth, the entropy over its
hypotheses, the exact posterior's entropy as the Bayes target, folds and bootstraps of whole sequences (a sequence's
prefixes are not independent), and one indicator per query position among the covariates (the bijection's exact
entropy is a function of position: its deconfounded R² is NaN, with that reason)."""

from __future__ import annotations

# plotly is imported inside the functions that draw: a run that only computes rows does not load it
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..core.results import Row, select
from ..core.registry import register
from ..core.plugin import Claim, Figure, Kind, Line, Result
from .common import check_folds, plan_sula, recipe_nuisances, sula, sula_groups, sula_prompts, sula_request
from .windtunnel import (TunnelParams, check_layers, tunnel_plan, tunnel_prefix, tunnel_subject, windtunnel_prompts,
                         windtunnel_set)
from ..analyses.decoding import decoding_curve
from ..core.figures import axis_titles, layout
from ..stats import ledger as L
from ..windtunnel.tunnels import open_tunnel


@dataclass(frozen=True)
class DecodingParams(TunnelParams):
    tunnel: str | None = None  # a wind tunnel (packaged name or trained folder); None: the sweep's model on SULA
    layers: tuple[int, ...] | str = "spread5"  # layers decoded from
    readings: tuple[Literal["resid", "v", "z", "attn_entropy"], ...] = ("resid", "v", "z")
    per_k: int = 50  # SULA: prompts per k
    n_sequences: int = 40  # wind tunnel: sequences whose query prefixes are the prompts
    seed: int = 42
    covariates: tuple[str, ...] = ("length", "k", "log_k")  # k: one indicator per value; length: a spline basis
    folds: int = 5
    n_null: int = 1000  # shuffled-target decoders of the null, at most (drawn until settled; a clear case ~550)
    n_boot: int = 1000

    def check(self, ctx, probe: str) -> None:
        if self.tunnel is None:
            check_folds(probe, self.folds, sula_prompts(self.per_k), "SULA prompts", "per_k")
        else:
            check_folds(probe, self.folds, self.n_sequences, "sequences", "n_sequences")
        check_layers(ctx, probe, self.tunnel, dict(layers=self.layers))


TARGETS = (("model entropy", None), ("bayes latent", "bayes_entropy"))


def run(ctx, p: DecodingParams) -> Result:
    if p.tunnel is None:
        layers = ctx.layers(p.layers)
        acts, cols = sula(ctx, "main", p.per_k, p.seed, p.layers)
        readings = ctx.activations("sula-main-readings", cols["text"], layers=layers, readings=p.readings,
                                   label_tokens=acts.meta["label_tokens"]).with_groups(sula_groups(cols))
    else:
        wt = windtunnel_set(ctx, p.tunnel, p.n_sequences, p.seed, layers=p.layers, readings=p.readings)
        readings, cols, layers = wt.acts, wt.cols, wt.layers
    cov, _ = recipe_nuisances(p, [len(t) for t in readings.token_ids], cols["k"])
    rows = []
    for name, column in TARGETS:
        curve = decoding_curve(readings, None if column is None else np.asarray(cols[column]), target_name=name,
                               readings=p.readings, layers=layers, covariates=cov, folds=p.folds, n_null=p.n_null,
                               n_boot=p.n_boot, seed=ctx.config.seed)
        rows += curve.rows()
    return Result(rows)


def _word(row: Row) -> str:
    """The R²'s place against its null, from its sequential test where it has one."""
    if not row.test:
        return row.verdict()
    return {L.HOLDS: "above null", L.BORDERLINE: L.BORDERLINE}.get(L.beyond_null(row), "within null")


def summary(rows: list[Row], p: DecodingParams) -> list[Line]:
    out = []
    where = tunnel_prefix(p)
    for target, _ in TARGETS:
        for adjust in ("raw", "deconfounded"):
            every = select(rows, "decoding_r2", target=target, adjust=adjust)
            r2 = [r for r in every if np.isfinite(r.value)]
            if every and not r2:  # e.g. the bijection's exact entropy given the query position
                reasons = sorted({r.note for r in every if r.note})
                out.append(Line(f"{where}decodable {target} ({adjust}): best held-out R²",
                                f"undefined at every layer ({'; '.join(reasons)})"))
            if not r2:
                continue
            # the family's row (one decision over every reading and layer) where the run has it
            best = next(iter(select(rows, "decoding_r2_best", target=target, adjust=adjust)), None) \
                or max(r2, key=lambda r: r.value)
            share = next((r for r in select(rows, "axis_share_of_decodable", target=target, adjust=adjust,
                                            layer=best.scope["layer"], reading="v")), None)
            share_text = f"; the values' PC1 axis carries {share.value:.0%} of it at that layer" \
                if share is not None and np.isfinite(share.value) else ""
            out.append(Line(f"{where}decodable {target} ({adjust}): best held-out R²",
                            f"{best.value:.2f} ({best.scope['reading']} L{best.scope['layer']}; shuffled-target null "
                            f"up to {best.null_high:.2f}){share_text}", _word(best)))
    return out


READING_COLOURS = {"resid": "#1f4e79", "v": "#27ae60", "z": "#8e44ad", "attn_entropy": "#d68910"}


def figures(probes) -> list[Figure]:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    out = []
    for p in probes:
        targets = list(dict.fromkeys(r.scope["target"] for r in select(p.rows, "decoding_r2")))
        adjusts = ("raw", "deconfounded")
        fig = make_subplots(rows=len(targets), cols=2, shared_xaxes=True, shared_yaxes=True,
                            subplot_titles=[f"{t}, {a}" for t in targets for a in adjusts])
        for i, target in enumerate(targets, start=1):
            for j, adjust in enumerate(adjusts, start=1):
                for reading in p.params.get("readings", []):
                    rs = sorted(select(p.rows, "decoding_r2", target=target, adjust=adjust, reading=reading),
                                key=lambda r: r.scope["layer"])
                    fig.add_trace(go.Scatter(x=[r.scope["layer"] for r in rs], y=[r.value for r in rs],
                                             mode="lines+markers", name=f"ridge R², {reading}", legendgroup=reading,
                                             line=dict(color=READING_COLOURS.get(reading, "#333")),
                                             showlegend=i == j == 1), row=i, col=j)  # one colour per reading
                axis = sorted(select(p.rows, "axis_r", target=target, adjust=adjust, reading="v"),
                              key=lambda r: r.scope["layer"])
                fig.add_trace(go.Scatter(x=[r.scope["layer"] for r in axis], y=[r.value ** 2 for r in axis],
                                         mode="lines+markers", line=dict(dash="dash", color="#c0392b"),
                                         name="PC1 axis r² (values)", legendgroup="axis", showlegend=i == j == 1),
                              row=i, col=j)
        axis_titles(fig, "layer", "held-out R²", yaxis=dict(range=[-0.1, 1.0]))
        out.append(Figure(f"decoding-{p.name}", "Decodable uncertainty per layer", layout(
            fig, "How much uncertainty a linear decoder reads at each layer, and how much of it the axis carries",
            height=330 * len(targets) + 80),
            "Solid: cross-fitted ridge R² per reading; dashed red: the values' PC1 axis r². A gap between them is "
            "uncertainty a single direction misses; the right column removes position, length and k first."))
    return out


def plan(ctx, p: DecodingParams) -> list:
    """The SULA main set and its readings at the probe's layers (or a wind tunnel's prefixes), then the ridge
    decoders (arithmetic only)."""
    if p.tunnel is not None:
        prompts, _ = windtunnel_prompts(open_tunnel(p.tunnel).task, p.n_sequences, p.seed)
        return tunnel_plan(p, f"{len(prompts)} prefixes, readings {', '.join(p.readings)} at every layer (a small "
                           "model: seconds)", len(prompts))
    req = sula_request(ctx, "main", p.per_k, p.seed, p.layers)
    return plan_sula(ctx, "decoding", ["main"], p.per_k, p.seed, p.layers) + [
        ctx.plan_acts("decoding", "sula-main-readings", req["prompts"], layers=ctx.layers(p.layers),
                      readings=p.readings, label_tokens=req["label_tokens"], dims=ctx.site_dims())]


DECODABLE_R2 = 0.1  # a held-out R² that clears its null but stays under this is decodable only weakly
AXIS_SHARE = (0.5, 0.25)  # the PC1 axis carries "most" (holds) or "a good part" (weakly) of the decodable R²


def decodable_claim(rows: list[Row]):
    """(verdict, the best row or None, evidence) of "model entropy is decodable beyond the confounds": one decision
    over every layer and reading (``analyses.decoding.best_of``: the largest deconfounded R² against the largest of
    the shuffled targets', family-wise at the level), the R²'s interval clearing 0 (``ledger.decodable``) and its
    low end at least ``DECODABLE_R2`` for "holds" (``ledger.at_least``). The best row is returned (its location
    named) only when it survives. Without a finite R² anywhere, the first cell's verdict (e.g. "inseparable"); None
    without any decoding row or without the family's row (a run from before it existed)."""
    best = next(iter(select(rows, "decoding_r2_best", target="model entropy", adjust="deconfounded")), None)
    if best is None:  # no finite R² at any cell (its reason: inseparable or untestable), or a run from before
        every = select(rows, "decoding_r2", target="model entropy", adjust="deconfounded")
        if not every or any(np.isfinite(r.value) for r in every):
            return None
        return L.decodable(every[0]), None, L.fmt(every[0])
    verdict = L.at_least(L.decodable(best), best, DECODABLE_R2)
    return verdict, best if verdict in (L.HOLDS, L.WEAK) else None, L.fmt(best)


def ledger(probes) -> list:
    """Where uncertainty is decodable: the model's entropy beyond the confounds, one decision over the layers and
    readings (``decodable_claim``), and the share of it the values' PC1 axis carries at the layer that survives."""
    out = []
    for p in probes:
        where = tunnel_subject(p.params_object())
        decided = decodable_claim(p.rows)
        if decided is None:
            continue
        verdict, best, evidence = decided
        at = f"best held-out R², {best.scope.get('reading')} L{best.scope.get('layer')}" if best is not None else \
            "no layer and reading survives the family-wise test"
        out.append(Claim("decodable", f"Model entropy is decodable beyond the confounds ({at})", verdict, evidence,
                         subject=where, rival=True, section=f"fig-decoding-{p.name}"))
        share = None if best is None else next(iter(select(
            p.rows, "axis_share_of_decodable", target="model entropy", adjust="deconfounded",
            layer=best.scope.get("layer"), reading="v")), None)
        if share is not None and np.isfinite(share.value):
            out.append(Claim("axis-share", f"The values' PC1 axis carries most of the decodable entropy (L"
                             f"{best.scope.get('layer')}, deconfounded)", L.magnitude(share.value, *AXIS_SHARE),
                             f"{share.value:.0%} of the decodable R²", subject=where, rival=True,
                             section=f"fig-decoding-{p.name}"))
    return out


KIND = register(Kind("decoding", DecodingParams, run, summary, figures, plan, doc=__doc__, ledger=ledger,
                     subject=tunnel_subject))
