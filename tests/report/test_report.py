"""The HTML report and the compare page, built from tiny-model run folders: self-contained (plotly.js inlined once,
packed, nothing external), the claims ledger first, data escaped, figures skipped cleanly when their probe did not run, and, when Chromium is
installed, every figure rendered by a real browser with no script error and no request leaving the machine."""

import argparse
import base64
import gzip
import json
import re
import shutil
import subprocess

import plotly.offline
import pytest
import yaml

from interp_bayes.run.config import SweepConfig
from interp_bayes.report.html import (Report, add_compare_arguments, add_report_arguments, build_compare,
                                      build_report, compare_main, report_main)
from interp_bayes.report.view import ReportError, RunView
from interp_bayes.run.sweep import run_sweep

XSS = "<script>alert(1)</script>"
PROBES = {  # the built-in probe names at toy sizes, for a 25-prompt pool and a 2-layer model
    "manifold_mixed": dict(kind="manifold", per_bin=4, n_boot=20, n_null=5),
    "manifold_math": dict(kind="manifold", domain="mathematics", per_bin=1, n_boot=20, n_null=5),
    "keys": dict(kind="keys", n_null=5),
    "focusing": dict(kind="focusing", per_bin=2, n_boot=20),
    "icl": dict(kind="icl", per_k=4, layers=[1], n_boot=20, n_null=5),
    "axis": dict(kind="axis", per_k=4, layers=[1], folds=3),
    "interventions": dict(kind="interventions", layer_sets=[[-1]], ops=["cut", "shift+"],
                          controls=dict(isotropic=2, matched=2, pcs=1), per_k=4, layers=[1]),
}
# the figures each probe kind draws (ids end with the recipe's name)
FIGURES = ["manifold", "shares", "manifold-examples", "keys-keys", "focusing-focusing", "icl-icl",
           "icl-geometry-icl", "icl-examples-icl", "axis-axis", "axis-deconfounded-axis", "interventions-interventions",
           "interventions-per-k-interventions"]
BUNDLE = plotly.offline.get_plotlyjs()


def _probe_files(folder, names):
    folder.mkdir(exist_ok=True)
    for name in names:
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(PROBES[name]))
    return [str(folder / f"{name}.yaml") for name in names]


@pytest.fixture(scope="module")
def runs(tiny_dirs, tmp_path_factory):
    """Two run folders: every probe on a GQA model whose folder name needs escaping, with a prompt pool in
    which every prompt carries a script tag; and only two probes on a second model (figures must skip)."""
    root = tmp_path_factory.mktemp("report")
    model = root / "m<b>&x"
    shutil.copytree(tiny_dirs["llama3"], model)
    words = ["cat", "2 + 2 =", "def f(x):", "the sum of 3 and 4 is", "Paris is", "x^2 + 1 =", "hello", "for i in",
             "7 * 8 =", "once upon"]
    rows = [dict(text=f"{XSS} {words[i % 10]} {i}", domain="mathematics" if "=" in words[i % 10] else "prose")
            for i in range(25)]
    pool = root / "pool.jsonl"
    pool.write_text("\n".join(json.dumps(r) for r in rows))
    full = run_sweep(SweepConfig(model=str(model), out=str(root / "runs"), prompts=str(pool), quiet=True,
                                 probes=_probe_files(root / "probes", PROBES)))
    part = run_sweep(SweepConfig(model=str(tiny_dirs["mistral"]), out=str(root / "runs"), prompts=str(pool),
                                 quiet=True, probes=_probe_files(root / "probes", ["manifold_mixed", "keys"])))
    return dict(full=full.folder, part=part.folder, report=build_report(full.folder),
                part_report=build_report(part.folder), root=root)


def _packed(text: str) -> list[str]:
    """The packed (gzip + base64) payloads of a page: plotly.js and the figure specs, unpacked."""
    blobs = re.findall(r'id="ib-plotly">([A-Za-z0-9+/=]+)</script>', text)
    blobs += re.findall(r'data-spec="([A-Za-z0-9+/=]+)"', text)
    return [gzip.decompress(base64.b64decode(b)).decode() for b in blobs]


def _outside_bundle(text: str) -> str:
    unpacked = _packed(text)
    assert sum(u == BUNDLE for u in unpacked) == 1 and BUNDLE not in text  # plotly.js once, packed
    rest = re.sub(r'id="ib-plotly">[A-Za-z0-9+/=]+</script>', "", text)
    return re.sub(r'data-spec="[A-Za-z0-9+/=]+"', "", rest) + "".join(u for u in unpacked if u != BUNDLE)


def test_report_is_self_contained(runs):
    text = runs["report"].read_text()
    assert runs["report"] == runs["full"] / "report.html"
    assert sum(u.count("* plotly.js v") for u in _packed(text)) == 1  # the bundle's header comment: inlined once
    rest = _outside_bundle(text)
    assert not re.search(r"(src|href)\s*=\s*[\"']?\s*(https?:)?//", rest, re.I)
    assert "http://" not in rest and "https://" not in rest and "<link" not in rest
    assert all(f'id="fig-{key}"' in text for key in FIGURES)  # every probe ran: every figure present
    assert '<a href="results.csv">results.csv</a>' in text and (runs["full"] / "results.csv").exists()
    # the ledger first, then the figures, the table of every number last
    assert text.index('id="ledger"') < text.index('id="fig-') < text.index("All numbers: this run beside Paper III")
    for needle in ("Pythia-410M: 79.6% (78.4, 80.8)", "mixed PC1+PC2", "git commit", "One dominant value axis",
                   'id="rows-filter"'):
        assert needle in text


def test_data_text_is_escaped(runs):
    text = runs["report"].read_text()
    assert "<script>alert" not in text and "m<b>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text  # the example-prompt table (and hover labels)
    assert "m&lt;b&gt;&amp;x" in text


def test_missing_probes_skip_their_figures(runs):
    text = runs["part_report"].read_text()
    present = {key for key in FIGURES if f'id="fig-{key}"' in text}
    assert present == {"manifold", "shares", "manifold-examples", "keys-keys"}
    with pytest.raises(ReportError, match="is not a run folder"):
        RunView.load(runs["root"])


def test_compare_page_and_cli_entry_points(runs, capsys):
    out = runs["root"] / "cmp" / "compare.html"
    parser = add_compare_arguments(argparse.ArgumentParser())
    assert compare_main(parser.parse_args([str(runs["full"]), str(runs["part"]), "--out", str(out)])) == 0
    text = out.read_text()
    rest = _outside_bundle(text)
    assert "https://" not in rest and "http://" not in rest
    assert "m&lt;b&gt;&amp;x" in text and "tiny-mistral" in text and "Llama-3.2-1B (paper)" in text
    assert "GQA (4/2)" in text and "MQA" in text  # llama3 tiny: 4 heads / 2 KV heads; mistral tiny: 1 KV head
    assert build_compare([runs["full"]], out) == out
    parser = add_report_arguments(argparse.ArgumentParser())
    assert report_main(parser.parse_args([str(runs["part"])])) == 0
    assert capsys.readouterr().out.strip().endswith("report.html")
    assert "Claims × models" in text and text.index("Claims × models") < text.index("Table 2 layout")
    first, second = Report(runs["part_report"])._repr_html_(), Report(runs["part_report"])._repr_html_()
    assert first.count(BUNDLE) <= 1 and BUNDLE not in second  # plotly.js sent once per kernel, not per output
    assert "key orthogonality (10-90% of heads)" in second and 'id="fig-keys-keys"' in second


def _chromium(page, tmp_path) -> tuple[str, str, list[str]]:
    """(dumped DOM, stderr, URLs in the network log) of headless Chromium loading ``page`` offline."""
    netlog = tmp_path / "netlog.json"
    proc = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--host-resolver-rules=MAP * ~NOTFOUND",
         f"--log-net-log={netlog}", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000",
         "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    urls = re.findall(r'"url":"(https?://[^"]+)"', netlog.read_text()) if netlog.exists() else []
    # the browser's own service traffic (update checks, accounts), not the page's
    urls = [u for u in urls if not re.match(r"https?://[^/]*(google\.com|googleapis\.com)/", u)]
    return proc.stdout, proc.stderr, urls


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="chromium is not installed (apt-get install -y chromium); the browser check needs it")
def test_report_renders_in_headless_chromium(runs, tmp_path):
    bad = tmp_path / "bad.html"  # the detectors themselves: a page script error and an external fetch
    bad.write_text('<html><body><img src="https://example.com/x.png"><script>throw new Error("boom")</script>'
                   "</body></html>")
    _, err, urls = _chromium(bad, tmp_path / "bad")
    assert "Uncaught Error: boom" in err and set(urls) == {"https://example.com/x.png"}

    _, err, urls = _chromium(runs["report"], tmp_path / "report")
    assert "Uncaught" not in err and "CONSOLE" not in err, err[-2000:]
    assert urls == []
    from tests.browser import Browser

    with Browser() as b:  # the figures are drawn as they come into view, then the rest when idle: wait for all
        b.open(runs["report"])
        drawn = b.evaluate("""new Promise(function (done) { var t0 = Date.now();
          (function check() { var plots = document.querySelectorAll('div.plot');
            var ok = Array.prototype.every.call(plots, function (p) { return p.querySelector('.main-svg'); });
            if (ok || Date.now() - t0 > 60000) done(JSON.stringify({n: plots.length, ok: ok,
              sections: document.querySelectorAll('section.fig').length})); else setTimeout(check, 100); })(); })""")
    drawn = json.loads(drawn)
    assert drawn["sections"] == len(FIGURES) and drawn["ok"] and drawn["n"] == len(FIGURES) - 2  # 2: prompt tables


def test_the_ledger_as_markdown_names_each_claim_its_subject_and_verdict():
    """``results --format markdown`` opens with the claims ledger: one row per claim, the run's model where a claim
    has no subject, the verdict with its symbol, and a pipe in a number escaped so that the table keeps its columns."""
    from interp_bayes.core.plugin import Claim
    from interp_bayes.report.ledger import ledger_markdown
    from interp_bayes.stats.ledger import FAILS, HOLDS

    claims = [Claim("readout", "The axis is a readout", HOLDS, "-0.003 [-0.01, 0.005]"),
              Claim("wt-pc1-bayes", "PC1 tracks the posterior", FAILS, "0.1 | 0.2", subject="hmm-cpu", rival=True)]
    lines = ledger_markdown(claims, "smollm2-135m").splitlines()
    assert lines[2] == "| The axis is a readout | smollm2-135m | ✔ holds | -0.003 [-0.01, 0.005] |"
    assert lines[3] == "| PC1 tracks the posterior (rival) | hmm-cpu | ✘ does not hold | 0.1 \\| 0.2 |"
    assert all(line.count(" | ") == 3 for line in lines[2:])  # escaped pipes are not column breaks
    assert "No finished probe" in ledger_markdown([], "m")
