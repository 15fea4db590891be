"""The command line and the sweep runner end to end on a tiny model: run folder, resume, errors without tracebacks."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from interp_bayes.cli import main
from interp_bayes.config import ConfigError, SweepConfig
from interp_bayes.sweep import builtin_probes, load_probe, run_sweep

SMALL_PROBES = {  # the built-in recipes at toy sizes, for the 64-prompt basic set and a 2-layer model
    "mixed.yaml": dict(kind="manifold", per_bin=4, n_boot=30, n_null=10, n_resample=10),
    "math.yaml": dict(kind="manifold", domain="mathematics", per_bin=2, n_boot=30, n_null=10, n_resample=10),
    "keys.yaml": dict(kind="keys", n_null=10),
    "focusing.yaml": dict(kind="focusing", per_bin=3, n_boot=30),
    "icl.yaml": dict(kind="icl", per_k=4, layers=[1], n_boot=30, n_null=10),  # layer 0 sees the last token only
    "axis.yaml": dict(kind="axis", per_k=4, layers=[1], folds=3),
}


@pytest.fixture
def small_probes(tmp_path):
    paths = []
    for name, body in SMALL_PROBES.items():
        (tmp_path / name).write_text(yaml.safe_dump(body))
        paths.append(str(tmp_path / name))
    return paths


def test_sweep_writes_run_folder_and_resumes(tiny_dirs, tmp_path, small_probes, capsys):
    out = tmp_path / "runs"
    args = ["sweep", "--model", str(tiny_dirs["llama3"]), "--out", str(out), "--prompts", "basic", "--quiet",
            "--probes", *small_probes]
    assert main(args) == 0
    (folder,) = list(out.glob("*/*"))
    for name in ("config.yaml", "env.json", "metrics.json", "sula_task.json"):
        assert (folder / name).exists(), name
    for probe in ("mixed", "math", "keys", "focusing", "icl", "axis"):
        assert (folder / "probes" / probe / "metrics.json").exists(), probe
    assert (folder / "axes" / "pc1-L1" / "axis.safetensors").exists()
    metrics = json.loads((folder / "metrics.json").read_text())
    rep = metrics["mixed"]["layers"]["1"]
    assert rep["dim"] == 2 * 24 and rep["n_prompts"] == 20  # GQA: 2 kv heads of 24; 4 per quintile
    assert 0 < rep["pc1_share"] <= rep["pc12_share"] <= 1
    assert rep["bootstrap"]["pc1_ci"][0] <= rep["bootstrap"]["pc1_ci"][1]
    assert rep["resample"]["n_resample"] == 10 and rep["resample"]["pc1_ci"][0] <= rep["resample"]["pc1_ci"][1]
    assert len(metrics["math"]["indices"]) == 10
    assert metrics["icl"]["conditions"]["shuffled"]["overall"]["bayes_entropy"] == 1.0
    env = json.loads((folder / "env.json").read_text())
    assert env["seed"] == 0 and env["packages"]["transformers"]
    assert yaml.safe_load((folder / "config.yaml").read_text())["prompts"] == "basic"
    printed = capsys.readouterr().out
    assert "SULA entropy MAE vs Bayes" in printed and f"run folder: {folder}" in printed

    config = SweepConfig(model=str(tiny_dirs["llama3"]), out=str(out), prompts="basic", quiet=True,
                         probes=small_probes)
    again = run_sweep(config)
    assert again.folder == folder and again.computed == []  # everything reused, nothing recomputed
    assert again.metrics["keys"] == metrics["keys"]
    assert "SULA entropy MAE vs Bayes" in again._repr_html_() and len(again.figure().data) > 0


def test_built_in_probes_load():
    names = builtin_probes()
    assert {"manifold_mixed", "manifold_math", "keys", "focusing", "icl", "axis"} <= set(names)
    assert load_probe("manifold_math").params["domain"] == "mathematics"
    with pytest.raises(ConfigError, match="No probe 'nope'; built-in probes: "):
        load_probe("nope")


def test_config_yaml_with_flag_override(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: pythia-70m\nlayers: [3]\nseed: 5\n")
    cfg = SweepConfig.from_yaml(path).override(seed=7, out=None)
    assert (cfg.model, cfg.layers, cfg.seed, cfg.out) == ("pythia-70m", [3], 7, "reports")
    assert cfg.digest() != SweepConfig.from_yaml(path).digest()
    assert cfg.digest() == cfg.override(out="elsewhere", quiet=True).digest()


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


def test_interventions_probe_on_a_tiny_model(tiny_dirs, tmp_path):
    probe = tmp_path / "iv.yaml"
    probe.write_text(yaml.safe_dump(dict(kind="interventions", layer_sets=[[-1]], ops=["cut", "shift+"],
                                         n_isotropic=2, n_matched=2, n_pcs=1, per_k=4, layers=[1])))
    run = run_sweep(SweepConfig(model=str(tiny_dirs["mistral"]), out=str(tmp_path), quiet=True, probes=[str(probe)]))
    m = run.metrics["iv"]
    assert m["n_eval"] == 10 and m["n_fit"] == 10 and m["layer_sets"] == [[1]]
    assert m["n_forward_prompts"] == (1 + 2 * 6) * 10
    assert {s["op"] for s in m["summary"]} == {"cut", "shift+"}
    rows = json.loads((run.folder / "probes" / "iv" / "rows.json").read_text())
    assert len(rows) == 2 * 6 and {r["kind"] for r in rows} == {"true", "isotropic", "matched", "pcs"}


def test_windtunnel_probe_on_the_packaged_bijection_model(tiny_dirs, tmp_path):
    probe = tmp_path / "wt.yaml"
    probe.write_text(yaml.safe_dump(dict(kind="windtunnel", checkpoint="bijection-cpu", n_sequences=6,
                                         n_isotropic=2, n_matched=2, n_pcs=1, n_boot=20, n_null=10)))
    run = run_sweep(SweepConfig(model=str(tiny_dirs["llama3"]), out=str(tmp_path), quiet=True, probes=[str(probe)]))
    m = run.metrics["wt"]
    assert m["task"] == "bijection" and m["n_prompts"] == 6 * 20
    assert m["calibration"]["mae"] < 0.01  # the committed model matches the exact posterior
    assert m["manifold"]["pc1_vs_bayes_entropy"]["spearman"] > 0.8  # values ordered by exact posterior entropy
    assert m["axis"]["pc1-L1-bayes"]["held_out"]["pearson"] > 0.8
    cut = next(s for s in m["interventions"]["summary"] if s["op"] == "cut" and s["metric"] == "mae_k_ge_1")
    assert "isotropic_percentile" in cut and len(m["focusing"]["mean_entropy"]) == 2


def test_report_builds_when_a_metric_exists_for_some_layer_sets_only(tiny_dirs, tmp_path):
    """Downstream geometry exists only for layer sets that end before the last axis layer."""
    from interp_bayes.report.html import build_report
    from interp_bayes.store import write_json

    probe = tmp_path / "interventions.yaml"
    probe.write_text(yaml.safe_dump(dict(kind="interventions", layer_sets=[[-1]], ops=["cut", "shift+"],
                                         n_isotropic=1, n_matched=1, n_pcs=1, per_k=4, layers=[1])))
    run = run_sweep(SweepConfig(model=str(tiny_dirs["llama3"]), out=str(tmp_path), quiet=True, probes=[str(probe)]))
    metrics = json.loads((run.folder / "metrics.json").read_text())
    iv = metrics["interventions"]["summary"]
    metrics["interventions"]["summary"] = [s for s in iv if not (s["op"] == "cut" and s["metric"] == "kl_bits")]
    write_json(run.folder / "metrics.json", metrics)
    html_text = build_report(run.folder).read_text()
    assert "Interventions: true axis vs control axes" in html_text
