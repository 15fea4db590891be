"""examples/architecture_table.py: each cell is the checkpoint's own fresh evaluation, in its tunnel's column, and a
tunnel with no checkpoint says "not trained" (never a number from elsewhere)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from interp_bayes.windtunnel.configs import make_config
from interp_bayes.windtunnel.evaluate import evaluate_windtunnel
from interp_bayes.windtunnel.train import train_main

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "architecture_table.py"


@pytest.fixture(scope="module")
def table_module():
    spec = importlib.util.spec_from_file_location("architecture_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("task, preset, column", [("bijection", "tiny", "bijection"),
                                                  ("bijection", "cpu_replacement", "bijection-replacement"),
                                                  ("hmm", "tiny", "hmm"), ("hmm", "sticky-tiny", "hmm-sticky"),
                                                  ("recall", "tiny", "recall")])
def test_each_preset_lands_in_its_tunnels_column(table_module, task, preset, column):
    assert table_module.tunnel_of(make_config(task, preset)) == column


def test_cells_are_the_checkpoints_own_evaluation(table_module, tmp_path):
    folders = {}
    for arch in ("transformer", "lstm"):
        folders[arch] = tmp_path / arch
        argv = ["bijection", "--preset", "tiny", "--arch", arch, "--steps", "3", "--out", str(folders[arch]), "--quiet"]
        assert train_main(argv) == 0
    rows = [table_module.score(folders[arch], n=64) for arch in ("transformer", "lstm")]
    for row, arch in zip(rows, ("transformer", "lstm")):
        reference = evaluate_windtunnel(folders[arch], n=64, lengths=[row["length"]], baselines=True)[row["length"]]
        assert row["arch"] == arch and row["tunnel"] == "bijection"
        assert row["kl_bits"] == reference["kl_bits"]
        assert row["margin_bits"] == reference["vs_best_window"]["margin_bits"]
    text = table_module.table(rows)
    lstm_line = next(line for line in text.splitlines() if line.startswith("| lstm |"))
    cells = [c.strip() for c in lstm_line.strip("|").split("|")]
    assert cells[1].startswith(f"KL {rows[1]['kl_bits']:.4g}") and cells[1].endswith("paper 0.009")
    assert cells[2] == "not trained" and cells[3] == "not trained; paper 0.411"
    mamba_line = next(line for line in text.splitlines() if line.startswith("| mamba |"))
    assert "KL" not in mamba_line  # nothing trained: no number appears


def test_no_committed_scores_only_the_given_folders(table_module, tmp_path):
    folder = tmp_path / "recall-lstm"
    argv = ["recall", "--preset", "tiny", "--arch", "lstm", "--steps", "3", "--out", str(folder), "--quiet"]
    assert train_main(argv) == 0
    out = tmp_path / "table"
    assert table_module.main(["--out", str(out), "--no-committed", "--checkpoints", str(folder), "--n", "32"]) == 0
    rows = json.loads((out / "table.json").read_text())
    assert [(r["checkpoint"], r["arch"], r["tunnel"]) for r in rows] == [("recall-lstm", "lstm", "recall")]
    assert rows[0]["train_cpu_s"] is not None
    with pytest.raises(SystemExit) as exit_info:  # a folder that is not a trained wind tunnel: refused up front
        table_module.main(["--out", str(out), "--no-committed", "--checkpoints", str(tmp_path)])
    assert exit_info.value.code == 2


def test_a_cell_of_a_run_stopped_early_says_so(table_module):
    row = dict(kl_bits=0.0123, recall_accuracy=None, best_window="window-4", margin_bits=0.14, margin_ci=[0.13, 0.15],
               steps=2000, planned_steps=4000)
    assert table_module.cell(row, "mamba", "hmm-sticky").endswith("(stopped at step 2,000 of 4,000)")
    assert "stopped" not in table_module.cell(row | dict(steps=4000), "mamba", "hmm-sticky")
