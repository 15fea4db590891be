"""Identity of results (issue 35, item 8): identical runs give byte-equal rows; every exported row names its run
and model; the compare page states each claim at each run's own scope; compare never writes into a run folder."""

import csv
import io
import json
import re
import shutil

import pytest

from interp_bayes import cli
from interp_bayes.core.store import content_key, read_json
from interp_bayes.model.testing import TOY_PROBES, make_tiny_model, make_tokenizer, tiny_config, write_toy_recipes
from interp_bayes.run.config import SweepConfig
from interp_bayes.run.sweep import run_sweep


def _deep_model(folder, n_layers: int = 4):
    """The tiny Llama with more layers: a model whose last layer is not the tiny one's."""
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_config("llama3")
    config.num_hidden_layers = n_layers
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    make_tokenizer(folder)
    model.save_pretrained(folder)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("identity")
    shallow, deep = root / "tiny-llama3", root / "deep-llama3"
    make_tiny_model("llama3", shallow)
    _deep_model(deep)
    probes = write_toy_recipes(root / "probes")
    first, second = (run_sweep(SweepConfig(model=str(shallow), out=str(root / out), prompts="basic", quiet=True,
                                           probes=probes)) for out in ("one", "two"))
    some = [p for p in probes if p.endswith(("mixed.yaml", "keys.yaml"))]  # the others pin layer 1
    other = run_sweep(SweepConfig(model=str(deep), out=str(root / "one"), prompts="basic", quiet=True, probes=some))
    return dict(first=first.folder, second=second.folder, deep=other.folder, root=root)


def test_two_identical_runs_write_byte_equal_rows(runs):
    """No wall time (or anything else of the moment) in a row: that is stage.json's ``seconds``."""
    first, second = runs["first"], runs["second"]
    assert sorted(p.parent.name for p in first.glob("probes/*/rows.json")) == sorted(TOY_PROBES)
    for name in TOY_PROBES:  # every kind of the toy sweep, the interventions kind among them
        rows = (first / "probes" / name / "rows.json").read_bytes()
        assert rows == (second / "probes" / name / "rows.json").read_bytes(), name
        assert "seconds" not in {r["metric"] for r in json.loads(rows)}
    assert read_json(first / "probes" / "cut" / "stage.json")["seconds"] > 0  # the time is kept, out of the rows


def _csv(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def test_results_name_the_run_and_the_model_of_every_row(runs, capsys):
    first, deep = runs["first"], runs["deep"]
    tables = {folder: _csv((folder / "results.csv").read_text()) for folder in (first, deep)}
    for folder, rows in tables.items():
        key = content_key(read_json(folder / "model.json")["identity"])
        assert list(rows[0])[:3] == ["run", "model", "model_key"]
        assert {(r["run"], r["model"], r["model_key"]) for r in rows} == {(folder.name, folder.parent.name, key)}
    # concatenated, the two models' rows stay apart (same probe, same metric, other model)
    both = tables[first] + tables[deep]
    assert {r["model"] for r in both if r["probe"] == "mixed"} == {"tiny-llama3", "deep-llama3"}
    assert len({r["model_key"] for r in both}) == 2
    # `interp-bayes results` exports the same, in both formats
    assert cli.main(["results", str(deep)]) == 0
    assert capsys.readouterr().out == (deep / "results.csv").read_text()
    assert cli.main(["results", str(deep), "--format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert records and all(r["model"] == "deep-llama3" and r["run"] == deep.name for r in records)


def test_a_snapshot_holds_the_rows_the_verdicts_and_the_recipes(runs, tmp_path, capsys):
    """`results RUN --snapshot DIR`: the rows exactly as `results` exports them, one ledger line per claim, and what
    ran; a docs.yaml already in DIR is kept; an empty folder is refused with exit 2 and nothing written."""
    from interp_bayes.report.ledger import collect
    from interp_bayes.report.view import RunView

    first, out = runs["first"], tmp_path / "snap"
    out.mkdir()
    (out / "docs.yaml").write_text("kept: {}\n")
    assert cli.main(["results", str(first), "--snapshot", str(out)]) == 0
    assert (out / "results.csv").read_text() == (first / "results.csv").read_text()
    claims = collect(RunView.load(first))
    ledger = _csv((out / "ledger.csv").read_text())
    assert claims and [(r["key"], r["verdict"], r["evidence"]) for r in ledger] == \
        [(c.key, c.verdict, c.evidence) for c in claims]
    meta = read_json(out / "snapshot.json")
    assert meta["run"] == first.name and meta["seed"] == 0
    assert sorted(p["name"] for p in meta["probes"]) == sorted(TOY_PROBES)
    # the version and commit that computed the stages, not those of the folder's first sweep (env.json)
    from interp_bayes import __version__
    from interp_bayes.core.store import git_commit
    assert meta["package"] == __version__ and meta["git_commit"] == git_commit()
    mixed = tmp_path / "mixed" / first.parent.name / first.name
    shutil.copytree(first, mixed)
    stage = mixed / "probes" / next(iter(TOY_PROBES)) / "stage.json"
    stage.write_text(json.dumps(dict(json.loads(stage.read_text()), package="0.0.1")))  # an older version's stage
    assert cli.main(["results", str(mixed), "--snapshot", str(tmp_path / "snap2")]) == 0
    assert read_json(tmp_path / "snap2" / "snapshot.json")["package"] == sorted(["0.0.1", __version__])
    assert (out / "docs.yaml").read_text() == "kept: {}\n"
    capsys.readouterr()
    empty = tmp_path / "empty"
    assert cli.main(["results", str(empty), "--snapshot", str(tmp_path / "nothing")]) == 2
    assert "not a run folder" in capsys.readouterr().err and not (tmp_path / "nothing").exists()


def _matrix_row(page: str, claim: str) -> str:
    table = re.search(r'<table class="ledger matrix">.*?</table>', page, re.S).group(0)
    (row,) = [r for r in re.findall(r"<tr[^>]*>.*?</tr>", table, re.S) if claim in r]
    return row


def test_compare_states_each_claim_at_each_runs_own_layer(runs, capsys):
    """The tiny model's last layer is L1, the deep one's L3: each cell says its own."""
    out = runs["root"] / "compare.html"
    assert cli.main(["compare", str(runs["first"]), str(runs["deep"]), "--out", str(out)]) == 0
    row = _matrix_row(out.read_text(), "One dominant value axis")
    label = re.search(r"<td>(.*?)</td>", row).group(1)
    assert "L1" not in label and "L3" not in label and "…" in label
    assert re.findall(r'<span class="scope">(.*?)</span>', row) == ["L1", "L3"]
    # a claim both runs state alike keeps its text whole, with no scope under the verdicts
    same = _matrix_row(out.read_text(), "Keys are near-orthogonal")
    assert "…" not in same and 'class="scope"' not in same


@pytest.mark.parametrize("where", ["report.html", "probes/new/compare.html"])
def test_compare_refuses_to_write_into_a_run_folder(runs, capsys, where):
    folder = runs["first"]
    before = (folder / "report.html").read_bytes()
    out = folder / where
    code = cli.main(["compare", str(folder), str(runs["deep"]), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"inside the run folder {folder}" in err and "--out compare.html" in err
    assert (folder / "report.html").read_bytes() == before and not (folder / "probes" / "new").exists()
