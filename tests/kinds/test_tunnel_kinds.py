"""The experiments that became kinds (issue 38, item 4: ``p4b``, ``tunnel_geometry``, ``belief``): their rows give
the numbers and verdicts the functions before the move gave, on the committed checkpoints.

``tests/data/tunnel_kinds_rows.json`` holds the outputs of the functions before the move (commit 51baa47:
``analyses.p4b.p4b`` on bijection-repl-cpu with ``n_fit=16, n_eval=8, n_controls=1, n_null=2, n_boot=10``, its
decoding and ablation tables, geometry, answer, unedited losses and cost tolerance; ``analyses.p4b.tunnel_geometry``
on hmm-sticky-cpu-mlp-context with ``n=16, folds=2, n_null=2, n_boot=10``; ``analyses.belief.
windtunnel_belief_probes`` on hmm-cpu with ``n_sequences=20, readings=("resid",), layers=[0], n_shuffles=2,
n_boot=10``), each passed through ``tests.analyses.test_moved_rows.plain``. Below, the same settings through the kinds, their
rows read back into the old tables' fields, compared number by number (``tests.analyses.test_moved_rows.differences``:
relative 1e-6, verdicts exactly)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.analyses.test_moved_rows import differences, plain
from conftest import FIXTURES

DATA = FIXTURES / "tunnel_kinds_rows.json"


@pytest.fixture(scope="module")
def before() -> dict:
    return json.loads(DATA.read_text())


def old_decoding(rows, **model) -> list[dict]:
    """``decoding_r2`` rows as the old decoding tables wrote them."""
    from interp_bayes.analyses.p4b import decoding_verdict

    return [dict(model, layer=r.scope["layer"], test=r.scope["test"], target=r.scope["target"], r2=r.value,
                 r2_ci=[r.low, r.high], null=r.null, null_range=[r.null_low, r.null_high], note=r.note,
                 verdict=decoding_verdict(r)) for r in rows if r.metric == "decoding_r2"]


def old_ablations(rows, model: str) -> list[dict]:
    """``cut_*`` rows and their controls as the old ablation table wrote them."""
    from interp_bayes.analyses.p4b import cut_verdicts
    from interp_bayes.core.results import find

    tol = find(rows, "cost_tolerance").value
    out = []
    for r in (r for r in rows if r.metric in ("cut_mae_bits", "cut_kl_bits")):
        at = r.scope

        def get(metric, family):
            return find(rows, f"{r.metric}_{metric}", family=family, **at)

        matched, iso = get("controls", "matched"), get("controls", "isotropic")
        inert, load_bearing = cut_verdicts(r, tol)
        out.append(dict(model=model, layer=at["layer"], subspace=at["subspace"], k=at["k"],
                        metric=r.metric.removeprefix("cut_"), cost=r.value, cost_ci=[r.low, r.high],
                        matched_mean=matched.value, matched_range=[r.null_low, r.null_high],
                        matched_p=get("p", "matched").value, matched_percentile=get("percentile", "matched").value,
                        isotropic_mean=iso.value, isotropic_range=[iso.low, iso.high],
                        isotropic_p=get("p", "isotropic").value,
                        variance_ratio=find(rows, "matched_variance_ratio", **at).value,
                        inert=inert, load_bearing=load_bearing))
    return out


def old_geometry(rows) -> dict:
    """The geometry rows as the old geometry dict held them (the numbers the rows keep)."""
    from interp_bayes.core.results import find, select

    share, s = find(rows, "pc1_share"), find(rows, "cluster_silhouette")
    out = dict(layer=share.scope["layer"], pc1_share=share.value, pc1_share_raw=find(rows, "pc1_share_raw").value,
               pc1_ci=[share.low, share.high], pc1_null=dict(pc1_range=[share.null_low, share.null_high],
                                                             pc1_test=share.test),
               clusters=dict(n_clusters=int(find(rows, "n_clusters").value),
                             best_k=int(find(rows, "cluster_best_k").value), silhouette=s.value,
                             null_range=[s.null_low, s.null_high], p=find(rows, "cluster_silhouette_p").value))
    align = select(rows, "cluster_alignment")
    if align:
        out["alignment"] = dict(k=int(align[0].note.split("= ")[1]), **{r.scope["label"]: r.value for r in align})
    return out


def kept(geometry: dict) -> dict:
    """The old geometry dict without the numbers the rows leave out (the other nulls' ranges, per-k silhouettes)."""
    g = dict(geometry, pc1_null={k: geometry["pc1_null"][k] for k in ("pc1_range", "pc1_test")},
             clusters={k: geometry["clusters"][k] for k in ("n_clusters", "best_k", "silhouette", "null_range", "p")})
    return g


@pytest.mark.slow
def test_p4b_rows_equal_the_old_p4b_on_a_committed_checkpoint(before):
    from interp_bayes.analyses.p4b import answer
    from interp_bayes.core.results import find
    from interp_bayes.kinds.p4b import P4bParams, run

    torch.set_num_threads(1)
    params = P4bParams.from_dict(dict(tunnel="bijection-repl-cpu", n_fit=16, n_eval=8, n_controls=1, n_null=2,
                                      n_boot=10))
    rows = run(None, params).rows
    after = dict(decoding=old_decoding(rows, model="bijection-repl-cpu"),
                 ablations=old_ablations(rows, "bijection-repl-cpu"), geometry=old_geometry(rows),
                 summary=answer(rows, "bijection-repl-cpu"),
                 base=dict(mae_bits=find(rows, "unedited_mae_bits").value,
                           kl_bits=find(rows, "unedited_kl_bits").value),
                 cost_tolerance_bits=find(rows, "cost_tolerance").value)
    old = dict(before["p4b"], geometry=kept(before["p4b"]["geometry"]))
    assert len(old["decoding"]) == 12 and len(old["ablations"]) == 42  # 3 readings x (4 tests; 7 subspaces x 2)
    diff = differences(old, plain(after))
    assert not diff, f"{len(diff)} numbers moved, e.g. {diff[:5]}"


@pytest.mark.slow
def test_tunnel_geometry_rows_equal_the_old_tunnel_geometry_on_a_committed_checkpoint(before):
    from interp_bayes.kinds.tunnel_geometry import TunnelGeometryParams, run

    torch.set_num_threads(1)
    rows = run(None, TunnelGeometryParams.from_dict(dict(tunnel="hmm-sticky-cpu-mlp-context", n=16, folds=2,
                                                         n_null=2, n_boot=10))).rows
    old = before["geometry"]
    after = dict(decoding=old_decoding(rows), geometry=old_geometry(rows))
    assert "alignment" in old["geometry"]  # the HMM's clusters against its states
    diff = differences(dict(decoding=old["decoding"], geometry=kept(old["geometry"])), plain(after))
    assert not diff, f"{len(diff)} numbers moved, e.g. {diff[:5]}"


@pytest.mark.slow
def test_the_tunnel_kinds_run_through_the_sweep_and_print_as_markdown(tmp_path, capsys):
    """The three kinds as recipes on committed tunnels at a small size, through the sweep: rows, ledger claims,
    figures in the report, and ``interp-bayes results RUN --format markdown`` with each probe's summary and tables;
    a second sweep finds them cached."""
    from interp_bayes import cli
    from interp_bayes.model.testing import make_tiny_model
    from interp_bayes.report.view import RunView
    from interp_bayes.run.config import SweepConfig
    from interp_bayes.run.sweep import run_sweep

    torch.set_num_threads(1)
    make_tiny_model("llama3", tmp_path / "m")
    (tmp_path / "p4b.yaml").write_text("kind: p4b\ntunnel: bijection-cpu-mlp\nn_fit: 12\nn_eval: 6\nn_controls: 1\n"
                                       "n_null: 2\nn_boot: 10\nfolds: 2\nframes: false\ngeometry: false\n")
    (tmp_path / "geo.yaml").write_text("kind: tunnel_geometry\ntunnel: hmm-sticky-cpu-mlp\nn: 10\nfolds: 2\n"
                                       "n_null: 2\nn_boot: 10\n")
    (tmp_path / "bel.yaml").write_text("kind: belief\ntunnel: hmm-cpu\nn_sequences: 10\nreadings: [resid]\n"
                                       "layers: [0]\nfolds: 2\nn_shuffles: 2\nn_boot: 10\n")
    config = SweepConfig(model=str(tmp_path / "m"), out=str(tmp_path / "runs"), quiet=True,
                         probes=[str(tmp_path / name) for name in ("p4b.yaml", "geo.yaml", "bel.yaml")])
    run = run_sweep(config)
    view = RunView.load(run.folder)
    from interp_bayes.kinds import belief, p4b, tunnel_geometry

    claims = (p4b.ledger(view.probes("p4b")) + tunnel_geometry.ledger(view.probes("tunnel_geometry"))
              + belief.ledger(view.probes("belief")))
    assert [(c.key, c.subject) for c in claims] == [("p4b-inert", "bijection-cpu-mlp"),
                                                    ("p4b-beyond-position", "bijection-cpu-mlp"),
                                                    ("tunnel-entropy-within-position", "hmm-sticky-cpu-mlp"),
                                                    ("belief-readable", "hmm-cpu"), ("belief-beyond-window", "hmm-cpu")]
    page = (run.folder / "report.html").read_text()
    assert all(f"fig-{name}" in page for name in ("p4b-p4b", "tunnel-geometry-geo", "belief-bel"))
    assert cli.main(["results", str(run.folder), "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    assert "## p4b (kind p4b, on bijection-cpu-mlp)" in text and "bijection-cpu-mlp: P4b answer" in text
    assert all(f"| {c.claim}{' (rival)' * c.rival} | {c.subject} |" in text for c in claims)  # the ledger, first
    assert "`cut_kl_bits`" in text and "`cluster_alignment`" in text and "## bel (kind belief, on hmm-cpu)" in text
    header = next(line for line in text.splitlines() if line.startswith("| target | layer | test | value"))
    assert "subspace" not in header  # a metric's table keeps only its own columns
    assert run_sweep(config).computed == []  # cached


@pytest.mark.slow
def test_belief_rows_equal_the_old_belief_probes_on_a_committed_checkpoint(before):
    from interp_bayes.core.results import find, select
    from interp_bayes.kinds.belief import BeliefParams, run

    torch.set_num_threads(1)
    rows = run(None, BeliefParams.from_dict(dict(tunnel="hmm-cpu", n_sequences=20, readings=["resid"], layers=[0],
                                                 n_shuffles=2, n_boot=10))).rows
    after = []
    for r in select(rows, "belief_r2"):
        at = r.scope
        after.append(dict(model=at["weights"], target=at["target"], reading=at["reading"], layer=at["layer"],
                          r2=r.value, r2_low=r.low, r2_high=r.high, kl_bits=find(rows, "belief_kl_bits", **at).value,
                          null_mean=find(rows, "belief_null_mean", **at).value, null_low=r.null_low,
                          null_high=r.null_high, n=r.n, n_sequences=int(r.note.split()[0]),
                          dim=int(find(rows, "belief_dim", **at).value), decision=r.test["decision"], p=r.test["p"],
                          draws=r.test["draws"]))
    assert len(before["belief"]) == 6  # trained and untrained x exact, window-4, exact minus window-4
    diff = differences(before["belief"], plain(after))
    assert not diff, f"{len(diff)} numbers moved, e.g. {diff[:5]}"
