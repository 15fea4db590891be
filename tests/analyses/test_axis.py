"""The entropy axis: planted recovery, orientation, cross-fitting honesty, save/load."""

import math

import numpy as np
import torch

from interp_bayes.analyses.axis import EntropyAxis, fit_entropy_axis
from interp_bayes.model.read import Activations


def fake_acts(x, y, dtype=torch.float32):
    meta = dict(layers=[3], n_layers=4, model={"name": "synthetic"}, prompt_digest="x")
    return Activations({"v": {3: torch.tensor(x, dtype=dtype)}}, torch.tensor(y, dtype=dtype), [[0]] * len(y), meta)


def planted(n=300, d=40, equal=True, seed=0):
    rng = np.random.default_rng(seed)
    u = rng.choice([-1.0, 1.0], size=d) if equal else rng.standard_normal(d)
    u /= np.linalg.norm(u)
    y = rng.uniform(0, 4, n)
    return np.outer(y - 2, 3 * u) + 0.5 * rng.standard_normal((n, d)) + rng.standard_normal(d), y, u


def test_pc1_and_ridge_recover_a_planted_direction_with_positive_orientation():
    x, y, u = planted(n=1000)
    for method in ("pc1", "ridge"):
        axis = fit_entropy_axis(fake_acts(x, y), layer=-1, method=method)
        cos = float(axis.direction.double() @ torch.tensor(u))
        assert cos > 0.99, (method, cos)  # oriented: projection grows with entropy
        assert axis.in_sample["pearson"] > 0.95 and axis.held_out["pearson"] > 0.95
        assert abs(axis.direction.norm().item() - 1) < 1e-6 and axis.layer == 3
    # unequal column scales: ridge still finds the raw direction, up to the bias of a penalty that is isotropic in
    # standardised (not raw) coordinates
    x2, y2, u2 = planted(n=1000, equal=False, seed=1)
    axis = fit_entropy_axis(fake_acts(x2, y2), method="ridge")
    assert float(axis.direction.double() @ torch.tensor(u2)) > 0.97


def test_sigma_is_std_of_projection_and_subset_fits_only_those_prompts():
    x, y, _ = planted(n=100)
    axis = fit_entropy_axis(fake_acts(x, y), subset=range(0, 100, 2), folds=0)
    proj = axis.project(torch.tensor(x[::2], dtype=torch.float32))
    assert math.isclose(axis.sigma, proj.double().std().item(), rel_tol=1e-5)
    assert axis.held_out is None and axis.provenance["n_fit"] == 50 and axis.provenance["fit_indices"][:2] == [0, 2]


def test_cross_fitting_exposes_in_sample_overfitting():
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((60, 200)), rng.uniform(0, 4, 60)  # no relation at all
    axis = fit_entropy_axis(fake_acts(x, y), method="ridge", folds=5)
    assert axis.in_sample["pearson"] > 0.5  # a ridge fit in-sample finds "signal" in noise
    assert abs(axis.held_out["pearson"]) < 0.35


def test_save_load_round_trip(tmp_path):
    x, y, _ = planted(n=50)
    axis = fit_entropy_axis(fake_acts(x, y), folds=3)
    back = EntropyAxis.load(axis.save(tmp_path / "axis"))
    assert torch.equal(back.direction, axis.direction)
    assert (back.sigma, back.in_sample, back.held_out, back.provenance) == (axis.sigma, axis.in_sample,
                                                                          axis.held_out, axis.provenance)


def test_a_constant_offset_leaves_the_held_out_correlation_unchanged():
    """Each fold's projections are centred on its training fold's mean; pooled uncentred projections would mix
    the folds' offsets (mean . u) into the correlation."""
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((120, 30)), rng.uniform(0, 4, 120)
    x[:, 0] += 2.0 * y  # a planted signal
    for method in ("pc1", "ridge"):  # float64 values, so that adding 30 itself rounds nothing away
        plain = fit_entropy_axis(fake_acts(x, y, torch.float64), method=method, folds=5, seed=1)
        shifted = fit_entropy_axis(fake_acts(x + 30.0, y, torch.float64), method=method, folds=5, seed=1)
        assert abs(plain.held_out["pearson"] - shifted.held_out["pearson"]) < 1e-9, method
        assert plain.held_out["pearson"] > 0.3


def test_axis_repr_is_a_summary():
    x, y, _ = planted(n=50)
    text = repr(fit_entropy_axis(fake_acts(x, y), folds=3))
    assert text.startswith("EntropyAxis(layer=3, method='pc1', dim=40") and "\n" not in text and len(text) < 200
