"""``stats.info``: one entropy, one KL convention, one LN2. Each former copy (written out below as it stood before
issue 38, with its call site's argument order) gives bit-identical numbers on random inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from interp_bayes.stats import info
from interp_bayes.tasks.kalman import gaussian_kl_bits

GEN = torch.Generator().manual_seed(0)


def probs(shape, dtype=torch.float32, zeros=True) -> torch.Tensor:
    """Random distributions over the last axis, with exact zeros (a posterior rules hypotheses out)."""
    p = torch.rand(shape, generator=GEN, dtype=torch.float64)
    if zeros:
        p = p * (torch.rand(shape, generator=GEN, dtype=torch.float64) > 0.3)
        p[..., 0] += 1e-3  # no all-zero row
    return (p / p.sum(-1, keepdim=True)).to(dtype)


def log_probs(shape, dtype=torch.float32) -> torch.Tensor:
    return torch.log_softmax(3 * torch.randn(shape, generator=GEN, dtype=torch.float64), -1).to(dtype)


def same(a, b) -> None:
    """Bit for bit: the arithmetic did not change."""
    a, b = (x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x) for x in (a, b))
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)


def test_ln2_is_the_value_every_copy_used():
    assert info.LN2 == math.log(2.0) == math.log(2) == float(np.log(2.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_entropy_equals_its_former_copies(dtype):
    p = probs((7, 5, 11), dtype)
    # model/collect.py (attention rows) and windtunnel/kalman.py: xlogy / LN2
    same(info.entropy(p), -torch.special.xlogy(p, p).sum(-1) / math.log(2.0))
    # tasks/base.py entropy_bits: divided by numpy's log 2
    same(info.entropy(p), -(torch.special.xlogy(p, p)).sum(-1) / np.log(2.0))
    # analyses/martingale.py, numpy: log2 directly
    q = p.double().numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        same(info.entropy(q), -np.where(q > 0, q * np.log2(q), 0.0).sum(-1))
    lp = log_probs((7, 5, 13), dtype)
    # model/read.py next_token_entropy, analyses/neurons.py, analyses/mechanisms.py: from log-probabilities
    same(info.entropy_of_log_probs(lp), -(lp.exp() * lp).sum(-1) / math.log(2.0))
    same(info.entropy_of_log_probs(lp[0, 0]), -(lp[0, 0].exp() * lp[0, 0]).sum() / math.log(2.0))  # neurons, 1-D
    # dynamics/measures.py entropy_nats, and frames.py's entropy_nats(...) / math.log(2)
    same(info.entropy_of_log_probs(lp, "nats"), -(lp.exp() * lp).sum(-1))
    same(info.entropy_of_log_probs(lp), -(lp.exp() * lp).sum(-1) / math.log(2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_entropy_of_log_probs_in_place_and_under_autograd_give_the_same_bits(dtype):
    """Without a graph the product is taken in place in exp's output; with one (a trained subspace's entropy) a
    fresh tensor, so the backward pass still has exp's output: the same number either way, and a gradient."""
    lp = log_probs((4, 6, 17), dtype)
    leaf = lp.clone().requires_grad_(True)
    h = info.entropy_of_log_probs(leaf)
    same(h.detach(), info.entropy_of_log_probs(lp))
    h.sum().backward()  # would fail had exp's saved output been overwritten
    manual = leaf.detach().clone().requires_grad_(True)
    (-(manual.exp() * manual).sum(-1) / math.log(2.0)).sum().backward()
    same(leaf.grad, manual.grad)


def test_kl_equals_its_former_copies_in_their_argument_order():
    lp, base = log_probs((6, 9)), log_probs((6, 9), torch.float64)
    # model/prefix.py kl_bits(logprobs, base): KL(edited || unperturbed), the edited run cast to float64
    d = lp.double()
    same(info.kl(lp.double(), base), (d.exp() * (d - base)).sum(-1) / math.log(2))
    a, b = log_probs((6, 9)), log_probs((6, 9))
    # analyses/mechanisms.py: KL(ablated || base), float32
    same(info.kl(a, b), (a.exp() * (a - b)).sum(-1) / math.log(2.0))
    # analyses/manifold_move.py: one row, KL(edited || base), divided by numpy's log 2
    assert float(info.kl(a[0], b[0])) == float((a[0].exp() * (a[0] - b[0])).sum() / np.log(2))
    # stats/calibration.py kl_bits(posterior, model_logprobs): KL(exact || model), float64 numpy, zeros in p
    for p, logq in ((probs((6, 9)), log_probs((6, 9))), (probs((6, 9)).numpy(), log_probs((6, 9)).numpy())):
        pp, lq = np.asarray(p, dtype=np.float64), np.asarray(logq, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            old = np.where(pp > 0, pp * (np.log(np.where(pp > 0, pp, 1.0)) - lq), 0.0).sum(-1) / math.log(2.0)
        same(info.kl_from_probs(p, logq), old)


def test_the_one_convention_is_sum_p_log_p_over_q():
    p, q = probs((4, 6), torch.float64, zeros=False), probs((4, 6), torch.float64, zeros=False)
    want = (p * (p / q).log()).sum(-1)  # nats, written from the definition
    torch.testing.assert_close(info.kl(p.log(), q.log(), "nats"), want, rtol=1e-12, atol=0)
    torch.testing.assert_close(torch.from_numpy(info.kl_from_probs(p, q.log(), "nats")), want, rtol=1e-12, atol=0)
    assert not torch.allclose(info.kl(q.log(), p.log()), info.kl(p.log(), q.log()))  # the order matters
    with pytest.raises(ValueError, match="bits' or 'nats"):
        info.entropy(p, "dits")


def test_gaussian_kls_equal_their_former_copies():
    n, d = 5, 3
    m0, m1 = torch.randn(n, d, generator=GEN, dtype=torch.float64), torch.randn(n, d, generator=GEN, dtype=torch.float64)
    a0, a1 = torch.randn(n, d, d, generator=GEN, dtype=torch.float64), torch.randn(n, d, d, generator=GEN, dtype=torch.float64)
    c0, c1 = a0 @ a0.mT + 0.5 * torch.eye(d), a1 @ a1.mT + 0.5 * torch.eye(d)
    l0, l1 = torch.linalg.cholesky(c0), torch.linalg.cholesky(c1)
    # tasks/kalman.py gaussian_kl_nats(mean0, chol0, mean1, chol1): KL(N0 || N1)
    trace = torch.linalg.solve_triangular(l1, l0, upper=False).pow(2).sum((-1, -2))
    maha = torch.linalg.solve_triangular(l1, (m1 - m0)[..., None], upper=False).pow(2).sum((-1, -2))
    logdet = 2 * (torch.diagonal(l1, dim1=-2, dim2=-1).abs().log() - torch.diagonal(l0, dim1=-2, dim2=-1).abs().log()
                  ).sum(-1)
    old_nats = 0.5 * (trace + maha - d + logdet)
    same(info.gaussian_kl(m0, l0, m1, l1, "nats"), old_nats)
    same(gaussian_kl_bits(m0, c0, m1, c1), old_nats / math.log(2.0))  # its covariance form, in bits
    # analyses/gaussian.py normal_kl_bits(mean0, sd0, mean1, sd1): KL(exact || model), divided by float(np.log(2))
    mu0, s0, mu1, s1 = (np.random.default_rng(i).uniform(0.2, 2, 50) for i in range(4))
    old = (np.log(s1 / s0) + (s0**2 + (mu0 - mu1) ** 2) / (2 * s1**2) - 0.5) / float(np.log(2.0))
    same(info.normal_kl(mu0, s0, mu1, s1), old)
    # and the one-dimensional case of the multivariate one, to rounding
    one = info.gaussian_kl(*(torch.from_numpy(x)[:, None] for x in (mu0,)), torch.from_numpy(s0)[:, None, None],
                           torch.from_numpy(mu1)[:, None], torch.from_numpy(s1)[:, None, None])
    np.testing.assert_allclose(one.numpy(), old, rtol=1e-12)
