"""Nothing a user types can destroy a run, corrupt a number or end in a traceback.

- Names that become paths are refused when they could climb out of the run folder, and nothing outside changes.
- A damaged cache (truncated, or changed in place at the same size) is noticed by its digest and recomputed with one
  warning, and the recomputed numbers equal a clean run's.
- A corpus of bad inputs through the command line: exit code 2, one sentence, no traceback, no file created.
- A failed or dry run changes nothing that was there.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from interp_bayes.cli import main
from interp_bayes.run.config import SweepConfig
from interp_bayes.run.sweep import run_sweep
from interp_bayes.model.testing import make_tiny_model

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}

# cheap recipes on the tiny model: keys reads weights only; mixed collects an activation set and writes data.json
RECIPES = {
    "keys": dict(kind="keys", n_null=5),
    "mixed": dict(kind="manifold", per_bin=3, n_boot=20, n_null=10, n_resample=10, n_perm=20),
}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("safety") / "tiny-llama3"
    make_tiny_model("llama3", folder)
    return folder


def _recipes(folder: Path, names=("keys", "mixed"), **changes) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name in names:
        path = folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump({**RECIPES[name], **changes.get(name, {})}))
        out.append(str(path))
    return out


def _config(model: Path, out: Path, probes: list[str], **kw) -> SweepConfig:
    return SweepConfig(model=str(model), out=str(out), prompts="basic", probes=probes, quiet=True, **kw)


def _rows(folder: Path) -> dict:
    """probe -> its rows as canonical JSON text (NaN equal to NaN)."""
    return {p.parent.name: json.dumps(json.loads(p.read_text()), sort_keys=True)
            for p in sorted(folder.glob("probes/*/rows.json"))}


def _tree(root: Path) -> dict:
    """Every path under ``root`` with its bytes (files) or None (folders): a snapshot to compare."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    """Run the command line in this process: (exit code, everything it printed). An uncaught exception (what a
    user would see as a traceback) fails the test here."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as err:  # argparse's own refusals
        code = err.code
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.fixture(scope="module")
def clean(model, tmp_path_factory) -> Path:
    """A finished run folder of both recipes: the reference every recomputation must equal."""
    root = tmp_path_factory.mktemp("clean")
    return run_sweep(_config(model, root / "out", _recipes(root / "recipes"))).folder


# ---------------------------------------------------------------------------------------------------------------
# names that become paths


def test_probe_name_climbing_out_is_refused_and_nothing_outside_changes(model, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    before = _tree(tmp_path)
    for name in ("../../../victim", "../victim", "..", ".", "a/b", "/abs", ".hidden", "x\\..\\y", ""):
        recipe = tmp_path / "recipes" / "evil.yaml"
        recipe.parent.mkdir(exist_ok=True)
        recipe.write_text(yaml.safe_dump(dict(kind="keys", n_null=5, name=name)))
        with pytest.raises(Exception) as err:
            run_sweep(_config(model, tmp_path / "out", [str(recipe)]))
        assert "cannot be a folder name" in str(err.value), name
        assert len(str(err.value).splitlines()) == 1
    (tmp_path / "recipes" / "evil.yaml").unlink()
    (tmp_path / "recipes").rmdir()
    assert _tree(tmp_path) == before  # no run folder, nothing in victim


def test_activation_set_label_and_grid_name_climbing_out_are_refused(model, tmp_path):
    from interp_bayes.core.errors import ConfigError
    from interp_bayes.run.grid import Grid
    from interp_bayes.run.sweep import Context

    ctx = Context(tmp_path / "run", _config(model, tmp_path, []), print)
    for label in ("../../x", "..", "a/../../b"):
        with pytest.raises(ConfigError, match="cannot be a folder name"):
            ctx.acts_path(label, [[1, 2, 3]], layers=[0])
    for name in ("../../x", "..", "a/b"):
        with pytest.raises(ConfigError, match="cannot be a folder name"):
            Grid.from_dict(dict(name=name, models=[str(model)], config=dict(out=str(tmp_path))))
    assert list(tmp_path.iterdir()) == []


def test_probe_folder_that_is_a_link_out_of_the_run_is_refused(model, clean, tmp_path):
    """A run folder whose probe folder was replaced by a symbolic link elsewhere: nothing is written through it."""
    run = tmp_path / "out" / clean.parent.name / clean.name
    shutil.copytree(clean, run)
    victim = tmp_path / "victim"
    victim.mkdir()
    shutil.rmtree(run / "probes" / "keys")
    (run / "probes" / "keys").symlink_to(victim)
    with pytest.raises(Exception, match="outside"):
        run_sweep(_config(model, run.parent.parent, _recipes(tmp_path / "recipes")), redo=["keys"])
    assert list(victim.iterdir()) == []


# ---------------------------------------------------------------------------------------------------------------
# a damaged cache is noticed, recomputed with one warning, and gives the clean numbers


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _same_size(path: Path) -> None:
    """Change bytes in place, keeping the size and (for JSON) the syntax: a digit becomes another digit."""
    data = bytearray(path.read_bytes())
    if path.suffix == ".json":
        text = data.decode()
        i = next(i for i in range(len(text) // 2, len(text)) if text[i].isdigit())
        data[i] = ord("1" if text[i] != "1" else "2")
    else:  # the tail of a safetensors file is tensor data: halve 50 float32 values (the issue's corruption)
        import numpy as np

        tail = np.frombuffer(bytes(data[-200:]), dtype=np.float32) / 2
        data[-200:] = tail.astype(np.float32).tobytes()
    path.write_bytes(bytes(data))


CACHED = [("probes/keys/rows.json", _truncate), ("probes/keys/rows.json", _same_size),
          ("probes/mixed/data.json", _same_size), ("probes/mixed/stage.json", _truncate),
          ("acts/*/activations.safetensors", _truncate), ("acts/*/activations.safetensors", _same_size),
          ("acts/*/activations.json", _truncate), ("acts/*/activations.json", _same_size),
          ("acts/*/manifest.json", _truncate)]


@pytest.mark.parametrize("pattern,damage", CACHED, ids=[f"{p.split('/')[-1]}-{d.__name__[1:]}" for p, d in CACHED])
def test_damaged_cache_is_recomputed_with_one_warning(model, clean, tmp_path, capfd, pattern, damage):
    run = tmp_path / "out" / clean.parent.name / clean.name
    shutil.copytree(clean, run)
    (target,) = run.glob(pattern)
    damage(target)
    if pattern.startswith("acts/"):  # a set is read when a probe needs it: make the probe that reads it recompute
        shutil.rmtree(run / "probes" / "mixed")
    capfd.readouterr()
    again = run_sweep(_config(model, tmp_path / "out", _recipes(tmp_path / "recipes")))
    err = capfd.readouterr().err
    assert again.folder == run
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and target.name in warnings[0], err
    assert again.computed, "a damaged stage must be recomputed"
    assert _rows(run) == _rows(clean)


def test_report_results_and_dry_run_on_a_damaged_folder_warn_and_go_on(model, clean, tmp_path, capsys):
    run = tmp_path / "out" / clean.parent.name / clean.name
    shutil.copytree(clean, run)
    _truncate(run / "probes" / "keys" / "rows.json")
    code, text = _cli(["results", run], capsys)
    assert code == 0 and "rows.json" in text and "Traceback" not in text
    assert "probe,kind,metric" in text and ",keys," not in text  # the damaged probe is left out, the rest shown
    code, text = _cli(["report", run], capsys)
    assert code == 0 and "rows.json" in text
    recipes = _recipes(tmp_path / "recipes")
    code, text = _cli(["sweep", "--model", model, "--out", tmp_path / "out", "--prompts", "basic", "--probes",
                       *recipes, "--dry-run"], capsys)
    assert code == 0 and "damaged" in text, text


# ---------------------------------------------------------------------------------------------------------------
# bad inputs: exit code 2, one sentence, no traceback, no file created


def _bad_inputs(model: Path, d: Path) -> dict:
    """case -> (files to create first: name -> text, argv). Paths are relative to the case folder ``d``."""
    sweep = ["sweep", "--model", model, "--out", d / "out", "--prompts", "basic"]
    keys = str(d / "keys.yaml")
    files_keys = {"keys.yaml": yaml.safe_dump(RECIPES["keys"])}
    mixed = str(d / "mixed.yaml")
    files_mixed = {"mixed.yaml": yaml.safe_dump(RECIPES["mixed"])}
    grid = "models: [{m}]\nprobes: [keys]\nconfig: {{out: {o}}}\n".format(m=model, o=d / "out")
    return {
        "recipe malformed yaml": ({"bad.yaml": "kind: keys\nn_null: [1,\n"}, [*sweep, "--probes", d / "bad.yaml"]),
        "--set malformed yaml": (files_keys, [*sweep, "--probes", keys, "--set", "keys.n_null=[1,"]),
        "--config malformed yaml": ({"c.yaml": "model: [\n"}, [*sweep, "--config", d / "c.yaml"]),
        "grid malformed yaml": ({"g.yaml": "models: [a,\n"}, ["grid", d / "g.yaml"]),
        "--config missing": ({}, [*sweep, "--config", d / "nope.yaml"]),
        "config layers: abc": ({"c.yaml": "layers: abc\n"}, [*sweep, "--config", d / "c.yaml"]),
        "config seed: zero": ({"c.yaml": 'seed: "zero"\n'}, [*sweep, "--config", d / "c.yaml"]),
        "config is a list": ({"c.yaml": "- a\n- b\n"}, [*sweep, "--config", d / "c.yaml"]),
        "config unknown key": ({"c.yaml": "modle: x\n"}, [*sweep, "--config", d / "c.yaml"]),
        "prompts malformed line": ({"p.jsonl": '{"text": "one"}\n{"text": \n', **files_mixed},
                                   [*sweep[:-2], "--prompts", d / "p.jsonl", "--probes", mixed]),
        "prompts missing": (files_mixed, [*sweep[:-2], "--prompts", d / "nope.jsonl", "--probes", mixed]),
        "out is a file": ({"file.txt": "x"}, ["sweep", "--model", model, "--out", d / "file.txt", "--probes", keys]),
        "n_null=-5": (files_keys, [*sweep, "--probes", keys, "--set", "keys.n_null=-5"]),
        "n_boot=0": ({}, [*sweep, "--probes", "manifold_mixed", "--set", "manifold_mixed.n_boot=0"]),
        "folds=1": ({}, [*sweep, "--probes", "axis", "--set", "axis.folds=1"]),
        "--threads -1": (files_keys, [*sweep, "--probes", keys, "--threads", "-1"]),
        "--batch-size 0": (files_keys, [*sweep, "--probes", keys, "--batch-size", "0"]),
        "literal outside its choices": ({}, [*sweep, "--probes", "interventions", "--set",
                                              "interventions.method=pc7"]),
        "tuple of literals outside": ({}, [*sweep, "--probes", "decoding", "--set", "decoding.readings=[v, q]"]),
        "unknown model alias": ({}, ["sweep", "--model", "no-such-model", "--out", d / "out"]),
        "unknown probe": ({}, [*sweep, "--probes", "no_such_probe"]),
        "--layers 99": (files_keys, [*sweep, "--probes", keys, "--layers", "99"]),
        "--dry-run --layers 99": (files_keys, [*sweep, "--probes", keys, "--layers", "99", "--dry-run"]),
        "--set unknown parameter": (files_keys, [*sweep, "--probes", keys, "--set", "keys.bogus=1"]),
        "--set unknown probe": (files_keys, [*sweep, "--probes", keys, "--set", "other.n_null=1"]),
        "--set without =": (files_keys, [*sweep, "--probes", keys, "--set", "keysn_null"]),
        "recipe without kind": ({"r.yaml": "n_null: 3\n"}, [*sweep, "--probes", d / "r.yaml"]),
        "recipe default not bool": ({"r.yaml": "kind: keys\ndefault: maybe\n"}, [*sweep, "--probes", d / "r.yaml"]),
        "recipe name climbs out": ({"r.yaml": "kind: keys\nname: ../../x\n"}, [*sweep, "--probes", d / "r.yaml"]),
        "recipe unknown kind": ({"r.yaml": "kind: nosuch\n"}, [*sweep, "--probes", d / "r.yaml"]),
        "recipe analyses a layer it does not collect": ({"r.yaml": "kind: icl\nlayers: [0]\nat: 1\n"},
                                                        [*sweep, "--probes", d / "r.yaml"]),
        "recipe collects a layer outside the model": ({"r.yaml": "kind: icl\nlayers: [0, 7]\nat: 0\n"},
                                                      [*sweep, "--probes", d / "r.yaml"]),
        "--redo unknown": (files_keys, [*sweep, "--probes", keys, "--redo", "nosuch"]),
        "grid missing": ({}, ["grid", d / "nope.yaml"]),
        "grid name climbs out": ({"g.yaml": grid + "name: ../../x\n"}, ["grid", d / "g.yaml"]),
        "grid seeds not ints": ({"g.yaml": grid + "seeds: [a]\n"}, ["grid", d / "g.yaml"]),
        "report of no run folder": ({"empty/x.txt": ""}, ["report", d / "empty"]),
        "results of a missing folder": ({}, ["results", d / "nope"]),
        "compare of no run folder": ({"empty/x.txt": ""}, ["compare", d / "empty", "--out", d / "c.html"]),
        "--dtype not a dtype": (files_keys, [*sweep, "--probes", keys, "--dtype", "float8"]),
        "orderings=-1": ({}, [*sweep, "--probes", "martingale_expectation", "--set",
                               "martingale_expectation.orderings=-1"]),
        "intervention op unknown": ({}, [*sweep, "--probes", "interventions_onmanifold", "--set",
                                          "interventions_onmanifold.ops=[cut, resample2]"]),
        "gaussian null outside its choices": ({}, [*sweep, "--probes", "gaussian", "--set",
                                                    "gaussian.geometry_null=flat"]),
        # a recipe's tunnel: is checked when the recipe is read (issue 35)
        "tunnel names no checkpoint": ({"r.yaml": "kind: martingale\ntunnel: no-such-tunnel\n"},
                                       [*sweep, "--probes", d / "r.yaml"]),
        "tunnel is a folder without a wind tunnel": ({"r.yaml": f"kind: decoding\ntunnel: {model}\n"},
                                                     [*sweep, "--probes", d / "r.yaml"]),
        "tunnel of another task family": ({"r.yaml": "kind: martingale\ntunnel: hmm-cpu\n"},
                                          [*sweep, "--probes", d / "r.yaml"]),
        "gaussian tunnel not a kalman one": ({"r.yaml": "kind: gaussian\ntunnel: bijection-cpu\n"},
                                             [*sweep, "--probes", d / "r.yaml"]),
        "windtunnel kind on a tunnel without attention": ({"r.yaml": "kind: windtunnel\ntunnel: hmm-cpu-mlp\n"},
                                                          [*sweep, "--probes", d / "r.yaml"]),
        "--set tunnel of another task family": ({}, [*sweep, "--probes", "decoding_windtunnel", "--set",
                                                      "decoding_windtunnel.tunnel=kalman-cpu"]),
        "--dry-run tunnel names no checkpoint": ({}, [*sweep, "--probes", "windtunnel", "--set",
                                                       "windtunnel.tunnel=nope", "--dry-run"]),
        "the old task: for a tunnel": ({"r.yaml": "kind: decoding\ntask: bijection-cpu\n"},
                                       [*sweep, "--probes", d / "r.yaml"]),
        "the old checkpoint: for a tunnel": ({"r.yaml": "kind: windtunnel\ncheckpoint: bijection-cpu\n"},
                                             [*sweep, "--probes", d / "r.yaml"]),
        **_sweep_inputs_of_issue_35(model, d),
    }


def _sweep_inputs_of_issue_35(model: Path, d: Path) -> dict:
    """Issue 35 items 5 and 6: each refused when the command line or the recipe is read, by the run and by its dry
    run alike (one validation path), so every case comes twice."""
    sweep = ["sweep", "--model", model, "--out", d / "out", "--prompts", "basic"]
    keys, files_keys = str(d / "keys.yaml"), {"keys.yaml": yaml.safe_dump(RECIPES["keys"])}
    mixed, files_mixed = str(d / "mixed.yaml"), {"mixed.yaml": yaml.safe_dump(RECIPES["mixed"])}

    def recipe(text: str):
        return {"r.yaml": text}, [*sweep, "--probes", d / "r.yaml"]

    cases = {
        "--seed beyond 2**32-1": (files_keys, [*sweep, "--probes", keys, "--seed", str(2**32)]),
        "--seed -1": (files_keys, [*sweep, "--probes", keys, "--seed", "-1"]),
        "--device tpu": (files_keys, [*sweep, "--probes", keys, "--device", "tpu"]),
        "--out name longer than the file system allows": (files_keys, ["sweep", "--model", model, "--out",
                                                                       d / ("x" * 300), "--probes", keys]),
        "--redo unknown, beside a cached probe": (files_keys, [*sweep, "--probes", keys, "--redo", "keys2"]),
        "martingale ks: [-1]": recipe("kind: martingale\nper_k: 2\nks: [-1]\n"),
        "martingale ks beyond the tunnel's pairs": recipe("kind: martingale\ntunnel: bijection-cpu\nks: [1, 20]\n"),
        "martingale n_draws: 1": recipe("kind: martingale\nper_k: 2\nn_draws: 1\n"),
        "resample ablation with per_k: 1": ({}, [*sweep, "--probes", "interventions_onmanifold", "--set",
                                                 "interventions_onmanifold.per_k=1"]),
        "controls isotropic: -1": ({}, [*sweep, "--probes", "interventions", "--set",
                                        "interventions.controls.isotropic=-1"]),
        "controls bogus: 3": ({}, [*sweep, "--probes", "interventions", "--set", "interventions.controls.bogus=3"]),
        "ops: [frobnicate]": ({}, [*sweep, "--probes", "interventions", "--set", "interventions.ops=[frobnicate]"]),
        "interventions fit unknown": ({}, [*sweep, "--probes", "interventions", "--set", "interventions.fit=half"]),
        "tunnel ops: [frobnicate]": recipe("kind: windtunnel\nops: [frobnicate]\n"),
        "tunnel resample with 2 sequences": recipe("kind: windtunnel\nn_sequences: 2\nfolds: 2\n"
                                                    "ops: [resample]\n"),
        "tunnel folds beyond its sequences": recipe("kind: windtunnel\nn_sequences: 3\n"),
        "axis folds beyond its prompts": ({}, [*sweep, "--probes", "axis", "--set", "axis.per_k=1", "axis.folds=6"]),
        "decoding folds beyond its sequences": recipe("kind: decoding\ntunnel: bijection-cpu\nn_sequences: 4\n"),
        "gaussian folds beyond its sequences": recipe("kind: gaussian\nn_sequences: 3\n"),
        "lone surrogate in a prompts file": ({"p.jsonl": '{"text": "fine"}\n{"text": "a \\ud800 b"}\n',
                                              **files_mixed},
                                             [*sweep[:-2], "--prompts", d / "p.jsonl", "--probes", mixed]),
    }
    return {**cases, **{f"{case} (dry run)": (files, [*argv, "--dry-run"]) for case, (files, argv) in cases.items()}}


def _model_cases(model: Path, d: Path) -> dict:
    """Bad model folders: (a function that makes the folder from the good one, argv)."""
    sweep = ["sweep", "--out", d / "out", "--prompts", "basic", "--probes", "keys", "--model", d / "m"]

    def truncated(m: Path) -> None:
        _truncate(m / "model.safetensors")

    def pickle_only(m: Path) -> None:
        import torch
        from safetensors.torch import load_file

        torch.save(load_file(m / "model.safetensors"), m / "pytorch_model.bin")
        (m / "model.safetensors").unlink()

    def config_damaged(m: Path) -> None:
        _truncate(m / "config.json")

    return {"truncated model.safetensors": (truncated, sweep), "pickle weights only": (pickle_only, sweep),
            "config.json damaged": (config_damaged, sweep)}


def _assert_refused(code: int, text: str, case: str) -> None:
    assert code == 2, f"{case}: exit {code}: {text}"
    assert "Traceback" not in text, f"{case}: {text}"
    errors = [line for line in text.splitlines() if "error" in line.lower()]
    assert errors, f"{case}: no error line: {text}"


BAD_INPUTS = list(_bad_inputs(Path("model"), Path("case")))
BAD_MODELS = list(_model_cases(Path("model"), Path("case")))


def test_the_corpus_holds_the_cases_of_the_issue():
    assert len(BAD_INPUTS) + len(BAD_MODELS) >= 25
    assert len(ISSUE_35) >= 20 and len(BAD_COMMANDS) >= 19  # issue 35, items 5 and 6


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_exits_2_with_one_sentence_and_creates_nothing(model, tmp_path, capsys, monkeypatch, case):
    d = tmp_path / "case"
    files, argv = _bad_inputs(model, d)[case]
    d.mkdir()
    for name, text in files.items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text)
    monkeypatch.chdir(d)
    before = _tree(d)
    code, text = _cli(argv, capsys)
    _assert_refused(code, text, case)
    assert _tree(d) == before, f"{case}: files changed: {sorted(set(_tree(d)) ^ set(before))}"


ISSUE_35 = [case for case in _sweep_inputs_of_issue_35(Path("model"), Path("case")) if not case.endswith("(dry run)")]


@pytest.mark.parametrize("case", ISSUE_35)
def test_dry_run_refuses_with_the_runs_own_sentence(model, tmp_path, capsys, monkeypatch, case):
    """One validation path: the dry run gives the run's error, not a stand-in (such as "found no activation set
    to time")."""
    d = tmp_path / "case"
    cases = _sweep_inputs_of_issue_35(model, d)
    d.mkdir()
    for name, text in cases[case][0].items():
        (d / name).write_text(text)
    monkeypatch.chdir(d)
    said = []
    for variant in (case, f"{case} (dry run)"):
        code, text = _cli(cases[variant][1], capsys)
        _assert_refused(code, text, variant)
        said.append([line for line in text.splitlines() if "error" in line.lower()])
    assert said[0] == said[1], said


def _bad_commands(model: Path, run: Path, d: Path) -> dict:
    """The other command lines (train, dynamics, results, compare, a wind-tunnel recipe's parameters): case ->
    (files to create first, argv)."""
    train = ["train", "bijection", "--preset", "tiny", "--quiet"]
    return {
        "train --steps -5": ({}, [*train, "--out", d / "t", "--steps", "-5"]),
        "train --steps 0": ({}, [*train, "--out", d / "t", "--steps", "0"]),
        "train --device tpu": ({}, [*train, "--out", d / "t", "--device", "tpu"]),
        "train --init-std 0": ({}, [*train, "--out", d / "t", "--init-std", "0"]),
        "train --init-std nan": ({}, [*train, "--out", d / "t", "--init-std", "nan"]),
        "train --seed -1": ({}, [*train, "--out", d / "t", "--seed", "-1"]),
        "train --seed beyond 2**32-1": ({}, [*train, "--out", d / "t", "--seed", str(2**32)]),
        "train --out ''": ({}, [*train, "--out", ""]),
        "train --out name too long": ({}, [*train, "--out", d / ("t" * 300)]),
        "train --out a file": ({"f.txt": "x"}, [*train, "--out", d / "f.txt"]),
        "train into a non-empty --out": ({"t/checkpoints/step_000050/config.json": "{}"}, [*train, "--out", d / "t"]),
        "results --out a folder": ({"dir/x.txt": ""}, ["results", run, "--out", d / "dir"]),
        "compare --out a folder": ({"dir/x.txt": ""}, ["compare", run, "--out", d / "dir"]),
        "dynamics --steps -5": ({}, ["dynamics", "--steps", "-5", "--out", d / "dyn.json"]),
        "dynamics --record-every 0": ({}, ["dynamics", "--record-every", "0", "--out", d / "dyn.json"]),
        "dynamics --seeds -1": ({}, ["dynamics", "--seeds", "-1", "--out", d / "dyn.json"]),
        "dynamics --deep-device tpu": ({}, ["dynamics", "--deep", "--deep-device", "tpu", "--out", d / "dyn.json"]),
        "architectures n -5": ({}, ["sweep", "--model", model, "--out", d / "out", "--probes", "architectures",
                                    "--set", "architectures.n=-5"]),
        "architectures folders not a tunnel": ({"dir/x.txt": ""}, ["sweep", "--model", model, "--out", d / "out",
                                                                   "--probes", "architectures", "--set",
                                                                   f"architectures.folders=[{d / 'dir'}]"]),
        "p4b n_fit 0": ({}, ["sweep", "--model", model, "--out", d / "out", "--probes", "p4b", "--set", "p4b.n_fit=0"]),
        "p4b tunnel an HMM": ({}, ["sweep", "--model", model, "--out", d / "out", "--probes", "p4b", "--set",
                                   "p4b.tunnel=hmm-cpu"]),
        "tunnel_geometry n -1": ({}, ["sweep", "--model", model, "--out", d / "out", "--probes", "tunnel_geometry_hmm",
                                      "--set", "tunnel_geometry_hmm.n=-1"]),
        "subspaces ops shift": ({}, ["sweep", "--model", model, "--out", d / "out", "--probes", "subspaces", "--set",
                                     "subspaces.ops=[cut,shift]"]),
        "manifold_move tunnel a bijection": ({}, ["sweep", "--model", model, "--out", d / "out", "--probes",
                                                  "manifold_move", "--set", "manifold_move.tunnel=bijection-cpu"]),
    }


BAD_COMMANDS = list(_bad_commands(Path("model"), Path("run"), Path("case")))


@pytest.mark.parametrize("case", BAD_COMMANDS)
def test_bad_command_exits_2_with_one_sentence_and_creates_nothing(model, clean, tmp_path, capsys, monkeypatch,
                                                                   case):
    d = tmp_path / "case"
    files, argv = _bad_commands(model, clean, d)[case]
    d.mkdir()
    for name, text in files.items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text)
    monkeypatch.chdir(d)
    before, run_before = _tree(d), _tree(clean)
    code, text = _cli(argv, capsys)
    _assert_refused(code, text, case)
    assert _tree(d) == before, f"{case}: files changed: {sorted(set(_tree(d)) ^ set(before))}"
    assert _tree(clean) == run_before


@pytest.mark.parametrize("case", BAD_MODELS)
def test_bad_model_folder_exits_2_and_creates_nothing(model, tmp_path, capsys, monkeypatch, case):
    d = tmp_path / "case"
    spoil, argv = _model_cases(model, d)[case]
    shutil.copytree(model, d / "m")
    spoil(d / "m")
    monkeypatch.chdir(d)
    before = _tree(d)
    code, text = _cli(argv, capsys)
    _assert_refused(code, text, case)
    assert _tree(d) == before, f"{case}: files changed: {sorted(set(_tree(d)) ^ set(before))}"


def test_unwritable_out_exits_2(model, tmp_path, capsys):
    """An immutable --out (chattr +i: root cannot write there either) and, for other users, a read-only one."""
    recipes = _recipes(tmp_path / "recipes", names=("keys",))
    tried = 0
    for case in ("immutable", "read-only"):
        out = tmp_path / case
        out.mkdir()
        if case == "immutable":
            if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", out]).returncode != 0:
                continue
        else:
            if os.geteuid() == 0:  # root writes into a read-only folder: nothing to refuse
                continue
            out.chmod(0o555)
        try:
            code, text = _cli(["sweep", "--model", model, "--out", out, "--prompts", "basic", "--probes", *recipes],
                              capsys)
        finally:
            subprocess.run(["chattr", "-i", out]) if case == "immutable" else out.chmod(0o755)
        _assert_refused(code, text, case)
        assert "--out" in text and list(out.iterdir()) == []
        tried += 1
    assert tried, "neither an immutable nor a read-only folder could be made here"


def test_a_refused_input_through_a_real_process_prints_no_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: keys\nn_null: [1,\n")
    out = subprocess.run([sys.executable, "-m", "interp_bayes.cli", "sweep", "--probes", str(bad), "--out",
                          str(tmp_path / "out")], env=ENV, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr + out.stdout
    assert "not valid YAML" in out.stderr and "line 3" in out.stderr  # where the unclosed list runs out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


# ---------------------------------------------------------------------------------------------------------------
# a failed or dry run changes nothing that was there


def test_failing_sweep_in_a_finished_folder_keeps_its_record_results_and_views(model, clean, tmp_path):
    run = tmp_path / "out" / clean.parent.name / clean.name
    shutil.copytree(clean, run)
    recipes = _recipes(tmp_path / "recipes")
    kept = {name: (run / name).read_bytes() for name in ("run.json", "config.yaml", "results.csv")}
    kept_probe = _tree(run / "probes" / "mixed")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{oops\n')
    # a parameter that fails only inside the probe: the probe's old folder must survive
    with pytest.raises(Exception, match="not valid JSON"):
        run_sweep(_config(model, tmp_path / "out", recipes, overrides={"mixed": {"prompts": str(bad)}}))
    assert _tree(run / "probes" / "mixed") == kept_probe
    assert {name: (run / name).read_bytes() for name in kept} == kept
    assert "Partial run" not in (run / "report.html").read_text()
    assert _rows(run) == _rows(clean)


def test_a_refused_model_leaves_no_run_folder(model, tmp_path):
    m = tmp_path / "m"
    shutil.copytree(model, m)
    _truncate(m / "model.safetensors")
    with pytest.raises(Exception):
        run_sweep(_config(m, tmp_path / "out", _recipes(tmp_path / "recipes", names=("keys",))))
    assert not (tmp_path / "out").exists()


def test_dry_run_writes_nothing(model, tmp_path, capsys):
    recipes = _recipes(tmp_path / "recipes")
    before = _tree(tmp_path)
    code, text = _cli(["sweep", "--model", model, "--out", tmp_path / "out", "--probes", *recipes, "icl",
                       "--dry-run"], capsys)
    assert code == 0, text
    assert "to compute" in text
    assert _tree(tmp_path) == before  # no run folder, no sula_task.json


def test_dry_run_with_nothing_to_time_prints_the_plan_untimed(model, tmp_path, capsys):
    """A fresh --out and probes with no activation set of the sweep's model (keys reads weights; a wind-tunnel
    selection runs on the tunnel): the plan, exit 0, nothing written; an edited recipe untimed, a shipped wind-tunnel
    recipe at its reference seconds (no forward of the sweep's model to measure the pace on)."""
    recipes = _recipes(tmp_path / "recipes", names=("keys",))
    before = _tree(tmp_path)
    for probes in (recipes, ["martingale_windtunnel"]):
        code, text = _cli(["sweep", "--model", model, "--out", tmp_path / "out", "--prompts", "basic", "--probes",
                           *probes, "--dry-run"], capsys)
        assert code == 0, text
        name = Path(probes[0]).stem
        assert f"{name:20s} probe of kind" in text and "to compute" in text
        if probes is recipes:
            assert f"estimated time: none; not timed: {name}" in text, text
        else:
            assert "(1 shipped recipe(s) at their reference seconds (pace not measured))" in text, text
    assert _tree(tmp_path) == before


def test_train_refuses_a_non_empty_out_and_overwrite_empties_it(tmp_path, capsys):
    """Issue 35 item 3: a second training into the folder of a first would leave the first's checkpoints beside
    the new model."""
    out = tmp_path / "tunnel"
    stale = out / "checkpoints" / "step_000050" / "config.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    argv = ["train", "bijection", "--preset", "tiny", "--steps", "2", "--quiet", "--threads", "1", "--out", out]
    code, text = _cli(argv, capsys)
    _assert_refused(code, text, "train into a non-empty --out")
    assert "--overwrite" in text and sorted(p.name for p in out.rglob("*")) == ["checkpoints", "config.json",
                                                                                "step_000050"]
    code, text = _cli([*argv, "--overwrite"], capsys)
    assert code == 0, text
    assert not stale.exists() and json.loads((out / "windtunnel.json").read_text())["step"] == 2
