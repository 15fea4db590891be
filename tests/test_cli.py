"""The command line and the sweep runner end to end on a tiny model: run folder, tidy rows, caching by content,
parameters checked, errors without tracebacks."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from interp_bayes.cli import main
from interp_bayes.core.errors import ConfigError
from interp_bayes.run.config import SweepConfig
from interp_bayes.core.results import find, select
from interp_bayes.run.sweep import builtin_probes, load_probe, plan_sweep, run_sweep

SMALL_PROBES = {  # the built-in recipes at toy sizes, for the 64-prompt basic set and a 2-layer model
    "mixed.yaml": dict(kind="manifold", per_bin=4, n_boot=30, n_null=10, n_resample=10),
    "math.yaml": dict(kind="manifold", domain="mathematics", per_bin=2, n_boot=30, n_null=10, n_resample=10),
    "keys.yaml": dict(kind="keys", n_null=10),
    "focusing.yaml": dict(kind="focusing", per_bin=3, n_boot=30),
    "icl.yaml": dict(kind="icl", per_k=4, layers=[1], n_boot=30, n_null=10),  # layer 0 sees the last token only
    "axis.yaml": dict(kind="axis", per_k=4, layers=[1], folds=3),
}


def write_probes(folder, probes: dict) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in probes.items():
        (folder / name).write_text(yaml.safe_dump(body))
    return [str(folder / name) for name in probes]


@pytest.fixture
def small_probes(tmp_path):
    return write_probes(tmp_path / "probes", SMALL_PROBES)


def test_sweep_writes_run_folder_and_resumes(tiny_dirs, tmp_path, small_probes, capsys):
    out = tmp_path / "runs"
    args = ["sweep", "--model", str(tiny_dirs["llama3"]), "--out", str(out), "--prompts", "basic", "--quiet",
            "--probes", *small_probes]
    assert main(args) == 0
    (folder,) = list(out.glob("*/*"))
    for name in ("config.yaml", "env.json", "run.json", "model.json", "sula_task.json", "results.csv", "report.html"):
        assert (folder / name).exists(), name
    for probe in ("mixed", "math", "keys", "focusing", "icl", "axis"):
        for name in ("stage.json", "rows.json", "data.json"):
            assert (folder / "probes" / probe / name).exists(), (probe, name)
    assert (folder / "probes" / "axis" / "axes" / "pc1-conditional-L1" / "axis.safetensors").exists()
    config = SweepConfig(model=str(tiny_dirs["llama3"]), out=str(out), prompts="basic", quiet=True,
                         probes=small_probes)
    run = run_sweep(config)
    rows = run.rows
    assert find(rows, "dim", layer=1).value == 2 * 24  # GQA: 2 kv heads of 24
    share = find(rows, "pc1_share", layer=1)
    assert share.probe == "mixed" and share.kind == "manifold" and share.n == 20  # 4 per quintile
    assert 0 < share.value <= find(rows, "pc12_share", layer=1).value <= 1
    assert share.low <= share.high and share.interval == "resampled 95%" and share.null.startswith("permuted")
    assert len(json.loads((folder / "probes" / "math" / "data.json").read_text())["indices"]) == 10
    shuffled = find(rows, "bayes_entropy", condition="shuffled", subset="all")
    assert shuffled.value == 1.0 and shuffled.unit == "bits"
    env = json.loads((folder / "env.json").read_text())
    assert env["seed"] == 0 and env["packages"]["transformers"]
    assert env["float32"] == "ieee"  # the mode that ran: conftest pins IEEE, so auto resolves to it on any CPU
    assert yaml.safe_load((folder / "config.yaml").read_text())["prompts"] == "basic"
    printed = capsys.readouterr().out
    # the terminal ends with the claims ledger (one line a claim), not the table of every number
    assert printed.startswith("claims ledger: ") and f"run folder: {folder}" in printed
    assert "In-context entropy is calibrated to Bayes" in printed and "SULA entropy MAE vs Bayes" not in printed
    assert len(printed.splitlines()) <= 20
    assert run.folder == folder and run.computed == []  # everything reused, nothing recomputed
    assert "SULA entropy MAE vs Bayes" in run._repr_html_() and len(run.figure().data) > 0
    table = run.table()
    assert len(table) == len(rows) and {"probe", "metric", "layer", "value", "verdict"} <= set(table.columns)


def test_summary_is_rebuilt_from_the_tidy_table_alone(tiny_dirs, tmp_path, small_probes):
    """Every number of the summary comes from the rows: the summary of the rows as exported equals the report's."""
    from interp_bayes.core.registry import get_kind
    from interp_bayes.report.view import RunView
    from interp_bayes.core.results import Row

    run = run_sweep(SweepConfig(model=str(tiny_dirs["llama3"]), out=str(tmp_path), prompts="basic", quiet=True,
                                probes=small_probes))
    view = RunView.load(run.folder)
    exported = [Row.from_dict(r) for r in json.loads(json.dumps([r.to_dict() for r in view.rows()]))]
    rebuilt = []
    for probe in view.probes():
        rows = [r for r in exported if r.probe == probe.name]
        rebuilt += get_kind(probe.kind).summary(rows, probe.params_object())
    assert [(line.label, line.value) for line in rebuilt] == [(line.label, line.value) for line in view.summary()]
    assert len(rebuilt) >= 12


def test_changing_a_parameter_recomputes_and_leaving_it_does_not(tiny_dirs, tmp_path):
    """The stale-cache repro: focusing with per_bin 2, then 4, must compute on 4 prompts per bin."""
    out, model = tmp_path / "runs", str(tiny_dirs["llama3"])

    def focusing(per_bin):
        probes = write_probes(tmp_path / "p", {"focusing.yaml": dict(kind="focusing", per_bin=per_bin, n_boot=20)})
        return run_sweep(SweepConfig(model=model, out=str(out), prompts="basic", quiet=True, probes=probes))

    first = focusing(2)
    assert find(first.rows, "focusing_reduction").n == 10 and first.computed == ["focusing"]
    assert focusing(2).computed == []
    second = focusing(4)
    assert second.computed == ["focusing"] and find(second.rows, "focusing_reduction").n == 20
    assert second.folder == first.folder  # same run, the pool activations reused
    stage = json.loads((second.folder / "probes" / "focusing" / "stage.json").read_text())
    assert stage["params"]["per_bin"] == 4


@pytest.mark.parametrize("kind, changes", [
    ("manifold", dict(per_bin=3, domain="mathematics", n_resample=3, n_bins=4, seed=5)),
    ("icl", dict(per_k=3, seed=7, conditions=["main"])),
    ("axis", dict(folds=2, methods=["ridge"], per_k=3)),
])
def test_every_parameter_that_changes_the_numbers_recomputes(tiny_dirs, tmp_path, kind, changes):
    base = dict(manifold=dict(per_bin=2, n_boot=10, n_null=5, n_resample=2),
                icl=dict(per_k=2, layers=[1], n_boot=10, n_null=5, conditions=["main", "shuffled"]),
                axis=dict(per_k=4, layers=[1], folds=3))[kind]
    out, model = str(tmp_path / "runs"), str(tiny_dirs["pythia"])

    def sweep(params):
        probes = write_probes(tmp_path / "p", {"probe.yaml": dict(kind=kind, **params)})
        run = run_sweep(SweepConfig(model=model, out=out, prompts="basic", quiet=True, probes=probes))
        return run.computed, sorted(json.dumps(r.to_dict(), sort_keys=True) for r in run.rows)

    computed, rows = sweep(base)
    assert computed == ["probe"] and sweep(base) == ([], rows)
    for key, value in changes.items():
        changed_computed, changed_rows = sweep(dict(base, **{key: value}))
        assert changed_computed == ["probe"], key
        assert changed_rows != rows, key


def test_unknown_and_mistyped_parameters_are_refused(tmp_path):
    path = tmp_path / "focusing.yaml"
    path.write_text(yaml.safe_dump(dict(kind="focusing", per_bim=4)))
    with pytest.raises(ConfigError, match=r"Unknown parameter\(s\) per_bim for probe kind 'focusing'; valid "
                                          r"parameters: n_boot, per_bin, prompts\."):
        load_probe(path)
    path.write_text(yaml.safe_dump(dict(kind="focusing", per_bin="four")))
    with pytest.raises(ConfigError, match="Parameter 'per_bin' of probe kind 'focusing' must be int, not 'four'"):
        load_probe(path)
    path.write_text(yaml.safe_dump(dict(kind="focussing")))
    with pytest.raises(ConfigError, match="Unknown probe kind 'focussing'; known kinds: "):
        load_probe(path)


def test_a_renamed_built_in_recipe_keeps_its_summary_and_figures(tiny_dirs, tmp_path):
    """The report knows kinds, not recipe names: `focus` and `sula` get the focusing and icl summary and figures."""
    probes = write_probes(tmp_path / "p", {"focus.yaml": SMALL_PROBES["focusing.yaml"],
                                           "sula.yaml": SMALL_PROBES["icl.yaml"]})
    run = run_sweep(SweepConfig(model=str(tiny_dirs["llama3"]), out=str(tmp_path), prompts="basic", quiet=True,
                                probes=probes))
    labels = [line.label for line in run.summary()]
    assert "attention focusing (first -> last layer)" in labels
    assert "SULA entropy MAE vs Bayes latent entropy (bits)" in labels
    page = (run.folder / "report.html").read_text()
    for needle in ("fig-focusing-focus", "fig-icl-sula", "fig-icl-geometry-sula", "In-context calibration"):
        assert needle in page


def test_interrupted_run_has_a_report_and_resumes(tiny_dirs, tmp_path):
    """Ctrl-C in the third probe: one line, exit 130, a report of the two finished probes, and a rerun that
    computes only the rest."""
    probes = write_probes(tmp_path / "p", {"keys.yaml": SMALL_PROBES["keys.yaml"],
                                           "mixed.yaml": SMALL_PROBES["mixed.yaml"],
                                           "icl.yaml": dict(SMALL_PROBES["icl.yaml"], per_k=40)})
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    # the process sends itself a real SIGINT (as Ctrl-C does) as the third probe starts: a signal sent from here once
    # the second stage's file shows raced the third probe, which takes a few seconds (on a busy CI machine it ended first)
    interrupt_icl = ("import os, signal, sys; import interp_bayes.run.sweep as s; from interp_bayes.cli import main; "
                     "run = s._run_probe; s._run_probe = lambda ctx, probe, *a, **k: "
                     "(probe.name == 'icl' and os.kill(os.getpid(), signal.SIGINT), run(ctx, probe, *a, **k))[1]; "
                     "sys.exit(main(sys.argv[1:]))")
    cmd = [sys.executable, "-c", interrupt_icl, "sweep", "--model", str(tiny_dirs["llama3"]), "--out",
           str(tmp_path / "runs"), "--prompts", "basic", "--quiet", "--probes", *probes]
    # a shell's background job inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted after 2 of 3 probes; rerun the same command to resume" in err
    (folder,) = list((tmp_path / "runs").glob("*/*"))
    page = (folder / "report.html").read_text()
    assert "Partial run" in page and "mixed PC1" in page and "key orthogonality" in page
    assert not (folder / "probes" / "icl" / "stage.json").exists()
    config = SweepConfig(model=str(tiny_dirs["llama3"]), out=str(tmp_path / "runs"), prompts="basic", quiet=True,
                         probes=probes)
    assert run_sweep(config).computed == ["icl"]


def test_dry_run_lists_the_plan_without_computing(tiny_dirs, tmp_path, small_probes, capsys):
    config = SweepConfig(model=str(tiny_dirs["llama3"]), out=str(tmp_path), prompts="basic", quiet=True,
                         probes=small_probes)
    plan = plan_sweep(config)
    assert not any(tmp_path.glob("*/*/probes"))
    assert all(item.cached is False for item in plan if item.what.startswith("probe of kind"))
    assert sum(item.forwards for item in plan) >= 64 and sum(item.disk_bytes for item in plan) > 0
    run_sweep(config)
    assert all(item.cached for item in plan_sweep(config))
    assert main(["sweep", "--model", str(tiny_dirs["llama3"]), "--out", str(tmp_path), "--prompts", "basic",
                 "--probes", *small_probes, "--dry-run"]) == 0
    assert "total still to run: 0 prompt forwards" in capsys.readouterr().out


def test_redo_recomputes_a_cached_probe(tiny_dirs, tmp_path, small_probes):
    config = SweepConfig(model=str(tiny_dirs["llama3"]), out=str(tmp_path), prompts="basic", quiet=True,
                         probes=small_probes[2:3])
    first = run_sweep(config)
    again = run_sweep(config, redo=["keys"])
    assert again.computed == ["keys"] and [r.value for r in again.rows] == [r.value for r in first.rows]
    with pytest.raises(ConfigError, match="--redo names nope, which are not probes of this sweep"):
        run_sweep(config, redo=["nope"])


def test_results_export_and_probes_listing(tiny_dirs, tmp_path, small_probes, capsys):
    run = run_sweep(SweepConfig(model=str(tiny_dirs["llama3"]), out=str(tmp_path), prompts="basic", quiet=True,
                                probes=small_probes[2:3]))
    assert main(["results", str(run.folder)]) == 0
    csv_text = capsys.readouterr().out
    assert csv_text.splitlines()[0].startswith("run,model,model_key,probe,kind,metric,layer,value,low,high,interval,"
                                               "null_low")
    assert f"{run.folder.name},{tiny_dirs['llama3'].name}," in csv_text
    assert ",keys,keys,key_orthogonality,1," in csv_text
    assert main(["results", str(run.folder), "--format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert records[0]["metric"] == "key_orthogonality" and records[0]["verdict"] in ("above null", "within null",
                                                                                     "below null")
    assert main(["probes"]) == 0
    listing = capsys.readouterr().out
    assert "kind focusing:" in listing and "    per_bin = 15" in listing and "manifold_math" in listing


def test_help_is_fast_and_version_answers(capsys):
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "interp_bayes.cli", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "sweep" in proc.stdout and time.perf_counter() - t < 5
    probe = subprocess.run([sys.executable, "-X", "importtime", "-m", "interp_bayes.cli", "--help"],
                           capture_output=True, text=True)
    assert "torch" not in probe.stderr and "transformers" not in probe.stderr  # nothing heavy is imported
    with pytest.raises(SystemExit):
        main(["--version"])
    import tomllib

    version = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["version"]
    assert f"interp-bayes {version}" in capsys.readouterr().out  # the package's version is pyproject's


def test_bad_inputs_are_one_sentence(tiny_dirs, tmp_path):
    for args, message in ((["sweep", "--model", str(tiny_dirs["llama3"]), "--out", str(tmp_path), "--probes",
                            "keys", "--layers", "99", "--prompts", "basic"], "Layer 99 is out of range"),
                          (["train", "bijection", "--preset", "gpu", "--out", str(tmp_path / "t")],
                           "Unknown preset 'gpu' for bijection")):
        proc = subprocess.run([sys.executable, "-m", "interp_bayes.cli", *args], capture_output=True, text=True,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and message in proc.stderr, proc.stderr


def test_built_in_probes_load():
    names = builtin_probes()
    assert {"manifold_mixed", "manifold_math", "keys", "focusing", "icl", "axis"} <= set(names)
    assert load_probe("manifold_math").params.domain == "mathematics"
    with pytest.raises(ConfigError, match="No probe 'nope'; built-in probes: "):
        load_probe("nope")


def test_config_yaml_with_flag_override(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: pythia-70m\nlayers: [3]\nseed: 5\n")
    cfg = SweepConfig.from_yaml(path).override(seed=7, out=None)
    assert (cfg.model, cfg.layers, cfg.seed, cfg.out) == ("pythia-70m", [3], 7, "reports")
    assert cfg.digest() != SweepConfig.from_yaml(path).digest()
    assert cfg.digest() == cfg.override(out="elsewhere", quiet=True).digest()


def test_set_overrides_recipe_parameters_key_by_key():
    """--set merges into the recipe (nested mappings key by key), changes the probe's cache key but not the run id,
    and refuses a probe the sweep does not run, a parameter the kind does not know and a malformed assignment."""
    from interp_bayes.run.config import parse_set
    from interp_bayes.run.sweep import load_probes

    overrides = parse_set(["interventions.controls.isotropic=3", "interventions.ops=[cut]"])
    assert overrides == {"interventions": {"controls": {"isotropic": 3}, "ops": ["cut"]}}
    base = SweepConfig(probes=["interventions", "keys"])
    cfg = base.override(overrides=overrides)
    (probe, keys), (default, _) = load_probes(cfg), load_probes(base)
    assert dict(probe.params.controls) == {"isotropic": 3, "matched": 10, "pcs": 3}  # the recipe's other draws kept
    assert tuple(probe.params.ops) == ("cut",) and probe.key() != default.key()
    assert cfg.digest() == base.digest()
    assert cfg.override(overrides=parse_set(["interventions.per_k=20"])).overrides["interventions"] == dict(
        controls={"isotropic": 3}, ops=["cut"], per_k=20)
    with pytest.raises(ConfigError, match="Overrides name probe.s. icl that this sweep does not run"):
        load_probes(base.override(overrides=parse_set(["icl.per_k=20"])))
    with pytest.raises(ConfigError, match="Unknown parameter.s. nope for probe kind 'interventions'"):
        load_probes(base.override(overrides=parse_set(["interventions.nope=1"])))
    with pytest.raises(ConfigError, match="--set takes PROBE.PARAMETER=VALUE"):
        parse_set(["interventions=3"])


def test_unknown_config_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("modle: x\n")
    with pytest.raises(ConfigError, match=r"Unknown config key\(s\) \['modle'\]"):
        SweepConfig.from_yaml(path)


def test_hub_model_offline_is_one_sentence_not_a_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "interp_bayes.cli", "sweep", "--model", "pythia-410m", "--out",
                           str(tmp_path), "--quiet"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "Cannot fetch 'EleutherAI/pythia-410m'" in proc.stderr


def test_the_manifold_sample_is_the_recipes_and_the_run_seed_draws_only_the_nulls(tiny_dirs, tmp_path):
    """The prompts a manifold recipe reads are drawn with its own ``seed``: --seed 1 reads the same prompts as
    --seed 0 (its nulls differ), and another recipe seed draws another sample. (At --seed 0 and the default recipe
    seed the rows equal those of the code that drew the sample with --seed, checked by hand: 16 rows identical.)"""
    base = dict(kind="manifold", per_bin=4, n_boot=10, n_null=5, n_resample=2)
    probes = write_probes(tmp_path / "p", {"a.yaml": base, "b.yaml": dict(base, seed=7)})

    def sweep(seed):
        run = run_sweep(SweepConfig(model=str(tiny_dirs["llama3"]), out=str(tmp_path / f"s{seed}"), prompts="basic",
                                    quiet=True, probes=probes, seed=seed))
        return {p: json.loads((run.folder / "probes" / p / "data.json").read_text())["indices"] for p in "ab"}

    zero, one = sweep(0), sweep(1)
    assert zero == one and zero["a"] != zero["b"]


@pytest.mark.parametrize("kind, params, model", [
    ("interventions", dict(layer_sets=[[-1]], per_k=4, layers=[1]), "mistral"),
    ("windtunnel", dict(tunnel="bijection-cpu", n_sequences=6, n_boot=20, n_null=10, n_perm=20), "llama3"),
])
def test_the_interventions_split_is_the_recipes_and_the_run_seed_draws_only_the_controls(tiny_dirs, tmp_path,
                                                                                         kind, params, model):
    """The fit / evaluation halves of an interventions protocol are drawn with the recipe's ``split_seed``: --seed 1
    fits the same axis (its sigma) and evaluates on the same prompts (the unedited and the true cut's calibration) as
    --seed 0, against other matched control axes; another split seed draws other halves."""
    base = dict(kind=kind, ops=["cut"], controls=dict(isotropic=0, matched=2, pcs=0), **params)
    probes = write_probes(tmp_path / "p", {"a.yaml": base, "b.yaml": dict(base, split_seed=7)})

    def sweep(seed):
        rows = run_sweep(SweepConfig(model=str(tiny_dirs[model]), out=str(tmp_path / f"s{seed}"), quiet=True,
                                     probes=probes, seed=seed)).rows
        return {p: [r for r in rows if r.probe == p] for p in "ab"}

    def numbers(rows):
        cut = dict(op="cut", measure="mae_k_ge_1")
        return dict(sigma=[r.value for r in select(rows, "axis_sigma")],
                    baseline=find(rows, "mae_k_ge_1", condition="baseline").value,
                    true=find(rows, "effect", family="true", **cut).value,
                    matched=find(rows, "effect", family="matched", **cut).value)

    zero, one = sweep(0), sweep(1)
    a0, a1, b0 = numbers(zero["a"]), numbers(one["a"]), numbers(zero["b"])
    assert (a1["sigma"], a1["baseline"], a1["true"]) == (a0["sigma"], a0["baseline"], a0["true"])
    assert a1["matched"] != a0["matched"]  # the control axes are the run seed's
    assert b0["sigma"] != a0["sigma"] and b0["baseline"] != a0["baseline"]  # the split is the recipe's


def test_readout_prompts_beside_the_evaluation_half_move_the_readout_row_alone(tiny_dirs, tmp_path):
    """A recipe with ``readout_per_k: 2`` scores the widest layer set's cut, its matched cuts and the unedited run on
    8 more prompts (2 of each k >= 1): every row equals the recipe without them but the readout excess, which pools
    their errors (n 8 + 8, its note says so), and the cost, larger by exactly the 4 runs of 8 prompts the dry run
    counts. A negative count, and one with axes fitted on the evaluation prompts, are refused."""
    import dataclasses

    base = dict(kind="interventions", layer_sets=[[-1]], ops=["cut"], controls=dict(isotropic=0, matched=2, pcs=0),
                per_k=4, layers=[1])
    probes = write_probes(tmp_path / "p", {"a.yaml": base, "b.yaml": dict(base, readout_per_k=2)})
    config = SweepConfig(model=str(tiny_dirs["mistral"]), out=str(tmp_path / "run"), quiet=True, probes=probes)
    planned = [i for i in plan_sweep(config) if i.probe == "b" and "readout prompts" in i.what]
    rows = run_sweep(config).rows
    a, b = ([r for r in rows if r.probe == p] for p in "ab")
    moved = ("readout_excess", "forward_prompts")

    def same(rs):
        return [repr(dataclasses.replace(r, probe="")) for r in rs if r.metric not in moved]
    assert same(a) == same(b) and len(same(a)) > 10
    assert find(b, "forward_prompts").value - find(a, "forward_prompts").value == 4 * 8 == planned[0].forwards
    old, new = (find(rs, "readout_excess", op="cut") for rs in (a, b))
    assert (old.n, new.n) == (8, 16) and "(8 evaluation, 8 drawn beside them)" in new.note
    assert new.value != old.value
    for bad, match in ((dict(readout_per_k=-1), "whole number of at least 0"),
                       (dict(readout_per_k=True), "readout_per_k"),
                       (dict(readout_seed=-1), "'readout_seed' .* must be a seed from 0"),
                       (dict(readout_per_k=2, fit="in_sample"), "use fit: cross or readout_per_k: 0")):
        wrong = write_probes(tmp_path / "bad", {"c.yaml": dict(base, **bad)})
        with pytest.raises(ConfigError, match=match):
            plan_sweep(SweepConfig(model=str(tiny_dirs["mistral"]), out=str(tmp_path / "x"), quiet=True,
                                   probes=wrong))


def test_interventions_probe_on_a_tiny_model(tiny_dirs, tmp_path):
    probes = write_probes(tmp_path / "p", {"iv.yaml": dict(kind="interventions", layer_sets=[[-1]],
                                                           ops=["cut", "shift+"], controls=dict(isotropic=2, matched=2,
                                                                                                pcs=1),
                                                           per_k=4, layers=[1])})
    config = SweepConfig(model=str(tiny_dirs["mistral"]), out=str(tmp_path), quiet=True, probes=probes)
    planned = [i for i in plan_sweep(config) if i.probe == "iv" and "edited and unedited runs" in i.what]
    run = run_sweep(config)
    rows = run.rows
    # two unperturbed runs: one with the true edits and the PC, one with the single batch of random controls; every
    # family drawn to its cap here, so the dry run's "at most" is exact
    assert find(rows, "forward_prompts").value == (2 + 2 * 6) * 10 == planned[0].forwards
    effects = select(rows, "effect", measure="mae_k_ge_1")
    assert {r.scope["op"] for r in effects} == {"cut", "shift+"}
    assert {r.scope["family"] for r in effects} == {"true", "isotropic", "matched", "pcs"}
    iso = find(rows, "percentile_of_true", op="cut", measure="mae_k_ge_1", family="isotropic")
    assert iso.n == 2 and "too few draws" in iso.note and iso.test["draws"] == 2  # the cap: undecided
    data = json.loads((run.folder / "probes" / "iv" / "data.json").read_text())
    assert data["n_eval"] == 10 and data["n_fit"] == 10 and len(data["runs"]) == 2 * 6
    assert "too few draws for a percentile: 2" in " ".join(line.value for line in run.summary())


def test_windtunnel_probe_on_the_packaged_bijection_model(tiny_dirs, tmp_path):
    probes = write_probes(tmp_path / "p", {"wt.yaml": dict(kind="windtunnel", tunnel="bijection-cpu",
                                                           n_sequences=6, controls=dict(isotropic=2, matched=2, pcs=1),
                                                           n_boot=20, n_null=10)})
    run = run_sweep(SweepConfig(model=str(tiny_dirs["llama3"]), out=str(tmp_path), quiet=True, probes=probes))
    rows = run.rows
    assert find(rows, "entropy_mae", condition="windtunnel", subset="all").n == 6 * 20
    assert find(rows, "entropy_mae", condition="windtunnel", subset="all").value < 0.01  # matches the posterior
    assert find(rows, "spearman_pc1", target="bayes entropy").value > 0.8  # values ordered by exact entropy
    assert find(rows, "pearson_projection", layer=1, target="bayes entropy", fit="held-out").value > 0.8
    assert find(rows, "percentile_of_true", op="cut", measure="mae_k_ge_1", family="isotropic") is not None
    assert len(select(rows, "key_orthogonality")) == 2
    page = (run.folder / "report.html").read_text()
    assert "fig-windtunnel-calibration-wt" in page and "fig-windtunnel-geometry-wt" in page


def test_rival_probes_on_the_wind_tunnels(tiny_dirs, tmp_path):
    """The entropy-neuron and decoding kinds on packaged wind tunnels at toy sizes: each loads its checkpoint (the
    sweep's model is never loaded), reads the hypotheses, resolves layers against the tunnel's depth, and reports
    what the query position alone determines (the bijection's exact entropy) as inseparable / NaN with the reason."""
    probes = write_probes(tmp_path / "p", {
        "neurons_wt.yaml": dict(kind="entropy_neurons", tunnel="bijection-cpu", n_sequences=4, top_n=2, n_random=2,
                                n_boot=20, n_random_directions=10, n_perm=1000),  # a cap: p < 0.05 settles by ~600
        "dec_wt.yaml": dict(kind="decoding", tunnel="bijection-cpu", layers="all", readings=["resid", "v"],
                            n_sequences=4, folds=4, n_null=2, n_boot=20),  # folds of whole sequences: at most 4
        "dec_hmm.yaml": dict(kind="decoding", tunnel="hmm-cpu", layers="all", readings=["v"], n_sequences=4, folds=4,
                             n_null=2, n_boot=20)})
    run = run_sweep(SweepConfig(model=str(tiny_dirs["llama3"]), out=str(tmp_path / "runs"), quiet=True,
                                probes=probes))
    rows = run.rows
    assert not (run.folder / "model.json").exists()  # the sweep's own model was never loaded
    assert find(rows, "null_space_chance_rho").value == pytest.approx(math.sqrt(44 / 63))  # kernel 63 - 19
    total, direct, mediated = (find(rows, f"ablation_{e}_label", rank=1) for e in ("total", "direct", "mediated"))
    assert total.value == pytest.approx(direct.value + mediated.value, abs=1e-12) and total.n == 4 * 20
    assert {r.scope["target"] for r in select(rows, "corr_final_scale")} == {"label_entropy", "bayes_entropy"}
    assert find(rows, "corr_final_scale", target="bayes_entropy", deconfounded="raw").value > 0.9
    for kind in ("partial", "within"):
        r = find(rows, "corr_final_scale", target="bayes_entropy", deconfounded=kind)
        assert math.isnan(r.value) and r.note.endswith("claim inseparable")
    dec = [r for r in select(rows, "decoding_r2") if r.probe == "dec_wt"]
    assert {r.scope["layer"] for r in dec} == {0, 1}
    assert find(dec, "decoding_r2", target="bayes latent", adjust="raw", reading="v", layer=1).value > 0.9
    nan = find(dec, "decoding_r2", target="bayes latent", adjust="deconfounded", reading="v", layer=1)
    assert math.isnan(nan.value) and nan.note == "the target is a function of the covariates"
    assert math.isfinite(find(dec, "decoding_r2", target="model entropy", adjust="deconfounded", reading="v",
                              layer=1).value)
    hmm = [r for r in select(rows, "decoding_r2", target="bayes latent", adjust="deconfounded") if r.probe == "dec_hmm"]
    assert {r.scope["layer"] for r in hmm} == {0, 1, 2}  # the HMM tunnel has 3 layers, the sweep's model 2
    assert all(math.isfinite(r.value) for r in hmm)  # its exact entropy varies within a query position
    labels = " ".join(line.label for line in run.summary())
    assert "final-norm scale vs bayes entropy (bijection-cpu)" in labels
    assert "total effect on label entropy at the final token" in labels


def test_quiet_silences_every_bar(tiny_dirs, tmp_path):
    probes = write_probes(tmp_path / "p", {"keys.yaml": SMALL_PROBES["keys.yaml"],
                                           "mixed.yaml": SMALL_PROBES["mixed.yaml"]})
    cmd = [sys.executable, "-m", "interp_bayes.cli", "sweep", "--model", str(tiny_dirs["gpt2"]), "--out",
           str(tmp_path / "runs"), "--prompts", "basic", "--probes", *probes]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    loud = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    # the bars exist without --quiet: into a pipe as plain lines, with no carriage return and no bar drawing
    assert loud.returncode == 0 and "read: 100% 64/64" in loud.stderr
    assert "\r" not in loud.stderr + loud.stdout and "%|" not in loud.stderr
    quiet = subprocess.run(cmd + ["--quiet", "--redo", "mixed"], capture_output=True, text=True, env=env,
                           timeout=300)
    assert quiet.returncode == 0 and "%|" not in quiet.stderr + quiet.stdout and "read:" not in quiet.stderr


def test_rival_probes_on_a_tiny_model(tiny_dirs, tmp_path):
    """The entropy-neuron, martingale (SULA and the bijection tunnel) and decoding kinds at toy sizes: their rows,
    summary lines and figures come through the sweep like any other probe's."""
    probes = write_probes(tmp_path / "p", {
        "neurons.yaml": dict(kind="entropy_neurons", n_prompts=12, top_n=2, n_random=2, n_boot=20,
                             n_random_directions=10, per_k=3, n_perm=20),
        "mart.yaml": dict(kind="martingale", per_k=3, ks=[1, 2], n_perms=2, n_draws=2, n_null=3, n_boot=20),
        "mart_wt.yaml": dict(kind="martingale", tunnel="bijection-cpu", per_k=3, ks=[2, 6], n_perms=2, n_draws=2,
                             n_null=3, n_boot=20),
        "dec.yaml": dict(kind="decoding", layers=[1], readings=["resid", "v"], per_k=3, n_null=2, n_boot=20)})
    run = run_sweep(SweepConfig(model=str(tiny_dirs["llama3"]), out=str(tmp_path / "runs"), prompts="basic",
                                quiet=True, probes=probes))
    rows = run.rows
    assert find(rows, "neuron_rho", rank=1).null.startswith("all neurons")
    assert {r.scope["target"] for r in select(rows, "corr_final_scale")} == {"entropy", "label_entropy"}
    assert find(rows, "axis_null_rho") is not None
    assert not list((run.folder / "acts").glob("pool-*"))  # entropy_neurons reads the pool's texts: no set of it
    wt = select(rows, "martingale_gap_kl_bits", task="bijection")
    assert [r.scope["k"] for r in wt] == [2, 6] and all(r.null_low <= r.null_high for r in wt)
    assert select(rows, "order_sensitivity_js_bits", task="sula")
    assert {r.scope["adjust"] for r in select(rows, "decoding_r2")} == {"raw", "deconfounded"}
    labels = " ".join(line.label for line in run.summary())
    assert "entropy-neuron candidates" in labels and "martingale gap" in labels and "decodable" in labels
    page = (run.folder / "report.html").read_text()
    for fig in ("fig-entropy-neurons-neurons", "fig-martingale-mart_wt", "fig-decoding-dec"):
        assert fig in page


def test_every_flag_of_every_command_has_help():
    import argparse

    from interp_bayes.cli import COMMANDS, build_parser

    for command in COMMANDS:
        parser = build_parser(command)
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        bare = [a.option_strings or a.dest for a in sub.choices[command]._actions if not a.help]
        assert not bare, f"{command}: {bare}"


def test_train_description_names_every_architecture(capsys):
    from interp_bayes.windtunnel.configs import ARCHS

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(arch in text for arch in ARCHS), text


def test_probes_lists_whole_first_sentences(capsys):
    assert main(["probes"]) == 0
    kinds = [line for line in capsys.readouterr().out.splitlines() if line.startswith("kind ")]
    assert len(kinds) >= 11
    for line in kinds:
        about = line.split(": ", 1)[1].rsplit(" [", 1)[0]
        assert about[-1] in ".?!", line  # a sentence, never cut at the end of a docstring's first line


def test_progress_bars_write_plain_lines_into_a_log_and_refresh_in_a_terminal():
    import io

    from interp_bayes.core.progress import progress_bar

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream in (io.StringIO(), Terminal()):
        fast = dict(mininterval=0) if isinstance(stream, Terminal) else {}  # a log keeps its one line a minute
        bar = progress_bar(total=500, desc="collect", file=stream, **fast)
        for _ in range(500):
            bar.update(1)
        bar.close()
        text = stream.getvalue()
        if isinstance(stream, Terminal):
            assert text.count("\r") > 2  # tqdm's own bar, refreshed in place
        else:
            lines = text.splitlines()
            assert "\r" not in text and "\x1b" not in text and len(lines) == 2, text  # start and end
            assert lines[-1].startswith("collect: 100% 500/500")


def test_a_repeated_set_or_redo_adds_to_the_earlier_ones():
    """``--set a=1 --set b=2`` keeps both assignments (argparse's default kept only the last, silently)."""
    from interp_bayes.cli import build_parser

    args = build_parser("sweep").parse_args(["sweep", "--set", "icl.per_k=3", "keys.n_null=5", "--set", "axis.seed=2",
                                      "--redo", "icl", "--redo", "keys"])
    assert args.assignments == ["icl.per_k=3", "keys.n_null=5", "axis.seed=2"] and args.redo == ["icl", "keys"]
    again = build_parser("sweep").parse_args(["sweep"])
    assert again.assignments == [] and again.redo == []  # the default list is not shared between parses
