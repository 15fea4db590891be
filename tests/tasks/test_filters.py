"""Shortcut baselines: window filters against brute-force enumeration of the generative process, m = K equal to the
exact filter, the position-only entropy, and the comparison the evaluation reports."""

import itertools
import math

import numpy as np
import pytest
import torch

from interp_bayes.core.errors import ConfigError
from interp_bayes.tasks.base import TaskBatch
from interp_bayes.tasks.bijection import BijectionTask
from interp_bayes.tasks.filters import (
    baseline_posteriors,
    hmm_marginals,
    hmm_window_posterior,
    position_entropy,
    window_posterior,
)
from interp_bayes.tasks.hmm import HMMTask, mixing_times
from interp_bayes.stats.info import kl_from_probs as kl_bits
from interp_bayes.windtunnel.discrete import compare_with_baselines, paired_margin

torch.set_num_threads(1)


def brute_force_window(T: np.ndarray, E: np.ndarray, obs: list[int], m: int) -> np.ndarray:
    """p(s_t | o_{t-m+1..t}) for every t by summing over all hidden paths s_1..s_t from a uniform start, with the
    emissions of the observations outside the window left out (they are marginalised: each row of E sums to 1)."""
    S, out = T.shape[0], []
    for t in range(1, len(obs) + 1):
        post = np.zeros(S)
        for path in itertools.product(range(S), repeat=t):
            p = 1.0 / S
            for i in range(1, t):
                p *= T[path[i - 1], path[i]]
            for i in range(max(0, t - m), t):
                p *= E[path[i], obs[i]]
            post[path[-1]] += p
        out.append(post / post.sum())
    return np.stack(out)


@pytest.mark.parametrize("S,O,K", [(3, 2, 5), (2, 3, 6)])
def test_hmm_window_filter_matches_enumeration(S, O, K):
    rng = np.random.default_rng(10 * S + K)
    n = 4
    T, E = rng.dirichlet(np.ones(S), size=(n, S)), rng.dirichlet(np.ones(O), size=(n, S))
    obs = rng.integers(0, O, size=(n, K))
    for m in range(0, K + 1):
        got = hmm_window_posterior(torch.from_numpy(T), torch.from_numpy(E), torch.from_numpy(obs), m).numpy()
        for i in range(n):
            np.testing.assert_allclose(got[i], brute_force_window(T[i], E[i], obs[i].tolist(), m), rtol=1e-10)


@pytest.mark.parametrize("kwargs", [{}, {"transitions": "sticky"}, {"emissions": "peaked"}])
def test_window_of_the_whole_sequence_is_the_exact_filter(kwargs):
    task = HMMTask(n_steps=7, **kwargs)
    b = task.sample(50, seed=3)
    torch.testing.assert_close(window_posterior(task, b, 7), b.posterior.double(), atol=1e-6, rtol=0)
    # a window cannot be worse than one that sees less, and the exact filter is the floor
    post = b.posterior.double()
    kls = [kl_bits(post, torch.log(window_posterior(task, b, m))).mean() for m in range(8)]
    assert all(a >= b_ - 1e-9 for a, b_ in zip(kls, kls[1:])) and kls[-1] < 1e-6 < kls[0]


def test_hmm_marginals_are_powers_of_the_transition_matrix():
    T = torch.tensor([[[0.9, 0.1], [0.3, 0.7]]], dtype=torch.float64)
    got = hmm_marginals(T, 4)
    for t in range(4):
        want = torch.tensor([0.5, 0.5], dtype=torch.float64) @ torch.linalg.matrix_power(T[0], t)
        torch.testing.assert_close(got[0, t], want)


def bijection_enumeration(V: int, keys: list[int], values: list[int], q: int, m: int, replacement: bool) -> np.ndarray:
    """p(value of keys[q] | the last m pairs before q, the query key, the position) by enumerating every
    permutation and every key sequence of the generative process, conditioning on what the window shows."""
    post = np.zeros(V)
    window = range(max(0, q - m), q)

    def key_sequences():
        return itertools.product(range(V), repeat=q + 1) if replacement else itertools.permutations(range(V), q + 1)

    for perm in itertools.permutations(range(V)):
        for seq in key_sequences():
            if seq[q] != keys[q] or any(seq[j] != keys[j] or perm[seq[j]] != values[j] for j in window):
                continue
            post[perm[keys[q]]] += 1.0
    return post / post.sum()


@pytest.mark.parametrize("replacement", [False, True])
def test_bijection_window_matches_enumeration(replacement):
    V, L = 4, 4
    task = BijectionTask(n_symbols=V, n_pairs=L, replacement=replacement)
    b = task.sample(6, seed=5)
    keys, values = b.input_ids[:, 0::2], b.labels
    for m in range(0, L + 1):
        got = window_posterior(task, b, m)
        for i in range(6):
            for q in range(L):
                want = bijection_enumeration(V, keys[i].tolist(), values[i].tolist(), q, m, replacement)
                np.testing.assert_allclose(got[i, q].numpy(), want, atol=1e-12)
    torch.testing.assert_close(window_posterior(task, b, L), b.posterior.double())


def test_bijection_window_by_hand():
    # keys k2 k0 k3 k1 with values v1 v3 v0 (v2 for k1, never shown); V = 4
    task = BijectionTask(n_symbols=4, n_pairs=4)
    ids = torch.tensor([[2, 4 + 1, 0, 4 + 3, 3, 4 + 0, 1]])
    b = TaskBatch(ids, torch.arange(0, 7, 2), torch.zeros(1, 4, 4), torch.tensor([[1, 3, 0, 2]]))
    w1 = window_posterior(task, b, 1)[0]
    torch.testing.assert_close(w1[0], torch.full((4,), 0.25, dtype=torch.float64))  # nothing shown yet
    torch.testing.assert_close(w1[3], torch.tensor([0, 1, 1, 1], dtype=torch.float64) / 3)  # only v0 excluded
    torch.testing.assert_close(window_posterior(task, b, 2)[0, 3], torch.tensor([0, 1, 1, 0], dtype=torch.float64) / 2)
    torch.testing.assert_close(window_posterior(task, b, 3)[0, 3], torch.tensor([0, 0, 1, 0], dtype=torch.float64))


def test_position_only_entropy_of_the_bijection_is_log2_of_the_remaining_values():
    V = 12
    h = position_entropy(BijectionTask(n_symbols=V), n=64, seed=1)
    torch.testing.assert_close(h, torch.tensor([math.log2(V - k) for k in range(V)], dtype=torch.float64))


def test_mixing_time_of_a_two_state_chain_is_closed_form():
    # symmetric chain with stay p: TV(T^t[s], pi) = |2p - 1|^t / 2, so t_mix(1/4) = ceil(log(1/2) / log|2p - 1|)
    ps = [0.6, 0.9, 0.95, 0.99]
    T = torch.tensor([[[p, 1 - p], [1 - p, p]] for p in ps], dtype=torch.float64)
    want = [math.ceil(math.log(0.5) / math.log(abs(2 * p - 1)) - 1e-12) for p in ps]
    assert mixing_times(T).tolist() == want == [1, 4, 7, 35]


def test_baselines_and_the_best_window_comparison():
    task = HMMTask(n_steps=10, transitions="sticky")
    b = task.sample(300, seed=9)
    beliefs = baseline_posteriors(task, b)
    assert list(beliefs) == ["uniform", "prior", "mean-matrices", "window-1", "window-2", "window-3", "window-4"]
    for q in beliefs.values():
        torch.testing.assert_close(q.sum(-1), torch.ones(300, 10, dtype=torch.float64))
    # the exact posterior itself, as a "model", beats every window; the uniform guess beats none
    exact = compare_with_baselines(torch.log(b.posterior.double().clamp(min=1e-30)), b, task)["vs_best_window"]
    assert exact["best_window"] == "window-4" and exact["beats"] and exact["margin_ci"][0] > 0
    flat = compare_with_baselines(torch.log(beliefs["uniform"]), b, task)["vs_best_window"]
    assert not flat["beats"] and flat["margin_ci"][1] < 0
    # a baseline compared with itself has margin 0; every baseline carries its margin over the model
    own = compare_with_baselines(torch.log(beliefs["mean-matrices"]), b, task)["baselines"]
    assert own["mean-matrices"]["kl_margin"]["margin_bits"] == pytest.approx(0.0, abs=1e-12)
    assert all("kl_margin" in m for name, m in own.items() if name != "position-only")


def test_paired_margin_interval_covers_the_mean_and_shrinks_with_n():
    rng = np.random.default_rng(0)
    small = paired_margin(rng.normal(1.0, 1.0, (50, 3)), np.zeros((50, 3)))
    large = paired_margin(rng.normal(1.0, 1.0, (5000, 3)), np.zeros((5000, 3)))
    for r in (small, large):
        assert r["margin_ci"][0] < r["margin_bits"] < r["margin_ci"][1]
    assert np.diff(large["margin_ci"])[0] < 0.2 * np.diff(small["margin_ci"])[0]


def test_negative_window_is_refused():
    task = HMMTask(n_steps=3)
    with pytest.raises(ConfigError, match="m >= 0"):
        window_posterior(task, task.sample(2, seed=0), -1)



def test_mean_matrix_filter_uses_the_family_average_and_every_observation():
    task = HMMTask(n_steps=12, transitions="sticky", emissions="peaked", peak_cents=(50, 70), symbol_map="identity")
    b = task.sample(400, seed=4)
    got = baseline_posteriors(task, b)["mean-matrices"]
    # the family's mean matrices: stay and peak at the middle of their ranges, the rest spread evenly
    T = torch.full((5, 5), 0.06 / 4, dtype=torch.float64).fill_diagonal_(0.94)
    E = torch.full((5, 5), 0.40 / 4, dtype=torch.float64).fill_diagonal_(0.60)
    want = hmm_window_posterior(T.expand(400, 5, 5), E.expand(400, 5, 5), task.observations(b.input_ids), 12)
    torch.testing.assert_close(got, want, atol=5e-3, rtol=0)  # a Monte Carlo estimate from 20,000 draws
    post = b.posterior.double()
    kl = {name: kl_bits(post, torch.log(q)).mean() for name, q in baseline_posteriors(task, b).items()}
    assert kl["mean-matrices"] < kl["window-4"] < kl["uniform"]  # this family is predictable: memory is what counts


def test_paired_margin_draws_until_the_interval_is_settled_against_zero():
    """Issue 36: ``beats`` is the sequential decision of the interval against 0 (``stats.beyond``), ``n_boot`` the
    cap, with the draws recorded: a clear margin settles after ~550 of 2000 draws, a clear loss after one batch, and
    a cap of 200 leaves the clear margin undecided (None: borderline)."""
    rng = np.random.default_rng(1)
    win, lose = rng.normal(1.0, 1.0, (200, 3)), rng.normal(-1.0, 1.0, (200, 3))
    clear = paired_margin(win, np.zeros((200, 3)))
    assert clear["beats"] is True and clear["test"]["decision"] == "reject" and 500 <= clear["test"]["draws"] < 2000
    assert clear["margin_ci"] == list(clear["test"]["null"]) and clear["margin_ci"][0] > 0
    loss = paired_margin(lose, np.zeros((200, 3)))
    assert loss["beats"] is False and loss["test"]["draws"] == 50
    capped = paired_margin(win, np.zeros((200, 3)), n_boot=200)
    assert capped["beats"] is None and capped["test"]["decision"] == "undecided" and capped["test"]["draws"] == 200
