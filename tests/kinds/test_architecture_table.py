"""The architecture table as the kind ``architectures`` (issue 38, item 4): its rows give the numbers
``examples/architecture_table.py`` gave on the committed checkpoints, each cell is the checkpoint's own fresh
evaluation in its tunnel's column, and a tunnel with no checkpoint says "not trained" (never a number from
elsewhere).

``tests/data/architectures_rows.json`` holds that script's ``score(folder, 64)`` of every committed checkpoint of a
discrete tunnel (``eval_seconds`` dropped) and its ``cell()`` for every architecture and tunnel, written once at
commit b1b0cbe, before the script was deleted, by a one-off script run there with one torch thread: the script
loaded by path (``importlib``), ``rows = [score(f, 64) for f in committed folders if tunnel_of(config) in TUNNELS]``,
``cells = {f"{arch}/{tunnel}": cell(row or None, arch, tunnel) for arch in ARCHS for tunnel in TUNNELS}``, both
dumped as JSON; its four recall rows and cells were rewritten by the same script (from b1b0cbe, loaded the same
way, which first reproduced the file exactly) when the recall checkpoints were retrained at init_std 0.1 (issue 40).
Below, the same through the kind, its rows read back into the script's fields, compared
number by number (``tests.analyses.test_moved_rows.differences``: relative 1e-6) and its summary against the cells."""

from __future__ import annotations

import json

import pytest
import torch

from interp_bayes.core.errors import ConfigError
from interp_bayes.core.results import find, select
from interp_bayes.kinds.architectures import ArchitecturesParams, run, summary, tunnel_of
from interp_bayes.windtunnel.configs import make_config
from interp_bayes.windtunnel.evaluate import evaluate_windtunnel
from interp_bayes.windtunnel.train import train_main
from tests.analyses.test_moved_rows import differences
from conftest import FIXTURES

DATA = FIXTURES / "architectures_rows.json"


def old_rows(rows) -> list[dict]:
    """The kind's rows as the script's ``score`` wrote them, one dict per checkpoint."""
    out = []
    for m in select(rows, "margin_bits"):
        at = {k: m.scope[k] for k in ("checkpoint", "arch", "tunnel", "length")}
        recall = find(rows, "recall_accuracy", **at)
        value = {metric: find(rows, metric, **at).value for metric in
                 ("kl_bits", "n_params", "train_wall_s", "train_cpu_s", "train_steps", "planned_steps")}
        out.append(dict(at, n=m.n, kl_bits=value["kl_bits"], best_window=m.scope["baseline"], margin_bits=m.value,
                        margin_ci=[m.low, m.high], beats={"reject": True, "accept": False}.get(m.test["decision"]),
                        recall_accuracy=None if recall is None else recall.value, n_params=int(value["n_params"]),
                        train_wall_s=value["train_wall_s"], train_cpu_s=value["train_cpu_s"],
                        steps=int(value["train_steps"]), planned_steps=int(value["planned_steps"])))
    return out


@pytest.mark.slow
def test_rows_equal_the_old_table_on_the_committed_checkpoints():
    torch.set_num_threads(1)
    before = json.loads(DATA.read_text())
    params = ArchitecturesParams.from_dict(dict(n=64))
    rows = run(None, params).rows
    assert len(before["rows"]) == 22  # every committed checkpoint but the two Kalman ones
    diff = differences(before["rows"], old_rows(rows))
    assert not diff, f"{len(diff)} numbers moved, e.g. {diff[:5]}"
    lines = summary(rows, params)
    assert {line.label.replace(" on ", "/"): line.value for line in lines} == before["cells"]
    assert {line.verdict for line in lines} == {"", "beats the best window", "does not beat the best window"}


@pytest.mark.parametrize("task, preset, column", [("bijection", "tiny", "bijection"),
                                                  ("bijection", "cpu_replacement", "bijection-replacement"),
                                                  ("hmm", "tiny", "hmm"), ("hmm", "sticky-tiny", "hmm-sticky"),
                                                  ("recall", "tiny", "recall")])
def test_each_preset_lands_in_its_tunnels_column(task, preset, column):
    assert tunnel_of(make_config(task, preset)) == column


def test_cells_are_the_checkpoints_own_evaluation(tmp_path):
    torch.set_num_threads(1)
    folders = {}
    for arch in ("transformer", "lstm"):
        folders[arch] = tmp_path / arch
        argv = ["bijection", "--preset", "tiny", "--arch", arch, "--steps", "3", "--out", str(folders[arch]), "--quiet"]
        assert train_main(argv) == 0
    params = ArchitecturesParams.from_dict(dict(committed=False, folders=[str(f) for f in folders.values()], n=64))
    rows = run(None, params).rows
    for arch, folder in folders.items():
        kl, margin = find(rows, "kl_bits", checkpoint=arch), find(rows, "margin_bits", checkpoint=arch)
        reference = evaluate_windtunnel(folder, n=64, lengths=[kl.scope["length"]], baselines=True)
        reference = reference[kl.scope["length"]]
        assert kl.scope["arch"] == arch and kl.scope["tunnel"] == "bijection"
        assert kl.value == reference["kl_bits"] and margin.value == reference["vs_best_window"]["margin_bits"]
    cells = {line.label: line.value for line in summary(rows, params)}
    assert cells["lstm on bijection"].startswith(f"KL {find(rows, 'kl_bits', checkpoint='lstm').value:.4g}")
    assert cells["lstm on bijection"].endswith("paper 0.009")
    assert cells["lstm on bijection-replacement"] == "not trained"
    assert cells["lstm on hmm"] == "not trained; paper 0.411"
    assert not any("KL" in v for k, v in cells.items() if k.startswith("mamba "))  # nothing trained: no number


def test_folders_only_and_refusals(tmp_path):
    folder = tmp_path / "recall-lstm"
    argv = ["recall", "--preset", "tiny", "--arch", "lstm", "--steps", "3", "--out", str(folder), "--quiet"]
    assert train_main(argv) == 0
    params = ArchitecturesParams.from_dict(dict(committed=False, folders=[str(folder)], n=32))
    assert list(params.checkpoints()) == ["recall-lstm"]
    rows = run(None, params).rows
    assert {(r.scope["checkpoint"], r.scope["arch"], r.scope["tunnel"]) for r in rows} == {
        ("recall-lstm", "lstm", "recall")}
    assert find(rows, "train_cpu_s").value is not None and find(rows, "recall_accuracy") is not None
    refused = {"no wind-tunnel checkpoint": dict(committed=False, folders=[str(tmp_path)]),  # not a trained folder
               "nothing to score": dict(committed=False),
               "recall-lstm names two": dict(folders=[str(folder), str(folder)]),
               "a kalman": dict(committed=False, folders=["kalman-cpu"])}  # no window filter
    for what, data in refused.items():
        with pytest.raises(ConfigError, match=what):
            ArchitecturesParams.from_dict(data).checkpoints()


def test_a_cell_of_a_run_stopped_early_says_so():
    from interp_bayes.core.results import Row

    at = dict(checkpoint="x", arch="mamba", tunnel="hmm-sticky", length=20)

    def rows(steps):
        return [Row("kl_bits", 0.0123, "bits", dict(at)),
                Row("margin_bits", 0.14, "bits", dict(at, baseline="window-4"), 0.13, 0.15,
                    test=dict(decision="reject")),
                Row("train_steps", steps, "steps", dict(at)), Row("planned_steps", 4000, "steps", dict(at))]

    line = {x.label: x for x in summary(rows(2000), ArchitecturesParams())}["mamba on hmm-sticky"]
    assert line.value.endswith("(stopped at step 2,000 of 4,000)") and line.verdict == "beats the best window"
    assert "stopped" not in {x.label: x for x in summary(rows(4000), ArchitecturesParams())}["mamba on hmm-sticky"].value


@pytest.mark.slow
def test_the_kind_runs_through_the_sweep_and_prints_as_markdown(tmp_path, capsys):
    """The recipe with a trained folder only, through ``interp-bayes sweep --set``: rows, the figure in the
    report, ``interp-bayes results RUN --format markdown`` with the table as summary lines; a second sweep finds it
    cached."""
    from interp_bayes import cli
    from interp_bayes.model.testing import make_tiny_model
    from interp_bayes.report.view import RunView

    torch.set_num_threads(1)
    folder = tmp_path / "bijection-mlp"
    argv = ["bijection", "--preset", "tiny", "--arch", "mlp", "--steps", "3", "--out", str(folder), "--quiet"]
    assert train_main(argv) == 0
    make_tiny_model("llama3", tmp_path / "m")  # the sweep's model: never read by this kind
    sweep = ["sweep", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "runs"), "--quiet", "--threads", "1",
             "--probes", "architectures", "--set", "architectures.committed=false",
             f"architectures.folders=[{folder}]", "architectures.n=16"]
    assert cli.main(sweep) == 0
    run_folder = next((tmp_path / "runs").glob("*/*/probes/architectures")).parents[1]
    view = RunView.load(run_folder)
    rows = view.probes("architectures")[0].rows
    assert {r.scope["checkpoint"] for r in rows} == {"bijection-mlp"} and find(rows, "kl_bits").n == 16
    assert "fig-architectures-architectures" in (run_folder / "report.html").read_text()
    assert cli.main(["results", str(run_folder), "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    assert "## architectures (kind architectures, on architectures x tunnels)" in text
    assert "| mlp on bijection | KL " in text and "| lstm on hmm | not trained; paper 0.411 |" in text
    assert "`margin_bits`" in text and "`n_params`" in text
    before = (run_folder / "probes" / "architectures" / "stage.json").read_text()
    assert cli.main(sweep) == 0
    assert (run_folder / "probes" / "architectures" / "stage.json").read_text() == before  # cached
