"""Grids (issue 15): a 4-cell grid (2 tiny models x 2 seeds, toy-sized probes) under the local executor and under
Ray gives the same numbers; a rerun recomputes nothing in either direction; a Ray worker killed in the middle of a
cell is retried and the grid completes with the same numbers; two processes racing on one cell compute each stage
once; the grid page reads its numbers from the run folders.

One Ray session (2 CPUs) serves every Ray test of the module: Ray takes seconds to start.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from interp_bayes import cli
from interp_bayes.run.config import SweepConfig
from interp_bayes.core.errors import ConfigError, GridError
from interp_bayes.run.grid import Grid, cell_resources, run_cell, run_grid
from interp_bayes.report.grid import CellView, build_grid_page, headline_rows, HEADLINES, scaling_figures
from interp_bayes.core.store import stage_lock, working_in
from interp_bayes.run.sweep import run_folder, run_sweep
from interp_bayes.model.testing import TOY_PROBES, write_toy_recipes

PROBES = list(TOY_PROBES)  # toy sizes: every headline kind, a few seconds per cell
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
       "PYTHONUNBUFFERED": "1"}
TIMEOUT = 300


@pytest.fixture(scope="module")
def recipes(tmp_path_factory) -> list[str]:
    return write_toy_recipes(tmp_path_factory.mktemp("probes"))


@pytest.fixture(scope="module")
def make_grid(tiny_dirs, recipes):
    def make(out: Path, **extra) -> dict:
        return dict(name="toy", models=[str(tiny_dirs["llama3"]), str(tiny_dirs["pythia"])], probes=recipes,
                    seeds=[0, 1], config=dict(out=str(out), prompts="basic", threads=1, quiet=True), **extra)
    return make


@pytest.fixture(scope="module")
def local_run(make_grid, tmp_path_factory):
    """The reference: the 4-cell grid under the local executor."""
    return run_grid(make_grid(tmp_path_factory.mktemp("local")), quiet=True)


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray", reason="ray is installed by the lock file (the 'grid' extra)")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=128 * 2**20)
    yield ray
    ray.shutdown()


def numbers(folder: Path) -> dict[str, str]:
    """probe -> its rows and data as canonical text (timing rows aside): what must not depend on the executor."""
    out = {}
    for rows in sorted(folder.glob("probes/*/rows.json")):
        kept = [r for r in json.loads(rows.read_text()) if r["unit"] != "s"]
        data = json.loads((rows.parent / "data.json").read_text())
        out[rows.parent.name] = json.dumps([kept, data], sort_keys=True)
    return out


def assert_same_numbers(run, reference) -> None:
    assert [c.folder.relative_to(c.folder.parents[1]) for c in run.cells] == \
           [c.folder.relative_to(c.folder.parents[1]) for c in reference.cells]  # same run keys
    for got, want in zip(run.cells, reference.cells):
        mine, theirs = numbers(got.folder), numbers(want.folder)
        assert sorted(mine) == sorted(PROBES)
        assert mine == theirs, got.cell.label


# --- the grid spec ---------------------------------------------------------------------------------------------

def test_cells_are_models_x_revisions_x_seeds(tmp_path):
    (tmp_path / "wt").mkdir()
    grid = Grid.from_dict(dict(models=["smollm2-135m", {"name": "EleutherAI/pythia-70m",
                                                          "revisions": ["step1000", "step143000"]}, "wt"],
                               seeds=[0, 1], probes=["keys"], config=dict(out="o", prompts="basic")), base=tmp_path)
    cells = grid.cells()
    assert [(c.model, c.revision, c.seed) for c in cells] == [
        ("smollm2-135m", None, 0), ("smollm2-135m", None, 1),
        ("EleutherAI/pythia-70m", "step1000", 0), ("EleutherAI/pythia-70m", "step1000", 1),
        ("EleutherAI/pythia-70m", "step143000", 0), ("EleutherAI/pythia-70m", "step143000", 1),
        (str(tmp_path / "wt"), None, 0), (str(tmp_path / "wt"), None, 1)]  # a folder beside the grid file
    config = cells[2].sweep_config()
    assert (config.revision, config.seed, config.probes, config.prompts) == ("step1000", 0, ["keys"], "basic")
    assert Path(config.out).is_absolute() and grid.folder() == Path("o").resolve() / "grids" / "grid"
    assert cells[2].label == "EleutherAI/pythia-70m@step1000 seed 0"


def test_revisions_enter_the_run_key_and_a_local_folder_refuses_one(tiny_dirs, tmp_path, monkeypatch):
    from huggingface_hub import constants

    from interp_bayes.core.errors import ModelNotFoundError
    from interp_bayes.model.loading import load_model, model_identity

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))  # an empty HF cache, whatever this machine holds
    hub = "EleutherAI/pythia-70m"  # offline and not cached: the identity is the revision's name, marked unresolved
    keys = {rev: run_folder(SweepConfig(model=hub, revision=rev)) for rev in (None, "step1000", "step143000")}
    assert len(set(keys.values())) == 3 and model_identity(hub, "step1000") == dict(hub=hub, revision="step1000",
                                                                                    commit=None)
    folder = str(tiny_dirs["pythia"])
    with pytest.raises(ModelNotFoundError, match=r"is a local folder, which has no revisions \(asked: 'step1000'\)"):
        load_model(folder, revision="step1000")
    with pytest.raises(ModelNotFoundError, match="has no revisions"):
        run_folder(SweepConfig(model=folder, revision="step1000"))


@pytest.mark.parametrize("bad, message", [
    (dict(models=[]), "needs 'models:'"),
    (dict(models=["a"], seeds=[0.5]), "'seeds:' must be a list of integers"),
    (dict(models=["a"], colour="red"), r"Unknown grid key\(s\) colour"),
    (dict(models=["a"], config=dict(seed=3)), "'config:' may not set seed"),
    (dict(models=["a"], config=dict(layerz=[1])), r"Unknown config key\(s\) \['layerz'\]"),
    (dict(models=[{"name": "a", "revision": "x"}]), r"Unknown key\(s\) revision for grid model 'a'"),
    (dict(models=[{"name": "a", "revisions": "step1"}]), "'revisions:' of 'a' must be a list"),
])
def test_bad_grids_are_refused_with_one_sentence(bad, message):
    with pytest.raises(ConfigError, match=message):
        Grid.from_dict(bad)


def test_unknown_executor_and_missing_ray_are_refused(make_grid, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="Unknown executor 'slurm'"):
        run_grid(make_grid(tmp_path), executor="slurm")
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(ConfigError, match=r"needs Ray: pip install 'interp_bayes\[grid\]'"):
        run_grid(make_grid(tmp_path), executor="ray")


def test_cell_resources_follow_the_model_size():
    import torch

    from interp_bayes.model.loading import memory_needed

    gib = 2**30
    assert cell_resources(None, None, 2, None) == dict(num_cpus=2)
    assert cell_resources(135_000_000, None, 1, None) == dict(num_cpus=1,
                                                               memory=memory_needed(135_000_000, torch.float32))
    assert cell_resources(135_000_000, None, 1, 80 * gib)["num_gpus"] == 0.25  # four small cells per GPU at most
    assert cell_resources(8_000_000_000, "bfloat16", 1, 80 * gib)["num_gpus"] == 0.25  # 16 GB of 80
    assert cell_resources(30_000_000_000, "bfloat16", 1, 80 * gib)["num_gpus"] == 1  # 60 GB: one GPU to itself
    assert cell_resources(70_000_000_000, "bfloat16", 4, 80 * gib) == dict(num_cpus=4, num_gpus=2)  # 140 GB
    # GPT-NeoX: the bridge holds the fused qkv twice; the dtype still follows the model's own size (2.8B: float32)
    assert cell_resources(2_800_000_000, None, 1, None, 3_400_000_000) == dict(
        num_cpus=1, memory=memory_needed(3_400_000_000, torch.float32))


# --- executors ------------------------------------------------------------------------------------------------

def test_local_grid_writes_ordinary_run_folders_and_a_rerun_computes_nothing(local_run, make_grid, tiny_dirs):
    assert len(local_run.cells) == 4 and all(c.error is None for c in local_run.cells)
    assert all(c.computed == list(PROBES) for c in local_run.cells)
    first = local_run.cells[0]
    same = SweepConfig(model=str(tiny_dirs["llama3"]), out=first.cell.config["out"], prompts="basic", seed=0,
                       probes=first.cell.config["probes"])
    assert run_folder(same) == first.folder  # the cell is the sweep `interp-bayes sweep` would run
    assert first.log.read_text().count("=== start") == 1
    again = run_grid(make_grid(Path(first.cell.config["out"])), quiet=True)
    assert again.computed == 0 and [c.folder for c in again.cells] == [c.folder for c in local_run.cells]
    record = json.loads((local_run.folder / "grid.json").read_text())
    assert [c["computed"] for c in record["cells"]] == [[]] * 4  # the record of the latest call
    table = again.table()
    assert set(table.model) == {str(tiny_dirs["llama3"]), str(tiny_dirs["pythia"])} and set(table.seed) == {0, 1}


def test_cells_of_one_model_at_other_seeds_share_its_activation_sets(local_run):
    """The local executor links the first seed's activation sets into the later seeds' run folders (the same files,
    not new collections); that they change no number is shown by the Ray grid, which shares nothing, giving the same
    numbers (test_killed_ray_worker_is_retried_and_the_grid_matches_the_local_run)."""
    by_model = {}
    for c in local_run.cells:
        by_model.setdefault(c.cell.model, []).append(c.folder)
    for first, later in by_model.values():
        sets = sorted(p.relative_to(first) for p in first.glob("acts/*/*") if p.is_file())
        assert sets, "the toy probes collect activation sets"
        assert [os.stat(later / p).st_ino for p in sets] == [os.stat(first / p).st_ino for p in sets]
    other = by_model[local_run.cells[0].cell.model][0]
    assert not any(set(os.listdir(other / "acts")) & set(os.listdir(f / "acts"))
                   for f in by_model[local_run.cells[-1].cell.model])  # nothing crosses models


def test_a_multi_device_cell_loads_nothing_when_everything_is_cached(local_run, tmp_path):
    first = local_run.cells[0]
    out = run_cell(first.cell.config, str(tmp_path / "cell.log"), split=True)
    assert out["computed"] == [] and out["folder"] == str(first.folder)
    assert "computed nothing (all cached)" in (tmp_path / "cell.log").read_text()


def test_a_grid_resolves_each_model_once(local_run, make_grid, tmp_path, monkeypatch):
    """A grid resolves each model once for all its cells (``model_ref``: their run folders, cache keys and loads use
    that reference), and a cell run on its own (a Ray task) resolves its model once. Before, the local executor
    resolved each cell's model twice (its run folder, then its sweep: 8 for these 4 cells) and a multi-device cell
    twice (its plan, then its sweep)."""
    from interp_bayes.model import loading

    calls = []
    real = loading.resolve
    monkeypatch.setattr(loading, "resolve", lambda name, *a, **kw: calls.append(str(name)) or real(name, *a, **kw))
    first = local_run.cells[0]
    again = run_grid(make_grid(Path(first.cell.config["out"])), quiet=True)
    assert again.computed == 0
    assert sorted(calls) == sorted({c.cell.model for c in local_run.cells})
    calls.clear()
    assert run_cell(first.cell.config, str(tmp_path / "cell.log"), split=True)["computed"] == []
    assert calls == [first.cell.model]


def test_ray_reuses_cells_finished_locally(local_run, make_grid, ray_session):
    again = run_grid(make_grid(Path(local_run.cells[0].cell.config["out"])), executor="ray", quiet=True)
    assert again.computed == 0 and all(c.error is None for c in again.cells)
    assert [c.folder for c in again.cells] == [c.folder for c in local_run.cells]


def test_a_cell_no_ray_node_can_take_is_refused_before_any_runs(make_grid, ray_session, tmp_path):
    grid = make_grid(tmp_path)
    grid["config"]["threads"] = 3  # the session has 2 CPUs
    with pytest.raises(GridError, match=r"needs 3 CPUs but the largest Ray node offers 2; use a bigger node"):
        run_grid(grid, executor="ray", quiet=True)
    assert not list(tmp_path.glob("*/*/probes"))


def test_killed_ray_worker_is_retried_and_the_grid_matches_the_local_run(local_run, make_grid, ray_session,
                                                                        tmp_path):
    """Ray from scratch with one worker killed in the middle of a cell: the retry reuses the stages that cell had
    finished, and every number equals the local executor's. Then the local executor reruns it: nothing computed."""
    out = tmp_path / "ray"
    result: dict = {}
    driver = threading.Thread(target=lambda: result.update(run=run_grid(make_grid(out), executor="ray", quiet=True)))
    driver.start()
    deadline = time.monotonic() + TIMEOUT
    while not (first := sorted(out.glob("*/*/probes/*/stage.json"))):
        assert driver.is_alive() and time.monotonic() < deadline, "no stage finished"
        time.sleep(0.02)
    folder = first[0].parents[2]
    finished = {p: p.stat().st_mtime_ns for p in folder.glob("probes/*/stage.json")}
    log = out / "grids" / "toy" / "logs" / f"{folder.parent.name}-{folder.name}.log"
    pid = int(log.read_text().split("=== start")[-1].split(" pid ")[1].split()[0])
    os.kill(pid, signal.SIGKILL)
    killed_at = len(list(folder.glob("probes/*/stage.json")))
    driver.join(TIMEOUT)
    assert not driver.is_alive() and "run" in result
    run = result["run"]
    assert killed_at < len(PROBES), "the kill landed after the cell finished: make its probes heavier"
    assert log.read_text().count("=== start") == 2  # the killed attempt and its retry
    for stage, mtime in finished.items():
        assert stage.stat().st_mtime_ns == mtime, f"{stage} was recomputed by the retry"
    retried = next(c for c in run.cells if c.folder == folder)
    assert set(retried.computed) == set(PROBES) - {p.parent.name for p in finished}
    assert_same_numbers(run, local_run)
    assert (run.folder / "grid.html").exists()
    again = run_grid(make_grid(out), quiet=True)  # a cell finished on Ray is never recomputed locally
    assert again.computed == 0


def test_failed_cells_are_named_with_their_logs(make_grid, tmp_path):
    grid = make_grid(tmp_path)
    grid["config"]["layers"] = [7]
    with pytest.raises(GridError, match=r"4 of 4 cells failed: tiny-llama3\S* seed 0 \(ConfigError: Layer 7 is "
                                        r"out of range .*; log .*\.log\)"):
        run_grid(grid, quiet=True)
    logs = sorted((tmp_path / "grids" / "toy" / "logs").glob("*.log"))
    assert len(logs) == 4 and "Traceback" in logs[0].read_text()


def test_cli_grid_command(local_run, make_grid, tmp_path, capsys):
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(make_grid(Path(local_run.cells[0].cell.config["out"]))))
    assert cli.main(["grid", str(path), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "4 cells, 0 stages computed" in printed and f"grid page: {local_run.page}" in printed
    assert cli.main(["grid", str(path), "--address", "auto"]) == 2
    assert "--address needs --executor ray" in capsys.readouterr().err


def test_grid_help_imports_neither_ray_nor_torch():
    code = ("import sys; from interp_bayes.cli import build_parser; build_parser('grid'); "
            "print(sorted({'ray', 'torch', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


# --- a store that several processes share -----------------------------------------------------------------------

def test_stage_lock_makes_a_second_holder_wait(tmp_path):
    events = []

    def second():
        with stage_lock(tmp_path, "probe-x", lambda: events.append("waiting")):
            events.append("in")

    with stage_lock(tmp_path, "probe-x"):
        waiter = threading.Thread(target=second)
        waiter.start()
        time.sleep(0.3)
        assert events == ["waiting"]  # blocked while the lock is held
    waiter.join(10)
    assert events == ["waiting", "in"]


def test_stale_temp_files_are_removed_only_when_no_one_else_works_in_the_folder(tmp_path):
    (tmp_path / ".rows.json.abc123").write_text("half")
    with working_in(tmp_path):  # alone: a killed run's leftover goes
        assert not (tmp_path / ".rows.json.abc123").exists()
        (tmp_path / ".report.html.def456").write_text("being written by this process")
        with working_in(tmp_path):  # a second process arrives: the first one's temp file is live
            assert (tmp_path / ".report.html.def456").exists()
    with working_in(tmp_path):
        assert not (tmp_path / ".report.html.def456").exists()


def test_two_processes_racing_on_one_cell_compute_each_stage_once(local_run, tiny_dirs, recipes, tmp_path):
    """Both sweeps are held at the first stage's lock until both wait there, then race through every stage."""
    out, racing = tmp_path / "race", recipes[:3]  # keys, mixed, icl
    config = SweepConfig(model=str(tiny_dirs["llama3"]), out=str(out), prompts="basic", probes=racing, seed=0)
    folder = run_folder(config)
    cmd = [sys.executable, "-m", "interp_bayes.cli", "sweep", "--model", config.model, "--out", str(out),
           "--prompts", "basic", "--seed", "0", "--threads", "1", "--probes", *racing]
    with stage_lock(folder, "probe-keys"):
        procs = [subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for _ in range(2)]
        lines: list[list[str]] = [[], []]

        def read(i):
            for line in procs[i].stdout:
                lines[i].append(line)
        readers = [threading.Thread(target=read, args=(i,)) for i in range(2)]
        for r in readers:
            r.start()
        deadline = time.monotonic() + TIMEOUT
        while not all(any(line.startswith("[waiting] keys") for line in got) for got in lines):
            assert all(p.poll() is None for p in procs), "".join(lines[0] + lines[1])
            assert time.monotonic() < deadline, "the sweeps never reached the first stage"
            time.sleep(0.05)
    for p, r in zip(procs, readers):
        assert p.wait(TIMEOUT) == 0, "".join(lines[0] + lines[1])
        r.join()
    done = [line.split()[1] for got in lines for line in got if line.startswith("[done]")]
    assert sorted(done) == sorted(PROBES[:3])  # every stage computed exactly once, by one of the two
    reference = next(c.folder for c in local_run.cells if c.cell.model == config.model and c.cell.seed == 0)
    mine = numbers(folder)
    assert sorted(mine) == sorted(done) and mine == {k: v for k, v in numbers(reference).items() if k in mine}
    leftovers = [p for p in folder.rglob("*") if p.name.startswith(".")]
    assert leftovers == []


def test_files_and_folders_respect_the_umask(tiny_dirs, recipes, tmp_path):
    old = os.umask(0o002)  # a group that shares a store: group-writable, world-readable
    try:
        run_sweep(SweepConfig(model=str(tiny_dirs["pythia"]), out=str(tmp_path), prompts="basic",
                              probes=[recipes[0]], quiet=True))
    finally:
        os.umask(old)
    paths = list(tmp_path.rglob("*"))
    assert any(p.name == "probe-keys.lock" for p in paths) and any(p.name == "stage.json" for p in paths)
    for p in paths:
        assert p.stat().st_mode & 0o777 == (0o775 if p.is_dir() else 0o664), p


# --- the grid page ---------------------------------------------------------------------------------------------

def test_grid_page_reads_every_headline_from_the_run_folders(local_run):
    html = local_run.page.read_text()
    cells = [CellView.load(c.folder) for c in local_run.cells]
    for cell, result in zip(cells, local_run.cells):
        rows = {p.parent.name: json.loads(p.read_text()) for p in result.folder.glob("probes/*/rows.json")}
        pc1 = max((r for r in rows["mixed"] if r["metric"] == "pc1_share"), key=lambda r: r["scope"]["layer"])
        mae = next(r for r in rows["icl"] if r["metric"] == "entropy_mae" and r["scope"].get("condition") == "main"
                   and r["scope"].get("subset") == "k>=1")
        got = {label: row.value for h in HEADLINES for label, row in headline_rows(cell, h).items()}
        assert got["PC1 share (mixed)"] == pc1["value"] and got["SULA MAE, k≥1 (bits)"] == mae["value"]
        assert f"{pc1['value']:.4g} ({pc1['low']:.4g}, {pc1['high']:.4g}) · null [{pc1['null_low']:.4g}, " \
               f"{pc1['null_high']:.4g}]" in html
        assert "axis held-out r (partial)" not in got  # no deconfounded rows in these runs ...
    assert "axis held-out r (partial)" in html and "<td class=\"num\">—</td>" in html  # ... shown as —
    figs = {f.id: f for f in scaling_figures(cells)}
    fig = figs["grid-pc1-pc1-share-mixed-params"].content
    values = sorted(y for t in fig.data if t.mode == "lines+markers" for y in t.y)
    assert values == sorted(headline_rows(c, HEADLINES[0])["PC1 share (mixed)"].value for c in cells)
    assert not any(i.endswith("-step") for i in figs)  # no training steps in this grid


def test_training_steps_come_from_revisions_or_checkpoint_folders(local_run, tmp_path):
    folders = []
    for step, cell in zip((2000, 1000), local_run.cells[:2]):
        folder = tmp_path / f"run{step}"
        shutil.copytree(cell.folder, folder)
        config = yaml.safe_load((folder / "config.yaml").read_text())
        (folder / "config.yaml").write_text(yaml.safe_dump(dict(config, revision=f"step{step}", seed=0)))
        folders.append(folder)
    cells = [CellView.load(f) for f in folders]
    assert [c.step for c in cells] == [2000, 1000]
    fig = next(f for f in scaling_figures(cells) if f.id == "grid-pc1-pc1-share-mixed-step").content
    line = next(t for t in fig.data if t.mode == "lines+markers")
    assert list(line.x) == [1000, 2000] and line.name.endswith("seed 0")
    page = build_grid_page(folders, tmp_path / "steps.html", title="steps")
    assert "PC1 share (mixed) vs training step" in page.read_text()
    checkpoint = CellView.load(folders[0])
    checkpoint.run.config.update(revision=None, model="/runs/bijection/checkpoints/step_000050")
    assert checkpoint.step == 50 and checkpoint.series == "bijection/checkpoints"
