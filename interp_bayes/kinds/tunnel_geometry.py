"""Geometry of a wind tunnel of any architecture (issue 27, item 6; ``analyses.p4b``): the exact posterior's
entropy decoded at the embedding output and after every block, held out with folds of whole sequences, raw (rows
shuffled for the null) and within position (one indicator per query index); the final layer's PC1 share and
cluster count against their nulls; and on the HMM, the question behind "one cluster per hidden state": the k-means
partition into as many clusters as states against the MAP state, and against the last observation, which names the
state under an identity emission map. The bijection and HMM tunnels (recall's exact entropy is 0 at every query:
nothing to decode)."""

from __future__ import annotations

# plotly is imported inside the functions that draw: a run that only computes rows does not load it
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core.plugin import Claim, Kind, Line, Result
from ..core.registry import register
from ..core.results import Row, find, select
from .common import check_folds, figure_per_probe
from .windtunnel import TunnelParams, tunnel_plan, tunnel_subject
from ..analyses import p4b as P
from ..analyses.p4b import decoding_verdict
from ..core.figures import COLOURS, axis_titles, error_bars
from ..stats import info
from ..windtunnel.tunnels import open_tunnel

TESTS = ("decodable", "within position")


@dataclass(frozen=True)
class TunnelGeometryParams(TunnelParams):
    tunnel_tasks: ClassVar[tuple[str, ...]] = ("bijection", "hmm")
    tunnel: str = "hmm-sticky-cpu"  # a packaged checkpoint's name or a trained folder
    n: int = 300  # sequences; every query position of each is a row
    folds: int = 5
    n_null: int = 1000  # shuffled-target decoders of the null, at most (drawn until settled)
    n_boot: int = 200
    seed: int = 2024  # the sequence draws, folds, nulls and k-means

    def check(self, ctx, probe: str) -> None:
        check_folds(probe, self.folds, self.n, "sequences", "n")


def run(ctx, p: TunnelGeometryParams) -> Result:
    tunnel = open_tunnel(p.tunnel)
    model, task = tunnel.model, tunnel.task
    batch = task.sample(p.n, seed=[p.seed, 0])
    post = batch.posterior.double()  # [n, Q, H]
    Q, H = post.shape[1:]
    entropy = info.entropy(post.reshape(-1, H)).numpy()
    position = np.tile(np.arange(Q, dtype=np.float64), p.n)
    groups = np.repeat(np.arange(p.n), Q)  # the sequence: the unit of independence
    sites = P.readout_sites(model)
    readings = P.residual_readings(model, batch, sites)
    rows = P.decoding_rows(readings, sites, entropy, position, groups, TESTS, n_layers=model.cfg.n_layers,
                           folds=p.folds, n_null=p.n_null, n_boot=p.n_boot, seed=p.seed)
    final = sites[-1][0]
    rows += P.geometry_rows(readings[final], entropy, groups, label=final, seed=p.seed)
    if tunnel.config.task == "hmm":
        last_obs = batch.input_ids[:, batch.query_pos].reshape(-1).numpy()
        rows += P.alignment_rows(readings[final], {"map_state": post.argmax(-1).reshape(-1).numpy(),
                                                   "last_observation": last_obs}, H, label=final, seed=p.seed)
    return Result(rows, dict(arch=tunnel.config.arch, task=tunnel.config.task))


def summary(rows: list[Row], p: TunnelGeometryParams) -> list[Line]:
    where = tunnel_subject(p)
    out = []
    for test in TESTS:
        rs = select(rows, "decoding_r2", test=test)
        out.append(Line(f"{where}: entropy R² per reading ({test})",
                        ", ".join(f"{r.scope['layer']} {r.value:.3f}" for r in rs),
                        ", ".join(decoding_verdict(r) for r in rs)))
    share, raw = find(rows, "pc1_share"), find(rows, "pc1_share_raw")
    c, s = find(rows, "n_clusters"), find(rows, "cluster_silhouette")
    k = find(rows, "cluster_best_k")
    out += [Line(f"{where}: PC1 share at {share.scope['layer']}, standardised / raw",
                 f"{share.value:.3f} (null {share.null_low:.3f} to {share.null_high:.3f}) / {raw.value:.3f}",
                 share.verdict()),
            Line(f"{where}: clusters at {c.scope['layer']}", f"{c.value:.0f} (best k {k.value:.0f}, silhouette "
                 f"{s.value:.3f} vs Gaussian null {s.null_low:.3f} to {s.null_high:.3f})", s.verdict())]
    for r in select(rows, "cluster_alignment"):
        out.append(Line(f"{where}: clusters at {r.scope['layer']} vs {r.scope['label'].replace('_', ' ')} (ARI)",
                        f"{r.value:.3f} ({r.note})"))
    return out


@figure_per_probe("tunnel-geometry", tunnel_subject)
def figures(fig, pr, where):
    for test in TESTS:
        rs = select(pr.rows, "decoding_r2", test=test)
        x = [r.scope["layer"] for r in rs]
        fig.add_scatter(x=x, y=[r.value for r in rs], mode="lines+markers", name=test, error_y=error_bars(rs))
        fig.add_scatter(x=x, y=[r.null_high for r in rs], mode="lines", showlegend=False,
                        line=dict(dash="dot", color=COLOURS["permuted"]))
    axis_titles(fig, "reading (embedding output, then after each block)", "held-out R² of the exact entropy",
                xaxis=dict(type="category"))
    return (f"Geometry of {where}", "The exact entropy decoded per reading, raw and within position",
            "Bootstrap 95% intervals; dotted: the top of each test's shuffled null.")


def plan(ctx, p: TunnelGeometryParams) -> list:
    return tunnel_plan(p, f"{p.n} sequences decoded at every reading, the final layer's PC1 share and clusters (a "
                       "small model: seconds)")


def ledger(probes) -> list:
    """Per probe: the exact entropy decodes from the final layer beyond its position (within position)."""
    out = []
    for pr in probes:
        within = select(pr.rows, "decoding_r2", test="within position")
        if not within:
            continue
        r = within[-1]
        out.append(Claim("tunnel-entropy-within-position", "The exact entropy decodes from the final layer beyond "
                         "its position", decoding_verdict(r), f"R² {r.value:.4f} vs null [{r.null_low:.4f}, "
                         f"{r.null_high:.4f}] (at {r.scope['layer']})" if np.isfinite(r.value) else f"n/a: {r.note}",
                         subject=tunnel_subject(pr.params_object()), section=f"fig-tunnel-geometry-{pr.name}"))
    return out


KIND = register(Kind("tunnel_geometry", TunnelGeometryParams, run, summary, figures, plan, doc=__doc__,
                     ledger=ledger, subject=tunnel_subject))
