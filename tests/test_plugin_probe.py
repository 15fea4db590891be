"""The worked example of docs/adding-a-probe.md, run as written: a probe kind registered from a temporary module
appears in the summary, the tidy table and the report without any edit to report code."""

import re
import subprocess
import sys
from pathlib import Path

import yaml

from interp_bayes.config import SweepConfig
from interp_bayes.results import find
from interp_bayes.sweep import run_sweep

DOC = Path(__file__).resolve().parent.parent / "docs" / "adding-a-probe.md"


def test_the_documented_toy_probe_runs_end_to_end(tiny_dirs, tmp_path):
    text = DOC.read_text()
    module = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    recipe = yaml.safe_load(re.search(r"```yaml\n(.*?)```", text, re.S).group(1))
    (tmp_path / "my_probes.py").write_text(module)
    (tmp_path / "mean_entropy.yaml").write_text(yaml.safe_dump(recipe))  # the module path is relative to the recipe
    run = run_sweep(SweepConfig(model=str(tiny_dirs["phi2"]), out=str(tmp_path / "runs"), quiet=True,
                                probes=["keys", str(tmp_path / "mean_entropy.yaml")]))
    row = find(run.rows, "mean_entropy")
    assert row.kind == "mean_entropy" and row.probe == "mean_entropy" and row.n == 64  # the basic prompt set
    assert row.low <= row.value <= row.high and row.interval == "bootstrap 95%"
    line = next(line for line in run.summary() if line.label == "mean next-token entropy")
    assert f"{row.value:.3f} bits" in line.value
    page = (run.folder / "report.html").read_text()
    assert 'id="fig-mean-entropy-mean_entropy"' in page and "mean next-token entropy" in page
    assert "mean_entropy,mean_entropy,mean_entropy," in (run.folder / "results.csv").read_text()
    # `interp-bayes report RUN` in a fresh process imports the plugin from the path the recipe gave
    proc = subprocess.run([sys.executable, "-m", "interp_bayes.cli", "report", str(run.folder)], capture_output=True,
                          text=True, cwd="/")
    assert proc.returncode == 0, proc.stderr
    assert 'id="fig-mean-entropy-mean_entropy"' in (run.folder / "report.html").read_text()
