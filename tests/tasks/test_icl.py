"""SULA: closed-form posterior vs brute-force enumeration; conditions; label-word choice; stratified sampling."""

import itertools
import math
from collections import Counter

import numpy as np
import pytest

from interp_bayes.core.prompts import stratified_sample
from interp_bayes.tasks.icl import CONDITIONS, SULATask, binary_entropy_bits, posterior_label1


def brute_force_posterior(labels, alpha):
    """P(y = 0 | labels) by enumerating the latent and summing the joint."""
    joint = [0.5 * math.prod(alpha if lab == y else 1 - alpha for lab in labels) for y in (0, 1)]
    return joint[0] / sum(joint)


@pytest.mark.parametrize("alpha", [0.9, 0.7])
def test_posterior_matches_enumeration(alpha):
    for k in range(0, 9):
        for labels in itertools.product((0, 1), repeat=k):
            n1 = labels.count(0)
            assert posterior_label1(n1, k - n1, alpha) == pytest.approx(brute_force_posterior(labels, alpha), abs=1e-12)


def test_binary_entropy_values():
    np.testing.assert_allclose(binary_entropy_bits([0.5, 0.9, 1.0, 0.0]), [1.0, 0.4689955935892812, 0.0, 0.0])


def test_main_set_shape_and_expected_entropies():
    cols = SULATask().generate("main", seed=42)
    assert len(cols["text"]) == 250 and Counter(cols["k"]) == {k: 50 for k in (0, 1, 2, 4, 8)}
    h = np.array(cols["bayes_entropy"])
    k = np.array(cols["k"])
    assert np.all(h[k == 0] == 1.0) and np.allclose(h[k == 1], 0.4689955935892812)
    assert h[k == 8].mean() < h[k == 2].mean() < h[k == 1].mean()
    assert cols["text"][0].endswith(":") and ": dax" not in cols["text"][0]  # k = 0: the query alone


def test_conditions_are_paired_and_have_the_right_posteriors():
    task = SULATask()
    sets = {c: task.generate(c, seed=7) for c in CONDITIONS}
    main = sets["main"]
    assert sets["remap"]["bayes_entropy"] == main["bayes_entropy"]
    assert sets["carrier_masked"]["bayes_entropy"] == main["bayes_entropy"]
    assert all(h == 1.0 for h in sets["shuffled"]["bayes_entropy"] + sets["label_masked"]["bayes_entropy"])
    i = 249
    assert sets["remap"]["text"][i] == main["text"][i].replace("dax", "mip").replace("lug", "zorb")
    assert "dax" not in sets["label_masked"]["text"][i] and "[MASK]" in sets["label_masked"]["text"][i]
    assert sets["carrier_masked"]["text"][i].split(". ")[1] == main["text"][i].split(". ")[1]  # same query word


def test_label_words_are_single_tokens_in_smollm2(smollm2):
    from interp_bayes.tasks.icl import LABEL_CANDIDATES

    task = SULATask.for_tokenizer(smollm2.tokenizer)
    assert set(task.labels + task.remap_labels) <= set(LABEL_CANDIDATES)  # nonsense words, not English ones
    ids = task.label_token_ids(smollm2.tokenizer) + task.label_token_ids(smollm2.tokenizer, "remap")
    assert len(set(ids)) == 4


def test_stratified_sampling_gives_15_per_quintile():
    h = np.random.default_rng(0).gamma(2.0, 1.5, size=500)
    idx = stratified_sample(h, per_bin=15, n_bins=5, seed=1)
    edges = np.quantile(h, np.linspace(0, 1, 6))
    bins = np.clip(np.searchsorted(edges, h[idx], side="right") - 1, 0, 4)
    assert len(idx) == 75 == len(set(idx)) and Counter(bins.tolist()) == {b: 15 for b in range(5)}
    assert stratified_sample(h, seed=1) == idx and stratified_sample(h, seed=2) != idx


def test_predictive_entropy_is_the_query_labels_by_enumeration():
    """p(next label = L1 | D) = sum_y P(y | D) P(label = L1 | y), enumerated over the latent."""
    cols = SULATask().generate("main", seed=3)
    for n1, n2, h in zip(cols["n1"], cols["n2"], cols["predictive_entropy"]):
        labels = [0] * n1 + [1] * n2
        post = brute_force_posterior(labels, 0.9)
        p = post * 0.9 + (1 - post) * 0.1
        assert h == pytest.approx(float(binary_entropy_bits(p)), abs=1e-12)
    assert min(cols["predictive_entropy"]) > 0.46  # label noise: never below H(0.9) = 0.469 bits


def test_fixed_k_varies_bayes_entropy_at_fixed_k_and_length(smollm2):
    from interp_bayes.model.loading import checkpoint_tokenizer

    tok = checkpoint_tokenizer(smollm2)
    task = SULATask.for_tokenizer(tok, per_k=20)
    cols = task.generate("fixed_k", seed=1)
    assert len(cols["text"]) == 100 and set(cols["k"]) == {8}
    assert {min(a, b) for a, b in zip(cols["n1"], cols["n2"])} == {0, 1, 2, 3, 4}
    lengths = {len(tok(t)["input_ids"]) for t in cols["text"]}
    assert len(lengths) == 1  # every carrier and label is one token: the length cannot explain anything
    assert len(set(np.round(cols["bayes_entropy"], 9))) == 5  # five entropy levels at one k and one length
    for n1, n2, p1 in zip(cols["n1"], cols["n2"], cols["p_label1"]):
        assert p1 == pytest.approx(brute_force_posterior([0] * n1 + [1] * n2, 0.9), abs=1e-12)
    big = SULATask(per_k=2000).generate("fixed_k", seed=0)
    ties = np.array(big["n1"]) == 4
    assert abs(np.mean(np.array(big["latent"])[ties] == 0) - 0.5) < 0.03  # latent drawn from its posterior
