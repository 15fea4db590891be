"""One self-contained HTML page per run (and one per set of runs): the summary table beside the paper's numbers
first, then the figures, each with a sentence saying what to look for.

Self-contained means viewable offline and forever: plotly.js is inlined exactly once, no stylesheet, font or
script is fetched, and every string that comes from data (prompts, model names, paths) is escaped.
"""

from __future__ import annotations

import argparse
import html
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import plotly.offline
import yaml

from ..store import atomic_write_text, read_json
from .figures import RunData, compare_figures, last_layer, run_figures, shorten
from .tables import PAPER_ROWS, summary_rows

# our summary_rows label -> the PAPER_ROWS key holding the paper's number for it (identical labels map to themselves)
PAPER_KEY = {"mixed Spearman(PC1, H)": "Spearman(PC1, H) mixed / math",
             "math Spearman(PC1, H)": "Spearman(PC1, H) mixed / math",
             "key orthogonality (10-90% of heads)": "key orthogonality",
             "attention focusing (first -> last layer)": "attention focusing",
             "SULA entropy MAE vs Bayes (bits)": "SULA MAE"}
PAPER_ATTENTION = {"Pythia-410M": "MHA", "Phi-2": "MHA", "Llama-3.2-1B": "GQA"}  # methods.md §3.9 Table 2
# compare-page columns: (header, our summary_rows label, the PAPER_ROWS key); None: a cell computed here / none
COMPARE_COLUMNS = (("attention", None, None), ("PC1+PC2 mixed", "mixed PC1+PC2", "mixed PC1+PC2"),
                   ("PC1+PC2 math", "math PC1+PC2", "math PC1+PC2"),
                   ("key orthogonality", "key orthogonality (10-90% of heads)", "key orthogonality"),
                   ("focusing", "attention focusing (first -> last layer)", "attention focusing"),
                   ("SULA MAE (k≥1)", None, "SULA MAE"), ("axis r in-sample / held-out", None, None))
PLOTLY_CONFIG = dict(displaylogo=False, responsive=True, toImageButtonOptions=dict(format="svg"))
CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #1d2733;
       max-width: 1180px; margin: 0 auto; padding: 24px 32px 64px; line-height: 1.45; background: #fff; }
h1 { font-size: 1.6em; margin: 0 0 4px; } h2 { font-size: 1.2em; margin: 36px 0 8px; border-bottom: 1px solid #e3e7ec;
     padding-bottom: 4px; }
.sub { color: #5b6b7c; font-size: 0.92em; margin: 0 0 4px; }
table { border-collapse: collapse; font-size: 0.88em; margin: 8px 0; width: 100%; }
th, td { border-bottom: 1px solid #e3e7ec; padding: 5px 8px; text-align: left; vertical-align: top; }
th { background: #f4f6f8; font-weight: 600; } td.ours { font-weight: 600; color: #1f4e79; }
table.summary td:first-child { min-width: 230px; } td.prompt { width: 70%; }
td.paper, tr.paper td { color: #5b6b7c; } td.num { font-variant-numeric: tabular-nums; }
.caption { color: #3d4b5a; font-size: 0.93em; margin: 2px 0 20px; }
.fig { margin-top: 16px; } nav a { margin-right: 14px; color: #1f4e79; text-decoration: none; font-size: 0.92em; }
details { margin: 6px 0; font-size: 0.9em; } pre { background: #f4f6f8; padding: 8px; overflow-x: auto; }
code, .prompt { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 0.9em; }
.note { color: #5b6b7c; font-size: 0.88em; }
"""


def _e(x) -> str:
    return html.escape(str(x))


def _table(header: list[str], rows: list[list[str]], classes: list[str] | None = None,
           row_classes: list[str] | None = None, table_class: str = "") -> str:
    """An HTML table; cells are escaped here, so pass raw strings."""
    classes = classes or [""] * len(header)
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join(
        f"<tr class=\"{(row_classes or [''] * len(rows))[i]}\">"
        + "".join(f"<td class=\"{c}\">{_e(v)}</td>" for v, c in zip(row, classes)) + "</tr>"
        for i, row in enumerate(rows))
    return f"<table class=\"{table_class}\"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{_e(title)}</title>"
            f"<style>{CSS}</style><script type=\"text/javascript\">{plotly.offline.get_plotlyjs()}</script></head>"
            f"<body>{body}</body></html>\n")


def _figure_sections(figs) -> str:
    nav = "".join(f"<a href=\"#fig-{key}\">{_e(title)}</a>" for key, title, _, _ in figs)
    parts = [f"<nav>{nav}</nav>"] if figs else ["<p class=\"note\">No probe with a figure ran in this folder.</p>"]
    for key, title, fig, caption in figs:
        div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{key}", config=PLOTLY_CONFIG)
        parts.append(f"<section class=\"fig\"><h2>{_e(title)}</h2>{div}<p class=\"caption\">{_e(caption)}</p>"
                     "</section>")
    return "".join(parts)


def _summary(run: RunData) -> str:
    papers = list(PAPER_ROWS)
    rows = [[label, value] + [PAPER_ROWS[p].get(PAPER_KEY.get(label, label), "") for p in papers]
            for label, value in summary_rows(run.metrics)]
    if not rows:
        return "<p class=\"note\">No summary measures in this run.</p>"
    return _table(["measure", f"{run.name} (this run)"] + [f"{p} (paper)" for p in papers], rows,
                  ["", "ours num"] + ["paper num"] * len(papers), table_class="summary")


def _provenance(run: RunData) -> str:
    env, model, cfg = run.env, run.model, run.config
    facts = [("model", cfg.get("model", run.name)), ("family", model.get("family", "?")),
             ("parameters", f"{model['n_params']:,}" if "n_params" in model else "?"),
             ("dtype", model.get("dtype", "?")), ("layers", model.get("n_layers", "?")), ("seed", cfg.get("seed")),
             ("git commit", (env.get("git_commit") or "unknown")[:12]), ("computed", env.get("time", "?")),
             ("run folder", run.folder)]
    line = " · ".join(f"{k}: <b>{_e(v)}</b>" for k, v in facts)
    versions = ", ".join(f"{k} {v}" for k, v in (env.get("packages") or {}).items() if v)
    system = f"Python {env.get('python', '?')} on {env.get('platform', '?')}, {env.get('torch_threads', '?')} threads"
    return (f"<p class=\"sub\">{line}</p><details><summary>environment and config</summary>"
            f"<p>{_e(system)}; CUDA: {_e(env.get('cuda'))}</p><p>{_e(versions)}</p>"
            f"<pre>{_e(yaml.safe_dump(cfg, sort_keys=False))}</pre></details>")


def _examples(run: RunData) -> str:
    """A few prompts per entropy quintile of each manifold set (the sets are drawn per quintile, so sorting the
    chosen prompts by entropy and cutting them into n_bins equal groups recovers the quintiles), and one SULA
    prompt per k."""
    parts = []
    for probe, label, m in run.manifold_sets():
        texts = run.pool_texts(probe)
        if texts is None:
            continue
        order = np.argsort(m["entropy"], kind="stable")
        score = m["layers"][last_layer(m)]["pc1_score"]
        rows = []
        for q, group in enumerate(np.array_split(order, m["_probe"]["params"].get("n_bins", 5)), start=1):
            rows += [[f"Q{q}", f"{m['entropy'][i]:.2f}", f"{score[i]:+.2f}", shorten(texts[m["indices"][i]], 160)]
                     for i in group[:3]]
        parts.append(f"<h3>{_e(label)} set</h3>"
                     + _table(["quintile", "entropy (bits)", "PC1 score", "prompt"], rows,
                              ["", "num", "num", "prompt"]))
    cols = run.sula_main
    if cols is not None:
        first = {k: i for i, k in reversed(list(enumerate(cols["k"])))}
        rows = [[str(k), f"{cols['bayes_entropy'][i]:.3f}", cols["text"][i]] for k, i in sorted(first.items())]
        parts.append("<h3>SULA in-context prompts (main condition)</h3>"
                     + _table(["k", "Bayes entropy (bits)", "prompt"], rows, ["num", "num", "prompt"]))
    if not parts:
        return ""
    return "<h2 id=\"examples\">Example prompts</h2>" + "".join(parts)


def build_report(run_folder: str | Path) -> Path:
    """Write ``report.html`` into ``run_folder`` from the folder alone and return its path."""
    run = RunData.load(run_folder)
    body = (f"<h1>interp_bayes report: {_e(run.name)}</h1>{_provenance(run)}"
            "<h2 id=\"summary\">Summary: this run beside Paper III</h2>"
            "<p class=\"note\">Shares are at the last layer: observed (95% interval over fresh stratified prompt "
            "sets from the pool); the bootstrap mean, the paper's statistic, sits above the observed share because "
            "resampled duplicates inflate PCA shares when prompts are fewer than dimensions; null = mean share of "
            "permuted / Gaussian clouds of the same size. Paper values as printed (Tables 1-2, §5).</p>"
            f"{_summary(run)}{_figure_sections(run_figures(run))}{_examples(run)}")
    return atomic_write_text(run.folder / "report.html", _page(f"interp_bayes: {run.name}", body))


def _attention(run: RunData) -> str:
    """MHA / GQA / MQA from the head counts recorded with any saved activation set."""
    for meta_path in sorted((run.folder / "acts").glob("*/activations.json")):
        meta = read_json(meta_path)
        heads, kv = meta.get("n_heads"), meta.get("n_kv_heads")
        if heads and kv:
            return "MHA" if kv == heads else "MQA" if kv == 1 else f"GQA ({heads}/{kv})"
    return "?"


def _compare_row(run: RunData) -> list[str]:
    rows = dict(summary_rows(run.metrics))
    main = run.metrics.get("icl", {}).get("conditions", {}).get("main")
    sula = f"{main['k_ge_1']['mae']:.3f} bits" if main else "—"
    axis = "; ".join(f"{label.removeprefix('entropy axis ').split(':')[0]}: {v}" for label, v in rows.items()
                     if label.startswith("entropy axis")) or "—"
    special = {"attention": _attention(run), "SULA MAE (k≥1)": sula, "axis r in-sample / held-out": axis}
    return [run.name] + [special[h] if key is None else rows.get(key, "—") for h, key, _ in COMPARE_COLUMNS]


def build_compare(run_folders: list[str | Path], out_path: str | Path) -> Path:
    """Write a cross-model page (Paper III Table 2 layout) for ``run_folders`` to ``out_path``."""
    runs = [RunData.load(f) for f in run_folders]
    header = ["model"] + [h for h, _, _ in COMPARE_COLUMNS]
    rows = [_compare_row(r) for r in runs]
    rows += [[f"{name} (paper)"] + [PAPER_ATTENTION[name] if h == "attention" else paper.get(key, "—")
                                    for h, _, key in COMPARE_COLUMNS] for name, paper in PAPER_ROWS.items()]
    sources = "".join(f"<li><b>{_e(r.name)}</b>: <code>{_e(r.folder)}</code> (seed {_e(r.config.get('seed'))}, "
                      f"commit {_e((r.env.get('git_commit') or 'unknown')[:12])})</li>" for r in runs)
    body = (f"<h1>interp_bayes: {len(runs)} models compared</h1><ul class=\"sub\">{sources}</ul>"
            "<h2>Table 2 layout</h2><p class=\"note\">Shares at the last layer with 95% intervals and null "
            "means; key orthogonality over 10-90% of heads with the Gaussian null; grey rows: Paper III as "
            "printed.</p>"
            + _table(header, rows, ["ours"] + ["num"] * len(COMPARE_COLUMNS),
                     [""] * len(runs) + ["paper"] * len(PAPER_ROWS), table_class="summary")
            + _figure_sections(compare_figures(runs)))
    out = Path(out_path)
    return atomic_write_text(out, _page("interp_bayes: model comparison", body))


@dataclass
class Report:
    """A built report; shows inline in Jupyter (as a sandboxed iframe holding the whole page)."""

    path: Path

    @classmethod
    def build(cls, run_folder: str | Path) -> "Report":
        return cls(build_report(run_folder))

    def _repr_html_(self) -> str:
        return (f"<iframe srcdoc=\"{html.escape(self.path.read_text())}\" sandbox=\"allow-scripts\" "
                "style=\"width:100%;height:900px;border:1px solid #ddd\"></iframe>")


def add_report_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Flags of ``interp-bayes report RUN``."""
    parser.add_argument("run", type=Path, help="run folder written by `interp-bayes sweep` (reports/<model>/<digest>)")
    return parser


def report_main(args: argparse.Namespace) -> int:
    """Entry point for ``interp-bayes report``: build RUN/report.html and print its path."""
    print(build_report(args.run))
    return 0


def add_compare_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Flags of ``interp-bayes compare RUN [RUN ...] --out FILE``."""
    parser.add_argument("runs", type=Path, nargs="+", help="run folders to compare, one per model")
    parser.add_argument("--out", type=Path, required=True, help="HTML file to write")
    return parser


def compare_main(args: argparse.Namespace) -> int:
    """Entry point for ``interp-bayes compare``: build the cross-model page and print its path."""
    print(build_compare(args.runs, args.out))
    return 0
