"""Order sensitivity and the martingale gap: closed forms for toy predictors (a Bayesian one has gap 0 and no order
effect; a permutation-invariant non-Bayesian one has a known positive gap; a recency predictor has a known order
spread), the exact bijection predictive against the task's own posterior, and real models end to end."""

import math

import numpy as np
import pytest

from interp_bayes.analyses.martingale import (AVERAGED, EXPECTATION_GAP, FLOAT_FLOOR, GAP_OVER_K, NULLS, Context,
    bijection_contexts, bijection_setup, debiased_gap_bits, martingale_gap, martingale_test, model_predictor,
    order_averaged, order_sensitivity, sula_contexts, sula_setup)
from interp_bayes.tasks.bijection import BijectionTask
from interp_bayes.tasks.icl import SULATask, posterior_label1

TASK = SULATask(per_k=6)
SETUP = sula_setup(TASK, label_tokens=[0, 1])  # token ids unused by the toy predictors


def latent_posterior(contexts):
    """pi = P(y = L1 | D) used as the next-label predictive: invariant to order, but not a martingale."""
    n1 = np.array([sum(o == 0 for _, o in c.examples) for c in contexts])
    k = np.array([c.k for c in contexts])
    pi = posterior_label1(n1, k - n1)
    return np.column_stack([pi, 1 - pi])


def last_label(contexts):
    """Predicts from the most recent example only: order-dependent."""
    p = np.array([0.5 if not c.examples else (0.8 if c.examples[-1][1] == 0 else 0.2) for c in contexts])
    return np.column_stack([p, 1 - p])


def kl_bits(m, p):
    return sum(mi * math.log2(mi / pi) for mi, pi in zip(m, p))


def test_render_reproduces_the_generated_prompts():
    cols = TASK.generate("main", seed=42)
    contexts = sula_contexts(TASK, seed=42)
    assert [SETUP.render(c) for c in contexts] == cols["text"]
    assert [c.k for c in contexts] == cols["k"]


def test_the_exact_bayesian_predictor_has_no_order_effect_and_gap_zero():
    contexts = sula_contexts(TASK, seed=3)
    report = martingale_test(None, SETUP, contexts, predictor=SETUP.exact, n_null=5, n_boot=50)
    for entry in report.per_k:
        for stat in ("debiased_bits", "kl_bits", "tv", "drift_top"):
            assert abs(entry[stat]["mean"]) < 1e-12
            assert max(abs(x) for x in entry[f"exact_{stat}"]["range"]) < 1e-12
        for stat in ("debiased_bits", "kl_bits", "drift_top"):  # its own null: no noise, nothing to test against
            assert max(abs(x) for x in entry[f"null_{stat}"]["range"]) < 1e-12
        if entry["k"] >= 2:
            assert entry["js_bits"]["mean"] < 1e-12 and entry["top_sd"]["mean"] < 1e-12
    gap = martingale_gap(SETUP.exact, contexts, SETUP, n_draws=3, seed=1)
    assert np.abs(gap["kl_bits"]).max() < 1e-12 and np.abs(gap["drift_top"]).max() < 1e-12
    assert gap["kl_floor_bits"].max() < 1e-12


def test_a_permutation_invariant_non_bayesian_predictor_has_the_closed_form_gap():
    ctx = Context(examples=(("happy", 0),), query="sad")  # one L1 label: pi = 0.9
    assert order_sensitivity(latent_posterior, [ctx])["js_bits"][0] == 0.0
    gap = martingale_gap(latent_posterior, [ctx], SETUP, n_draws=2, seed=0)
    # next label enumerated with the predictor's own probabilities: L1 w.p. 0.9 -> pi(2, 0) = 81/82, L2 -> pi(1, 1)
    m1 = 0.9 * 81 / 82 + 0.1 * 0.5
    assert gap["kl_bits"][0] == pytest.approx(kl_bits([m1, 1 - m1], [0.9, 0.1]), rel=1e-12)
    assert gap["drift_top"][0] == pytest.approx(m1 - 0.9, rel=1e-12) and gap["drift_top"][0] > 0.03
    assert gap["kl_floor_bits"][0] == 0.0 and gap["kl_today_bits"][0] == gap["kl_bits"][0]  # the word is ignored
    contexts = sula_contexts(TASK, seed=3, ks=(1, 2))
    report = martingale_test(None, SETUP, contexts, predictor=latent_posterior, n_null=5, n_boot=200)
    for entry in report.per_k:
        assert entry["kl_bits"]["ci"][0] > entry["null_kl_bits"]["range"][1]  # separated from its martingale null
        if entry["k"] >= 2:
            assert entry["js_bits"]["mean"] == 0.0


def test_an_order_dependent_predictor_has_the_closed_form_spread():
    ctx = Context(examples=(("happy", 0), ("sad", 1)), query="calm")
    out = order_sensitivity(last_label, [ctx], n_perms=6)
    h = lambda p: -(p * math.log2(p) + (1 - p) * math.log2(1 - p))
    assert out["n_orders"][0] == 2
    assert out["js_bits"][0] == pytest.approx(h(0.5) - h(0.8), rel=1e-12)  # orders predict 0.8 and 0.2
    assert out["top_sd"][0] == pytest.approx(0.3, rel=1e-12)


def test_the_floor_measures_what_the_query_word_alone_does():
    def word_sensitive(contexts):  # ignores the examples, follows the query word's first letter
        p = np.array([0.7 if c.query[0] < "m" else 0.3 for c in contexts])
        return np.column_stack([p, 1 - p])

    ctx = Context(examples=(("happy", 0),), query="calm")
    gap = martingale_gap(word_sensitive, [ctx], SETUP, n_draws=200, seed=0)
    assert gap["kl_floor_bits"][0] > 0.01
    assert gap["kl_today_bits"][0] == pytest.approx(gap["kl_floor_bits"][0], rel=1e-12)  # all of it is the word
    assert gap["kl_bits"][0] < 1e-12  # same queries with and without the new example: no martingale gap


def test_exact_bijection_predictive_equals_the_task_posterior():
    task = BijectionTask(n_symbols=7)
    batch = task.sample(20, seed=5)
    keys, values = batch.input_ids[:, 0::2].tolist(), batch.labels.tolist()
    for i in range(20):
        for q in range(7):
            pairs = list(zip(keys[i][:q], values[i][:q]))
            np.testing.assert_allclose(task.predictive(pairs, keys[i][q]), batch.posterior[i, q].double().numpy(),
                                       atol=1e-7)


def test_sampled_exact_null_is_zero_up_to_monte_carlo_error():
    task = BijectionTask(n_symbols=6)
    setup = bijection_setup(task)
    contexts = bijection_contexts(task, ks=(1, 3), per_k=10, seed=2)
    assert all(len(setup.render(c)) == 2 * c.k + 1 for c in contexts)
    few, many = (martingale_gap(setup.exact, contexts, setup, n_draws=n, seed=0) for n in (4, 400))
    assert np.abs(many["drift_top"]).mean() < 0.02 < np.abs(few["drift_top"]).mean()  # -> 0 as draws grow
    assert many["tv"].mean() < 0.25 * few["tv"].mean()
    report = martingale_test(None, setup, contexts, predictor=setup.exact, n_draws=4, n_null=40, n_boot=50)
    for entry in report.per_k:
        lo, hi = entry["null_drift_top"]["range"]
        assert lo < 0 < hi and entry["kl_bits"]["mean"] > 0  # the plug-in KL is biased up by sampling noise
        assert entry["null_kl_bits"]["range"][0] <= entry["kl_bits"]["mean"] <= entry["null_kl_bits"]["range"][1]
        assert entry["exact_kl_bits"]["range"][0] <= entry["kl_bits"]["mean"] <= entry["exact_kl_bits"]["range"][1]


BIJECTION = BijectionTask()
BIJ_SETUP = bijection_setup(BIJECTION)


def flatter(lam: float, favourite: float = 0.0):
    """(1 - lam - favourite) exact + lam uniform over every value (revealed ones too) + favourite on the smallest
    unrevealed value. With favourite = 0 a martingale (a fixed mixture of the exact predictive and a constant; an
    already revealed value drawn from the uniform part reveals nothing new) whose draws move less than the exact
    predictor's; with favourite > 0 over-confident in one value, and not a martingale."""
    def predict(contexts):
        e = BIJ_SETUP.exact(contexts)
        out = (1 - lam - favourite) * e + lam / BIJECTION.n_symbols
        out[np.arange(len(e)), (e > 0).argmax(1)] += favourite
        return out
    return predict


def gap_rows(predictor, n_draws: int, seed: int = 42):
    contexts = bijection_contexts(BIJECTION, ks=(1, 5, 10, 15), per_k=40, seed=seed)
    report = martingale_test(None, BIJ_SETUP, contexts, predictor=predictor, n_draws=n_draws, n_null=10,
                             n_boot=500, seed=seed)
    return report, {(r.metric, r.scope.get("k", "all")): r for r in report.rows()}  # the pooled row has no k


def test_debiased_gap_is_the_mean_over_pairs_of_distinct_draws():
    rng = np.random.default_rng(0)
    nxt, same = rng.dirichlet(np.ones(5), size=(3, 4)), rng.dirichlet(np.ones(5), size=(3, 4))
    today = rng.dirichlet(np.ones(5), size=3)
    got = debiased_gap_bits(nxt, same, today)
    d = nxt - same
    for i in range(3):
        pairs = [np.sum(d[i, j] * d[i, l] / today[i]) for j in range(4) for l in range(4) if j != l]
        assert got[i] == pytest.approx(np.mean(pairs) / (2 * math.log(2)), rel=1e-12)
    # a martingale's draws average to m0: over many draws the plug-in KL stays biased up, the debiased gap does not
    contexts = bijection_contexts(BIJECTION, ks=(5,), per_k=40, seed=1)
    gap = martingale_gap(BIJ_SETUP.exact, contexts, BIJ_SETUP, n_draws=64, seed=3)
    se = gap["debiased_bits"].std(ddof=1) / math.sqrt(len(contexts))
    assert abs(gap["debiased_bits"].mean()) < 3 * se < 0.2 * gap["kl_bits"].mean()
    assert math.isnan(debiased_gap_bits(nxt[:, :1], same[:, :1], today)[0])  # one draw: no pair
    with pytest.raises(ValueError, match="n_draws >= 2"):
        martingale_test(None, BIJ_SETUP, contexts, predictor=BIJ_SETUP.exact, n_draws=1)


def test_a_flatter_martingale_is_within_its_own_null_and_below_the_exact_predictors_band():
    """The issue's case: the exact predictor's band is its own Monte-Carlo bias; a flatter martingale moves less per
    draw, so its plug-in gap sat below that band at every k. Against its own draws it is never flagged, and its
    debiased gap is within 3 standard errors of 0 at every k (the band is 1.96 of them; either tail holds 2.5% of
    the draws: 0-3% above and 2-5% below over 60 seeds per k, measured)."""
    report, rows = gap_rows(flatter(0.3), n_draws=16)
    for k in (1, 5, 10, 15):  # its band is at its own noise level (the exact predictor's was twice as high)
        gap = rows[("martingale_gap_kl_bits", k)]
        assert gap.null_low <= 1.25 * gap.value and gap.verdict() != "above null"
    for entry in report.per_k:
        k = entry["k"]
        assert entry["kl_bits"]["mean"] < entry["exact_kl_bits"]["range"][0]  # the old null: "below null"
        for stat in ("kl_bits", "debiased_bits", "drift_top"):
            assert rows[(f"martingale_gap_{stat}", k)].verdict() != "above null", (stat, k)
        debiased = rows[("martingale_gap_debiased_bits", k)]
        assert abs(debiased.value) < 3 / 1.96 * max(-debiased.null_low, debiased.null_high)
        shift = entry["null_kl_bits"]["value"]  # where its plug-in gap sits as a martingale: its own noise level
        assert shift == pytest.approx(entry["kl_bits"]["mean"], rel=0.25) and shift < entry["exact_kl_bits"]["value"]


def test_an_over_confident_flatter_predictor_is_flagged_where_the_exact_band_missed_it():
    """Flatter overall but 5% too sure of one value: its plug-in gap is below the exact predictor's band at every k
    (the old null called it Bayesian); its own null flags the gap at 3 of 4 k and the drift of its favourite at
    every k (power: the gap at k = 1, 0.0007 bits, is inside its band's half-width 0.0009 with 16 draws)."""
    report, rows = gap_rows(flatter(0.5, favourite=0.05), n_draws=16)
    flagged = [k for k in (1, 5, 10, 15) if rows[("martingale_gap_kl_bits", k)].verdict() == "above null"]
    assert flagged == [5, 10, 15]
    assert all(rows[("martingale_gap_debiased_bits", k)].verdict() == "above null" for k in flagged)
    for entry in report.per_k:
        assert entry["kl_bits"]["mean"] < entry["exact_kl_bits"]["range"][0]
        assert rows[("martingale_gap_drift_top", entry["k"])].verdict() == "below null"  # the favourite loses mass


def tempered(t: float):
    """The SULA next-label predictive sharpened to the power t: over-confident, order-free, not a martingale."""
    def predict(contexts):
        p = SETUP.exact(contexts) ** t
        return p / p.sum(1, keepdims=True)
    return predict


def test_the_power_floor_an_over_confident_predictor_below_the_float_floor_at_k_ge_4():
    """Tempered (t = 2) on SULA, labels enumerated and the word ignored: no Monte-Carlo noise, so the gap is its
    closed form. It clears the null at k = 1 and 2 and falls under the float32 floor from k = 4 on: undetectable."""
    contexts = sula_contexts(TASK, seed=3, ks=(1, 2, 4, 8))
    pred = tempered(2.0)
    gap = martingale_gap(pred, contexts, SETUP, n_draws=2, seed=0)
    for i, c in enumerate(contexts):  # the closed form: the next label enumerated with the predictor's own weights
        p = pred([c])[0]
        up = [pred([Context(c.examples + ((c.query, o),), c.query)])[0] for o in (0, 1)]
        m = p[0] * up[0] + p[1] * up[1]
        assert gap["kl_bits"][i] == pytest.approx(kl_bits(m, p), rel=1e-9, abs=1e-15)
    report = martingale_test(None, SETUP, contexts, predictor=pred, n_draws=2, n_null=3, n_boot=200)
    for r in report.rows():
        if r.metric in ("martingale_gap_kl_bits", "martingale_gap_debiased_bits"):
            k = r.scope["k"]
            assert r.verdict() == ("above null" if k <= 2 else "within null"), (r.metric, k, r.value)
            if k >= 4:
                assert r.value < 0.6 * FLOAT_FLOOR and r.null_high == FLOAT_FLOOR


def test_model_predictor_matches_the_wind_tunnel_evaluation():
    import torch

    from interp_bayes.model.loading import load_model
    from interp_bayes.windtunnel.tunnels import PACKAGED
    from interp_bayes.windtunnel.discrete import restricted_log_probs

    model = load_model(PACKAGED / "bijection-cpu")
    task = BijectionTask()
    setup = bijection_setup(task)
    batch = task.sample(3, seed=11)
    with torch.no_grad():
        ref = restricted_log_probs(model, batch, task.hypothesis_ids).exp().double().numpy()  # [3, Q, V]
    keys, values = batch.input_ids[:, 0::2].tolist(), batch.labels.tolist()
    contexts = [Context(tuple(zip(keys[i][:q], values[i][:q])), keys[i][q]) for i in range(3) for q in (0, 4, 9)]
    got = model_predictor(model, setup)(contexts)
    np.testing.assert_allclose(got, ref[:, [0, 4, 9]].reshape(-1, task.n_symbols), atol=1e-5)
    report = martingale_test(model, setup, bijection_contexts(task, ks=(2, 8), per_k=4, seed=1), n_perms=3,
                             n_draws=2, n_null=10, n_boot=50)
    assert [e["k"] for e in report.per_k] == [2, 8] and all(np.isfinite(r.value) for r in report.rows())


def test_martingale_test_on_a_tiny_model_runs_and_keeps_the_exact_null_at_zero(tiny_dirs):
    from interp_bayes.model.loading import load_model

    model = load_model(tiny_dirs["gpt2"])
    task = SULATask.for_tokenizer(model.tokenizer, per_k=3, ks=(1, 2, 4))
    setup = sula_setup(task, task.label_token_ids(model.tokenizer))
    report = martingale_test(model, setup, sula_contexts(task), n_perms=3, n_draws=2, n_null=3, n_boot=50)
    assert [e["k"] for e in report.per_k] == [1, 2, 4]
    for entry in report.per_k:
        assert entry["exact_kl_bits"]["value"] == pytest.approx(0.0, abs=1e-12)
        assert entry["kl_bits"]["mean"] >= 0
    rows = report.rows()
    assert {r.metric for r in rows} >= {"martingale_gap_kl_bits", "martingale_gap_debiased_bits",
                                        "order_sensitivity_js_bits"}
    per_k = [r for r in rows if r.metric != GAP_OVER_K]
    assert all(r.null == NULLS.get(r.metric.split("_", 2)[-1]) and "k" in r.scope for r in per_k)
    pooled = [r for r in rows if r.metric == GAP_OVER_K]  # one decision over k, with its draws recorded
    assert len(pooled) == 1 and pooled[0].n == 9 and pooled[0].test["draws"] > 0


# Bayes in expectation (Chlon et al. 2025): the predictor averaged over orderings of the same examples.

def first_last(eps: float):
    """The exact SULA predictive plus eps (1[last label is L1] - 1[first label is L1]): order-sensitive, and
    exactly the exact predictor on average over all orders (the first and the last example are the same draw
    from the multiset under a uniform order)."""
    def predict(contexts):
        p = SETUP.exact(contexts)[:, 0]
        tilt = np.array([0.0 if not c.examples else float(c.examples[-1][1] == 0) - float(c.examples[0][1] == 0)
                         for c in contexts])
        p1 = p + eps * tilt
        return np.column_stack([p1, 1 - p1])
    return predict


def test_the_averaged_predictor_is_the_brute_force_average_over_all_orders():
    import itertools

    ctx = Context(examples=(("happy", 0), ("sad", 1), ("calm", 0)), query="bold")
    brute = np.mean([last_label([Context(tuple(ctx.examples[i] for i in perm), ctx.query)])[0]
                     for perm in itertools.permutations(range(3))], axis=0)  # 2 of 3 orders end in L1: 0.6
    np.testing.assert_allclose(brute, [0.6, 0.4], rtol=1e-12)
    np.testing.assert_allclose(order_averaged(last_label, 6)([ctx])[0], brute, rtol=1e-12)
    assert abs(order_averaged(last_label, 2)([ctx])[0, 0] - 0.6) > 0.05  # 2 of the 6 orders (0.2, 0.5 or 0.8)
    # with fewer orders than k! the orders are drawn from the multiset, so every order of it averages the same ones
    contexts = sula_contexts(TASK, seed=3, ks=(8,))
    averaged = order_averaged(first_last(0.08), 5, seed=1)
    assert order_sensitivity(averaged, contexts, n_perms=4)["js_bits"].max() < 1e-12
    assert order_sensitivity(first_last(0.08), contexts, n_perms=4)["js_bits"].max() > 0.01
    with pytest.raises(ValueError, match="n_orders >= 1"):
        order_averaged(last_label, 0)


def test_an_exchangeable_in_expectation_predictor_passes_averaged_and_fails_per_order():
    """first_last(0.1) depends on the order, so per order its spread and its martingale gap (the new example
    becomes the last) clear their nulls; averaged over all orders it is the exact predictor, gap 0 (the contexts
    have at most 5 examples after the draw: 5! = 120 orders, all of them). 40 contexts per k: about a fifth (k = 2)
    and a third (k = 4) of them mix the two labels, the only ones whose order matters."""
    contexts = sula_contexts(SULATask(per_k=40), seed=3, ks=(2, 4))
    report = martingale_test(None, SETUP, contexts, predictor=first_last(0.1), n_draws=2, n_null=3, n_boot=500,
                             n_orders=120)
    rows = {(r.metric, r.scope.get("k", "all")): r for r in report.rows()}  # the pooled rows have no k
    for k in (2, 4):
        assert rows[("order_sensitivity_js_bits", k)].verdict() == "above null"
        assert rows[("martingale_gap_debiased_bits", k)].verdict() == "above null"
        assert rows[(f"{AVERAGED}order_sensitivity_js_bits", k)].verdict() == "within null"
        averaged = rows[(f"{AVERAGED}martingale_gap_debiased_bits", k)]
        assert averaged.verdict() == "within null" and abs(averaged.value) < 1e-12
        assert rows[(EXPECTATION_GAP, k)].verdict() == "above null" and rows[(EXPECTATION_GAP, k)].scope["orders"] == 120
        assert "p = " in rows[("martingale_gap_debiased_bits", k)].note
    for entry in report.per_k:  # p against the recentred bootstrap as drawn agrees with the band
        assert entry["p_debiased_bits"] < 0.05
    exact = martingale_test(None, SETUP, contexts, predictor=SETUP.exact, n_draws=2, n_null=3, n_boot=50, n_orders=4)
    for a, b in zip(exact.per_k, exact.averaged):  # exchangeable by construction: averaging changes nothing
        assert a["debiased_bits"]["mean"] == pytest.approx(b["debiased_bits"]["mean"], abs=1e-15)
    assert martingale_test(None, SETUP, contexts, predictor=SETUP.exact, n_null=1, n_boot=20).averaged == []


def test_nope_transformer_has_no_position_signal():
    """positions="none": a one-layer model's last position is a softmax-weighted sum over the earlier positions,
    so permuting them changes its logits only by float32 reordering (tolerance: a few ulps of the logits' scale per
    summed position); the same model with rotary positions moves by orders of magnitude more."""
    import torch

    from interp_bayes.windtunnel.configs import build_transformer, make_config, make_task

    task = make_task(make_config("bijection", "cpu_replacement"))
    x = torch.randint(0, 2 * task.n_symbols, (4, 13), generator=torch.Generator().manual_seed(0))
    perm = torch.cat([torch.randperm(12, generator=torch.Generator().manual_seed(1)), torch.tensor([12])])
    diffs = {}
    for positions in ("none", "rotary"):
        torch.manual_seed(0)
        preset = "cpu_replacement_nope" if positions == "none" else "cpu_replacement"
        model = build_transformer(make_config("bijection", preset, n_layers=1), task)
        assert model.config.model_type == "gpt_neox"
        model.eval()
        with torch.no_grad():
            a, b = model(x).logits[:, -1], model(x[:, perm]).logits[:, -1]
        diffs[positions] = ((a - b).abs().max() / a.abs().max()).item()
        if positions == "none":
            assert model.config.rope_parameters["partial_rotary_factor"] == 0.0
            assert not [n for n, _ in model.named_parameters() if "wpe" in n or "position" in n]
    tol = 8 * x.shape[1] * torch.finfo(torch.float32).eps
    assert diffs["none"] < tol < 100 * tol < diffs["rotary"], diffs


def test_the_kinds_defaults_are_valid_recipe_values():
    """The sweep rebuilds every probe's parameters from their dict: a default the recipe check refuses (a count
    named n_* at 0) broke the default martingale recipe."""
    from interp_bayes.kinds.martingale import MartingaleParams

    assert MartingaleParams.from_dict(MartingaleParams().to_dict()) == MartingaleParams()
    assert MartingaleParams.from_dict(dict(orderings=8)).orderings == 8


def test_one_decision_over_k_flags_a_small_violation_at_every_k_and_passes_a_martingale():
    """The ledger's martingale claim is one decision: the debiased gap pooled over k against its own null. The
    over-confident predictor is flagged as a whole and its k are named only where they survive Holm; the flatter
    martingale holds, its test able to see far less than the claim's delta."""
    from interp_bayes.kinds.martingale import DELTA_BITS, martingale_claim
    from interp_bayes.stats import ledger as L

    report, _ = gap_rows(flatter(0.5, favourite=0.05), n_draws=16)
    verdict, evidence = martingale_claim(report.rows(), "martingale_gap_debiased_bits")
    assert verdict == L.FAILS and "Holm over k: k=" in evidence
    report, _ = gap_rows(flatter(0.3), n_draws=16)
    rows = report.rows()
    verdict, evidence = martingale_claim(rows, "martingale_gap_debiased_bits")
    pooled = next(r for r in rows if r.metric == GAP_OVER_K)
    assert verdict == L.HOLDS and "no single k" in evidence and L.detectable(pooled) < DELTA_BITS / 10
    assert pooled.test["decision"] == "accept" and pooled.test["draws"] < 5000  # settled before the cap
