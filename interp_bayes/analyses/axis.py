"""The entropy axis: one unit direction in a layer's value space along which projection tracks predictive entropy.

Two fits on the final-token value vectors (``[n_prompts, n_kv_heads * d_head]``):

- ``pc1``: PC1 of the standardised values (Paper III's u_ent), carried back to raw value space;
- ``ridge``: a ridge regression of entropy on the standardised values (cross-validated penalty), carried back.

A direction w found in standardised coordinates reads the score s(v) = w . (v - mean) / sd; in raw value space the
same readout is the unit vector u = (w / sd) / |w / sd|, so v . u is an affine function of s(v) and cutting u from v
makes s constant. That raw-space u is what interventions act on (the authors applied the standardised PC1 to raw
values directly, mixing the two spaces).

The sign is oriented so that projection grows with the entropy the axis was fitted against. Besides the in-sample
correlation, ``folds``-fold cross-fitting gives a held-out one: each fold's projections come from an axis fitted on
the other folds (the authors fitted and evaluated on the same prompts).

A **conditional axis** (``control=`` nuisance covariates: position, length, k) is fitted on values and entropy
residualised on the covariates, so it follows the part of entropy that position or k do not explain.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import safetensors.torch
import torch

from ..core.errors import AxisError
from ..core.store import atomic_write_bytes, write_json
from ..stats import CONSTANT_RTOL, as_float64
from ..stats.confounds import covariate_matrix
from ..stats.pca import correlations, pca
from ..stats import fit_ridge, group_folds, residual_confounding, residualize

METHODS = ("pc1", "ridge")


def fit_direction(x: np.ndarray, y: np.ndarray, method: str) -> np.ndarray:
    """Unit direction in raw value space for rows ``x`` and entropies ``y``, oriented so projection grows with y."""
    if method == "pc1":
        sd = x.std(axis=0, ddof=1)
        sd = np.where(sd > 0, sd, 1.0)
        _, comps, _ = pca(x)
        w = comps[0]
    elif method == "ridge":
        fit = fit_ridge(x, y)  # the toolkit's one ridge: standardised inputs, leave-one-out penalty
        w, sd = fit.coef[:, 0], fit.sd
    else:
        raise AxisError(f"Unknown axis method '{method}'; choose one of {', '.join(METHODS)}.")
    u = w / sd
    norm = np.linalg.norm(u)
    if norm == 0:  # a ridge fit that found nothing (all coefficients shrunk to 0): no direction, projections 0
        return u
    u /= norm
    if correlations(x @ u, y)["pearson"] < 0:
        u = -u
    return u


@dataclass
class EntropyAxis:
    """A fitted entropy axis of one layer, with its statistics and provenance."""

    direction: torch.Tensor  # [dim] float32 unit vector in raw value space
    layer: int
    method: str
    sigma: float  # std of v . u over the fit prompts (the unit of AxisShift)
    in_sample: dict  # pearson / spearman of v . u with entropy on the fit prompts
    held_out: dict | None  # the same from cross-fitting (None when folds < 2)
    provenance: dict = field(default_factory=dict)
    # the share of the fit prompts' projection variance that lies between strata (e.g. values of k), when strata
    # were given: how much of the axis is still the confound (``stats.residual_confounding``)
    residual_confounding: float | None = None

    def __repr__(self) -> str:
        held = f"{self.held_out['pearson']:+.3f}" if self.held_out else "n/a"
        return (f"EntropyAxis(layer={self.layer}, method={self.method!r}, dim={self.direction.numel()}, "
                f"sigma={self.sigma:.4g}, r_in_sample={self.in_sample['pearson']:+.3f}, r_held_out={held}, "
                f"target={self.provenance.get('target', '?')!r})")

    def project(self, values: torch.Tensor) -> torch.Tensor:
        """v . u for each row of ``values`` ([n, dim] -> [n])."""
        return values.to(self.direction.dtype) @ self.direction

    def save(self, path: str | Path) -> Path:
        """``path/axis.safetensors`` (direction) and ``path/axis.json`` (everything else), atomically."""
        path = Path(path)
        atomic_write_bytes(path / "axis.safetensors", safetensors.torch.save({"direction": self.direction.contiguous()}))
        meta = {k: v for k, v in asdict(self).items() if k != "direction"}
        write_json(path / "axis.json", meta)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "EntropyAxis":
        path = Path(path)
        meta = json.loads((path / "axis.json").read_text())
        return cls(direction=safetensors.torch.load_file(path / "axis.safetensors")["direction"], **meta)


def cross_fitted_projections(x: np.ndarray, y: np.ndarray, method: str, *, folds: int, seed: int,
                             control: np.ndarray | None = None, groups=None
                             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(each row projected on an axis fitted on the other folds, the target it is compared with, and the row's
    unresidualised values projected on that same axis: the held-out readout a deconfounded analysis starts from).

    Folds are made of whole ``groups`` (``stats.group_folds``: a wind tunnel's sequences; None: every row its own).
    Projections are centred on the training fold's mean: each fold's axis has its own offset mean . u, and pooling
    uncentred projections across folds mixes those offsets into the correlation (a constant added to every value
    would change it). With ``control`` ([n, c] nuisance covariates), the values and the target are residualised on
    them inside each fold: the coefficients are fitted on the training fold only and applied to the held-out fold,
    so nothing about the held-out prompts leaks into the axis; the target returned is then the residualised one."""
    if folds > len(x):
        raise AxisError(f"folds={folds} exceeds the {len(x)} fit prompts; use fewer folds.")
    out, target, raw = np.empty(len(x)), y.copy(), np.empty(len(x))
    for train, part in group_folds(groups, folds, seed=seed, n=len(x)):
        x_train, x_part, y_train = x[train], x[part], y[train]
        if control is not None:
            x_train, x_part = residualize(x_train, x_part, control[train], control[part])
            y_train, target[part] = residualize(y_train, y[part], control[train], control[part])
        u = fit_direction(x_train, y_train, method)
        out[part] = (x_part - x_train.mean(axis=0)) @ u
        raw[part] = (x[part] - x[train].mean(axis=0)) @ u
    return out, target, raw


def _control_matrix(control, n: int) -> tuple[np.ndarray | None, list[str]]:
    """Nuisance covariates as [n, c] and their names, from a dict of named columns or an array."""
    if control is None:
        return None, []
    if isinstance(control, dict):
        return covariate_matrix(control), list(control)
    c = as_float64(control).reshape(n, -1)
    return c, [f"covariate {i}" for i in range(c.shape[1])]


def fit_entropy_axis(acts, layer: int = -1, method: str = "pc1", *, folds: int = 5, entropy=None,
                     subset=None, seed: int = 0, control=None, strata=None) -> EntropyAxis:
    """Fit the entropy axis of ``layer`` from ``Activations`` (value reading).

    entropy: the target, default the model's own predictive entropy (``acts.entropy``); pass Bayes entropy to fit
    against the exact posterior. subset: indices of the prompts to fit on (the rest stay untouched, for
    cross-fitting against an evaluation set). folds: K for the held-out correlation (K >= 2; 0 or 1 skips it).
    control: nuisance covariates, one row per prompt (a dict of named columns, e.g. from
    ``stats.confounds.nuisance_columns``, or an [n, c] array): the **conditional axis**. Values and target are
    residualised on them (inside each training fold for the held-out number) before PC1 or ridge, so the axis
    follows what entropy does beyond position, length or k; its in-sample and held-out correlations are then
    partial correlations given the covariates. Discrete covariates enter as one indicator per level, length as a
    spline basis (``stats.confounds.covariate_matrix``). The held-out folds are made of whole ``acts.groups``.
    strata: one label per prompt (e.g. k): the axis then reports its ``residual_confounding``, the share of its
    projection's variance on the fit prompts that lies between strata.
    """
    x_all = as_float64(acts.values(layer))
    y_all = as_float64(acts.entropy if entropy is None else entropy)
    idx = np.arange(len(x_all)) if subset is None else np.asarray(subset)
    x, y = x_all[idx], y_all[idx]
    if np.ptp(x, axis=0).max() <= CONSTANT_RTOL * np.abs(x).max():  # every coordinate constant up to rounding
        raise AxisError(f"The values at layer {layer} are identical for every prompt (at layer 0 the final token's "
                         "value depends on that token alone); fit the axis at a later layer.")
    cov_all, cov_names = _control_matrix(control, len(x_all))
    cov = None if cov_all is None else cov_all[idx]
    x_fit, y_fit = (x, y) if cov is None else (residualize(x, cov_train=cov), residualize(y, cov_train=cov))
    u = fit_direction(x_fit, y_fit, method)
    proj = x @ u
    held_out = None
    if folds and folds >= 2:
        groups = None if acts.groups is None else np.asarray(acts.groups)[idx]
        out, target, raw = cross_fitted_projections(x, y, method, folds=folds, seed=seed, control=cov, groups=groups)
        held_out = dict(correlations(out, target), folds=folds, projections=raw.tolist())
    layer_idx = acts.layer_index(layer)
    provenance = dict(model=acts.meta.get("model"), layer=layer_idx, prompt_digest=acts.meta.get("prompt_digest"),
                      n_fit=int(len(idx)), fit_indices=idx.tolist(), target="model entropy" if entropy is None
                      else "given entropy", seed=seed, control=cov_names)
    between = None if strata is None else residual_confounding(proj, np.asarray(strata)[idx])
    return EntropyAxis(direction=torch.tensor(u, dtype=torch.float32), layer=layer_idx, method=method,
                       sigma=float(proj.std(ddof=1)), in_sample=correlations(x_fit @ u, y_fit), held_out=held_out,
                       provenance=provenance, residual_confounding=between)
