"""``stats.probe.scalar_probes``, the per-target probe that was ``windtunnel.kalman.belief_probe`` (a statistic in a
trainer module, issue 38): its numbers equal the former function's, and it finds what it should on planted data.

``tests/data/scalar_probes_rows.json``: the output of ``windtunnel.kalman.belief_probe`` at commit 7f1f98e on
``planted()`` (``groups=seq, strata=step, n_null=200, seed=3``), before the move."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import FIXTURES
from interp_bayes.stats.probe import scalar_probes


def planted():
    """40 sequences of 10 steps: readings carrying three planted components and the step; a linear target, noise,
    and a target that moves with the step alone."""
    rng = np.random.default_rng(0)
    seq, step = np.repeat(np.arange(40), 10), np.tile(np.arange(10), 40)
    x = np.column_stack([rng.standard_normal((400, 12)), step])
    targets = {"linear": x[:, :3] @ np.array([1.0, -2.0, 0.5]) + 0.5 * rng.standard_normal(400),
               "noise": rng.standard_normal(400), "position": step + 0.3 * rng.standard_normal(400)}
    return x, targets, seq, step


def assert_close_tree(got, want, path="") -> None:
    """``got`` equals ``want`` (nested dicts and lists from JSON): floats to relative 1e-9, everything else exactly."""
    if isinstance(want, dict):
        assert got.keys() == want.keys(), path
        for key in want:
            assert_close_tree(got[key], want[key], f"{path}/{key}")
    elif isinstance(want, list):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close_tree(g, w, f"{path}/{i}")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12), path
    else:
        assert got == want, path


def test_scalar_probes_equal_the_former_kalman_belief_probe():
    torch.set_num_threads(1)
    x, targets, seq, step = planted()
    after = json.loads(json.dumps(scalar_probes(x, targets, groups=seq, strata=step, n_null=200, seed=3)))
    before = json.loads((FIXTURES / "scalar_probes_rows.json").read_text())
    # decisions and draws exactly; every number to float64 rounding of the BLAS the machine has (ridge fits of 400
    # rows: relative 1e-9 is some 10^6 ulps, far below any change of the computation; AVX-512 and AVX2 kernels
    # differ in the last bits)
    assert_close_tree(after, before)
    decisions = {(t, v): before[t][v]["test"]["decision"] for t in before for v in ("raw", "within")}
    assert set(decisions.values()) == {"accept", "undecided"}  # the pin covers a stop at the first look and the cap


def test_scalar_probes_find_linear_targets_and_separate_position_codes():
    rng = np.random.default_rng(0)
    strata = np.repeat(np.arange(8), 50)
    x = np.column_stack([rng.standard_normal((400, 16)), strata])  # readings that also carry the stratum
    linear = x[:, :3] @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.standard_normal(400)
    by_position = strata + 0.3 * rng.standard_normal(400)  # moves with the stratum, not with the readings
    res = scalar_probes(x, {"linear": linear, "noise": rng.standard_normal(400), "position": by_position},
                        strata=strata, n_null=1000, seed=1)
    assert res["linear"]["raw"]["r2_held_out"] > 0.95 and res["linear"]["within"]["r2_held_out"] > 0.95
    assert res["linear"]["raw"]["null"][1] < 0.1
    assert res["linear"]["raw"]["test"]["decision"] == "reject" and res["linear"]["raw"]["test"]["draws"] < 1000
    assert res["noise"]["raw"]["test"]["decision"] == "accept" and res["noise"]["raw"]["test"]["draws"] == 50
    assert res["noise"]["raw"]["r2_held_out"] < res["noise"]["raw"]["null"][1] + 0.02
    assert res["position"]["raw"]["r2_held_out"] > 0.9  # read off the position code ...
    assert res["position"]["within"]["r2_held_out"] < res["position"]["within"]["null"][1] + 0.02  # ... only
