"""The sticky Markov chain of Paper II (methods.md §2.2)."""

from __future__ import annotations

import math

import pytest
import torch

from interp_bayes.tasks.sticky import bayes_predictive, entropy_floor, sample_sticky, transition_matrix

torch.set_num_threads(1)


def test_transition_matrix_matches_the_reference():
    p = transition_matrix()
    assert p.shape == (8, 8)
    torch.testing.assert_close(p.sum(1), torch.ones(8, dtype=torch.float64))
    row0 = torch.tensor([0.350, 0.166, 0.083, 0.055, 0.042, 0.055, 0.083, 0.166], dtype=torch.float64)
    torch.testing.assert_close(p[0], row0, atol=6e-4, rtol=0)
    for i in range(8):  # circulant: every row is row 0 shifted
        torch.testing.assert_close(p[i], p[0].roll(i))


def test_entropy_floor_is_1_829_nats():
    h = entropy_floor(transition_matrix())
    assert h == pytest.approx(1.829, abs=5e-4)
    assert h / math.log(2) == pytest.approx(2.639, abs=5e-4)


def authors_sample(seed: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampling order of repo:experiments/paper2_gradient/em_vs_sgd_multiseed.py, on the global RNG."""
    p = transition_matrix().float()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        state = torch.get_rng_state()
        torch.manual_seed(0)
        mu = torch.randn(8, 20)
        torch.set_rng_state(state)
        seq = [torch.randint(8, (1,)).item()]
        for _ in range(T - 1):
            seq.append(torch.multinomial(p[seq[-1]], 1).item())
        seq = torch.tensor(seq)
        return seq, mu[seq[:-1]] + torch.randn(T - 1, 20)


def test_sample_reproduces_the_authors_draws():
    chain = sample_sticky(300, 42)
    seq, inputs = authors_sample(42, 300)
    assert torch.equal(chain.symbols, seq)
    assert torch.equal(chain.inputs, inputs)


def test_sample_shapes_seeds_and_embedding():
    a, b, c = sample_sticky(500, 1), sample_sticky(500, 1), sample_sticky(500, 2)
    assert a.inputs.shape == (499, 20) and a.targets.shape == (499,) and a.symbols.shape == (500,)
    assert torch.equal(a.targets, a.symbols[1:])
    assert torch.equal(a.inputs, b.inputs) and not torch.equal(a.symbols, c.symbols)
    assert torch.equal(a.means, c.means)  # embed_seed fixes the means across seeds
    assert not torch.equal(a.means, sample_sticky(500, 1, embed_seed=1).means)
    noise = a.inputs - a.means[a.symbols[:-1]]
    assert abs(float(noise.mean())) < 0.05 and float(noise.std()) == pytest.approx(1.0, abs=0.05)


def test_empirical_transitions_follow_the_matrix():
    chain = sample_sticky(40_000, 3)
    counts = torch.zeros(8, 8, dtype=torch.float64)
    counts.index_put_((chain.symbols[:-1], chain.symbols[1:]), torch.ones(39_999, dtype=torch.float64), accumulate=True)
    torch.testing.assert_close(counts / counts.sum(1, keepdim=True), transition_matrix(), atol=0.03, rtol=0)


def test_bayes_filter_limits():
    clear = sample_sticky(400, 5, noise_std=1e-3)
    lp = bayes_predictive(clear)
    torch.testing.assert_close(lp.exp().sum(1), torch.ones(399, dtype=torch.float64))
    # noiseless glimpses: the predictive is the transition row of the current symbol
    torch.testing.assert_close(lp.exp(), clear.transition[clear.symbols[:-1]], atol=1e-6, rtol=0)
    # hopeless glimpses: the predictive is the stationary law (uniform: the matrix is doubly stochastic)
    fog = bayes_predictive(sample_sticky(400, 5, noise_std=1e3))
    torch.testing.assert_close(fog.exp(), torch.full_like(fog, 1 / 8), atol=2e-3, rtol=0)


def test_bayes_filter_loss_is_near_the_floor_on_the_default_chain():
    chain = sample_sticky(2000, 42)
    ce = float(-bayes_predictive(chain).gather(1, chain.targets[:, None]).mean())
    assert abs(ce - chain.entropy_floor) < 0.05


def test_too_short_chain_is_rejected():
    with pytest.raises(ValueError, match="T=1"):
        sample_sticky(1, 0)
