"""The last two experiments that became kinds (issue 38, item 4: ``subspaces``, ``manifold_move``): their rows give
the numbers the functions before the move gave, on the committed checkpoints.

Before: ``tests/data/moved_rows.json``'s ``subspaces`` (``analyses.subspaces.subspace_ablation`` on bijection-cpu,
``layers=[0], n_fit=16, n_eval=8, n_isotropic=1, n_matched=1``, captured at commit 64eb0d5, see
``tests/analyses/test_moved_rows.py``) and ``tests/data/manifold_move_rows.json`` (``analyses.manifold_move.
kalman_move`` on kalman-cpu, ``layer=0, n_sequences=12, seed=2024, delta=1.0, n_random=2``: its ``rows``,
``probe_r2_eval``, ``probe_gain``, ``n_eval`` and ``n_fit``, captured at commit 1ae197a before the move). The kinds'
rows are read back into the old fields and compared number by number (``tests.analyses.test_moved_rows.differences``:
relative 1e-6)."""

from __future__ import annotations

import json

import pytest
import torch

from interp_bayes.core.errors import ConfigError
from interp_bayes.core.results import find
from interp_bayes.kinds.manifold_move import ManifoldMoveParams
from interp_bayes.kinds.subspaces import SubspacesParams
from tests.analyses.test_moved_rows import differences, plain
from conftest import FIXTURES

SUBSPACES = dict(tunnel="bijection-cpu", layers=[0], n_fit=16, n_eval=8, n_isotropic=1, n_matched=1)
MOVE = dict(tunnel="kalman-cpu", layers=[0], n_sequences=12, n_random=2)


def old_summary(rows) -> list[dict]:
    """The edits' cost rows and their controls as ``SubspaceAblationResult.summary`` held them."""
    from interp_bayes.kinds.subspaces import edit_rows

    out = []
    for r in edit_rows(rows):
        at = {k: r.scope[k] for k in ("layer", "subspace", "k")}
        op, metric = r.metric.split("_", 1)
        entry = dict(layer=at["layer"], subspace=at["subspace"], k=at["k"], op=op, metric=metric, true_cost=r.value,
                     true_cost_ci=[r.low, r.high])
        for fam in ("isotropic", "matched"):
            c = find(rows, f"{r.metric}_controls", family=fam, **at)
            entry |= {f"{fam}_mean": c.value, f"{fam}_range": [c.low, c.high],
                      f"{fam}_percentile": find(rows, f"{r.metric}_percentile", family=fam, **at).value,
                      f"{fam}_p": find(rows, f"{r.metric}_p", family=fam, **at).value, f"{fam}_n": c.n}
        entry["matched_variance_ratio_mean"] = find(rows, "matched_variance_ratio", **at).value
        out.append(entry)
    return out


@pytest.mark.slow
def test_subspaces_rows_equal_the_old_subspace_ablation_on_a_committed_checkpoint():
    from interp_bayes.kinds.subspaces import run

    torch.set_num_threads(1)
    old = json.loads((FIXTURES / "moved_rows.json").read_text())["subspaces"]
    result = run(None, SubspacesParams.from_dict(SUBSPACES))
    assert len(old["summary"]) == 4 * 2 * 2  # four subspaces (the bijection has a token frame), cut and only
    diff = differences(dict(summary=old["summary"], rows=old["rows"]),
                       plain(dict(summary=old_summary(result.rows), rows=result.data["draws"])))
    assert not diff, f"{len(diff)} numbers moved, e.g. {diff[:5]}"
    assert find(result.rows, "unedited_kl_bits").n == 8 and find(result.rows, "only_kl_bits") is not None


@pytest.mark.slow
def test_manifold_move_rows_equal_the_old_kalman_move_on_a_committed_checkpoint():
    from interp_bayes.kinds.manifold_move import run, summary

    torch.set_num_threads(1)
    old = json.loads((FIXTURES / "manifold_move_rows.json").read_text())
    p = ManifoldMoveParams.from_dict(MOVE)
    rows = run(None, p).rows
    assert {r.scope["layer"] for r in rows} == {0}
    after = dict(rows=[dict(op=r.scope["op"], measure=r.metric, value=r.value, low=r.low, high=r.high,
                            interval=r.interval, n=r.n) for r in rows if "op" in r.scope],
                 probe_r2_eval=find(rows, "probe_r2_eval").value, probe_gain=find(rows, "probe_gain").value,
                 n_eval=find(rows, "probe_r2_eval").n, n_fit=find(rows, "probe_gain").n)
    assert len(after["rows"]) == len(old["rows"]) == 39
    diff = differences({k: old[k] for k in after}, plain(after))
    assert not diff, f"{len(diff)} numbers moved, e.g. {diff[:5]}"
    lines = summary(rows, p)
    assert len(lines) == 5 and "manifold-null after block 0" in lines[3].label and ", –," in lines[3].value


@pytest.mark.parametrize("kind, params, match", [
    (SubspacesParams, dict(tunnel="kalman-cpu"), "subspaces.*bijection or hmm transformer"),
    (SubspacesParams, dict(tunnel="bijection-cpu-lstm"), "subspaces.*transformer"),
    (ManifoldMoveParams, dict(tunnel="bijection-cpu"), "manifold_move.*kalman transformer"),
])
def test_a_tunnel_the_kind_cannot_read_is_refused(kind, params, match):
    with pytest.raises(ConfigError, match=match):
        kind.from_dict(params).checkpoints()


def test_unknown_keys_and_edits_are_refused():
    with pytest.raises(ConfigError, match="n_fits"):
        SubspacesParams.from_dict(dict(n_fits=3))
    with pytest.raises(ConfigError, match="shift"):
        SubspacesParams.from_dict(dict(ops=["cut", "shift"])).check(None, "sub")
    with pytest.raises(ConfigError, match="n_sequences"):
        ManifoldMoveParams.from_dict(dict(n_sequences=2))


@pytest.mark.slow
def test_the_two_kinds_run_through_the_sweep_and_print_as_markdown(tmp_path, capsys):
    """Both kinds as recipes on committed tunnels at a small size, through the sweep: rows, figures in the report
    and ``interp-bayes results RUN --format markdown`` (the command docs/windtunnels.md gives for their tables); a
    second sweep finds them cached."""
    from interp_bayes import cli
    from interp_bayes.model.testing import make_tiny_model
    from interp_bayes.run.config import SweepConfig
    from interp_bayes.run.sweep import run_sweep

    torch.set_num_threads(1)
    make_tiny_model("llama3", tmp_path / "m")
    (tmp_path / "sub.yaml").write_text("kind: subspaces\ntunnel: hmm-cpu\nlayers: [-1]\nops: [cut]\nn_fit: 12\n"
                                       "n_eval: 6\nn_isotropic: 1\nn_matched: 1\n")
    (tmp_path / "move.yaml").write_text("kind: manifold_move\ntunnel: kalman-cpu\nlayers: [2]\nn_sequences: 8\n"
                                        "n_random: 1\n")
    config = SweepConfig(model=str(tmp_path / "m"), out=str(tmp_path / "runs"), quiet=True,
                         probes=[str(tmp_path / name) for name in ("sub.yaml", "move.yaml")])
    run = run_sweep(config)
    page = (run.folder / "report.html").read_text()
    assert "fig-subspaces-sub" in page and "fig-manifold-move-move" in page
    assert cli.main(["results", str(run.folder), "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    assert "## sub (kind subspaces, on hmm-cpu)" in text and "## move (kind manifold_move, on kalman-cpu)" in text
    assert "`cut_kl_bits`" in text and "`spread_change`" in text and "`only_kl_bits`" not in text
    assert run_sweep(config).computed == []  # cached
