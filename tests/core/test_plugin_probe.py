"""Plugins are first-class: the worked example of docs/adding-a-probe.md runs as written (its code and its shell
commands); a kind registered by import, by a .py path or by an installed entry point comes back in a fresh
`interp-bayes report` process through the module its stage.json records; names are unique; a broken plugin gets one
sentence."""

import html
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from interp_bayes.core import registry as kinds
from interp_bayes.core.plugin import Kind
from interp_bayes.run.config import SweepConfig
from interp_bayes.core.errors import ConfigError
from interp_bayes.core.results import find
from interp_bayes.run.sweep import load_probe, run_sweep

DOC = Path(__file__).resolve().parents[2] / "docs" / "adding-a-probe.md"
DOC_TEXT = DOC.read_text()
MODULE = re.search(r"```python\n(.*?)```", DOC_TEXT, re.S).group(1)  # the worked example's module
RECIPE = yaml.safe_load(re.search(r"```yaml\n(.*?)```", DOC_TEXT, re.S).group(1))
COMMANDS = re.search(r"```bash\n(.*?)```", DOC_TEXT, re.S).group(1)  # "Try it on a tiny model"
FIGURE = 'id="fig-mean-entropy-mean_entropy"'
TUNNEL_DOC = DOC_TEXT.split("\n## A wind-tunnel example\n")[1]  # the second worked example
TUNNEL_MODULE = re.search(r"```python\n(.*?)```", TUNNEL_DOC, re.S).group(1)
TUNNEL_RECIPE = yaml.safe_load(re.search(r"```yaml\n(.*?)```", TUNNEL_DOC, re.S).group(1))
CLI = [sys.executable, "-m", "interp_bayes.cli"]


@pytest.fixture
def registry(monkeypatch):
    """Kinds registered by a test are forgotten after it (built-ins are loaded first, so they stay)."""
    for name in kinds.BUILTIN:
        kinds.get_kind(name)
    monkeypatch.setattr(kinds, "_REGISTRY", dict(kinds._REGISTRY))
    monkeypatch.setattr(kinds, "_SOURCE", dict(kinds._SOURCE))


def _env(pythonpath=None) -> dict:
    """A subprocess's environment: PYTHONPATH holds this checkout and ``pythonpath`` only, so a plugin folder is
    importable only when given."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(([str(pythonpath)] if pythonpath else []) + [str(DOC.parent.parent)])
    return env


def _cli(*args, cwd="/", pythonpath=None):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=_env(pythonpath))


def _fresh_report(folder: Path, pythonpath=None) -> str:
    """``interp-bayes report RUN`` in a new interpreter; the page it wrote (the old page is removed first), with
    its text unescaped."""
    (folder / "report.html").unlink()
    proc = _cli("report", folder, pythonpath=pythonpath)
    assert proc.returncode == 0, proc.stderr
    return html.unescape((folder / "report.html").read_text())


def _page_here(folder: Path, forget: str = "") -> str:
    """The report rebuilt in this process, after forgetting the kind ``forget`` (as a fresh process would not know
    it: ``registry`` restores it), with its text unescaped."""
    from interp_bayes.report.html import build_report

    kinds._REGISTRY.pop(forget, None), kinds._SOURCE.pop(forget, None)
    return html.unescape(build_report(folder).read_text())


def _stage(folder: Path, probe="mean_entropy") -> dict:
    return json.loads((folder / "probes" / probe / "stage.json").read_text())


def test_the_documented_toy_probe_runs_end_to_end(tiny_dirs, tmp_path, registry):
    (tmp_path / "my_probes.py").write_text(MODULE)
    (tmp_path / "mean_entropy.yaml").write_text(yaml.safe_dump(RECIPE))  # the module path is relative to the recipe
    run = run_sweep(SweepConfig(model=str(tiny_dirs["phi2"]), out=str(tmp_path / "runs"), quiet=True,
                                probes=["keys", str(tmp_path / "mean_entropy.yaml")]))
    row = find(run.rows, "mean_entropy")
    assert row.kind == "mean_entropy" and row.probe == "mean_entropy" and row.n == 64  # the basic prompt set
    assert row.low <= row.value <= row.high and row.interval == "bootstrap 95%"
    line = next(line for line in run.summary() if line.label == "mean next-token entropy")
    assert f"{row.value:.3f} bits" in line.value
    page = (run.folder / "report.html").read_text()
    assert FIGURE in page and "mean next-token entropy" in page
    assert "mean_entropy,mean_entropy,mean_entropy," in (run.folder / "results.csv").read_text()
    stage = _stage(run.folder)
    assert stage["kind_module"] == str((tmp_path / "my_probes.py").resolve()) and stage["kind_from"] == "file"
    assert _stage(run.folder, "keys")["kind_from"] == "built-in"
    page = _page_here(run.folder, forget="mean_entropy")  # the kind unknown here: the recorded file is imported
    assert FIGURE in page and "mean next-token entropy" in page
    # the file gone: one line names the module it needs, and the rows are shown as they are
    (tmp_path / "my_probes.py").unlink()
    page = _page_here(run.folder, forget="mean_entropy")
    assert FIGURE not in page and "mean_entropy: kind mean_entropy not loaded" in page
    assert f"needs the module {tmp_path.resolve() / 'my_probes.py'}" in page and "mean_entropy: mean_entropy {}" in page


def test_the_documented_wind_tunnel_probe_runs_and_computes_what_it_says(tiny_dirs, tmp_path, registry):
    """The wind-tunnel example as written, through the sweep on bijection-repl-cpu, against references computed
    here: the residual norms from the tunnel's own forward pass at the query positions, the exact posterior's entropy
    from the batch, rho from scipy, the null range and p from numpy over permutations of whole sequences; its claim
    is in the ledger and its figure in the page. A layer beyond the tunnel's depth is refused before anything is
    written, and a null shuffling single rows would sit near 0, far below the one that keeps position."""
    import numpy as np
    from scipy.stats import spearmanr

    from interp_bayes.report.ledger import collect, ledger_lines
    from interp_bayes.report.view import RunView
    from interp_bayes.stats import group_permutations
    from interp_bayes.windtunnel.tunnels import open_tunnel

    (tmp_path / "resid_norm.py").write_text(TUNNEL_MODULE)
    (tmp_path / "resid_norm.yaml").write_text(yaml.safe_dump(TUNNEL_RECIPE))
    (tmp_path / "deep.yaml").write_text(yaml.safe_dump(dict(TUNNEL_RECIPE, at=5)))
    config = SweepConfig(model=str(tiny_dirs["llama3"]), out=str(tmp_path / "runs"), quiet=True,
                         probes=[str(tmp_path / "deep.yaml")])
    with pytest.raises(ConfigError, match="Layer 5 is out of range for a model with 2 layers"):
        run_sweep(config)
    assert not (tmp_path / "runs").exists()

    run = run_sweep(config.override(probes=[str(tmp_path / "resid_norm.yaml")]))
    row = find(run.rows, "spearman_norm_entropy", layer=1)
    assert row.kind == "resid_norm" and row.n == 40 and row.null == "sequences permuted"
    data = json.loads((run.folder / "probes" / "resid_norm" / "data.json").read_text())
    tunnel = open_tunnel("bijection-repl-cpu")
    batch = tunnel.task.sample(40, seed=2024)
    _, cache = tunnel.model.run_with_cache(batch.input_ids, names_filter="blocks.1.hook_resid_post")
    norm = cache["blocks.1.hook_resid_post"][:, batch.query_pos].double().norm(dim=-1).reshape(-1).numpy()
    post = batch.posterior.double().reshape(-1, batch.posterior.shape[-1]).numpy()
    exact = -(post * np.log2(np.where(post > 0, post, 1.0))).sum(-1)
    np.testing.assert_allclose(data["norm"], norm, rtol=1e-4)
    np.testing.assert_allclose(data["entropy"], exact, rtol=1e-12, atol=1e-12)
    tied = np.round(exact, 9)  # equal entropies computed along different paths differ by 1e-16: ties, as ranks snaps
    assert row.value == pytest.approx(spearmanr(norm, tied).statistic, abs=1e-9)
    groups = np.repeat(np.arange(40), len(batch.query_pos))
    null = np.array([spearmanr(norm, tied[i]).statistic for i in group_permutations(groups, 1000, run.config.seed)])
    assert [row.null_low, row.null_high] == pytest.approx(np.percentile(null, [2.5, 97.5]), abs=1e-9)
    p = min(1.0, 2 * (1 + min((null >= row.value).sum(), (null <= row.value).sum())) / 1001)
    assert row.note == f"p = {p:.3g}"
    rows_shuffled = [spearmanr(norm, tied[np.random.default_rng(s).permutation(len(exact))]).statistic
                     for s in range(200)]
    assert abs(np.mean(rows_shuffled)) < 0.1 < row.null_low  # the null that keeps position is far from 0

    claims = [c for c in collect(RunView.load(run.folder)) if c.key == "resid-norm-entropy"]
    assert len(claims) == 1 and claims[0].subject == "bijection-repl-cpu"
    assert claims[0].verdict == ("holds" if row.value > row.null_high else "does not hold")
    assert ledger_lines(claims, "m")[1].startswith("  wind tunnel bijection-repl-cpu: 1 claims: ")
    page = html.unescape((run.folder / "report.html").read_text())
    assert 'id="fig-resid-norm-resid_norm"' in page and claims[0].claim in page


def test_the_documented_tiny_model_commands_run_and_a_fresh_report_shows_the_plugin(tmp_path):
    """The doc's shell commands, as written, each in its own process (so the report re-imports the plugin)."""
    (tmp_path / "my_probes.py").write_text(MODULE)
    (tmp_path / "mean_entropy.yaml").write_text(yaml.safe_dump(RECIPE))
    run = None
    for command in COMMANDS.strip().splitlines():
        argv = shlex.split(command)
        argv = [sys.executable, *argv[1:]] if argv[0] == "python" else [*CLI, *argv[1:]]
        argv = [str(run) if a == "RUN" else a for a in argv]
        if argv[-2:] == ["report", str(run)]:
            (run / "report.html").unlink()  # the sweep's own page: the report below must be rebuilt from scratch
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=_env())
        assert proc.returncode == 0, (command, proc.stderr)
        found = re.search(r"^run folder: (.+)$", proc.stdout, re.M)
        run = tmp_path / found.group(1) if found else run
    assert (tmp_path / "tiny-llama" / "model.safetensors").exists() and run.parent.name == "tiny-llama"
    page = (run / "report.html").read_text()
    assert FIGURE in page and "Next-token entropy" in page and "mean next-token entropy" in page


def test_a_kind_registered_by_import_comes_back_in_a_fresh_report(tiny_dirs, tmp_path, monkeypatch, registry):
    """`import my_probes`, then a recipe `kind: mean_entropy`: the recipe names no module, the stage records it."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "my_probes.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(plugins))
    monkeypatch.delitem(sys.modules, "my_probes", raising=False)
    import my_probes  # noqa: F401  (registers mean_entropy)

    monkeypatch.delitem(sys.modules, "my_probes")
    (tmp_path / "mean_entropy.yaml").write_text(yaml.safe_dump(dict(RECIPE, kind="mean_entropy")))
    run = run_sweep(SweepConfig(model=str(tiny_dirs["llama3"]), out=str(tmp_path / "runs"), quiet=True,
                                probes=[str(tmp_path / "mean_entropy.yaml")]))
    assert _stage(run.folder)["kind_module"] == "my_probes" and _stage(run.folder)["kind_from"] == "module"
    page = _fresh_report(run.folder, pythonpath=plugins)
    assert FIGURE in page and "mean next-token entropy" in page
    sys.path.remove(str(plugins))  # not importable any more: one line says which module, the raw rows follow
    page = _page_here(run.folder, forget="mean_entropy")
    assert FIGURE not in page and "needs the module my_probes, which cannot be imported here" in page
    assert "mean_entropy: mean_entropy {}" in page


def _installed_plugin(site: Path) -> None:
    """A distribution 'toy-probes' as pip would leave it: a module and its dist-info (METADATA, entry points), one
    entry point good and one pointing at a module that does not exist."""
    site.mkdir()
    (site / "toy_probes.py").write_text(MODULE)
    info = site / "toy_probes-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-probes\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[interp_bayes.kinds]\nmean_entropy = toy_probes:KIND\n"
                                           "broken = toy_probes_missing:KIND\n")


def test_an_installed_entry_point_is_listed_runs_and_reports(tiny_dirs, tmp_path, monkeypatch, registry):
    site = tmp_path / "site"
    _installed_plugin(site)
    listing = _cli("probes", pythonpath=site)
    assert listing.returncode == 0, listing.stderr
    out = listing.stdout
    assert "kind focusing: " in out and "[built-in]" in out  # built-ins still first, marked
    assert ("kind mean_entropy: Mean next-token entropy of a prompt set, with a bootstrap interval: a worked example "
            "of a probe kind. [entry point 'mean_entropy' of distribution 'toy-probes']") in out
    assert "    n_boot = 200" in out.split("kind mean_entropy:")[1]
    broken = next(line for line in out.splitlines() if line.startswith("kind broken:"))
    assert "not loadable" in broken and "'broken = toy_probes_missing:KIND'" in broken and "'toy-probes'" in broken
    assert "ModuleNotFoundError" in broken and "Traceback" not in listing.stdout + listing.stderr

    (tmp_path / "mean_entropy.yaml").write_text(yaml.safe_dump(dict(RECIPE, kind="mean_entropy")))
    sweep = _cli("sweep", "--model", tiny_dirs["pythia"], "--out", tmp_path / "runs", "--quiet", "--probes",
                 tmp_path / "mean_entropy.yaml", pythonpath=site)
    assert sweep.returncode == 0, sweep.stderr
    # the terminal shows the claims ledger (a plugin without a ledger hook adds no line); its lines are in the page
    assert sweep.stdout.startswith("claims ledger: ") and "mean next-token entropy" not in sweep.stdout
    folder = tmp_path / re.search(r"^run folder: (.+)$", sweep.stdout, re.M).group(1)
    assert _stage(folder)["kind_module"] == "mean_entropy" and _stage(folder)["kind_from"] == "entry point"
    page = _fresh_report(folder, pythonpath=site)
    assert FIGURE in page and "mean next-token entropy" in page
    page = _page_here(folder)  # here the package is not installed
    assert FIGURE not in page and "needs the package that declares the entry point 'mean_entropy'" in page

    monkeypatch.syspath_prepend(str(site))  # installed here too: a recipe of the broken entry point
    (tmp_path / "broken.yaml").write_text("kind: broken\n")
    with pytest.raises(ConfigError) as err:
        load_probe(tmp_path / "broken.yaml")
    assert str(err.value) == ("Entry point 'broken = toy_probes_missing:KIND' of distribution 'toy-probes' (group "
                              "interp_bayes.kinds) cannot be loaded (ModuleNotFoundError: No module named "
                              "'toy_probes_missing'); fix or reinstall toy-probes.")


def _plugin(folder: Path, kind_name: str, body: str = "") -> Path:
    """A .py plugin registering a trivial kind called ``kind_name``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "plugin.py"
    path.write_text("from dataclasses import dataclass\nfrom interp_bayes.core.plugin import Kind, Params, Result\n"
                    "from interp_bayes.core.registry import register\n"
                    f"{body}\n@dataclass(frozen=True)\nclass P(Params):\n    n: int = 1\n\n"
                    f"KIND = register(Kind({kind_name!r}, P, lambda ctx, p: Result([])))\n")
    return path


def test_duplicate_names_are_refused_and_the_same_module_again_is_quiet(tmp_path, registry):
    first = _plugin(tmp_path / "a", "dup")
    kind = kinds.get_kind(f"{first}:dup")
    again = kinds.get_kind(f"{first}:dup")  # the same file loaded again by path: replaced quietly
    assert again.name == "dup" and again is not kind and kinds.get_kind("dup") is again
    assert kinds.provenance(again) == dict(kind_module=str(first.resolve()), kind_from="file")
    assert kinds.register(again) is again  # the very same Kind object registered again (here): harmless...
    assert kinds.provenance(again)["kind_module"] == str(first.resolve())  # ...and it still belongs to its file
    impostor = Kind("dup", again.params, again.run)
    with pytest.raises(ConfigError, match="Two modules register a probe kind named 'dup'") as err:
        kinds.register(impostor)  # another Kind under that name, from another module (this one)
    assert str(first.resolve()) in str(err.value) and f"module {__name__}" in str(err.value)
    assert kinds.get_kind("dup") is again

    second = _plugin(tmp_path / "b", "dup2")
    kinds.get_kind(f"{second}:dup2")
    other = _plugin(tmp_path / "c", "dup2")
    with pytest.raises(ConfigError) as err:
        kinds.get_kind(f"{other}:dup2")
    assert str(second.resolve()) in str(err.value) and str(other.resolve()) in str(err.value)
    assert kinds.provenance(kinds.get_kind("dup2"))["kind_module"] == str(second.resolve())  # the first one kept


def test_built_in_names_are_reserved(tmp_path, registry):
    path = _plugin(tmp_path, "keys")
    with pytest.raises(ConfigError, match="'keys' is the name of a built-in probe kind"):
        kinds.get_kind(f"{path}:keys")
    assert kinds.provenance(kinds.get_kind("keys")) == dict(kind_module="interp_bayes.kinds.keys",
                                                            kind_from="built-in")


def test_a_plugin_that_fails_on_import_gets_one_sentence(tmp_path, registry):
    path = _plugin(tmp_path, "boom", body="raise RuntimeError('no GPU here')")
    with pytest.raises(ConfigError) as err:
        kinds.get_kind(f"{path}:boom")
    assert str(err.value) == (f"Probe-kind module {path.resolve()} fails on import (RuntimeError: no GPU here); fix "
                              "it and rerun.")
    assert "boom" not in kinds.known_kinds()
    with pytest.raises(ConfigError, match=r"registers no probe kind 'other'"):
        kinds.get_kind(f"{_plugin(tmp_path / 'x', 'fine')}:other")
