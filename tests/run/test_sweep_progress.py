"""The sweep's progress lines: "probe i/N: NAME" with an ETA that comes from the seconds an earlier run recorded
(unknown on a first run; nothing for probes that are cached)."""

import re
import pytest

import yaml

from interp_bayes.run.config import SweepConfig
from interp_bayes.run.sweep import run_sweep


def test_progress_says_probe_i_of_n_with_an_eta(tiny_dirs, tmp_path, capsys):
    probes = []
    for name, spec in (("keys", dict(kind="keys", n_null=5)), ("focusing", dict(kind="focusing", per_bin=2,
                                                                                n_boot=20))):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(spec))
        probes.append(str(tmp_path / f"{name}.yaml"))
    config = SweepConfig(model=str(tiny_dirs["llama3"]), out=str(tmp_path / "runs"), prompts="basic", quiet=False,
                         probes=probes)
    run_sweep(config)
    first = capsys.readouterr().out
    assert re.search(r"^probe 1/2: keys \(ETA unknown \(first run here\); 0s so far\)$", first, re.M), first
    assert re.search(r"^probe 2/2: focusing \(ETA \d+s for this and the rest; ", first, re.M), first
    # a second model under the same --out: the probes' recorded seconds give the ETA from the start
    run_sweep(config.override(seed=1))
    second = capsys.readouterr().out
    assert re.search(r"^probe 1/2: keys \(ETA \d+s for this and the rest; 0s so far\)$", second, re.M), second
    run_sweep(config)  # all cached: nothing left to wait for
    assert re.search(r"^probe 1/2: keys \(ETA 0s for this and the rest", capsys.readouterr().out, re.M)


def test_dry_run_counts_shared_sets_once_and_estimates_time(tiny_dirs, tmp_path):
    from interp_bayes.run.sweep import calibrate, estimate, plan_sweep

    specs = dict(mixed=dict(kind="manifold", per_bin=4, n_boot=20, n_null=5),
                 code=dict(kind="manifold", per_bin=2, n_boot=20, n_null=5),
                 decoding=dict(kind="decoding", per_k=2, layers=[1], n_null=2, n_boot=10),
                 martingale=dict(kind="martingale", per_k=2, ks=[1, 2], n_null=5, n_boot=10),
                 neurons=dict(kind="entropy_neurons", n_prompts=8, per_k=2, top_n=2, n_random=2))
    probes = []
    for name, spec in specs.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(spec))
        probes.append(str(tmp_path / f"{name}.yaml"))
    config = SweepConfig(model=str(tiny_dirs["llama3"]), out=str(tmp_path / "runs"), prompts="basic", quiet=True,
                         probes=probes)
    items = plan_sweep(config)
    pools = [i for i in items if i.what.startswith("activations pool-basic")]
    # once, by the first; entropy_neurons reads the pool's texts, not its set
    assert len(pools) == 2 and pools[0].forwards == 64 and pools[0].probe == "mixed"
    assert not [i for i in items if i.probe == "neurons" and "pool" in i.what]
    assert all(i.forwards == 0 and "(shared with mixed)" in i.what for i in pools[1:])
    assert {i.probe for i in items if i.forwards} >= {"mixed", "decoding", "martingale", "neurons"}
    per_probe = {name: sum(i.forwards for i in items if i.probe == name) for name in specs}
    assert per_probe["martingale"] == 2 * 2 * (6 + 2 * 4 + 1)  # contexts x (orders + 2 x draws + 1)
    est = estimate(config, items, per_forward=0.5)
    assert est.seconds == {name: 0.5 * n for name, n in per_probe.items()} and set(est.source.values()) == \
        {"throughput"}
    seconds, how, load, pace = calibrate(config, items)
    assert 0 < seconds < 60 and "ms per prompt" in how and 0 < load < 60 and "to load the model" in how
    assert pace is None  # the reference sample is timed only where an estimate takes it: no shipped recipe here
    shipped = config.override(probes=["focusing"])  # a shipped recipe of the model: its reference takes the pace
    assert calibrate(shipped, plan_sweep(shipped))[3] > 0
    assert not (tmp_path / "runs").exists()  # the plan and the calibration wrote nothing
    run_sweep(config.override(probes=probes[:1]))  # an earlier run under --out records mixed's time
    other = config.override(seed=3)
    est = estimate(other, plan_sweep(other), per_forward=0.5)
    assert est.source["mixed"] == "recorded" and est.source["code"] == "throughput"


def test_blas_follows_torch_threads_and_changes_no_row(tiny_dirs, tmp_path, monkeypatch):
    """``cpu_threads`` holds numpy's and scipy's BLAS to torch's thread count during a sweep (two BLAS threads beside
    a one-thread sweep ran the statistics 8-10x slower on shared cores) and restores it after; the rows of every
    toy kind are byte-equal to those of the same sweep with BLAS at two threads."""
    from contextlib import contextmanager

    import torch
    from threadpoolctl import threadpool_info, threadpool_limits

    from interp_bayes.model.testing import write_toy_recipes
    from interp_bayes.run import sweep

    def blas_threads() -> set[int]:
        return {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}

    threads = torch.get_num_threads()
    with threadpool_limits(limits=2, user_api="blas"):
        with sweep.cpu_threads(1):
            assert blas_threads() == {1} and torch.get_num_threads() == 1
        assert blas_threads() == {2}
    torch.set_num_threads(threads)

    @contextmanager
    def free_blas(n):  # the sweep before: torch's threads set, BLAS at two threads
        torch.set_num_threads(n)
        with threadpool_limits(limits=2, user_api="blas"):
            yield

    probes = write_toy_recipes(tmp_path / "probes")
    config = SweepConfig(model=str(tiny_dirs["llama3"]), prompts="basic", quiet=True, probes=probes, threads=1)
    try:
        held = run_sweep(config.override(out=str(tmp_path / "held"))).folder
        monkeypatch.setattr(sweep, "cpu_threads", free_blas)
        free = run_sweep(config.override(out=str(tmp_path / "free"))).folder
    finally:
        torch.set_num_threads(threads)
    names = sorted(p.parent.name for p in held.glob("probes/*/rows.json"))
    assert len(names) >= 5
    for name in names:
        assert (held / "probes" / name / "rows.json").read_bytes() == \
            (free / "probes" / name / "rows.json").read_bytes(), name


def test_estimates_take_a_shipped_recipe_from_its_reference_time(tiny_dirs, tmp_path):
    """A shipped recipe as shipped is estimated from ``REFERENCE_SECONDS`` times the pace of the reference sample on
    the sweep's model here (a wind tunnel's at that pace only on the reference model, whose pace is the machine's);
    overridden, it falls back to its forwards. The progress ETA takes the same seconds, times how far the probes this
    run has computed strayed from theirs."""
    from interp_bayes.run.sweep import ETA, REFERENCE_MODEL, REFERENCE_SECONDS, estimate, load_probe, plan_sweep

    config = SweepConfig(model=str(tiny_dirs["llama3"]), out=str(tmp_path / "runs"), prompts="basic", quiet=True,
                         probes=["decoding_windtunnel", "windtunnel", "keys"])
    est = estimate(config, plan_sweep(config), per_forward=0.5, pace=2.0)
    assert est.source == dict(decoding_windtunnel="reference", windtunnel="reference", keys="reference")
    # another model's pace holds its cost beside the machine's: its stages follow it, a wind tunnel's does not
    assert est.seconds["windtunnel"] == REFERENCE_SECONDS["windtunnel"]
    assert est.seconds["keys"] == 2 * REFERENCE_SECONDS["keys"]
    edited = config.override(overrides=dict(windtunnel=dict(n_boot=10)))
    est = estimate(edited, plan_sweep(edited), per_forward=0.5, pace=2.0)
    assert est.source["windtunnel"] == "throughput" and est.source["decoding_windtunnel"] == "reference"

    probes = [load_probe("windtunnel"), load_probe("decoding_windtunnel"), load_probe("keys")]
    rd, rw, rk = REFERENCE_SECONDS["decoding_windtunnel"], REFERENCE_SECONDS["windtunnel"], REFERENCE_SECONDS["keys"]
    eta = ETA(probes, tmp_path / "nothing-here", model=REFERENCE_MODEL)
    assert eta.remaining() == pytest.approx(rw + rd + rk)
    eta.t_probe -= 3 * rw  # windtunnel took three times its reference
    eta.done(probes[0], cached=False)
    assert abs(eta.remaining() - 3 * (rd + rk)) < 0.05 * (rd + rk)
    # the pace timed at the start (eta_pace) scales every reference on the reference model, until a stage has ended
    eta = ETA(probes, tmp_path / "nothing-here", model=REFERENCE_MODEL, pace=0.5)
    assert eta.remaining() == pytest.approx(0.5 * (rw + rd + rk))
    eta.t_probe -= 3 * rw
    eta.done(probes[0], cached=False)
    assert abs(eta.remaining() - 3 * (rd + rk)) < 0.05 * (rd + rk)
    # on another model only the model's stages: a 0.5B model's ETA was the wind tunnels' minutes for a 22-minute sweep
    eta = ETA(probes, tmp_path / "nothing-here", model="some-model", pace=3.0)
    assert eta.remaining() == pytest.approx(rw + rd + 3 * rk)
    assert eta.expected("keys") == pytest.approx(3 * rk)
    # so the workers take another model's interventions first, as on the reference model (they took its stages last)
    probes = [load_probe("windtunnel_replacement"), load_probe("interventions")]
    eta = ETA(probes, tmp_path / "nothing-here", model="some-model")
    assert max(probes, key=lambda p: eta.expected(p.name) or 0.0).name == "interventions"


def test_workers_take_the_longest_stage_first_and_the_estimate_their_makespan(tiny_dirs, monkeypatch):
    """Two workers by default only where they pay: on a CPU with two or more cores, for two or more stages of a
    model of ``WORKER_MIN_PARAMS`` or more whose two loads fit in RAM; ``workers`` or ``threads`` given win."""
    import interp_bayes.run.sweep as sweep

    assert sweep.makespan([5, 4, 3, 3, 1], 2) == 8  # 5+3 | 4+3+1
    assert sweep.makespan([5, 4, 3], 1) == 12 and sweep.makespan([], 2) == 0
    # the last worker, alone after 2 s, takes the other's core: its 8 s left at half the time
    assert sweep.makespan([10, 2], 2, alone=0.5) == 6 and sweep.makespan([5, 4, 3, 3, 1], 2, alone=0.5) == 8
    config = SweepConfig(model=str(tiny_dirs["llama3"]))
    ref = config.model_ref()
    monkeypatch.setattr(sweep.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(sweep.torch.cuda, "is_available", lambda: False)
    assert sweep.sweep_workers(config, ref) == 1  # a tiny model: a second process would not pay
    monkeypatch.setattr(sweep, "WORKER_MIN_PARAMS", 1)
    assert sweep.sweep_workers(config, ref) == 2
    assert sweep.sweep_workers(config, ref, stages=1) == 1
    assert sweep.sweep_workers(config.override(threads=2), ref) == 1
    assert sweep.sweep_workers(config.override(workers=3), ref) == 3
    assert sweep.sweep_workers(config, ref, model=object()) == 1
    monkeypatch.setattr(sweep.os, "cpu_count", lambda: 1)
    assert sweep.sweep_workers(config, ref) == 1


def test_the_first_worker_takes_the_cores_of_helpers_once_all_have_exited():
    """At a safe point after every helper has exited, the first worker's torch threads go up to the workers' cores
    (said once); while one still runs, nothing changes. A sweep whose threads were given keeps them."""
    import torch

    import interp_bayes.run.sweep as sweep

    class Helper:
        alive = True

        def is_alive(self):
            return self.alive

    helpers, said, threads = [Helper(), Helper()], [], torch.get_num_threads()
    call = sweep._take_cores_of_finished_helpers(helpers, 2, said.append)
    try:
        torch.set_num_threads(1)
        helpers[0].alive = False
        call()
        assert torch.get_num_threads() == 1 and not said
        helpers[1].alive = False
        call()
        assert torch.get_num_threads() == 2
        torch.set_num_threads(1)
        call()  # once only
        assert torch.get_num_threads() == 1 and len(said) == 1 and "2 torch threads" in said[0]
    finally:
        torch.set_num_threads(threads)
    config = SweepConfig(model="x")
    assert sweep.alone_pace(config, 2) == sweep.TWO_THREAD_PACE < 1
    assert sweep.alone_pace(config, 1) == sweep.alone_pace(config.override(threads=1), 2) == 1.0


def test_the_first_eta_is_timed_at_this_machines_pace_only_where_it_is_used(tmp_path, monkeypatch):
    """``eta_pace`` times the reference sample (as the dry run does) only with progress shown and where a stage to
    compute will be estimated from its reference seconds at that pace; the model it times is the stages'."""
    from types import SimpleNamespace

    from interp_bayes.run import sweep

    timed = []
    monkeypatch.setattr(sweep, "reference_pace", lambda model, config: timed.append(model) or 0.55)
    probes = [sweep.load_probe("windtunnel"), sweep.load_probe("keys")]

    def ctx(**kw):
        config = SimpleNamespace(quiet=False, model=sweep.REFERENCE_MODEL) if not kw else SimpleNamespace(**kw)
        return SimpleNamespace(config=config, folder=tmp_path / "run", model="the stages' model")

    assert sweep.eta_pace(ctx(), probes, cached=set()) == 0.55 and timed == ["the stages' model"]
    assert sweep.eta_pace(ctx(), probes, cached={"windtunnel", "keys"}) is None  # nothing left to estimate
    assert sweep.eta_pace(ctx(quiet=True, model=sweep.REFERENCE_MODEL), probes, cached=set()) is None
    # another model's pace is timed for its own stages, not for a wind tunnel's alone
    assert sweep.eta_pace(ctx(quiet=False, model="another-model"), probes, cached=set()) == 0.55
    assert sweep.eta_pace(ctx(quiet=False, model="another-model"), probes, cached={"keys"}) is None
    assert len(timed) == 2
