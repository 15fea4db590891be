"""Rows of the experiments whose opening moved to ``open_tunnel`` (issue 38, item 1) and whose entropies and KLs
moved to ``stats.info`` (item 3), equal to the rows the code before the move gave on the committed checkpoints.

``tests/data/moved_rows.json`` was written by ``compute()`` below run on the code before the move (commit 64eb0d5;
``PYTHONPATH=<that checkout> python -c "import tests.analyses.test_moved_rows as t, json; json.dump(t.compute(), ...)"``).
On the machine that wrote it the rows are bit-identical; the comparison allows float64 rounding of float32
forwards on another CPU (relative 1e-6)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import interp_bayes
from conftest import FIXTURES

DATA = FIXTURES / "moved_rows.json"
CHECKPOINTS = Path(interp_bayes.__file__).resolve().parent / "windtunnel" / "checkpoints"
PATH_KEYS = ("folder", "run")  # where the checkpoint sat: not a number


def plain(x):
    """JSON-able, the paths dropped."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return plain(dataclasses.asdict(x))
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items() if k not in PATH_KEYS}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, (np.ndarray, torch.Tensor)):
        return plain(x.tolist())
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.integer):
        return int(x)
    return x


def compute() -> dict:
    """The frame curves, at small settings; only the API that exists before and after the move. (P4b, the tunnel
    geometry, the belief probes and the subspace ablation, the fixture's ``p4b``, ``geometry``, ``belief`` and
    ``subspaces``, became kinds: ``tests/kinds/test_tunnel_kinds.py`` and ``tests/kinds/test_subspace_kinds.py``
    compare their rows with the functions' outputs before that move.)"""
    from interp_bayes.dynamics.frames import frame_precision_run

    torch.set_num_threads(1)
    return plain({"frames": frame_precision_run(CHECKPOINTS / "bijection-cpu", n_eval=10)})


def differences(before, after, path: str = "") -> list[str]:
    if isinstance(before, dict) and isinstance(after, dict):
        if set(before) != set(after):
            return [f"{path}: keys {sorted(set(before) ^ set(after))}"]
        return [d for k in before for d in differences(before[k], after[k], f"{path}.{k}")]
    if isinstance(before, list) and isinstance(after, list):
        if len(before) != len(after):
            return [f"{path}: {len(before)} vs {len(after)} entries"]
        return [d for i, (b, a) in enumerate(zip(before, after)) for d in differences(b, a, f"{path}[{i}]")]
    if isinstance(before, float) and isinstance(after, float):
        ok = (np.isnan(before) and np.isnan(after)) or np.isclose(before, after, rtol=1e-6, atol=1e-12)
        return [] if ok else [f"{path}: {before!r} vs {after!r}"]
    return [] if before == after else [f"{path}: {before!r} vs {after!r}"]


@pytest.mark.slow
def test_moved_experiments_give_the_rows_they_gave_before():
    before, after = json.loads(DATA.read_text()), compute()
    assert set(before) == {"p4b", "geometry", "subspaces", "belief", "frames"} and set(after) == set(before) - {
        "p4b", "geometry", "belief", "subspaces"}
    diff = differences({k: before[k] for k in after}, after)
    assert not diff, f"{len(diff)} numbers moved, e.g. {diff[:5]}"


def test_the_comparison_sees_a_moved_number():
    before = {"rows": [{"r2": 0.5, "verdict": "holds"}]}
    assert differences(before, {"rows": [{"r2": 0.5 * (1 + 1e-9), "verdict": "holds"}]}) == []
    assert differences(before, {"rows": [{"r2": 0.5001, "verdict": "holds"}]})
    assert differences(before, {"rows": [{"r2": 0.5, "verdict": "fails"}]})
