"""Linear Gaussian state tracking: a fresh stable linear system in every sequence, exact Kalman posteriors.

Each sequence carries its own system (state dimension d = 1..3, observation dimension m <= d):

    x_1 ~ N(m0, P0),   x_{t+1} = A x_t + w_t,  w_t ~ N(0, Q),   y_t = C x_t + v_t,  v_t ~ N(0, R)

with A = U diag(s) V^T (U, V Haar-orthogonal, singular values s ~ U[s_lo, s_hi], so ||A|| < 1 and the spectral
radius is below 1), unit-norm rows of C, and Q, R, P0 random SPD matrices (Haar eigenvectors, eigenvalues a
log-uniform scale times U[1/2, 1]). Slow dynamics and noisy observations give the filter a long memory, so a
filter that sees only the last few observations loses information (``window_filter`` measures how much).

Inputs are continuous "soft tokens": each position is a weight vector over the task's feature tokens, and the
model embeds it as that weighted sum of token embeddings (a linear embedding). Position 0 is the header
``[SYS]`` with the system's numbers on the tokens ``A00 .. C.. Q.. R.. m0_.. P0..`` (lower triangles of the
covariances); position t is ``[OBS]`` with y_t on ``y0 ..``. The target at position t is the filtering posterior
p(x_t | y_1..y_t) = N(m_t, P_t) under the very system shown. Read-out tokens ``mean0.. chol00 ..`` exist only as
outputs: the model's LM head at those ids is its Gaussian belief (mean and Cholesky factor, log diagonal).

Gaussian comparisons (torch, any float dtype, batched over leading axes): ``gaussian_w2``, ``gaussian_kl_bits``,
``gaussian_entropy_bits``. Statistics are float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np
import torch

from ..stats.info import LN2, gaussian_kl
from .base import as_rng



@dataclass
class LinearGaussianSystems:
    """A batch of linear Gaussian systems, float64; ``A`` [n, d, d], ``C`` [n, m, d], ``Q`` [n, d, d],
    ``R`` [n, m, m], ``m0`` [n, d] and ``P0`` [n, d, d] (the prior of the first state x_1)."""

    A: torch.Tensor
    C: torch.Tensor
    Q: torch.Tensor
    R: torch.Tensor
    m0: torch.Tensor
    P0: torch.Tensor

    def map(self, fn) -> LinearGaussianSystems:
        """The same systems with ``fn`` applied to every tensor (e.g. indexing or expanding the batch axis)."""
        return LinearGaussianSystems(**{f.name: fn(getattr(self, f.name)) for f in fields(self)})


@dataclass
class KalmanBatch:
    """Sequences with their exact filtering posteriors; query q sits at ``features[:, query_pos[q]]``."""

    features: torch.Tensor  # [n, T, F] float32: each position's weights over the feature tokens
    query_pos: torch.Tensor  # [K] int64, the observation positions (the same for every sequence)
    mean: torch.Tensor  # [n, K, d] float64, m_t
    cov: torch.Tensor  # [n, K, d, d] float64, P_t
    states: torch.Tensor  # [n, K, d] float64, the realised x_t (a draw from the posterior's generative process)
    obs: torch.Tensor  # [n, K, m] float64, y_t
    system: LinearGaussianSystems


def _haar(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    """n Haar-random orthogonal d x d matrices (QR of a Gaussian with the sign of R's diagonal fixed)."""
    q, r = np.linalg.qr(rng.standard_normal((n, d, d)))
    return q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[:, None, :]


def _random_spd(rng: np.random.Generator, n: int, d: int, scale: tuple[float, float]) -> np.ndarray:
    """SPD matrices W diag(e) W^T: W Haar, e = c * U[1/2, 1] with c log-uniform on ``scale``."""
    c = np.exp(rng.uniform(np.log(scale[0]), np.log(scale[1]), size=(n, 1)))
    e = c * rng.uniform(0.5, 1.0, size=(n, d))
    w = _haar(rng, n, d)
    return np.einsum("nij,nj,nkj->nik", w, e, w)


def sample_systems(
    rng: np.random.Generator,
    n: int,
    state_dim: int,
    obs_dim: int,
    *,
    singular_values: tuple[float, float],
    proc_scale: tuple[float, float],
    obs_scale: tuple[float, float],
    prior_scale: tuple[float, float],
) -> LinearGaussianSystems:
    """``n`` random stable systems (see the module docstring for the distribution)."""
    d, m = state_dim, obs_dim
    s = rng.uniform(*singular_values, size=(n, d))
    A = np.einsum("nij,nj,nkj->nik", _haar(rng, n, d), s, _haar(rng, n, d))
    C = rng.standard_normal((n, m, d))
    C /= np.linalg.norm(C, axis=-1, keepdims=True)
    out = dict(A=A, C=C, Q=_random_spd(rng, n, d, proc_scale), R=_random_spd(rng, n, m, obs_scale),
               m0=rng.standard_normal((n, d)), P0=_random_spd(rng, n, d, prior_scale))
    return LinearGaussianSystems(**{k: torch.from_numpy(v) for k, v in out.items()})


def _noise(cov: torch.Tensor, k: int, rng: np.random.Generator) -> torch.Tensor:
    """k independent draws from N(0, cov) per batch row: [n, k, dim]."""
    z = torch.from_numpy(rng.standard_normal((cov.shape[0], k, cov.shape[-1], 1)))
    return (torch.linalg.cholesky(cov)[:, None] @ z)[..., 0]


def simulate(system: LinearGaussianSystems, length: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw states [n, K, d] and observations [n, K, m] of ``length`` steps from each system."""
    w, v = _noise(system.Q, length, rng), _noise(system.R, length, rng)
    x = system.m0 + _noise(system.P0, 1, rng)[:, 0]
    states = [x]
    for t in range(1, length):
        x = (system.A @ x[..., None])[..., 0] + w[:, t]
        states.append(x)
    states = torch.stack(states, 1)  # [n, K, d]
    return states, (system.C[:, None] @ states[..., None])[..., 0] + v  # obs [n, K, m]


def _symmetric(p: torch.Tensor) -> torch.Tensor:
    return 0.5 * (p + p.transpose(-1, -2))


def predict(system: LinearGaussianSystems, mean: torch.Tensor, cov: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One time update: N(m, P) of x_t -> N(A m, A P A^T + Q) of x_{t+1}."""
    A = system.A
    return (A @ mean[..., None])[..., 0], _symmetric(A @ cov @ A.transpose(-1, -2) + system.Q)


def update(system: LinearGaussianSystems, mean: torch.Tensor, cov: torch.Tensor, y: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """One measurement update with y = C x + v (gain by a linear solve, covariance in Joseph form)."""
    C, R = system.C, system.R
    S = C @ cov @ C.transpose(-1, -2) + R  # [n, m, m]
    gain = torch.linalg.solve(S, C @ cov).transpose(-1, -2)  # [n, d, m] = P C^T S^-1 (S, P symmetric)
    mean = mean + (gain @ (y - (C @ mean[..., None])[..., 0])[..., None])[..., 0]
    eye = torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device)
    I_KC = eye - gain @ C
    cov = I_KC @ cov @ I_KC.transpose(-1, -2) + gain @ R @ gain.transpose(-1, -2)
    return mean, _symmetric(cov)


def kalman_filter(system: LinearGaussianSystems, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact filtering posteriors p(x_t | y_1..y_t) = N(m_t, P_t) for obs [n, K, m]; returns [n, K, d] and
    [n, K, d, d] float64. The prior of x_1 is N(m0, P0)."""
    mean, cov = system.m0.double(), system.P0.double()
    means, covs = [], []
    for t in range(obs.shape[1]):
        if t:
            mean, cov = predict(system, mean, cov)
        mean, cov = update(system, mean, cov, obs[:, t].double())
        means.append(mean)
        covs.append(cov)
    return torch.stack(means, 1), torch.stack(covs, 1)


def prior_marginals(system: LinearGaussianSystems, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Unconditional marginals p(x_t) = N(A^{t-1} m0, ...) for t = 1..length: [n, K, d], [n, K, d, d]."""
    mean, cov = system.m0.double(), system.P0.double()
    means, covs = [mean], [cov]
    for _ in range(length - 1):
        mean, cov = predict(system, mean, cov)
        means.append(mean)
        covs.append(cov)
    return torch.stack(means, 1), torch.stack(covs, 1)


def window_filter(system: LinearGaussianSystems, obs: torch.Tensor, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """p(x_t | y_{t-window+1}..y_t): the exact posterior given only the last ``window`` observations.

    The Bayes-optimal predictor with that much memory: a Kalman filter started at the window's first step from
    that state's unconditional marginal (the header's prior carried forward). Up to ``window`` steps it is the
    exact filter. Returns [n, K, d] and [n, K, d, d] float64.
    """
    if window < 1:
        raise ValueError(f"window={window} must be at least 1.")
    n, K, m = obs.shape
    mean, cov = kalman_filter(system, obs)
    if window >= K:
        return mean, cov
    starts = K - window + 1  # windows ending at t = window-1 .. K-1 (0-based), starting at s = t - window + 1
    prior_mean, prior_cov = prior_marginals(system, starts)  # marginals at every start s
    runs = system.map(lambda x: x[:, None].expand(n, starts, *x.shape[1:]).reshape(n * starts, *x.shape[1:]))
    runs.m0, runs.P0 = prior_mean.reshape(n * starts, -1), prior_cov.reshape(n * starts, *prior_cov.shape[2:])
    windows = obs.double().unfold(1, window, 1).transpose(-1, -2)  # [n, starts, window, m]
    w_mean, w_cov = kalman_filter(runs, windows.reshape(n * starts, window, m))
    d = mean.shape[-1]
    mean = torch.cat([mean[:, : window - 1], w_mean[:, -1].reshape(n, starts, d)], 1)
    cov = torch.cat([cov[:, : window - 1], w_cov[:, -1].reshape(n, starts, d, d)], 1)
    return mean, cov


def _sqrtm_psd(p: torch.Tensor) -> torch.Tensor:
    """Symmetric square root of PSD matrices via eigh (negative rounding-level eigenvalues clipped)."""
    ev, vec = torch.linalg.eigh(_symmetric(p))
    return vec @ torch.diag_embed(ev.clamp_min(0).sqrt()) @ vec.transpose(-1, -2)


def gaussian_w2(mean1: torch.Tensor, cov1: torch.Tensor, mean2: torch.Tensor, cov2: torch.Tensor) -> torch.Tensor:
    """2-Wasserstein distance between N(mean1, cov1) and N(mean2, cov2), batched over leading axes:
    W2^2 = |m1 - m2|^2 + tr P1 + tr P2 - 2 tr (P1^1/2 P2 P1^1/2)^1/2 (in the state's units)."""
    root1 = _sqrtm_psd(cov1)
    cross = torch.linalg.eigvalsh(_symmetric(root1 @ cov2 @ root1)).clamp_min(0).sqrt().sum(-1)
    trace = torch.diagonal(cov1, dim1=-2, dim2=-1).sum(-1) + torch.diagonal(cov2, dim1=-2, dim2=-1).sum(-1)
    w2sq = ((mean1 - mean2) ** 2).sum(-1) + trace - 2 * cross
    return w2sq.clamp_min(0).sqrt()


def gaussian_kl_bits(mean0: torch.Tensor, cov0: torch.Tensor, mean1: torch.Tensor, cov1: torch.Tensor) -> torch.Tensor:
    """KL(N(mean0, cov0) || N(mean1, cov1)) in bits, batched over leading axes."""
    return gaussian_kl(mean0, torch.linalg.cholesky(cov0), mean1, torch.linalg.cholesky(cov1))


def gaussian_entropy_bits(cov: torch.Tensor) -> torch.Tensor:
    """Differential entropy of N(., cov) in bits: 0.5 log2 det(2 pi e cov)."""
    d = cov.shape[-1]
    return 0.5 * (d * math.log(2 * math.pi * math.e) + torch.linalg.slogdet(cov).logabsdet) / LN2


class KalmanTask:
    """Generator of linear-Gaussian filtering sequences (fresh system per sequence) with exact posteriors."""

    name = "kalman"

    def __init__(
        self,
        state_dim: int = 2,
        obs_dim: int = 1,
        n_steps: int = 24,
        singular_values: tuple[float, float] = (0.8, 0.99),
        proc_scale: tuple[float, float] = (0.01, 0.05),
        obs_scale: tuple[float, float] = (0.5, 2.0),
        prior_scale: tuple[float, float] = (0.25, 1.0),
    ) -> None:
        if not 1 <= state_dim <= 3 or not 1 <= obs_dim <= state_dim:
            raise ValueError(f"state_dim={state_dim}, obs_dim={obs_dim}: need 1 <= obs_dim <= state_dim <= 3.")
        if not 0 < singular_values[0] <= singular_values[1] < 1:
            raise ValueError(f"singular_values={singular_values} must lie in (0, 1) for a stable system.")
        self.state_dim, self.obs_dim, self.n_steps = state_dim, obs_dim, n_steps
        self.ranges = dict(singular_values=tuple(singular_values), proc_scale=tuple(proc_scale),
                           obs_scale=tuple(obs_scale), prior_scale=tuple(prior_scale))
        d, m = state_dim, obs_dim
        tri = lambda name, k: [f"{name}{i}{j}" for i in range(k) for j in range(i + 1)]  # noqa: E731
        self.header_tokens = ([f"A{i}{j}" for i in range(d) for j in range(d)]
                              + [f"C{i}{j}" for i in range(m) for j in range(d)]
                              + tri("Q", d) + tri("R", m) + [f"m0_{i}" for i in range(d)] + tri("P0_", d))
        self.feature_tokens = ["[SYS]", "[OBS]", *self.header_tokens, *[f"y{i}" for i in range(m)]]
        self.readout_tokens = [f"mean{i}" for i in range(d)] + tri("chol", d)

    @property
    def vocab(self) -> list[str]:
        """Token strings in id order: feature tokens (inputs), then read-out tokens (outputs only)."""
        return self.feature_tokens + self.readout_tokens

    @property
    def n_features(self) -> int:
        return len(self.feature_tokens)

    @property
    def readout_ids(self) -> list[int]:
        """Ids of the read-out tokens: the LM head there gives the mean, then the Cholesky factor's lower
        triangle row by row (diagonal entries as logs)."""
        return list(range(self.n_features, len(self.vocab)))

    def seq_len(self, length: int | None = None) -> int:
        """Positions per sequence with ``length`` observations: the header plus one per observation."""
        return 1 + (length or self.n_steps)

    def features(self, system: LinearGaussianSystems, obs: torch.Tensor) -> torch.Tensor:
        """The input rows [n, 1 + K, F] float32 for these systems and observations."""
        n, K, m = obs.shape
        d = self.state_dim
        rows, cols = torch.tril_indices(d, d)
        mrows, mcols = torch.tril_indices(m, m)
        header = torch.cat([system.A.reshape(n, -1), system.C.reshape(n, -1), system.Q[:, rows, cols],
                            system.R[:, mrows, mcols], system.m0, system.P0[:, rows, cols]], 1)
        out = torch.zeros(n, 1 + K, self.n_features, dtype=torch.float64)
        out[:, 0, 0] = 1.0
        out[:, 0, 2 : 2 + header.shape[1]] = header
        out[:, 1:, 1] = 1.0
        out[:, 1:, -m:] = obs
        return out.float()

    def sample(self, n: int, *, seed: int | np.random.Generator | None = None, length: int | None = None) -> KalmanBatch:
        """Draw ``n`` sequences of ``length`` observations (default ``n_steps``), each with its own system."""
        rng, K = as_rng(seed), length or self.n_steps
        system = sample_systems(rng, n, self.state_dim, self.obs_dim, **self.ranges)
        states, obs = simulate(system, K, rng)
        mean, cov = kalman_filter(system, obs)
        return KalmanBatch(features=self.features(system, obs), query_pos=torch.arange(1, K + 1), mean=mean,
                           cov=cov, states=states, obs=obs, system=system)
