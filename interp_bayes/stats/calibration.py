"""A model's predictive entropy against the exact Bayesian one: the one comparison the sweep, the interventions and
the wind-tunnel evaluation all report, in bits.

For each stratum (``by``: k, the number of in-context examples, or a query position) and over all rows:

- ``mae``: per-sample entropy MAE, mean |H_model - H_Bayes| (errors cannot cancel);
- ``mean_curve_mae`` (all rows only): |mean H_model - mean H_Bayes| per stratum, averaged over strata (the authors'
  ``src/utils/entropy.py`` definition; errors can cancel, so it is the smaller number);
- ``kl_bits``: KL(Bayes || model) of the full predictive distributions, when both are given;
- ``accuracy``: the share of rows whose predicted hypothesis is the realised one, when both are given;
- ``corr_with_bayes``: Pearson and Spearman of H_model with H_Bayes (NaN with a reason where H_Bayes is constant,
  e.g. within one k of the in-context task).
"""

from __future__ import annotations


import numpy as np

from . import as_float64
from .info import kl_from_probs
from .pca import correlations

def _block(err: np.ndarray, h_model: np.ndarray, h_bayes: np.ndarray, kl: np.ndarray | None,
           hit: np.ndarray | None) -> dict:
    out = dict(n=int(len(err)), model_entropy=float(h_model.mean()), bayes_entropy=float(h_bayes.mean()),
               mae=float(err.mean()), corr_with_bayes=correlations(h_model, h_bayes))
    if kl is not None:
        out["kl_bits"] = float(kl.mean())
    if hit is not None:
        out["accuracy"] = float(hit.mean())
    return out


def compare_to_bayes(model_entropy, bayes_entropy, *, by=None, model_logprobs=None, posterior=None,
                     predicted=None, latent=None) -> dict:
    """Model vs exact Bayes, overall and per stratum (see the module docstring), all in bits.

    model_entropy, bayes_entropy: [n] entropies in bits. by: [n] stratum labels (k or position; ``by``, not
    ``groups``, which everywhere else names the unit of independence); with strata, the result also holds
    ``k_ge_1`` (by >= 1: the in-context task's k = 0 prompts have no example at all, a formatting confound). model_logprobs, posterior: [n, H] distributions for the KL. predicted, latent: [n]
    hypothesis indices for the accuracy.
    Returns ``{"all": block, "per_group": {label: block}, "k_ge_1": block}`` (the last two with ``by`` only).
    """
    h_model, h_bayes = as_float64(model_entropy), as_float64(bayes_entropy)
    err = np.abs(h_model - h_bayes)
    kl = kl_from_probs(posterior, model_logprobs) if posterior is not None and model_logprobs is not None else None
    hit = np.asarray(predicted) == np.asarray(latent) if predicted is not None and latent is not None else None

    def block(mask: np.ndarray) -> dict:
        return _block(err[mask], h_model[mask], h_bayes[mask], None if kl is None else kl[mask],
                      None if hit is None else hit[mask])

    out = dict(all=block(np.ones(len(err), dtype=bool)))
    if by is not None:
        g = np.asarray(by)
        labels = sorted(set(g.tolist()))
        out["per_group"] = {label: block(g == label) for label in labels}
        out["all"]["mean_curve_mae"] = float(np.mean([abs(b["model_entropy"] - b["bayes_entropy"])
                                                      for b in out["per_group"].values()]))
        if (g >= 1).any():
            out["k_ge_1"] = block(g >= 1)
    return out
