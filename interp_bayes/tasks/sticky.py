"""Sticky Markov chain of Paper II (methods.md §2.2): next-symbol prediction from noisy glimpses.

Eight symbols on a circle; transition weights are 0.3 on the diagonal and 1/(circular distance) off it; each row
is normalised, scaled by 0.7, given 0.3 more on the diagonal and renormalised (effective self-probability ≈0.35).
Symbol means ``mu`` [8, 20] are N(0, I) from ``embed_seed`` (fixed across seeds); input ``x_t = mu[y_t] + N(0, I)``,
target ``y_{t+1}``. Sampling draws from a ``torch.Generator`` in the same order as the authors' script
(``repo:experiments/paper2_gradient/em_vs_sgd_multiseed.py``), so a seed gives their sequence.

Two floors: ``entropy_floor`` = mean row entropy H(Y_{t+1} | Y_t) (1.829 nats, ignores observation noise), and
``bayes_predictive``, the exact forward-filter posterior p(y_{t+1} | x_1..x_t), whose cross-entropy is the best any
predictor of the sampled sequence can do in expectation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..core.errors import ConfigError


def transition_matrix(n_symbols: int = 8, self_prob: float = 0.3) -> torch.Tensor:
    """Row-stochastic sticky transition matrix [n, n] (float64), built as in the authors' code."""
    idx = torch.arange(n_symbols)
    diff = (idx[:, None] - idx[None, :]).abs()
    dist = torch.minimum(diff, n_symbols - diff).to(torch.float64)
    eye = torch.eye(n_symbols, dtype=torch.float64)
    w = torch.where(eye.bool(), torch.full_like(dist, self_prob), 1.0 / dist.clamp(min=1))
    p = w / w.sum(1, keepdim=True) * (1 - self_prob) + eye * self_prob
    return p / p.sum(1, keepdim=True)


def entropy_floor(transition: torch.Tensor) -> float:
    """Mean row entropy in nats, H(Y_{t+1} | Y_t) averaged uniformly over current symbols (1.829 for the default)."""
    return float(-(torch.special.xlogy(transition, transition)).sum(1).mean())


@dataclass
class StickyChain:
    """One sampled sequence: ``inputs[t]`` is a noisy glimpse of ``symbols[t]``; ``targets[t] = symbols[t + 1]``."""

    inputs: torch.Tensor  # [T-1, d_embed] float32
    targets: torch.Tensor  # [T-1] int64
    symbols: torch.Tensor  # [T] int64
    means: torch.Tensor  # [n_symbols, d_embed] float32
    transition: torch.Tensor  # [n_symbols, n_symbols] float64
    noise_std: float

    @property
    def entropy_floor(self) -> float:
        """H(Y_{t+1} | Y_t) in nats."""
        return entropy_floor(self.transition)


def sample_sticky(
    T: int = 2000,
    seed: int | torch.Generator = 0,
    *,
    n_symbols: int = 8,
    d_embed: int = 20,
    self_prob: float = 0.3,
    embed_seed: int = 0,
    noise_std: float = 1.0,
) -> StickyChain:
    """Sample one chain of ``T`` symbols (``T - 1`` input/target pairs); uniform start symbol."""
    if T < 2:
        raise ConfigError(f"T={T} gives no input/target pair; use T >= 2.")
    gen = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(seed)
    trans = transition_matrix(n_symbols, self_prob)
    means = torch.randn(n_symbols, d_embed, generator=torch.Generator().manual_seed(embed_seed))
    probs = trans.to(torch.float32)
    seq = [int(torch.randint(n_symbols, (1,), generator=gen))]
    for _ in range(T - 1):
        seq.append(int(torch.multinomial(probs[seq[-1]], 1, generator=gen)))
    symbols = torch.tensor(seq)
    inputs = means[symbols[:-1]] + noise_std * torch.randn(T - 1, d_embed, generator=gen)
    return StickyChain(inputs, symbols[1:], symbols, means, trans, noise_std)


def bayes_predictive(chain: StickyChain) -> torch.Tensor:
    """Exact log p(y_{t+1} | x_1..x_t) [T-1, n] (float64) by the HMM forward filter with the true parameters."""
    x = chain.inputs.to(torch.float64)
    mu = chain.means.to(torch.float64)
    log_lik = -0.5 * torch.cdist(x, mu).square() / chain.noise_std**2  # [T-1, n], constants cancel
    log_trans = chain.transition.log()
    n = mu.shape[0]
    log_prior = torch.full((n,), -math.log(n), dtype=torch.float64)  # p(y_1), uniform start
    out = torch.empty_like(log_lik)
    for t in range(x.shape[0]):
        log_post = log_prior + log_lik[t]
        log_post = log_post - torch.logsumexp(log_post, 0)  # p(y_t | x_1..x_t)
        out[t] = torch.logsumexp(log_post[:, None] + log_trans, 0)  # p(y_{t+1} | x_1..x_t)
        log_prior = out[t]
    return out
