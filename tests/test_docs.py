"""Docs that cannot go stale (issue 36, item 5): every <!-- snapshot NAME/ENTRY --> block of the docs equals what
its committed snapshot (docs/snapshots/NAME) renders, every entry a snapshot defines is quoted somewhere, and moving
a number (in the snapshot or in the doc) fails until the doc follows. Reads files only; runs no model.

The check failed on docs/rivals.md §5 as it stood before this test (pre-0.3.0 row-fold decoding numbers), its
decoding table wrapped in a marker with the old numbers kept (commit ab8791d): ``interp-bayes docs docs/rivals.md
--check`` -> exit 1, "docs/rivals.md: windtunnels/decoding", and this file's first test fails; every row of the
table differs (deconfounded R²: hmm-cpu resid L2 exact entropy 0.364 -> -0.081, model entropy 0.494 -> -0.121;
bijection-cpu z L1 0.235 -> -0.319; bijection-repl-cpu resid L1 0.680 -> 0.610).
"""

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from interp_bayes import cli
from interp_bayes.core.errors import ConfigError
from interp_bayes.core.store import read_yaml
from interp_bayes.report.snapshot import SPEC, Snapshot, docs_main, quoted, render

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
SNAPSHOTS = ROOT / "docs" / "snapshots"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_marked_block_equals_its_snapshot(doc):
    _, stale = render(doc.read_text(), SNAPSHOTS)
    assert not stale, (f"{doc.name}: {', '.join(stale)} differ from the committed snapshot; refill them with "
                       f"`interp-bayes docs {doc.relative_to(ROOT)}` and make the prose around them agree")


def test_every_entry_of_a_snapshot_is_quoted_in_the_docs():
    """A table or value defined and quoted nowhere is dead, and a removed block would leave its numbers unchecked."""
    used = {q for doc in DOCS for q in quoted(doc.read_text())}
    specs = sorted(SNAPSHOTS.glob(f"*/{SPEC}"))
    assert specs, "no committed snapshot"
    for spec in specs:
        for entry in read_yaml(spec, "entries"):
            assert (spec.parent.name, entry) in used, f"{spec.parent.name}/{entry} is quoted in no doc"


def _copy(tmp_path):
    shutil.copytree(SNAPSHOTS, tmp_path / "snapshots")
    return tmp_path / "snapshots"


def test_a_number_moved_in_the_snapshot_fails_until_the_doc_follows(tmp_path):
    """The lead's case: a merge moves a number; the committed doc is then stale, and refilling it fixes that."""
    root = _copy(tmp_path)
    results = root / "windtunnels" / "results.csv"
    lines = results.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if ",decoding_windtunnel_hmm,decoding,decoding_r2,bayes latent,resid,2,"
              in line and ",deconfounded," in line)
    fields = lines[at].split(",")
    value = fields.index(next(f for f in fields[8:] if f.startswith(("-", "0."))))  # the first number: the value
    fields[value] = "0.364"  # the pre-0.3.0 number §5 quoted
    lines[at] = ",".join(fields)
    results.write_text("".join(lines))
    doc = (ROOT / "docs" / "rivals.md").read_text()
    new, stale = render(doc, root)
    assert "windtunnels/decoding" in stale and "0.364" in new
    assert render(new, root)[1] == []


def test_a_number_edited_in_the_doc_fails():
    doc = (ROOT / "docs" / "rivals.md").read_text()
    block = doc.index("<!-- snapshot windtunnels/decoding -->")
    row = doc.index("| hmm-cpu | resid L2 |", block)
    end = doc.index("\n", row)
    edited = doc[:row] + doc[row:end].rsplit("|", 2)[0] + "| 0.364 |" + doc[end:]
    assert edited != doc and render(edited, SNAPSHOTS)[1] == ["windtunnels/decoding"]


def _snapshot(tmp_path, entries: dict, results: str) -> Path:
    folder = tmp_path / "snapshots" / "s"
    folder.mkdir(parents=True)
    import yaml

    (folder / SPEC).write_text(yaml.safe_dump(entries))
    (folder / "results.csv").write_text(results)
    return folder.parent


RESULTS = ("model,probe,metric,layer,value,low,high\n"
           "a,p,r2,0,0.5,0.4,0.6\n"
           "a,p,r2,1,nan,,\n"
           "a,p,share,0,0.25,,\n"
           "b,p,r2,0,-0.125,-0.2,0.1\n")


def test_tables_and_values_render_from_records(tmp_path):
    root = _snapshot(tmp_path, {
        "t": {"rows": {"probe": "p"}, "key": ["model", "layer"],
              "columns": [{"head": "model", "text": "{model} L{layer}"},
                          {"head": "R²", "match": {"metric": "r2"}, "format": "{value:.2f} [{low:.2f}, {high:.2f}]"},
                          {"head": "share", "match": {"metric": "share"}, "format": "{value:.1f}"}]},
        "best": {"rows": {"metric": "r2"}, "agg": "max", "format": "{value:.3f} ({model} L{layer})"},
        "worst": {"rows": {"metric": "r2"}, "agg": "min", "format": "{value:+.3f}"},
        "n": {"rows": {"metric": "r2", "model": ["a", "b"]}, "agg": "count", "format": "{count}"},
        "one": {"rows": {"metric": "share"}, "format": "{value:.2f}"}}, RESULTS)
    text = ("x\n<!-- snapshot s/t -->\n<!-- /snapshot -->\nbest <!-- snapshot s/best -->?<!-- /snapshot -->, "
            "worst <!-- snapshot s/worst -->?<!-- /snapshot --> of <!-- snapshot s/n --><!-- /snapshot -->; "
            "<!-- snapshot s/one -->0.25<!-- /snapshot -->\n")
    quoted_in_code = "the syntax: `<!-- snapshot s/t -->` ... `<!-- /snapshot -->`\n"  # described, not filled
    new, stale = render(text + quoted_in_code, root)
    assert stale == ["s/t", "s/best", "s/worst", "s/n"]  # s/one was already right
    assert new == ("x\n<!-- snapshot s/t -->\n| model | R² | share |\n|---|---|---|\n"
                   "| a L0 | 0.50 [0.40, 0.60] | 0.2 |\n| a L1 | NaN [—, —] | — |\n| b L0 | -0.12 [-0.20, 0.10] | — |\n"
                   "<!-- /snapshot -->\nbest <!-- snapshot s/best -->0.500 (a L0)<!-- /snapshot -->, "
                   "worst <!-- snapshot s/worst -->-0.125<!-- /snapshot --> of <!-- snapshot s/n -->3<!-- /snapshot -->; "
                   "<!-- snapshot s/one -->0.25<!-- /snapshot -->\n" + quoted_in_code)
    assert render(new, root) == (new, [])


@pytest.mark.parametrize("entry, message", [
    ({"rows": {"metric": "r2"}, "format": "{value}"}, "3 records match where one must"),
    ({"rows": {"metric": "r2"}, "key": ["model"], "columns": [{"head": "h", "match": {}, "format": "{value}"}]},
     "matches 2 records of one line"),
    ({"rows": {"nope": 1}, "format": "{value}"}, "no column nope"),
    ({"rows": {"metric": "share"}, "format": "{missing}"}, "cannot be filled"),
    ({"rows": {"metric": "r2"}, "agg": "mean", "format": "{value}"}, "agg must be one of"),
    ({"rows": {"metric": "r2"}, "agg": "max", "field": "model", "format": "{value}"}, "not a numeric column"),
    ({"rows": {"metric": "zzz"}, "key": ["model"], "columns": [{"head": "h", "text": "{model}"}]}, "no record matches"),
])
def test_a_bad_entry_is_refused_in_one_sentence(tmp_path, entry, message):
    root = _snapshot(tmp_path, {"e": entry}, RESULTS)
    with pytest.raises(ConfigError, match=message):
        render("<!-- snapshot s/e --><!-- /snapshot -->", root)
    with pytest.raises(ConfigError, match="s/zzz is not defined"):
        render("<!-- snapshot s/zzz --><!-- /snapshot -->", root)
    with pytest.raises(ConfigError, match="is no snapshot"):
        Snapshot.load(tmp_path)


def test_docs_command_checks_refills_and_writes_nothing_on_a_bad_marker(tmp_path, capsys):
    root = _snapshot(tmp_path, {"one": {"rows": {"metric": "share"}, "format": "{value:.2f}"}}, RESULTS)
    good, bad = tmp_path / "good.md", tmp_path / "bad.md"
    good.write_text("share <!-- snapshot s/one -->0.3<!-- /snapshot -->\n")
    assert cli.main(["docs", str(good), "--snapshots", str(root), "--check"]) == 1
    assert "good.md: s/one" in capsys.readouterr().err and "0.3<" in good.read_text()
    bad.write_text("<!-- snapshot s/nothing --><!-- /snapshot -->\n")
    # exit 2, one sentence, and good.md untouched though it comes first
    assert cli.main(["docs", str(good), str(bad), "--snapshots", str(root)]) == 2
    assert "s/nothing is not defined" in capsys.readouterr().err
    assert "0.3<" in good.read_text()
    assert docs_main(SimpleNamespace(files=[str(good)], snapshots=str(root), check=False)) == 0
    assert good.read_text() == "share <!-- snapshot s/one -->0.25<!-- /snapshot -->\n"


def test_a_pipe_in_a_record_is_escaped_in_its_cell(tmp_path):
    """A claim's text ("mean |cos| of key columns") would otherwise split its table cell in two."""
    root = _snapshot(tmp_path, {"t": {"rows": {}, "key": ["claim"], "columns": [{"head": "claim", "text": "{claim}"}]}},
                     "claim,value\nmean |cos| of W_K,1\n")
    new, _ = render("<!-- snapshot s/t --><!-- /snapshot -->", root)
    assert "| mean \\|cos\\| of W_K |" in new.splitlines()
