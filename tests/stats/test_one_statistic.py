"""One statistic, one value: a single ranking for every Spearman rho, a share bounded in [0, 1], and the dynamics'
cross-validated R² over folds of whole sequences."""

import numpy as np
import torch

from interp_bayes.analyses.decoding import axis_share
from interp_bayes.dynamics import cv_r2
from interp_bayes.stats import deconfounded_correlation
from interp_bayes.stats.pca import correlations


def test_rounding_noise_ties_give_one_spearman_everywhere():
    """An entropy that is exact per position but carries float noise (as the bijection's does) against a reading:
    ``correlations`` and ``deconfounded_correlation`` give the same rho, the one of the exact ties."""
    rng = np.random.default_rng(0)
    exact = np.repeat(np.log2(np.arange(20, 0, -1)), 6)  # [120] six tied rows per position
    noisy = exact * (1 + 1e-15 * rng.standard_normal(len(exact)))  # float64 noise below the 12th digit
    reading = -exact + 0.5 * rng.standard_normal(len(exact))
    rho = correlations(reading, noisy)["spearman"]
    assert rho == correlations(reading, exact)["spearman"]
    dec = deconfounded_correlation(reading, noisy, np.zeros((len(exact), 0)), np.zeros(len(exact)), n_perm=10)
    assert abs(dec.values["raw"]["spearman"] - rho) < 1e-12


def test_the_axis_share_is_a_share_and_only_of_decodable_entropy():
    nan = float("nan")
    # an R² of 0.005 clearing a negative null, but its interval reaches below 0: nothing decodable to share
    assert np.isnan(axis_share(0.08, 0.005, [-0.01, 0.02], True))  # beyond a negative null, interval spans 0
    assert np.isnan(axis_share(0.5, 0.3, [0.2, 0.4], False))  # its test did not reject the null
    assert axis_share(0.5, 0.5, [0.4, 0.6], True) == 0.25 / 0.5
    assert axis_share(0.6, 0.2, [0.1, 0.3], True) == 1.0  # the axis beats the ridge: all of it, not 1.8


def test_cv_r2_holds_out_whole_sequences():
    """A target constant within each sequence and unrelated to the features' signal, features that identify the
    sequence: row folds 'decode' it from the other positions of the same sequence; sequence folds give R² <= 0."""
    gen = torch.Generator().manual_seed(0)
    n_seq, n_pos, d = 30, 8, 48  # more coordinates than sequences: a linear map can recall each sequence
    seq_code = torch.randn(n_seq, d, generator=gen, dtype=torch.float64)
    features = (seq_code[:, None, :] + 0.1 * torch.randn(n_seq, n_pos, d, generator=gen,
                                                         dtype=torch.float64)).reshape(-1, d)
    target = torch.randn(n_seq, generator=gen, dtype=torch.float64).repeat_interleave(n_pos)
    groups = np.repeat(np.arange(n_seq), n_pos)
    assert cv_r2(features, target, groups) <= 0.05
    assert cv_r2(features, target, None) > 0.5  # what folding rows reports
