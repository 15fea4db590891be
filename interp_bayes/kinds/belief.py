"""Belief-state probes on a wind tunnel (Shai et al. 2024; ``analyses.belief``): cross-fitted ridge probes from the
residual stream, the values and the attention output at every layer onto the exact posterior of fresh sequences, with
three controls: the same architecture untrained (fresh initialisation), the window-filter posterior as the target,
and the part of the exact posterior the window misses (exact minus window; R² only)."""

from __future__ import annotations

# plotly is imported inside the functions that draw: a run that only computes rows does not load it
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import torch

from ..core.plugin import Claim, Kind, Line, Result
from ..core.registry import register
from ..core.results import Row, find, select
from .common import check_folds, figure_per_probe
from .windtunnel import TunnelParams, check_layers, tunnel_plan, tunnel_subject
from ..analyses.belief import belief_rows
from ..core.figures import axis_titles, error_bars
from ..model.collect import query_readings
from ..stats import ledger as L
from ..stats.ledger import beyond_null
from ..tasks.filters import window_posterior
from ..windtunnel.configs import build_transformer
from ..windtunnel.train import save_folder
from ..windtunnel.tunnels import open_tunnel


@dataclass(frozen=True)
class BeliefParams(TunnelParams):
    tunnel_tasks: ClassVar[tuple[str, ...]] = ("bijection", "hmm")  # the tasks with a window filter
    tunnel_archs: ClassVar[tuple[str, ...] | None] = ("transformer",)  # values, attention output, an untrained twin
    tunnel: str = "hmm-cpu"  # a packaged checkpoint's name or a trained folder
    n_sequences: int = 400  # fresh sequences; every query position of each is a row
    length: int | None = None  # observations per sequence (None: the task's own)
    readings: tuple[Literal["resid", "v", "z"], ...] = ("resid", "v", "z")
    layers: tuple[int, ...] | None = None  # None: every layer
    window: int = 4  # observations the shortcut's window filter sees
    folds: int = 5
    n_shuffles: int = 1000  # shuffled-posterior fits of the null, at most (drawn until settled)
    n_boot: int = 1000
    seed: int = 2024  # the sequence draws, folds and nulls
    untrained: bool = True  # probe the untrained twin too

    def check(self, ctx, probe: str) -> None:
        check_folds(probe, self.folds, self.n_sequences, "sequences", "n_sequences")
        check_layers(ctx, probe, self.tunnel, dict(layers=self.layers))


def untrained_like(tunnel, tmp: Path, *, seed: int):
    """A model of ``tunnel``'s architecture with a fresh initialisation (``seed``), saved under ``tmp`` and opened
    as the trained one is."""
    torch.manual_seed(seed)
    hf = build_transformer(tunnel.config, tunnel.task).eval()
    save_folder(hf, tunnel.config, tunnel.task, tmp, {"step": 0, "untrained_seed": seed})
    return open_tunnel(tmp).model


def run(ctx, p: BeliefParams) -> Result:
    tunnel = open_tunnel(p.tunnel)
    task = tunnel.task
    batch = task.sample(p.n_sequences, seed=p.seed, length=p.length)
    H = len(task.hypothesis_ids)
    exact = batch.posterior.double().reshape(-1, H).numpy()  # [n * Q, H], sequence-major like query_readings
    shortcut = window_posterior(task, batch, p.window).reshape(-1, H).numpy()
    targets = {"exact": (exact, True), f"window-{p.window}": (shortcut, True),
               f"exact-minus-window-{p.window}": (exact - shortcut, False)}
    kw = dict(groups=np.repeat(np.arange(p.n_sequences), len(batch.query_pos)), folds=p.folds,
              n_shuffles=p.n_shuffles, n_boot=p.n_boot, seed=p.seed)
    layers = None if p.layers is None else list(p.layers)

    def probe(model, weights: str) -> list[Row]:
        return belief_rows(query_readings(model, batch, layers=layers, readings=p.readings), targets,
                           weights=weights, **kw)

    rows = probe(tunnel.model, "trained")
    if p.untrained:
        with tempfile.TemporaryDirectory() as tmp:
            rows += probe(untrained_like(tunnel, Path(tmp), seed=tunnel.config.seed), "untrained")
    return Result(rows, dict(task=task.name, task_kwargs=tunnel.config.task_kwargs))


def summary(rows: list[Row], p: BeliefParams) -> list[Line]:
    out = []
    for r in select(rows, "belief_r2"):
        at = r.scope
        kl = find(rows, "belief_kl_bits", **at)
        out.append(Line(f"{tunnel_subject(p)}: belief probe R², {at['weights']}, {at['target']}, {at['reading']} "
                        f"L{at['layer']}", f"{r.value:.3f} ({r.low:.3f}, {r.high:.3f}); null {r.null_low:.3f} to "
                        f"{r.null_high:.3f}" + (f"; KL {kl.value:.4g} bits" if np.isfinite(kl.value) else ""),
                        beyond_null(r)))
    return out


@figure_per_probe("belief", tunnel_subject)
def figures(fig, pr, where):
    """Per probe: R² per layer of the residual stream for each (weights, target), with its bootstrap interval, and
    the trained model's exact-target shuffled null as a grey band."""
    rs = select(pr.rows, "belief_r2", reading="resid")
    if not rs:
        return None
    null = sorted(select(rs, weights="trained", target="exact"), key=lambda r: r.scope["layer"])
    x = [r.scope["layer"] for r in null]
    fig.add_scatter(x=x + x[::-1], y=[r.null_high for r in null] + [r.null_low for r in null][::-1],
                    fill="toself", line=dict(width=0), fillcolor="rgba(128,128,128,0.3)", name="shuffled null")
    for weights, target in dict.fromkeys((r.scope["weights"], r.scope["target"]) for r in rs):
        g = sorted(select(rs, weights=weights, target=target), key=lambda r: r.scope["layer"])
        fig.add_scatter(x=[r.scope["layer"] for r in g], y=[r.value for r in g], mode="lines+markers",
                        name=f"{weights}: {target}", error_y=error_bars(g))
    axis_titles(fig, "layer", "cross-fitted R²")
    return (f"Belief probes on {where}",
            f"Belief probes ({pr.data.get('task')}, resid): the exact posterior against its controls",
            "Grey: the 95% range of the R² of probes fitted to posteriors shuffled across sequences.")


def plan(ctx, p: BeliefParams) -> list:
    return tunnel_plan(p, f"belief probes of {p.n_sequences} sequences at {', '.join(p.readings)}, "
                       f"{'trained and untrained' if p.untrained else 'trained'} (a small model: minutes)")


def ledger(probes) -> list:
    """Per probe, at the trained model's last probed residual layer: the exact posterior is linearly readable
    (beyond its shuffled null), and so is the part the window shortcut misses (the model carries more than it)."""
    out = []
    for pr in probes:
        trained = select(pr.rows, "belief_r2", weights="trained", reading="resid")
        if not trained:
            continue
        params, layer = pr.params_object(), max(r.scope["layer"] for r in trained)
        exact = find(trained, "belief_r2", target="exact", layer=layer)
        missed = find(trained, "belief_r2", target=f"exact-minus-window-{params.window}", layer=layer)
        where, section = tunnel_subject(params), f"fig-belief-{pr.name}"
        out += [Claim("belief-readable", f"The exact posterior is linearly readable (belief probe, resid L{layer})",
                      L.beyond_null(exact), L.fmt(exact), subject=where, section=section),
                Claim("belief-beyond-window", f"The part of the posterior the window-{params.window} shortcut "
                      f"misses is readable too (resid L{layer})", L.beyond_null(missed), L.fmt(missed),
                      subject=where, section=section, rival=True)]
    return out


KIND = register(Kind("belief", BeliefParams, run, summary, figures, plan, doc=__doc__, ledger=ledger,
                     subject=tunnel_subject))
