"""The recall-circuit scores (analyses/recall_circuit.py) on planted attention patterns whose scores are known; the
patterns read by ``model.read.patterns`` (bit for bit those of the former ``run_with_cache`` of
``analyses.recall_circuit.attention_patterns``, kept below as the reference); and the kind ``recall_circuit``: its
rows equal the former ``analyses.recall_circuit.recall_circuit``'s on the committed recall transformer
(``tests/data/recall_circuit_rows.json``: ``recall_circuit(model, task, n=64, n_boot=200)`` of recall-cpu, seed 2024,
by the former function as it stood at commit 5901ed0 before the move; captured then on the non-binding transformer,
and again, by that same function, on the binding one that replaced it (issue 40)), along a run's checkpoints, and
through the sweep."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from interp_bayes.analyses.recall_circuit import recall_circuit_scores
from interp_bayes.core.errors import ConfigError
from interp_bayes.kinds.recall_circuit import RecallCircuitParams, run, summary
from interp_bayes.model.read import patterns
from interp_bayes.tasks.recall import RecallTask
from interp_bayes.windtunnel.tunnels import PACKAGED, open_tunnel
from conftest import FIXTURES

BEFORE = FIXTURES / "recall_circuit_rows.json"


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


@torch.no_grad()
def former_attention_patterns(model, input_ids: torch.Tensor) -> list[torch.Tensor]:
    """``analyses.recall_circuit.attention_patterns`` as it was before ``model.read.patterns``."""
    _, cache = model.run_with_cache(input_ids, names_filter=lambda name: name.endswith("attn.hook_pattern"))
    return [cache[f"blocks.{layer}.attn.hook_pattern"] for layer in range(model.cfg.n_layers)]


def test_patterns_equal_the_former_run_with_cache():
    torch.set_num_threads(1)
    tunnel = open_tunnel("recall-cpu")
    ids = tunnel.task.sample(12, seed=7).input_ids
    old = former_attention_patterns(tunnel.model, ids)
    assert len(old) == 2 and old[0].dtype == torch.float32
    for batch_size in (None, 5):  # one forward pass, and chunks of 5, 5 and 2 sequences
        new = patterns(tunnel.model, ids, batch_size=batch_size)
        assert all(torch.equal(a, b) for a, b in zip(new, old, strict=True)), batch_size
    last = patterns(tunnel.model, ids, layers=[-1])
    assert len(last) == 1 and torch.equal(last[0], old[1])


def rows_by_key(rows) -> dict:
    return {(r.scope["step"], r.metric, r.scope.get("layer"), r.scope.get("head")): r for r in rows}


def test_rows_equal_the_former_recall_circuit_on_the_committed_transformer():
    """The kind's scores at the committed transformer's step are the captured rows of the former function, number
    by number to float32 rounding; the recall beside them is near 100%, and a head binds."""
    torch.set_num_threads(1)
    p = RecallCircuitParams.from_dict(dict(tunnel="recall-cpu", n=64, n_boot=200))
    rows = run(None, p).rows
    before = json.loads(BEFORE.read_text())
    after = [dict(metric=r.metric, value=r.value, low=r.low, high=r.high, layer=r.scope["layer"],
                  head=r.scope["head"], n=r.n) for r in rows if r.metric != "recall_accuracy"]
    # the scores are means of float32 attention probabilities (each <= 1): equal to float32 rounding (1e-7 absolute,
    # float32's unit roundoff at 1, or 1e-6 relative), which a CPU's kernels move in the last bits (an AVX-512 Xeon
    # against an AVX2 EPYC: 6e-11 absolute)
    assert len(before) == 4 * 2 * 4 and len(after) == len(before)
    for got, want in zip(after, before):
        assert {k: v for k, v in got.items() if not isinstance(v, float)} == \
            {k: v for k, v in want.items() if not isinstance(v, float)}
        assert [got[k] for k in ("value", "low", "high")] == pytest.approx([want[k] for k in ("value", "low", "high")],
                                                                            rel=1e-6, abs=1e-7)
    assert {r.scope["step"] for r in rows} == {2000}
    recall = [r for r in rows if r.metric == "recall_accuracy"]
    assert len(recall) == 1 and recall[0].value > 0.95 and recall[0].scope["n_pairs"] == 4
    lines = summary(rows, p)
    assert lines[-1].verdict == "holds" and "1/N = 0.25" in lines[-1].label


def test_committed_recall_transformer_binds_through_a_look_back_and_a_match():
    """The committed recall-cpu transformer (recall 100%, docs/windtunnels.md): layer 0 still spreads its attention
    from the query keys evenly over the N = 4 stored values (the stored-values shortcut), one layer-0 head reads
    each stored value's key two tokens back above the uniform level (0.130), and every layer-1 head gives the
    queried key's value well over its 1/N share of the stored values' attention: the two steps of binding."""
    torch.set_num_threads(1)
    rows = run(None, RecallCircuitParams.from_dict(dict(tunnel="recall-cpu", n=200))).rows
    s = scores(r for r in rows if r.metric != "recall_accuracy")
    assert max(s["recall_key_lookback", 0, head].low for head in range(4)) > 0.2
    for head in range(4):
        assert abs(s["recall_value_share", 0, head].value - 0.25) < 0.02
        assert s["recall_value_share", 1, head].low > 0.5


def checkpointed_run(tmp_path: Path) -> Path:
    """A trained folder with one saved checkpoint (step 50): copies of the committed recall transformer."""
    run_dir = tmp_path / "run"
    shutil.copytree(PACKAGED / "recall-cpu", run_dir)
    step = run_dir / "checkpoints" / "step_000050"
    shutil.copytree(PACKAGED / "recall-cpu", step)
    meta = json.loads((step / "windtunnel.json").read_text())
    (step / "windtunnel.json").write_text(json.dumps(meta | {"step": 50}))
    return run_dir


@pytest.mark.slow
def test_steps_score_every_checkpoint_and_run_through_the_sweep(tmp_path, capsys):
    """``steps: true`` scores the saved checkpoint before the final model (the same weights here, so the same
    numbers at both steps); through the sweep the recipe gives rows, the ledger claim, the curve in the report and
    ``results --format markdown``, and a second sweep finds it cached."""
    from interp_bayes import cli
    from interp_bayes.kinds.recall_circuit import ledger
    from interp_bayes.model.testing import make_tiny_model
    from interp_bayes.report.view import RunView
    from interp_bayes.run.config import SweepConfig
    from interp_bayes.run.sweep import run_sweep

    torch.set_num_threads(1)
    folder = checkpointed_run(tmp_path)
    make_tiny_model("llama3", tmp_path / "m")
    (tmp_path / "rc.yaml").write_text(f"kind: recall_circuit\ntunnel: {folder}\nsteps: true\nn: 16\nn_boot: 20\n")
    config = SweepConfig(model=str(tmp_path / "m"), out=str(tmp_path / "runs"), quiet=True,
                         probes=[str(tmp_path / "rc.yaml")])
    result = run_sweep(config)
    view = RunView.load(result.folder)
    rows = view.probes("recall_circuit")[0].rows
    by = rows_by_key(rows)
    assert {key[0] for key in by} == {50, 2000} and len(rows) == 2 * (4 * 2 * 4 + 1)
    assert all(by[(50, *key[1:])].value == r.value for key, r in by.items() if key[0] == 2000)
    claims = ledger(view.probes("recall_circuit"))
    assert [(c.key, c.verdict, c.subject) for c in claims] == [("recall-head-binds", "holds", "run")]
    assert "fig-recall-circuit-rc" in (result.folder / "report.html").read_text()
    assert cli.main(["results", str(result.folder), "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    assert "## rc (kind recall_circuit, on run)" in text and "run at step 50: recall" in text
    assert run_sweep(config).computed == []  # cached
    # a new checkpoint in the folder is a new stage (the key holds every model the kind reads); one saved at the
    # final model's step stands for it, so each step is scored once
    shutil.copytree(PACKAGED / "recall-cpu", folder / "checkpoints" / "step_002000")
    again = run_sweep(config)
    assert again.computed != []
    rows = RunView.load(again.folder).probes("recall_circuit")[0].rows
    assert len(rows_by_key(rows)) == len(rows) == 2 * (4 * 2 * 4 + 1)


def test_a_tunnel_without_attention_is_refused():
    with pytest.raises(ConfigError, match="recall_circuit.*transformer"):
        RecallCircuitParams.from_dict(dict(tunnel="recall-cpu-lstm")).checkpoints()
