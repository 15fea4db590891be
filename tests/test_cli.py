"""The command line end to end on a tiny model: run folder contents, resume, and errors without tracebacks."""

import json
import subprocess
import sys

import yaml

from interp_bayes.cli import main
from interp_bayes.config import SweepConfig


def test_sweep_writes_run_folder_and_resumes(tiny_dirs, tmp_path, capsys):
    args = ["sweep", "--model", str(tiny_dirs["llama3"]), "--out", str(tmp_path), "--layers", "0", "-1", "--quiet"]
    assert main(args) == 0
    (folder,) = list(tmp_path.glob("*/*"))
    for name in ("config.yaml", "env.json", "metrics.json", "values/activations.safetensors"):
        assert (folder / name).exists(), name
    metrics = json.loads((folder / "metrics.json").read_text())
    assert set(metrics["value_manifold"]) == {"0", "1"}
    m = metrics["value_manifold"]["1"]
    assert 0 < m["pc1_share"] <= m["pc12_share"] <= 1 and -1 <= m["spearman_pc1_entropy"] <= 1
    assert m["dim"] == 2 * 24 and m["n_prompts"] == 64  # GQA: 2 kv heads of 24
    env = json.loads((folder / "env.json").read_text())
    assert env["seed"] == 0 and env["packages"]["transformers"]
    assert yaml.safe_load((folder / "config.yaml").read_text())["layers"] == [0, -1]
    first = (folder / "metrics.json").stat().st_mtime_ns
    capsys.readouterr()
    assert main(args) == 0
    assert (folder / "metrics.json").stat().st_mtime_ns == first  # nothing recomputed
    assert f"run folder: {folder}" in capsys.readouterr().out


def test_config_yaml_with_flag_override(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: pythia-70m\nlayers: [3]\nseed: 5\n")
    cfg = SweepConfig.from_yaml(path).override(seed=7, out=None)
    assert (cfg.model, cfg.layers, cfg.seed, cfg.out) == ("pythia-70m", [3], 7, "reports")
    assert cfg.digest() != SweepConfig.from_yaml(path).digest()
    assert cfg.digest() == cfg.override(out="elsewhere", quiet=True).digest()


def test_unknown_config_key(tmp_path):
    import pytest

    from interp_bayes.config import ConfigError

    path = tmp_path / "c.yaml"
    path.write_text("modle: x\n")
    with pytest.raises(ConfigError, match=r"Unknown config key\(s\) \['modle'\]"):
        SweepConfig.from_yaml(path)


def test_hub_model_offline_is_one_sentence_not_a_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "interp_bayes.cli", "sweep", "--model", "pythia-410m", "--out",
                           str(tmp_path), "--quiet"], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "Cannot fetch 'EleutherAI/pythia-410m'" in proc.stderr
