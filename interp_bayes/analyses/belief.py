"""Belief-state probes (Shai et al. 2024): can the exact posterior be read linearly from a model's activations?

A ridge regression (``stats.RidgeBasis``: standardised inputs, penalty chosen by exact leave-one-out error inside
each training fold)
from one reading (the residual stream after a block, the concatenated value vectors or the attention output) onto
the exact posterior vector, cross-fitted over sequences: every prediction comes from a probe fitted on other
sequences, so positions of one sequence never sit on both sides. Reported per reading and layer:

- ``r2``: 1 - SS_res / SS_tot pooled over the posterior's coordinates (the fraction of the belief's variance the
  probe recovers), with a bootstrap interval over sequences;
- ``kl_bits``: mean KL(exact || predicted belief), the prediction clipped at ``floor`` and renormalised onto the
  simplex (a linear map can leave it);
- ``shuffled``: the same fit against posteriors permuted across sequences at fixed position (so the null keeps
  whatever the position alone explains): mean and 95% range of R² over draws.

``windtunnel_belief_probes`` runs that on a wind-tunnel checkpoint with the two other controls of the issue:
the same architecture untrained (fresh initialisation, same seed discipline), and the window-filter posterior as
the target, plus the part of the exact posterior the window misses (exact minus window): if the model carried
only the shortcut, that part would not be readable (R² near 0).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..model.collect import PROBE_READINGS, query_readings
from ..stats.probe import FLOOR, belief_probe


@dataclass
class BeliefProbeResult:
    """Tidy rows, one per (model, target, reading, layer): r2 with its interval and shuffled null, kl_bits."""

    rows: list[dict]
    meta: dict

    def table(self):
        """The rows as a pandas DataFrame (interval columns split into low/high)."""
        import pandas as pd

        return pd.DataFrame(self.rows)

    def figure(self, reading: str = "resid"):
        """Plotly: R² per layer of one reading for each (model, target), with its bootstrap interval, and the
        shuffled null's 95% range as a grey band (the trained model's exact-target null)."""
        import plotly.graph_objects as go

        df = self.table()
        df = df[df.reading == reading]
        fig = go.Figure()
        null = df[(df.model == "trained") & (df.target == "exact")].sort_values("layer")
        fig.add_trace(go.Scatter(x=list(null.layer) + list(null.layer[::-1]),
                                 y=list(null.null_high) + list(null.null_low[::-1]), fill="toself",
                                 line=dict(width=0), fillcolor="rgba(128,128,128,0.3)", name="shuffled null"))
        for (model, target), g in df.groupby(["model", "target"], sort=False):
            g = g.sort_values("layer")
            fig.add_trace(go.Scatter(x=g.layer, y=g.r2, mode="lines+markers", name=f"{model}: {target}",
                                     error_y=dict(type="data", symmetric=False, array=g.r2_high - g.r2,
                                                  arrayminus=g.r2 - g.r2_low)))
        return fig.update_layout(template="plotly_white", xaxis_title="layer", yaxis_title="cross-fitted R²",
                                 title=f"Belief probes ({self.meta['task']}, {reading}): exact posterior vs controls")


def untrained_like(folder: str | Path, tmp: str | Path, *, seed: int = 0):
    """A bridge of ``folder``'s architecture with a fresh initialisation (``seed``), saved under ``tmp``."""
    from ..windtunnel.configs import build_transformer
    from ..windtunnel.train import save_folder
    from ..windtunnel.tunnels import open_tunnel

    trained = open_tunnel(folder)
    torch.manual_seed(seed)
    hf = build_transformer(trained.config, trained.task).eval()
    save_folder(hf, trained.config, trained.task, Path(tmp), {"step": 0, "untrained_seed": seed})
    return open_tunnel(tmp).model


def windtunnel_belief_probes(folder: str | Path, *, n_sequences: int = 400, length: int | None = None,
                             readings: tuple[str, ...] = PROBE_READINGS, layers: list[int] | None = None,
                             window: int = 4, folds: int = 5, n_shuffles: int = 1000, n_boot: int = 1000,
                             seed: int = 2024, untrained: bool = True) -> BeliefProbeResult:
    """Belief probes of a trained wind-tunnel folder on ``n_sequences`` fresh sequences, with the three controls.

    Rows: models ``trained`` and ``untrained`` (same architecture, fresh weights) against targets ``exact``,
    ``window-m`` and ``exact-minus-window-m`` (R² only). Every row carries the shuffled null (drawn until settled,
    ``n_shuffles`` the cap) with its ``decision``, ``p`` and ``draws``.
    """
    from ..tasks.filters import window_posterior
    from ..windtunnel.tunnels import open_tunnel

    folder = Path(folder)
    tunnel = open_tunnel(folder)
    task = tunnel.task
    batch = task.sample(n_sequences, seed=seed, length=length)
    H = len(task.hypothesis_ids)
    exact = batch.posterior.double().reshape(-1, H).numpy()  # [n * Q, H], sequence-major like query_readings
    shortcut = window_posterior(task, batch, window).reshape(-1, H).numpy()
    groups = np.repeat(np.arange(n_sequences), len(batch.query_pos))
    targets = {"exact": (exact, True), f"window-{window}": (shortcut, True),
               f"exact-minus-window-{window}": (exact - shortcut, False)}
    kw = dict(groups=groups, folds=folds, n_shuffles=n_shuffles, n_boot=n_boot, seed=seed)
    rows = []

    def probe_all(model, name: str, wanted: dict) -> None:
        acts = query_readings(model, batch, layers=layers, readings=readings)
        for reading, by_layer in acts.items():
            for layer, x in by_layer.items():
                for target, (y, simplex) in wanted.items():
                    r = belief_probe(x, y, simplex=simplex, **kw)
                    rows.append(dict(model=name, target=target, reading=reading, layer=layer, r2=r["r2"],
                                     r2_low=r["r2_ci"][0], r2_high=r["r2_ci"][1], kl_bits=r["kl_bits"],
                                     null_mean=r["shuffled"]["mean"], null_low=r["shuffled"]["range"][0],
                                     null_high=r["shuffled"]["range"][1], n=r["n"], n_sequences=r["n_sequences"],
                                     dim=r["dim"], decision=r["shuffled"]["test"]["decision"],
                                     p=r["shuffled"]["test"]["p"], draws=r["shuffled"]["n"]))

    probe_all(tunnel.model, "trained", targets)
    if untrained:
        with tempfile.TemporaryDirectory() as tmp:
            probe_all(untrained_like(folder, tmp, seed=tunnel.config.seed), "untrained", targets)
    meta = dict(folder=str(folder), task=task.name, task_kwargs=tunnel.config.task_kwargs, n_sequences=n_sequences,
                length=length or (task.n_pairs if task.name == "bijection" else task.n_steps), window=window,
                folds=folds, n_shuffles=n_shuffles, n_boot=n_boot, seed=seed, floor=FLOOR)
    return BeliefProbeResult(rows, meta)
