"""Wind-tunnel tasks: exact posteriors, token layouts, reproducibility."""

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from interp_bayes.stats.info import entropy as entropy_bits
from interp_bayes.tasks.bijection import BijectionTask
from interp_bayes.core.errors import ConfigError
from interp_bayes.tasks.hmm import MIN_CENTS, HMMTask, discretize_rows, hmm_filter, split_cents

torch.set_num_threads(1)


@pytest.mark.parametrize("replacement", [False, True])
def test_bijection_posteriors_are_distributions(replacement):
    b = BijectionTask(n_symbols=12, n_pairs=12, replacement=replacement).sample(64, seed=0)
    torch.testing.assert_close(b.posterior.sum(-1), torch.ones(64, 12))
    assert (b.posterior >= 0).all()
    # the realised value always has positive posterior mass
    assert (torch.gather(b.posterior, 2, b.labels[..., None]) > 0).all()


def test_bijection_entropy_is_log2_of_remaining_values():
    V = 20
    b = BijectionTask(n_symbols=V).sample(32, seed=1)
    expected = torch.tensor([math.log2(V - k + 1) for k in range(1, V + 1)])
    torch.testing.assert_close(entropy_bits(b.posterior), expected.expand(32, V), atol=1e-5, rtol=0)


def test_bijection_layout_and_consistency():
    V = 10
    b = BijectionTask(n_symbols=V, n_pairs=7).sample(16, seed=2)
    ids = b.input_ids
    assert ids.shape == (16, 13)
    keys, shown_values = ids[:, 0::2], ids[:, 1::2] - V
    assert torch.equal(b.query_pos, torch.arange(0, 13, 2))
    assert (keys < V).all() and (shown_values >= 0).all() and (shown_values < V).all()
    torch.testing.assert_close(shown_values, b.labels[:, :-1])
    # a value already shown has zero mass at every later query
    for q in range(1, 7):
        seen = torch.nn.functional.one_hot(b.labels[:, :q], V).sum(1) > 0
        assert (b.posterior[:, q][seen] == 0).all()


def test_bijection_with_replacement_is_a_delta_on_repeated_keys():
    b = BijectionTask(n_symbols=5, n_pairs=12, replacement=True).sample(64, seed=3)
    keys = b.input_ids[:, 0::2]
    repeated = torch.stack([(keys[:, :q] == keys[:, q : q + 1]).any(1) for q in range(12)], 1)
    assert repeated.any()
    h = entropy_bits(b.posterior)
    assert (h[repeated].abs() < 1e-6).all()
    assert torch.equal(b.posterior[repeated].argmax(-1), b.labels[repeated])
    n_distinct_seen = torch.stack([torch.tensor([len(set(r[:q].tolist())) for r in keys]) for q in range(12)], 1)
    torch.testing.assert_close(h[~repeated], torch.log2(5 - n_distinct_seen[~repeated].float()))


def test_bijection_key_pool_keeps_the_exact_posterior():
    V, pool = 12, 3
    b = BijectionTask(n_symbols=V, replacement=True, key_pool=pool).sample(300, seed=6)
    keys, L = b.input_ids[:, 0::2], b.labels.shape[1]
    assert max(len(set(r.tolist())) for r in keys) == pool
    assert len(set(keys.flatten().tolist())) == V  # a different pool per sequence
    for q in range(L):  # a repeated key's value with certainty, else uniform over the values not yet shown
        repeated = (keys[:, :q] == keys[:, q : q + 1]).any(1)
        seen = torch.nn.functional.one_hot(b.labels[:, :q], V).sum(1) > 0 if q else torch.zeros(len(keys), V, dtype=bool)
        expected = torch.where(repeated[:, None], torch.nn.functional.one_hot(b.labels[:, q], V).double(),
                               (~seen).double() / (~seen).sum(1, keepdim=True))
        torch.testing.assert_close(b.posterior[:, q].double(), expected)


@pytest.mark.parametrize("kwargs", [dict(key_pool=3), dict(replacement=True, key_pool=0),
                                    dict(replacement=True, key_pool=21)])
def test_bijection_refuses_a_key_pool_it_cannot_draw(kwargs):
    with pytest.raises(ValueError, match="key_pool"):
        BijectionTask(n_symbols=20, **kwargs)


@pytest.mark.parametrize("task", [BijectionTask(), HMMTask(), HMMTask(transitions="sticky", emissions="peaked")])
def test_generation_is_reproducible_from_a_seed(task):
    a, b, c = task.sample(8, seed=7), task.sample(8, seed=7), task.sample(8, seed=8)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.posterior, b.posterior)
    assert not torch.equal(a.input_ids, c.input_ids)


def brute_force_filter(T: np.ndarray, E: np.ndarray, obs: list[int]) -> np.ndarray:
    """p(s_t | o_1..t) by summing over every hidden path, uniform start."""
    S, out = T.shape[0], []
    for t in range(1, len(obs) + 1):
        post = np.zeros(S)
        for path in itertools.product(range(S), repeat=t):
            p = 1.0 / S * E[path[0], obs[0]]
            for i in range(1, t):
                p *= T[path[i - 1], path[i]] * E[path[i], obs[i]]
            post[path[-1]] += p
        out.append(post / post.sum())
    return np.stack(out)


@pytest.mark.parametrize("S,O,K", [(3, 2, 4), (2, 3, 5), (4, 4, 3)])
def test_forward_algorithm_matches_brute_force(S, O, K):
    rng = np.random.default_rng(S * 100 + K)
    n = 5
    T, E = rng.dirichlet(np.ones(S), size=(n, S)), rng.dirichlet(np.ones(O), size=(n, S))
    obs = rng.integers(0, O, size=(n, K))
    got = hmm_filter(torch.from_numpy(T), torch.from_numpy(E), torch.from_numpy(obs)).numpy()
    for i in range(n):
        np.testing.assert_allclose(got[i], brute_force_filter(T[i], E[i], obs[i].tolist()), rtol=1e-10)


def test_hmm_tokens_carry_the_matrices_the_posterior_uses():
    task = HMMTask(n_steps=4)
    b = task.sample(6, seed=4)
    ids = b.input_ids.numpy()
    assert ids.shape == (6, 53 + 8) and task.header_len == 53
    assert (ids[:, 0] == task.trans_id).all() and (ids[:, 26] == task.emit_id).all()
    assert (ids[:, 52] == task.sep_id).all()
    T = (ids[:, 1:26].reshape(6, 5, 5) + MIN_CENTS) / 100.0
    E = (ids[:, 27:52].reshape(6, 5, 5) + MIN_CENTS) / 100.0
    np.testing.assert_allclose(T.sum(-1), 1.0)
    np.testing.assert_allclose(E.sum(-1), 1.0)
    obs = ids[:, b.query_pos.numpy()] - task.symbol_offset  # observation o_t sits at each query position
    assert (ids[:, b.query_pos.numpy() - 1] == task.obs_id).all()
    for i in range(6):
        np.testing.assert_allclose(b.posterior[i].numpy(), brute_force_filter(T[i], E[i], obs[i].tolist()), atol=1e-6)
    torch.testing.assert_close(b.posterior.sum(-1), torch.ones(6, 4))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=5, max_size=5).filter(lambda x: sum(x) > 0.1))
def test_discretized_rows_are_valid_hundredths(raw):
    p = np.maximum(np.array(raw) / sum(raw), 0.05)
    p = p / p.sum()
    cents = discretize_rows(p[None])[0]
    assert cents.sum() == 100 and cents.min() >= MIN_CENTS
    assert np.abs(cents - 100 * p).max() <= 5


VARIANTS = [dict(transitions="sticky"), dict(transitions="sticky", spread="dirichlet"), dict(emissions="peaked"),
            dict(transitions="sticky", emissions="peaked", peak_cents=(50, 70), symbol_map="identity")]


@pytest.mark.parametrize("kwargs", VARIANTS)
def test_hmm_variant_posteriors_match_enumeration_under_the_matrices_in_the_tokens(kwargs):
    task = HMMTask(n_steps=4, **kwargs)
    b = task.sample(6, seed=4)
    assert task.vocab[0] == "0.00" and task.vocab[-1] == "s4" and len(task.vocab) == 101 + 4 + 5 + 5
    T, E = task.matrices(b.input_ids)
    T, E = T.numpy(), E.numpy()
    obs = task.observations(b.input_ids).numpy()
    np.testing.assert_array_equal(obs, b.input_ids[:, b.query_pos].numpy() - task.symbol_offset)
    np.testing.assert_allclose(T.sum(-1), 1.0)
    np.testing.assert_allclose(E.sum(-1), 1.0)
    for i in range(6):
        np.testing.assert_allclose(b.posterior[i].numpy(), brute_force_filter(T[i], E[i], obs[i].tolist()), atol=1e-6)


def test_sticky_rows_keep_their_state_with_the_drawn_probability():
    task = HMMTask(transitions="sticky", stay_cents=(90, 98))
    T, _ = task.matrices(task.sample(500, seed=1).input_ids)
    cents = torch.round(T * 100).long()
    stay = torch.diagonal(cents, dim1=1, dim2=2)  # [n, S]
    assert stay.min() == 90 and stay.max() == 98  # every value of the range is reached in 2,500 rows
    assert (cents.sum(-1) == 100).all() and (cents >= 0).all()


def test_even_spread_is_as_equal_as_whole_cents_allow():
    task = HMMTask(transitions="sticky", emissions="peaked", peak_cents=(50, 70), symbol_map="identity")
    T, E = task.matrices(task.sample(300, seed=6).input_ids)
    for m in (T, E):
        cents = torch.round(m * 100).long()
        off = cents.masked_select(~torch.eye(5, dtype=torch.bool).expand(300, 5, 5)).reshape(300, 5, 4)
        assert (off.amax(-1) - off.amin(-1) <= 1).all()  # the rest differs by at most one cent between states
    assert (E.argmax(-1) == torch.arange(5)).all()  # identity map: state s favours symbol s


def test_peaked_emissions_give_each_state_its_own_symbol():
    task = HMMTask(emissions="peaked", peak_cents=(80, 95))
    _, E = task.matrices(task.sample(300, seed=2).input_ids)
    top, symbol = (E * 100).round().max(-1)
    assert top.min() >= 80 and top.max() <= 95
    assert all(len(set(row.tolist())) == 5 for row in symbol)  # one-to-one


def test_the_paper_family_on_the_full_token_range_draws_the_same_matrices():
    a, b = HMMTask(), HMMTask(min_cents=0)
    x, y = a.sample(5, seed=3), b.sample(5, seed=3)
    assert b.vocab[5:] == a.vocab and b.vocab[0] == "0.00"
    (ta, ea), (tb, eb) = a.matrices(x.input_ids), b.matrices(y.input_ids)
    torch.testing.assert_close(ta, tb)
    torch.testing.assert_close(ea, eb)
    torch.testing.assert_close(x.posterior, y.posterior)
    assert torch.equal(x.input_ids[:, 1:26] + 5, y.input_ids[:, 1:26])  # the same entries, 5 ids further


def test_the_default_task_is_unchanged_by_the_variants():
    # the paper's family keeps its 0.05 floor and token ids, so committed checkpoints stay valid
    task = HMMTask()
    assert task.min_cents == MIN_CENTS and task.vocab[0] == "0.05" and task.trans_id == 96
    ids = task.sample(2, seed=0).input_ids
    assert ids[0, :6].tolist() == [96, 22, 36, 0, 0, 17]  # what the code before the variants drew for seed 0


@pytest.mark.parametrize("kwargs,match", [(dict(transitions="lazy"), "transitions"),
                                          (dict(emissions="peaked", n_obs=3), "n_obs=3"),
                                          (dict(transitions="sticky", stay_cents=(90, 101)), "cents range"),
                                          (dict(transitions="sticky", min_cents=5), "min_cents=5"),
                                          (dict(transitions="sticky", spread="gaussian"), "spread"),
                                          (dict(emissions="peaked", symbol_map="cyclic"), "symbol map")])
def test_bad_hmm_variants_are_refused(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        HMMTask(**kwargs).sample(2, seed=0)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 100), min_size=1, max_size=6), st.integers(1, 6), st.integers(0, 2**31))
def test_split_cents_sums_exactly(totals, parts, seed):
    total = np.array(totals)
    for spread in ("dirichlet", "even"):
        out = split_cents(np.random.default_rng(seed), total, parts, spread)
        assert out.shape == (len(totals), parts) and (out >= 0).all()
        np.testing.assert_array_equal(out.sum(-1), total)
    assert (out.max(-1) - out.min(-1) <= 1).all()  # even
