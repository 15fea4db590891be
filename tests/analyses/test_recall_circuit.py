"""The recall-circuit scores (analyses/recall_circuit.py) on planted attention patterns whose scores are known."""

import numpy as np
import pytest
import torch

from interp_bayes.analyses.recall_circuit import recall_circuit_scores
from interp_bayes.core.errors import ConfigError
from interp_bayes.tasks.recall import RecallTask


def planted(task: RecallTask, n: int = 40, seed: int = 3, misbind: int = 0):
    """Sequences and a 2-layer, 3-head pattern: layer 0 head 0 reads the key two back at every stored value; layer 1
    head 0 binds (each query key attends to its value), head 1 spreads evenly over the stored values (the
    stored-values shortcut), head 2 attends to the token after the matching key; every other row is uniform over
    the causal prefix. ``misbind``: head 0 of layer 1 attends to the value of the slot that many after the query's."""
    batch = task.sample(n, seed=seed)
    ids = batch.input_ids
    T, N = ids.shape[1], task.n_pairs
    uniform = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]
    p = uniform.expand(n, 2, 3, T, T).clone()  # [n, layer, head, T, T]
    for s in range(N):
        p[:, 0, 0, 4 * s + 3] = 0.0
        p[:, 0, 0, 4 * s + 3, 4 * s + 1] = 1.0
    keys = ids[:, 1 : 4 * N : 4]
    for j, t in enumerate(task.query_positions().tolist()):
        slot = (keys == ids[:, t : t + 1]).float().argmax(-1)  # [n]
        for head, offset, shift in ((0, 3, misbind), (2, 2, 0)):
            p[:, 1, head, t] = 0.0
            p[torch.arange(n), 1, head, t, 4 * ((slot + shift) % N) + offset] = 1.0
        p[:, 1, 1, t] = 0.0
        p[:, 1, 1, t, 3 : 4 * N : 4] = 1.0 / N
    return ids, [p[:, 0], p[:, 1]]


def scores(rows) -> dict:
    return {(r.metric, r.scope["layer"], r.scope["head"]): r for r in rows}


def test_planted_circuit_is_read_back():
    task = RecallTask(n_keys=12, n_values=12, n_pairs=4, n_queries=3, n_filler=4)
    ids, patterns = planted(task)
    s = scores(recall_circuit_scores(patterns, ids, task, n_boot=200))
    assert len(s) == 4 * 2 * 3
    assert s["recall_key_lookback", 0, 0].value == pytest.approx(1.0)
    # a uniform row at value position 4s+3 gives its key 1 / (4s+4); averaged over the N stored pairs
    assert s["recall_key_lookback", 0, 1].value == pytest.approx(np.mean([1 / (4 * k + 4) for k in range(4)]))
    assert s["recall_value_attention", 1, 0].value == pytest.approx(1.0)
    assert s["recall_value_share", 1, 0].value == pytest.approx(1.0)
    assert s["recall_prefix_matching", 1, 0].value == pytest.approx(0.0)
    assert s["recall_value_share", 1, 1].value == pytest.approx(1 / 4)  # the stored-values shortcut: 1/N
    assert s["recall_value_attention", 1, 1].value == pytest.approx(1 / 4)
    assert s["recall_prefix_matching", 1, 2].value == pytest.approx(1.0)
    assert s["recall_value_share", 1, 2].value == pytest.approx(0.0)
    # a uniform head shares its attention evenly among the values too
    assert s["recall_value_share", 0, 2].value == pytest.approx(1 / 4)
    r = s["recall_value_attention", 1, 1]
    assert r.low <= r.value <= r.high and r.n == 40 and r.unit == "attention"


def test_misplaced_lookup_scores_zero():
    """A head that attends to the value of another stored key than the query's gets no credit."""
    task = RecallTask(n_keys=12, n_values=12, n_pairs=4, n_queries=3, n_filler=4)
    ids, patterns = planted(task, misbind=1)
    s = scores(recall_circuit_scores(patterns, ids, task, n_boot=200))
    assert s["recall_value_share", 1, 0].value == 0.0
    assert s["recall_value_attention", 1, 0].value == 0.0


def test_shape_mismatch_is_refused():
    task = RecallTask(n_keys=12, n_values=12, n_pairs=4, n_queries=3, n_filler=4)
    ids, patterns = planted(task)
    with pytest.raises(ConfigError, match="layer 1"):
        recall_circuit_scores([patterns[0], patterns[1][:, :, :-1, :-1]], ids, task)


def test_committed_recall_transformer_has_no_binding_head():
    """The committed recall-cpu transformer (recall 25%): every layer-0 head spreads its attention from the query
    keys evenly over the N = 4 stored values (the stored-values shortcut, docs/windtunnels.md), and no head of either
    layer gives the queried key's value more than its 1/N share."""
    from interp_bayes.analyses.recall_circuit import recall_circuit
    from interp_bayes.windtunnel.tunnels import open_tunnel

    torch.set_num_threads(1)
    tunnel = open_tunnel("recall-cpu")
    s = scores(recall_circuit(tunnel.model, tunnel.task, n=200, n_boot=200))
    for head in range(4):
        assert s["recall_value_attention", 0, head].value > 0.2  # ~0.93 of each row on the four stored values
        for layer in range(2):
            assert abs(s["recall_value_share", layer, head].value - 0.25) < 0.02
