"""Belief-state probes (Shai et al. 2024): can the exact posterior be read linearly from a model's activations?

A ridge regression (standardised inputs, penalty chosen by exact leave-one-out error inside each training fold)
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

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .calibration import kl_bits
from .errors import ConfigError
from .extract import HOOKS
from .geometry import as_float64

ALPHAS = np.logspace(-3, 5, 17)
PROBE_READINGS = ("resid", "v", "z")
FLOOR = 1e-3


@torch.no_grad()
def query_readings(model, batch, *, layers: list[int] | None = None, readings: tuple[str, ...] = ("resid",),
                   batch_size: int = 250) -> dict[str, dict[int, torch.Tensor]]:
    """Activations at every query position of ``batch`` (a ``TaskBatch``), one forward pass per chunk of sequences.

    Returns ``{reading: {layer: [n * Q, dim] float32}}``, rows in sequence-major order (row i * Q + q is sequence
    i, query q), heads concatenated as in ``extract.collect``. ``readings``: any of ``"resid"`` (after the
    block), ``"v"`` and ``"z"``; ``layers`` default to all.
    """
    unknown = set(readings) - set(PROBE_READINGS)
    if unknown:
        raise ConfigError(f"Unknown probe reading(s) {sorted(unknown)}; choose from {', '.join(PROBE_READINGS)}.")
    n_layers = model.cfg.n_layers
    layers = list(range(n_layers)) if layers is None else [layer % n_layers for layer in layers]
    device = next(model.parameters()).device
    pos = batch.query_pos.to(device)
    got: dict[tuple[str, int], list[torch.Tensor]] = {(r, layer): [] for r in readings for layer in layers}

    def keep(reading: str, layer: int):
        def hook(act: torch.Tensor, hook) -> None:  # observes only
            picked = act[:, pos].detach().to("cpu", torch.float32)  # [b, Q, ...]
            got[(reading, layer)].append(picked.reshape(picked.shape[0] * picked.shape[1], -1))
        return hook

    fwd_hooks = [(HOOKS[r][0].format(layer=layer), keep(r, layer)) for r in readings for layer in layers]
    with model.hooks(fwd_hooks=fwd_hooks):
        for start in range(0, batch.input_ids.shape[0], batch_size):
            model(batch.input_ids[start : start + batch_size].to(device))
    return {r: {layer: torch.cat(got[(r, layer)]) for layer in layers} for r in readings}


def pooled_r2(y: np.ndarray, y_hat: np.ndarray) -> float:
    """1 - sum of squared residuals / total sum of squares, over all rows and coordinates ([n, H] each)."""
    total = ((y - y.mean(axis=0)) ** 2).sum()
    return float(1.0 - ((y - y_hat) ** 2).sum() / total) if total > 0 else float("nan")


def simplex_belief(pred: np.ndarray, floor: float = FLOOR) -> np.ndarray:
    """Rows clipped at ``floor`` and renormalised: a probability vector from a linear prediction."""
    clipped = np.maximum(pred, floor)
    return clipped / clipped.sum(axis=-1, keepdims=True)


@dataclass
class RidgeFit:
    """A ridge probe on standardised inputs: predict(x) = ((x - mean) / sd) @ coef + intercept."""

    mean: np.ndarray  # [d]
    sd: np.ndarray  # [d]
    coef: np.ndarray  # [d, H]
    intercept: np.ndarray  # [H]
    alpha: float
    loo_mse: float  # leave-one-out mean squared error (per row and coordinate) at ``alpha``

    def predict(self, x: np.ndarray) -> np.ndarray:
        return ((x - self.mean) / self.sd) @ self.coef + self.intercept


class RidgeBasis:
    """The SVD of one training set's standardised inputs, shared by every target fitted on them."""

    def __init__(self, x: np.ndarray) -> None:
        self.mean, sd = x.mean(axis=0), x.std(axis=0)
        self.sd = np.where(sd > 0, sd, 1.0)
        self.u, self.s, self.vt = np.linalg.svd((x - self.mean) / self.sd, full_matrices=False)
        self.leverage_u2 = self.u**2

    def fit(self, y: np.ndarray, alphas: np.ndarray = ALPHAS) -> RidgeFit:
        """Multi-output ridge with an unpenalised intercept, the penalty chosen among ``alphas`` by the exact
        leave-one-out error pooled over outputs (the LOO residual of a linear smoother is (y - y_hat) / (1 - h_ii)):
        what ``sklearn.linear_model.RidgeCV`` computes, from one SVD for all alphas and targets."""
        y_mean = y.mean(axis=0)
        yc = y - y_mean
        uty = self.u.T @ yc  # [k, H]
        best = (np.inf, None)
        for alpha in alphas:
            shrink = self.s**2 / (self.s**2 + alpha)  # [k]
            resid = yc - self.u @ (shrink[:, None] * uty)
            leverage = self.leverage_u2 @ shrink + 1.0 / len(y)  # [n] hat-matrix diagonal, intercept included
            loo = float(((resid / (1.0 - leverage)[:, None]) ** 2).mean())
            if loo < best[0]:
                best = (loo, alpha)
        loo, alpha = best
        coef = self.vt.T @ ((self.s / (self.s**2 + alpha))[:, None] * uty)  # [d, H]
        return RidgeFit(self.mean, self.sd, coef, y_mean, float(alpha), loo)


def fit_ridge(x: np.ndarray, y: np.ndarray, alphas: np.ndarray = ALPHAS) -> RidgeFit:
    """Ridge probe of ``y`` [n, H] on standardised ``x`` [n, d], penalty by leave-one-out (``RidgeBasis.fit``)."""
    return RidgeBasis(x).fit(y, alphas)


def cross_fitted_ridge(x: np.ndarray, ys: list[np.ndarray], groups: np.ndarray, *, folds: int = 5, seed: int = 0,
                       alphas: np.ndarray = ALPHAS) -> list[np.ndarray]:
    """Held-out ridge predictions of each target in ``ys`` ([n, H] each) from ``x`` [n, d]: each group (sequence)
    predicted by a probe fitted on the other folds of groups (standardised on the training fold, LOO penalty)."""
    from sklearn.model_selection import GroupKFold

    if len(np.unique(groups)) < folds:
        raise ConfigError(f"{len(np.unique(groups))} sequences cannot be split into {folds} folds; use more sequences "
                          "or fewer folds.")
    out = [np.empty_like(y) for y in ys]
    for train, test in GroupKFold(n_splits=folds, shuffle=True, random_state=seed).split(x, groups=groups):
        basis = RidgeBasis(x[train])
        for y, pred in zip(ys, out):
            pred[test] = basis.fit(y[train], alphas).predict(x[test])
    return out


def bootstrap_r2(y: np.ndarray, y_hat: np.ndarray, group: np.ndarray, *, n_boot: int, seed: int) -> np.ndarray:
    """``pooled_r2`` over ``n_boot`` resamples of whole groups (``group``: 0..G-1 per row), from per-group sums:
    a resample's sums are its group counts times the groups' sums."""
    G = int(group.max()) + 1
    stats = np.stack([np.bincount(group, minlength=G).astype(float),  # rows
                      np.bincount(group, weights=((y - y_hat) ** 2).sum(-1), minlength=G),  # residual squares
                      np.bincount(group, weights=(y**2).sum(-1), minlength=G)], axis=1)  # [G, 3]
    sums = np.stack([np.bincount(group, weights=y[:, h], minlength=G) for h in range(y.shape[1])], axis=1)  # [G, H]
    rng = np.random.default_rng(seed)
    counts = np.stack([np.bincount(rng.integers(0, G, G), minlength=G) for _ in range(n_boot)]).astype(float)
    rows, res, sq = (counts @ stats).T  # [n_boot] each
    total = sq - ((counts @ sums) ** 2).sum(-1) / rows
    return 1.0 - res / total


def _interval(samples: np.ndarray) -> list[float]:
    return [float(np.quantile(samples, 0.025)), float(np.quantile(samples, 0.975))]


def belief_probe(acts, posterior, *, groups=None, folds: int = 5, n_shuffles: int = 20, n_boot: int = 1000,
                 seed: int = 0, floor: float = FLOOR, simplex: bool = True) -> dict[str, Any]:
    """Cross-fitted linear probe of ``posterior`` [n, H] from ``acts`` [n, d] (see the module docstring).

    ``groups``: the sequence of each row (rows of one sequence share a fold); default: rows are independent.
    Rows must come in equal-sized groups in sequence-major order for the position-keeping shuffle (as
    ``query_readings`` gives them); otherwise whole rows are shuffled. ``simplex=False`` skips the KL (for targets
    that are not distributions, e.g. exact minus window). Returns r2, r2_ci, kl_bits and the shuffled null.
    """
    from threadpoolctl import threadpool_limits

    x, y = as_float64(acts), as_float64(posterior)
    if x.ndim != 2 or y.ndim != 2 or len(x) != len(y):
        raise ConfigError(f"belief_probe needs acts [n, d] and posterior [n, H] with the same n; got {x.shape} and "
                          f"{y.shape}.")
    with threadpool_limits(limits=torch.get_num_threads()):  # BLAS follows torch's thread count (shared cores)
        return _belief_probe(x, y, groups=groups, folds=folds, n_shuffles=n_shuffles, n_boot=n_boot, seed=seed,
                             floor=floor, simplex=simplex)


def _belief_probe(x: np.ndarray, y: np.ndarray, *, groups, folds: int, n_shuffles: int, n_boot: int, seed: int,
                  floor: float, simplex: bool) -> dict[str, Any]:
    groups = np.arange(len(x)) if groups is None else np.asarray(groups)
    ids, inverse = np.unique(groups, return_inverse=True)
    sizes = np.bincount(inverse)
    by_sequence = (sizes == sizes[0]).all() and (inverse == np.repeat(np.arange(len(ids)), sizes[0])).all()
    nulls = []
    for i in range(n_shuffles):
        shuffle_rng = np.random.default_rng([seed, 1, i])
        if by_sequence:  # permute whole sequences, keeping each row's position
            order = shuffle_rng.permutation(len(ids))
            nulls.append(y[(order[:, None] * sizes[0] + np.arange(sizes[0])[None, :]).reshape(-1)])
        else:
            nulls.append(y[shuffle_rng.permutation(len(y))])
    y_hat, *null_hats = cross_fitted_ridge(x, [y, *nulls], groups, folds=folds, seed=seed)
    boot = bootstrap_r2(y, y_hat, inverse, n_boot=n_boot, seed=seed)
    null = [pooled_r2(y_null, hat) for y_null, hat in zip(nulls, null_hats)]
    out = dict(r2=pooled_r2(y, y_hat), r2_ci=_interval(boot), n=int(len(y)), n_sequences=int(len(ids)),
               dim=int(x.shape[1]), folds=folds,
               shuffled=dict(mean=float(np.mean(null)), range=_interval(np.array(null)), n=n_shuffles))
    out["kl_bits"] = float(kl_bits(y, np.log(simplex_belief(y_hat, floor))).mean()) if simplex else float("nan")
    return out


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
    from .models import load_model
    from .windtunnel.configs import TrainConfig, build_transformer, make_task
    from .windtunnel.train import save_folder

    cfg = TrainConfig.from_dict(json.loads((Path(folder) / "windtunnel.json").read_text())["config"])
    torch.manual_seed(seed)
    hf = build_transformer(cfg, make_task(cfg)).eval()
    save_folder(hf, cfg, make_task(cfg), Path(tmp), {"step": 0, "untrained_seed": seed})
    return load_model(tmp)


def windtunnel_belief_probes(folder: str | Path, *, n_sequences: int = 400, length: int | None = None,
                             readings: tuple[str, ...] = PROBE_READINGS, layers: list[int] | None = None,
                             window: int = 4, folds: int = 5, n_shuffles: int = 20, n_boot: int = 1000,
                             seed: int = 2024, untrained: bool = True) -> BeliefProbeResult:
    """Belief probes of a trained wind-tunnel folder on ``n_sequences`` fresh sequences, with the three controls.

    Rows: models ``trained`` and ``untrained`` (same architecture, fresh weights) against targets ``exact``,
    ``window-m`` and ``exact-minus-window-m`` (R² only). Every row carries the shuffled null.
    """
    from .models import load_model
    from .tasks.filters import window_posterior
    from .windtunnel.configs import TrainConfig, make_task

    folder = Path(folder)
    cfg = TrainConfig.from_dict(json.loads((folder / "windtunnel.json").read_text())["config"])
    task = make_task(cfg)
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
                                     dim=r["dim"]))

    probe_all(load_model(folder), "trained", targets)
    if untrained:
        with tempfile.TemporaryDirectory() as tmp:
            probe_all(untrained_like(folder, tmp, seed=cfg.seed), "untrained", targets)
    meta = dict(folder=str(folder), task=task.name, task_kwargs=cfg.task_kwargs, n_sequences=n_sequences,
                length=length or (task.n_pairs if task.name == "bijection" else task.n_steps), window=window,
                folds=folds, n_shuffles=n_shuffles, n_boot=n_boot, seed=seed, floor=FLOOR)
    return BeliefProbeResult(rows, meta)
