"""A sweep killed with SIGKILL mid-run resumes: finished probes are reused untouched, the final numbers equal an
uninterrupted run's, and no half-written or temporary file is left behind."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from interp_bayes.run.config import SweepConfig
from interp_bayes.run.sweep import run_sweep
from interp_bayes.model.testing import make_tiny_model

# Run in this order: `keys` (weights only) finishes first; the later ones take a few seconds on the tiny model, so
# the kill lands while the sweep is still running.
PROBES = {
    "keys": dict(kind="keys", n_null=10),
    "mixed": dict(kind="manifold", per_bin=4, n_boot=4000, n_null=600, n_resample=600),
    "icl": dict(kind="icl", per_k=20, layers=[1], n_boot=300, n_null=50),  # layer 0 sees the last token only
    "axis": dict(kind="axis", per_k=20, layers=[1], folds=3),
}
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
TIMEOUT = 180


def _command(model: Path, out: Path, probes: list[str]) -> list[str]:
    return [sys.executable, "-m", "interp_bayes.cli", "sweep", "--model", str(model), "--out", str(out),
            "--prompts", "basic", "--probes", *probes, "--quiet"]


def _results(folder: Path) -> dict[str, str]:
    """Relative path -> canonical content of every result file (stages without timing; tensors as hex digests).
    Left out: env.json (time), config.yaml (holds the output root) and report.html (holds paths and times)."""
    import hashlib

    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = str(path.relative_to(folder))
        if rel in ("env.json", "config.yaml", "report.html"):
            continue
        if path.name == "stage.json":
            data = {k: v for k, v in json.loads(path.read_text()).items() if k != "seconds"}
        elif path.suffix == ".json":
            data = json.loads(path.read_text())
        else:
            data = hashlib.sha256(path.read_bytes()).hexdigest()
        out[rel] = json.dumps(data, sort_keys=True)  # text: NaN compares equal to NaN
    return out


@pytest.fixture
def sweep_setup(tmp_path):
    model = tmp_path / "tiny-llama3"
    make_tiny_model("llama3", model)
    paths = []
    for name, body in PROBES.items():
        path = tmp_path / "probes" / f"{name}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(body))
        paths.append(str(path))
    return model, paths


def test_sweep_killed_mid_run_resumes_without_recomputing(sweep_setup, tmp_path):
    model, probes = sweep_setup
    killed_out, clean_out = tmp_path / "killed", tmp_path / "clean"

    # the uninterrupted reference runs alongside (its CPU use only slows the killed run, which helps the kill land)
    clean = subprocess.Popen(_command(model, clean_out, probes), env=ENV, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    first = subprocess.Popen(_command(model, killed_out, probes), env=ENV, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + TIMEOUT
        # a finished stage: sealed and renamed into place (a stage is sealed inside its hidden temporary folder first)
        while not [p for p in killed_out.glob("*/*/probes/*/stage.json") if not p.parent.name.startswith(".")]:
            assert first.poll() is None, f"the sweep exited ({first.returncode}) before any probe finished: " \
                                         f"{first.stderr.read()}"
            assert time.monotonic() < deadline, "no probe finished in time"
            time.sleep(0.01)
        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=30) == -signal.SIGKILL
    finally:
        if first.poll() is None:
            first.kill()
        first.stderr.close()

    (folder,) = killed_out.glob("*/*")
    finished = {p.parent.name: {f.name: (f.stat().st_mtime_ns, f.read_bytes()) for f in p.parent.iterdir()}
                for p in folder.glob("probes/*/stage.json") if not p.parent.name.startswith(".")}
    assert len(finished) < len(PROBES), "the kill landed after the sweep finished: make later probes heavier"
    assert "keys" in finished and set(finished) < set(PROBES), sorted(finished)
    leftovers_at_kill = sorted(str(p.relative_to(folder)) for p in folder.rglob(".*"))

    resumed = subprocess.run(_command(model, killed_out, probes), env=ENV, capture_output=True, text=True,
                             timeout=TIMEOUT)
    assert resumed.returncode == 0, resumed.stderr
    assert f"run folder: {folder}" in resumed.stdout
    _, clean_err = clean.communicate(timeout=TIMEOUT)
    assert clean.returncode == 0, clean_err

    # (a) probes finished before the kill are reused as they were, byte for byte, not rewritten
    for name, files in finished.items():
        for file, (mtime, content) in files.items():
            path = folder / "probes" / name / file
            assert path.stat().st_mtime_ns == mtime and path.read_bytes() == content, (name, file)
    assert {p.parent.name for p in folder.glob("probes/*/stage.json")} == set(PROBES)
    third = run_sweep(SweepConfig(model=str(model), out=str(killed_out), prompts="basic", probes=probes, quiet=True))
    assert third.folder == folder and third.computed == []

    # (b) the resumed run's results equal an uninterrupted run's (timing fields aside)
    (clean_folder,) = clean_out.glob("*/*")
    assert clean_folder.name == folder.name  # same config digest
    got, want = _results(folder), _results(clean_folder)
    assert sorted(got) == sorted(want)
    for rel in want:
        assert got[rel] == want[rel], f"{rel} differs between the resumed and the uninterrupted run"
    rows = json.loads(got["probes/mixed/rows.json"])
    assert next(r for r in rows if r["metric"] == "pc1_share")["n"] == 20  # sanity: real content

    # (c) nothing half-written: no temporary files beside the results, every JSON parses (checked by _results)
    leftovers = sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                       if p.name.startswith(".") or p.name.endswith(".tmp"))
    assert leftovers == [], f"temporary files left: {leftovers} (at kill time: {leftovers_at_kill})"


def test_two_workers_compute_each_stage_once_with_the_results_of_one(sweep_setup, tmp_path):
    """``--workers 2``: a helper process computes stages of the same folder beside the first worker; every stage is
    computed once (by one of them: the other passes over it while held and finds it cached) and the results equal a
    one-worker run's byte for byte (timing aside)."""
    model, probes = sweep_setup
    two = subprocess.run([*_command(model, tmp_path / "two", probes)[:-1], "--workers", "2"], env=ENV,
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert two.returncode == 0, two.stderr
    one = subprocess.run([*_command(model, tmp_path / "one", probes), "--workers", "1"], env=ENV,
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert one.returncode == 0, one.stderr
    done = [line.removeprefix("[worker 2] ").split()[1] for line in two.stdout.splitlines()
            if line.removeprefix("[worker 2] ").startswith("[done] ")]
    assert sorted(done) == sorted(PROBES), two.stdout  # each stage computed once, by one worker
    (folder_two,), (folder_one,) = (tmp_path / "two").glob("*/*"), (tmp_path / "one").glob("*/*")
    assert folder_two.name == folder_one.name  # workers do not enter the run's id
    got, want = _results(folder_two), _results(folder_one)
    assert sorted(got) == sorted(want)
    for rel in want:
        assert got[rel] == want[rel], f"{rel} differs between two workers and one"


def test_sigterm_to_a_two_worker_sweep_stops_both_and_the_rerun_equals_a_clean_run(sweep_setup, tmp_path):
    """SIGTERM to the first of two workers while both compute a stage: it stops the helper (no orphan computes on),
    exits 143 with one line, leaves no temporary folder, and a rerun computes only the rest, with the results of an
    uninterrupted one-worker run."""
    import psutil

    model, probes = sweep_setup
    out, clean_out = tmp_path / "stopped", tmp_path / "clean"
    clean = subprocess.Popen([*_command(model, clean_out, probes), "--workers", "1"], env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = subprocess.Popen([*_command(model, out, probes), "--workers", "2"], env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + TIMEOUT
        while len(list(out.glob("*/*/probes/.*"))) < 2:  # two stages building at once: one per worker
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.01)
        children = {p: " ".join(p.cmdline()) for p in psutil.Process(first.pid).children(recursive=True)}
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=TIMEOUT)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and len([x for x in err.splitlines() if "terminated (SIGTERM)" in x]) == 1, err
    # the helper worker is gone when the first exits; multiprocessing's resource tracker follows within moments
    workers = [p for p, command in children.items() if "spawn_main" in command]
    assert len(workers) == 1 and not [p for p in workers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    _, alive = psutil.wait_procs(list(children), timeout=30)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive
    (folder,) = out.glob("*/*")
    assert not list(folder.rglob(".*")), "a stage's temporary folder was left behind"
    finished = {p.parent.name for p in folder.glob("probes/*/stage.json")}
    assert finished < set(PROBES), "the stop landed after the sweep finished: make the probes heavier"

    rerun = run_sweep(SweepConfig(model=str(model), out=str(out), prompts="basic", probes=probes, quiet=True,
                                  workers=1))
    assert sorted(rerun.computed) == sorted(set(PROBES) - finished)
    _, clean_err = clean.communicate(timeout=TIMEOUT)
    assert clean.returncode == 0, clean_err
    (clean_folder,) = clean_out.glob("*/*")
    got, want = _results(folder), _results(clean_folder)
    assert sorted(got) == sorted(want)
    for rel in want:
        assert got[rel] == want[rel], f"{rel} differs between the rerun after a stop and an uninterrupted run"
