"""Entropy axis against hypothesis frame: what it costs, in bits against the exact posterior, to cut (or keep only)
each subspace of a wind-tunnel model's activations, beside random subspaces of the same dimension.

The authors' follow-up reports that cutting the entropy axis of a wind tunnel is causally inert (about -0.001
bits) while cutting the "hypothesis frame" costs about +0.75 bits (methods.md §1.7). Here, at one site
(``hook_v`` by default; ``hook_z`` or the residual stream) and one layer at a time, with the subspaces fitted on
one set of sequences and the edits scored on another:

- ``entropy-axis`` (k = 1): the ridge direction of the exact posterior entropy (``axis`` module, method
  ``ridge``, fitted against Bayes entropy);
- ``frame-belief`` (k = H - 1): the row space of the cross-fitted belief probe's readout (``stats.fit_ridge``
  of the exact posterior on the activations, carried back to raw coordinates): the directions a linear reader
  uses to recover the belief over hypotheses;
- ``frame-pcs`` (k = H - 1): the top H - 1 principal components of the raw activations at every position (the
  issue's "top-k PCs of the values");
- ``frame-tokens`` (k = H - 1, only where hypothesis tokens occur in the prompt, i.e. the bijection): the span
  of the mean activation each hypothesis token writes at its own positions, centred (the value-space image of the
  hypothesis tokens; the key vectors of the authors' frame live in key space, where no site edits).

An edit acts at every position, and attention moves the values of the positions it reads (a bijection's shown
values, an HMM's header and observations), not those of the query; so the PCs, the token frame and the variance
the matched controls match are taken over every position, while the axis and the belief frame, defined by the
posterior, are fitted at the query positions. H - 1 is the dimension of the belief simplex (Shai et al.: the belief
geometry is a linear image of it). Controls are the lead's equal-dimension families
(``analyses.controls.isotropic_subspaces``, ``matched_subspaces``). Costs are differences from the unedited model on
the same sequences, with a paired bootstrap interval over sequences.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch

from ..model.read import read, sites_of
from ..stats import fit_ridge, interval, p_value, percentile_of
from ..stats import info
from ..core.errors import ConfigError
from ..core.layers import layer_index
from ..core.results import Row
from ..core.stop import check_stop
from ..stats import as_float64
from ..stats.arrays import thin_svd
from ..stats.pca import pca
from ..model.edits import SubspaceCut, SubspaceOnly, intervene
from .axis import fit_direction
from .controls import isotropic_subspaces, matched_subspaces
from .p4b import ablation_rows
from ..tasks.base import TaskBatch
from ..windtunnel.discrete import paired_margin, restricted_log_probs

OPS = {"cut": SubspaceCut, "only": SubspaceOnly}
QUERY_BATCH = 250  # sequences per forward pass of a reading


def top_rows(m: np.ndarray, k: int) -> np.ndarray:
    """An orthonormal basis [k, dim] of the leading k-dimensional row space of ``m`` [r, dim] (SVD)."""
    return thin_svd(m)[2][:k]


def every_position(model, batch: TaskBatch, layer: int, site: str) -> tuple[np.ndarray, np.ndarray]:
    """(activations [n * T, dim] at every position of ``batch``, the token at each row [n * T]), sequence-major."""
    x = as_float64(read(model, batch, [(layer, site)], "all", batch_size=QUERY_BATCH, distribution=False
                        ).reading(site, layer))
    return x, batch.input_ids.reshape(-1).numpy()


def fit_subspaces(x_query: np.ndarray, posterior: np.ndarray, x_all: np.ndarray, tokens: np.ndarray,
                  hypothesis_ids: list[int]) -> dict[str, np.ndarray]:
    """name -> orthonormal basis [k, dim] (see the module docstring): the axis and the belief frame from the
    activations at the query positions ``x_query`` [n, dim] and their exact posteriors [n, H]; the PCs and the
    token frame from the activations at every position ``x_all`` with their ``tokens``."""
    H = posterior.shape[1]
    h_bayes = info.entropy(torch.from_numpy(posterior)).numpy()
    bases = {"entropy-axis": fit_direction(x_query, h_bayes, "ridge")[None]}
    probe = fit_ridge(x_query, posterior)
    bases["frame-belief"] = top_rows((probe.coef / probe.sd[:, None]).T, H - 1)  # raw-space readouts
    bases["frame-pcs"] = pca(x_all, standardize=False)[1][: H - 1]
    means = [x_all[tokens == h].mean(0) for h in hypothesis_ids if (tokens == h).any()]
    if len(means) > 1:  # hypothesis tokens occur in the prompts (bijection values; never the HMM's states)
        means = np.stack(means)
        bases["frame-tokens"] = top_rows(means - means.mean(0), min(H - 1, len(means) - 1))
    return bases


def sequence_losses(logp: torch.Tensor, posterior: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per sequence and position: |H(model) - H(Bayes)| and KL(Bayes || model), bits, [n, Q] each."""
    logp = logp.detach()
    err = (info.entropy(logp.double().exp()) - info.entropy(posterior.double())).abs().numpy()
    return err, info.kl_from_probs(posterior, logp)


def subspace_rows(model, task, *, site: str = "v", layers: list[int] | None = None,
                  ops: tuple[str, ...] = ("cut", "only"), n_fit: int = 400, n_eval: int = 300,
                  n_isotropic: int = 10, n_matched: int = 10, seed: int = 2024) -> tuple[list[Row], list[dict]]:
    """(rows, draws): cut / keep-only each subspace of ``fit_subspaces`` at ``site`` of each layer of a wind-tunnel
    ``model`` on its ``task``, against equal-dimension isotropic and variance-matched random subspaces (see the module
    docstring). Rows: the unedited model's losses, then ``ablation_rows`` per layer; draws: one dict per edited run."""
    unknown = set(ops) - set(OPS)
    if unknown:
        raise ConfigError(f"Unknown subspace edit(s) {sorted(unknown)}; choose from {', '.join(OPS)}.")
    layers = list(range(model.cfg.n_layers)) if layers is None else [layer_index(x, model.cfg.n_layers) for x in layers]
    fit, ev = task.sample(n_fit, seed=[seed, 0]), task.sample(n_eval, seed=[seed, 1])
    hyp, H = task.hypothesis_ids, len(task.hypothesis_ids)
    x_fit = read(model, fit, sites_of(layers, (site,)), "queries", batch_size=QUERY_BATCH,
                 distribution=False).readings[site]
    post_fit = fit.posterior.double().reshape(-1, H).numpy()

    def run(edits: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad(), intervene(model, edits or {}, site=site):
            return sequence_losses(restricted_log_probs(model, ev, hyp).cpu(), ev.posterior)

    base_err, base_kl = run()
    rows = [Row("unedited_kl_bits", float(base_kl.mean()), "bits", dict(site=site), n=n_eval,
                note="KL(exact posterior || model), the unedited model"),
            Row("unedited_mae_bits", float(base_err.mean()), "bits", dict(site=site), n=n_eval,
                note="|H(model) - H(exact posterior)|, the unedited model")]
    draws = []
    for layer in layers:
        x_every, tokens = every_position(model, fit, layer, site)
        named = fit_subspaces(as_float64(x_fit[layer]), post_fit, x_every, tokens, hyp)
        got, summary = ablation_costs(lambda op, layer=layer: run({layer: op}), x_every, named, (base_err, base_kl),
                                      layer=layer, ops=ops, n_isotropic=n_isotropic, n_matched=n_matched, seed=seed,
                                      scope=dict(task=task.name, site=site))
        draws += got
        rows += [replace(r, scope=r.scope | dict(site=site)) for r in ablation_rows(summary, layer, n_eval)]
    return rows, draws


def ablation_costs(run, values: np.ndarray, named: dict[str, np.ndarray], base_losses, *, layer: int,
                   ops: tuple[str, ...] = ("cut",), n_isotropic: int = 10, n_matched: int = 10, seed: int = 2024,
                   scope: dict | None = None) -> tuple[list[dict], list[dict]]:
    """(rows, summary) of cutting / keeping only each basis of ``named`` (name -> [k, dim]) at one layer, beside
    ``n_isotropic`` isotropic and ``n_matched`` variance-matched (over ``values`` [n, dim], the activations the edit
    acts on) random subspaces of the same dimension. ``run(op)`` scores the model with the operator ``op`` applied
    (the caller chooses site and layer) and returns per-sequence (|H error|, KL) [n, Q] each, as ``base_losses``
    holds them for the unedited model; ``scope`` is copied into every row."""
    base_err, base_kl = base_losses
    rows, summary = [], []
    for name, basis in named.items():
        frames = {"true": (basis[None], np.ones(1)),
                  "isotropic": (isotropic_subspaces(basis, n_isotropic, layer=layer, seed=seed),
                                np.full(n_isotropic, np.nan)),
                  "matched": matched_subspaces(values, basis, n_matched, layer=layer, seed=seed)}
        for op in ops:
            true_losses = None
            for kind, (draws, ratios) in frames.items():
                for draw, (frame, ratio) in enumerate(zip(draws, ratios)):
                    check_stop()
                    err, kl = run(OPS[op](torch.from_numpy(np.ascontiguousarray(frame)).float()))
                    true_losses = (err, kl) if kind == "true" else true_losses
                    rows.append(dict(scope or {}, layer=layer, subspace=name, k=int(basis.shape[0]), op=op,
                                     kind=kind, draw=draw, variance_ratio=float(ratio), mae_bits=float(err.mean()),
                                     kl_bits=float(kl.mean()), cost_mae_bits=float(err.mean() - base_err.mean()),
                                     cost_kl_bits=float(kl.mean() - base_kl.mean())))
            summary += summarise_costs(rows, layer, name, op, true_losses, base_losses, seed=seed)
    return rows, summary


def summarise_costs(rows: list[dict], layer: int, name: str, op: str, true_losses, base_losses, *,
                    seed: int) -> list[dict[str, Any]]:
    """Summary rows of one (layer, subspace, op): the true cost with a paired bootstrap interval over sequences,
    each control family's mean cost, 95% range, the share of its draws at or below the true cost, and the
    two-sided p-value of the true cost against those draws as drawn (``stats.p_value``)."""
    mine = [r for r in rows if (r["layer"], r["subspace"], r["op"]) == (layer, name, op)]
    out = []
    for i, metric in enumerate(("mae_bits", "kl_bits")):
        true = next(r for r in mine if r["kind"] == "true")
        entry = dict(layer=layer, subspace=name, k=true["k"], op=op, metric=metric, true_cost=true[f"cost_{metric}"],
                     true_cost_ci=paired_margin(true_losses[i], base_losses[i], seed=seed)["margin_ci"])
        for fam in ("isotropic", "matched"):
            costs = np.array([r[f"cost_{metric}"] for r in mine if r["kind"] == fam])
            if len(costs):
                entry |= {f"{fam}_mean": float(costs.mean()),
                          f"{fam}_range": interval(costs),
                          f"{fam}_percentile": percentile_of(entry["true_cost"], costs),
                          f"{fam}_p": p_value(entry["true_cost"], costs), f"{fam}_n": len(costs)}
        ratios = [r["variance_ratio"] for r in mine if r["kind"] == "matched"]
        if ratios:
            entry["matched_variance_ratio_mean"] = float(np.mean(ratios))
        out.append(entry)
    return out
