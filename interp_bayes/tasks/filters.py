"""Shortcut baselines of the wind tunnels: what a predictor that sees less than the whole context can reach.

Exact and closed-form, no training. Each returns a belief over the task's hypotheses at every query position,
[n, Q, H] float64, read from the prompt tokens alone (an independent path from the task's own posterior):

- ``uniform``: 1/H everywhere.
- ``window m`` (m >= 1): the exact posterior given only the last m observations, p(hypothesis | last m
  observations), which minimises the expected KL to the exact posterior among all predictors that see only those
  m observations (and the position). HMM: the forward filter over o_{t-m+1..t} started from the marginal
  p(s_{t-m+1}) = init T^(t-m) (the stationary distribution once t - m exceeds the mixing time). Bijection: uniform
  over the values not shown in the last m pairs, or a delta when the query key is one of those m keys (keys with
  replacement). When m reaches back to the first observation the window filter is the exact filter.
- ``prior`` (m = 0): the belief before any observation: the HMM marginal p(s_t) = init T^(t-1); for the bijection
  the uniform guess.
- ``mean-matrices`` (HMM): the forward filter over every observation, but with the family's mean T and E instead
  of the prompt's own: full memory without reading the header's numbers. Where a family's matrices are
  predictable (the sticky chain with peaked, identity-mapped emissions) it is far better than the windows, so a
  model that beats only the windows has shown memory, and one that also beats this filter reads the header.

``position_entropy`` gives the position-only predictor of the entropy: the mean exact entropy at each position,
the best a predictor of H that sees nothing but the position can do (for the bijection without replacement the
exact entropy is a function of the position, so this predictor's entropy MAE is 0).
"""

from __future__ import annotations

import numpy as np
import torch

from ..core.errors import ConfigError
from ..stats import info
from .base import TaskBatch
from .bijection import BijectionTask
from .hmm import HMMTask, hmm_filter
from .recall import RecallTask


def uniform_posterior(task, batch: TaskBatch) -> torch.Tensor:
    """1/H at every query position: [n, Q, H] float64."""
    n, Q, H = batch.input_ids.shape[0], len(batch.query_pos), len(task.hypothesis_ids)
    return torch.full((n, Q, H), 1.0 / H, dtype=torch.float64)


def hmm_marginals(trans: torch.Tensor, n_steps: int, init: torch.Tensor | None = None) -> torch.Tensor:
    """p(s_t) for t = 1..n_steps before any observation: init T^(t-1). ``trans`` [n, S, S]; returns [n, K, S]."""
    n, S = trans.shape[0], trans.shape[1]
    current = torch.full((n, S), 1.0 / S, dtype=torch.float64) if init is None else init.double()
    out = [current]
    for _ in range(n_steps - 1):
        current = torch.einsum("ns,nst->nt", current, trans.double())
        out.append(current)
    return torch.stack(out, dim=1)


def hmm_window_posterior(trans: torch.Tensor, emit: torch.Tensor, obs: torch.Tensor, m: int) -> torch.Tensor:
    """p(s_t | o_{t-m+1..t}) for every t, uniform first state: [n, K, S] float64 (m = 0: the marginal p(s_t))."""
    n, K = obs.shape
    marginal = hmm_marginals(trans, K)  # [n, K, S]
    if m == 0:
        return marginal
    out = torch.empty(n, K, trans.shape[1], dtype=torch.float64)
    for t in range(K):
        start = max(0, t - m + 1)
        out[:, t] = hmm_filter(trans, emit, obs[:, start : t + 1], init=marginal[:, start])[:, -1]
    return out


def hmm_mean_matrix_posterior(task: HMMTask, batch: TaskBatch, *, n: int = 20000, seed: int = 0) -> torch.Tensor:
    """The exact filter of every prompt's observations under the family's mean matrices (estimated from ``n`` draws
    of the task's matrix sampler with ``seed``): [n_seq, K, S] float64."""
    t_cents, e_cents = task.sample_matrices(n, np.random.default_rng(seed))
    obs = task.observations(batch.input_ids)
    trans = torch.from_numpy(t_cents.mean(0) / 100.0).expand(len(obs), -1, -1)
    emit = torch.from_numpy(e_cents.mean(0) / 100.0).expand(len(obs), -1, -1)
    return hmm_filter(trans, emit, obs)


def bijection_window_posterior(task: BijectionTask, input_ids: torch.Tensor, m: int) -> torch.Tensor:
    """Belief about each query key's value from the last m pairs only: [n, Q, V] float64 (see module docstring)."""
    V = task.n_symbols
    keys, values = input_ids[:, 0::2], input_ids[:, 1::2] - V  # [n, Q], [n, Q-1]
    n, Q = keys.shape
    out = torch.empty(n, Q, V, dtype=torch.float64)
    rows = torch.arange(n)
    for q in range(Q):
        window = range(max(0, q - m), q)
        shown = torch.zeros(n, V, dtype=torch.bool)
        known = torch.full((n,), -1, dtype=torch.int64)  # the query key's value when the window shows that key
        for j in window:
            shown[rows, values[:, j]] = True
            known = torch.where(keys[:, j] == keys[:, q], values[:, j], known)
        free = (~shown).double()
        belief = free / free.sum(-1, keepdim=True)
        delta = torch.nn.functional.one_hot(known.clamp(min=0), V).double()
        out[:, q] = torch.where((known >= 0)[:, None], delta, belief)
    return out


def window_posterior(task, batch: TaskBatch, m: int) -> torch.Tensor:
    """The m-observation window filter of ``task`` (HMM or bijection) on ``batch``: [n, Q, H] float64."""
    if m < 0:
        raise ConfigError(f"A window holds m >= 0 observations; got m={m}.")
    if isinstance(task, HMMTask):
        trans, emit = task.matrices(batch.input_ids)
        return hmm_window_posterior(trans, emit, task.observations(batch.input_ids), m)
    if isinstance(task, BijectionTask):
        return bijection_window_posterior(task, batch.input_ids, m)
    if isinstance(task, RecallTask):  # m counts tokens here (tasks/recall.py)
        return task.window_posterior(batch.input_ids, m)
    raise ConfigError(f"No window filter for task '{getattr(task, 'name', task)}'; known: bijection, hmm, recall.")


def baseline_posteriors(task, batch: TaskBatch, windows: tuple[int, ...] = (1, 2, 3, 4)) -> dict[str, torch.Tensor]:
    """name -> [n, Q, H] float64 for the uniform guess, the prior and the mean-matrix filter (HMM only: for the
    bijection the prior is the uniform guess), the position-only and stored-values beliefs (recall) and each window
    filter ``window-m``."""
    out = {"uniform": uniform_posterior(task, batch)}
    if isinstance(task, RecallTask):
        out["position-only"] = task.position_only_posterior(batch)
        out["stored-values"] = task.stored_values_posterior(batch.input_ids)
    if isinstance(task, HMMTask):
        out["prior"] = window_posterior(task, batch, 0)
        out["mean-matrices"] = hmm_mean_matrix_posterior(task, batch)
    out |= {f"window-{m}": window_posterior(task, batch, m) for m in windows}
    return out


def position_entropy(task, length: int | None = None, *, n: int = 2000, seed: int = 0) -> torch.Tensor:
    """Mean exact entropy in bits at each query position, [Q] float64, over ``n`` sequences drawn with ``seed``
    (use a seed other than the evaluation's, so the predictor is fitted on other sequences)."""
    return info.entropy(task.sample(n, seed=seed, length=length).posterior.double()).mean(0)
