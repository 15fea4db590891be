"""One self-contained HTML page per run (and one per set of runs): the summary beside the paper's numbers first,
with a verdict per number against its null, then each probe kind's figures, each with a sentence saying what to
look for. Everything comes from the run folder's tidy rows and the data its probes wrote.

Self-contained means viewable offline and forever: plotly.js is inlined exactly once, no stylesheet, font or
script is fetched, and every string that comes from data (prompts, model names, paths) is escaped.
"""

from __future__ import annotations

# plotly is imported inside the function that sends plotly.js to a notebook: only a report shown in Jupyter needs it
import argparse
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..core.results import find
from ..core.figures import escape, table
from ..core.store import atomic_write_text
from ..stats.ledger import VERDICTS
from . import ledger as L
from .page import FILTER_SCRIPT, figure_div, plotly_packed_script, renderer_script
from .paper import PAPER_ATTENTION, PAPER_ROWS
from .view import ReportError, RunView, enclosing_run
from ..core.checks import out_file_arg
from .figures import compare_figures
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
td.verdict { white-space: nowrap; }
.caption { color: #3d4b5a; font-size: 0.93em; margin: 2px 0 20px; }
.fig { margin-top: 16px; } nav a { margin-right: 14px; color: #1f4e79; text-decoration: none; font-size: 0.92em; }
details { margin: 6px 0; font-size: 0.9em; } pre { background: #f4f6f8; padding: 8px; overflow-x: auto; }
code, .prompt { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 0.9em; }
.note { color: #5b6b7c; font-size: 0.88em; }
h3 { font-size: 1.02em; margin: 22px 0 4px; }
table.ledger td { vertical-align: top; } table.ledger td:first-child { min-width: 320px; }
table.ledger .num { font-variant-numeric: tabular-nums; font-size: 0.95em; } .paper { color: #5b6b7c; }
.tag { font-size: 0.75em; color: #5b6b7c; border: 1px solid #c9d1da; border-radius: 3px; padding: 0 3px; }
tr.flip td:first-child { border-left: 3px solid #9a6700; } tr.group td { background: #eef2f6; font-weight: 600; }
nav.top { position: sticky; top: 0; background: #fff; padding: 6px 0; border-bottom: 1px solid #e3e7ec; z-index: 5; }
.filters input, .filters select { font: inherit; padding: 3px 6px; margin-right: 8px; }
.legend span { margin-right: 14px; }
""" + L.ledger_css()
INTERVAL_NOTE = ("Intervals are labelled by kind: <b>resampled</b> = over fresh prompt sets drawn from the pool "
                 "(no prompt repeated); <b>bootstrap</b> = resampling prompts with replacement, the paper's statistic, "
                 "which sits above the observed share because duplicated prompts inflate PCA shares when prompts are "
                 "fewer than dimensions. <b>null</b> = mean share of permuted / Gaussian clouds of the same size. The "
                 "verdict says whether a number lies above, below or within the 95% range of its null; a blank verdict "
                 "means the number has no null. Paper values as printed (Tables 1-2, §5).")




def plotly_bundle() -> str:
    """plotly.js as a plain script (a notebook's first output; pages carry it packed, ``page.py``)."""
    import plotly.offline

    return f"<script type=\"text/javascript\">{plotly.offline.get_plotlyjs()}</script>"


def page(title: str, body: str) -> str:
    """One self-contained page: packed plotly.js, the renderer that draws the figures as they come into view."""
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{escape(title)}</title>"
            f"<style>{CSS}</style></head><body>{body}{plotly_packed_script()}{renderer_script()}</body></html>\n")


def unique_titles(figs, model: str = "") -> list[str]:
    """Each figure's heading, naming its model or wind tunnel (``Figure.subject``) unless the title already does,
    and numbered where two would still read the same."""
    out, seen = [], {}
    for f in figs:
        title = f.title
        where = f.subject or model
        if where and where.lower() not in title.lower():
            title = f"{title} — {where}"
        seen[title] = seen.get(title, 0) + 1
        out.append(title if seen[title] == 1 else f"{title} ({seen[title]})")
    return out


def _figure(f, title: str, level: str = "h2") -> str:
    if isinstance(f.content, str):
        content = f"<a id=\"fig-{escape(f.id)}\"></a>{f.content}"
    else:
        fig = f.content
        inner = fig.layout.title.text if fig.layout.title and fig.layout.title.text else ""
        if f.subject and inner and f.subject.lower() not in inner.lower():  # the plot names its tunnel too
            fig.update_layout(title_text=f"{f.subject}: {inner}")
        content = figure_div(fig, f"fig-{f.id}")
    return (f"<section class=\"fig\"><{level}>{escape(title)}</{level}>{content}"
            f"<p class=\"caption\">{escape(f.caption)}</p></section>")


def figure_sections(figs) -> str:
    """Sections for Figures (plotly figures drawn by the page's renderer, or HTML fragments), with a navigation
    bar."""
    if not figs:
        return "<p class=\"note\">No probe with a figure ran in this folder.</p>"
    titles = unique_titles(figs)
    parts = ["<nav>" + "".join(f"<a href=\"#fig-{escape(f.id)}\">{escape(t)}</a>" for f, t in zip(figs, titles)) + "</nav>"]
    parts += [_figure(f, t) for f, t in zip(figs, titles)]
    return "".join(parts)


def subject_label(subject: str, model: str) -> str:
    return f"Wind tunnel {subject}" if subject else model


def subject_sections(figs, model: str) -> tuple[str, str]:
    """(navigation, sections): the figures grouped by what they are about, the model first, then each wind
    tunnel, each section titled with it."""
    if not figs:
        return "", "<p class=\"note\">No probe with a figure ran in this folder.</p>"
    titles = dict(zip((id(f) for f in figs), unique_titles(figs, model)))
    subjects = sorted(dict.fromkeys(f.subject for f in figs), key=lambda s: s != "")
    nav, parts = [], []
    for s in subjects:
        anchor = f"sec-{s or 'model'}"
        nav.append(f"<a href=\"#{escape(anchor)}\">{escape(subject_label(s, model))}</a>")
        mine = [f for f in figs if f.subject == s]
        links = " · ".join(f"<a href=\"#fig-{escape(f.id)}\">{escape(f.title)}</a>" for f in mine)
        parts.append(f"<h2 id=\"{escape(anchor)}\">{escape(subject_label(s, model))}</h2><p class=\"sub\">{links}</p>"
                     + "".join(_figure(f, titles[id(f)], "h3") for f in mine))
    return "".join(nav), "".join(parts)


def merge_duplicates(lines: list) -> list:
    """Summary lines that say the same thing twice merged into one: equal value and verdict, labels that differ in
    one word (the Bayes latent and predictive entropies rank prompts alike, so their correlations coincide)."""
    out = []
    for line in lines:
        prev = out[-1] if out else None
        if prev is not None and prev.value == line.value and prev.verdict == line.verdict:
            a, b = prev.label.split(" "), line.label.split(" ")
            diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
            if len(a) == len(b) and len(diff) == 1 and "/" not in a[diff[0]]:
                a[diff[0]] = f"{a[diff[0]]} / {b[diff[0]]}"
                out[-1] = type(prev)(" ".join(a), prev.value, prev.verdict, prev.paper or line.paper)
                continue
        out.append(line)
    return out


def paper_value(key: str | None) -> str:
    """The papers' numbers for a summary line (a key of PAPER_ROWS), one cell."""
    if not key:
        return ""
    return " · ".join(f"{model}: {row[key]}" for model, row in PAPER_ROWS.items() if key in row)


def _summary(run: RunView) -> str:
    """Every summary line, grouped by subject (the model, then each wind tunnel), duplicates merged, filterable;
    a papers column only when some line has a paper number."""
    pairs = run.summary_by_subject()
    if not pairs:
        return "<p class=\"note\">No probe has finished in this folder yet.</p>"
    subjects = sorted(dict.fromkeys(s for s, _ in pairs), key=lambda s: s != "")
    grouped = {s: merge_duplicates([line for t, line in pairs if t == s]) for s in subjects}
    with_paper = any(paper_value(line.paper) for lines in grouped.values() for line in lines)
    head = ["measure", "this run", "verdict"] + (["papers (Paper III, as printed)"] if with_paper else [])
    body = []
    for s in subjects:
        label = subject_label(s, run.name)
        body.append(f"<tr class=\"group\" data-subject=\"{escape(label)}\"><td colspan=\"{len(head)}\">{escape(label)}"
                    f" ({len(grouped[s])})</td></tr>")
        for line in grouped[s]:
            cells = [(line.label, ""), (line.value, "ours num"), (line.verdict, "verdict")]
            if with_paper:
                cells.append((paper_value(line.paper), "paper num"))
            body.append(f"<tr data-subject=\"{escape(label)}\">" + "".join(f"<td class=\"{c}\">{escape(v)}</td>"
                                                                       for v, c in cells) + "</tr>")
    options = "".join(f"<option>{escape(subject_label(s, run.name))}</option>" for s in subjects)
    n = sum(len(v) for v in grouped.values())
    filters = (f"<p class=\"filters\"><input id=\"rows-filter\" type=\"search\" placeholder=\"filter rows (words)\">"
               f"<select id=\"rows-subject\"><option value=\"\">all subjects</option>{options}</select>"
               f"<span id=\"rows-count\" class=\"note\">{n} rows</span></p>")
    return (filters + f"<table class=\"summary\" id=\"all-rows\"><thead><tr>"
            + "".join(f"<th>{escape(h)}</th>" for h in head) + f"</tr></thead><tbody>{''.join(body)}</tbody></table>"
            + FILTER_SCRIPT)


def _provenance(run: RunView) -> str:
    env, model, cfg = run.env, run.model, run.config
    facts = [("model", cfg.get("model", run.name)), ("family", model.get("family", "?")),
             ("parameters", f"{model['n_params']:,}" if "n_params" in model else "?"),
             ("dtype", model.get("dtype", "?")), ("layers", model.get("n_layers", "?")), ("seed", cfg.get("seed")),
             ("git commit", (env.get("git_commit") or "unknown")[:12]), ("computed", env.get("time", "?")),
             ("run folder", run.folder)]
    line = " · ".join(f"{k}: <b>{escape(v)}</b>" for k, v in facts)
    versions = ", ".join(f"{k} {v}" for k, v in (env.get("packages") or {}).items() if v)
    system = f"Python {env.get('python', '?')} on {env.get('platform', '?')}, {env.get('torch_threads', '?')} threads"
    done = ", ".join(f"{p.name} ({p.kind}, {p.seconds or 0:.0f} s)" for p in run.probes())
    missing = [n for n in run.order if n not in {p.name for p in run.probes()}]
    partial = (f"<p class=\"note\"><b>Partial run:</b> not finished yet: {escape(', '.join(missing))}. Rerun the same "
               "command to resume.</p>" if missing else "")
    return (f"<p class=\"sub\">{line}</p>{partial}<details><summary>environment, config and probes</summary>"
            f"<p>{escape(system)}; CUDA: {escape(env.get('cuda'))}</p><p>{escape(versions)}</p><p>probes: {escape(done)}</p>"
            f"<pre>{escape(yaml.safe_dump(cfg, sort_keys=False))}</pre></details>")


def verdict_legend() -> str:
    return "<p class=\"note legend\">" + "".join(f"<span>{L.badge(v)}</span>" for v in VERDICTS) + "</p>"


def report_body(run: RunView) -> str:
    """The ledger first (the answer), then the figures by subject, then every number, grouped and filterable."""
    nav, sections = subject_sections(run.figures(), run.name)
    return (f"<h1>interp_bayes report: {escape(run.name)}</h1>{_provenance(run)}"
            f"<nav class=\"top\"><a href=\"#ledger\">Claims ledger</a>{nav}<a href=\"#summary\">All numbers</a></nav>"
            "<h2 id=\"ledger\">Claims ledger: does this run support the papers' claims?</h2>"
            f"{verdict_legend()}{L.ledger_table(L.collect(run), run.name)}"
            "<p class=\"note\">Each verdict comes from one rule applied to the probe's rows (interp_bayes/stats/"
            "ledger.py): a number against its null or interval, a deconfounded correlation's claim, or a size the "
            "papers name. Rivals are explanations other than a Bayesian value axis.</p>"
            f"{sections}"
            "<h2 id=\"summary\">All numbers: this run beside Paper III</h2>"
            f"<p class=\"note\">{INTERVAL_NOTE} Every number of this run, one row each: "
            "<a href=\"results.csv\">results.csv</a> (also `interp-bayes results RUN`).</p>"
            f"{_summary(run)}")


def build_report(run_folder: str | Path) -> Path:
    """Write ``report.html`` into ``run_folder`` from the folder alone and return its path."""
    run = RunView.load(run_folder)
    return atomic_write_text(run.folder / "report.html", page(f"interp_bayes: {run.name}", report_body(run)))


def _attention(run: RunView) -> str:
    heads, kv = run.model.get("n_heads"), run.model.get("n_kv_heads")
    if not heads or not kv:
        return "?"
    return "MHA" if kv == heads else "MQA" if kv == 1 else f"GQA ({heads}/{kv})"


def _compare_row(run: RunView) -> list[str]:
    lines = [line for subject, line in run.summary_by_subject() if not subject]  # the model's, not a tunnel's
    by_paper = {line.paper: line.value for line in lines if line.paper}
    sula = find(run.rows(), "entropy_mae", condition="main", target="latent", subset="k>=1")
    # each axis line whole (method, layer, what is correlated with what), duplicates merged
    axis = "; ".join(f"{line.label.removeprefix('entropy axis ')}: {line.value}" for line in merge_duplicates(lines)
                     if line.label.startswith("entropy axis")) or "—"
    return [run.name, _attention(run), by_paper.get("mixed PC1+PC2", "—"), by_paper.get("math PC1+PC2", "—"),
            by_paper.get("key orthogonality", "—"), by_paper.get("attention focusing", "—"),
            f"{sula.value:.3f} bits" if sula else "—", axis]


COMPARE_HEADER = ["model", "attention", "PC1+PC2 mixed", "PC1+PC2 math", "key orthogonality", "focusing",
                  "SULA MAE (k≥1)", "axis r in-sample / held-out"]
PAPER_KEYS = [None, None, "mixed PC1+PC2", "math PC1+PC2", "key orthogonality", "attention focusing", "SULA MAE", None]


def partial_note(run: RunView) -> str:
    """' — partial run: N of M probes finished (missing: ...)' for a run whose sweep has not finished, else ''."""
    done = {p.name for p in run.probes()}
    missing = [n for n in run.order if n not in done]
    if not missing:
        return ""
    return (f" <b>— partial run: {len(run.order) - len(missing)} of {len(run.order)} probes finished</b> "
            f"(missing: {escape(', '.join(missing))}; its verdicts there read “not testable here”)")


def build_compare(run_folders: list[str | Path], out_path: str | Path) -> Path:
    """Write a cross-model page (Paper III Table 2 layout) for ``run_folders`` to ``out_path`` (never into a run
    folder, where it would overwrite or mix with what the sweep wrote: its report.html above all)."""
    run = enclosing_run(out_path)
    if run is not None:
        raise ReportError(f"--out {out_path} is inside the run folder {run} and would overwrite its files (its "
                          "report.html); write the comparison outside every run folder, e.g. --out compare.html.")
    runs = [RunView.load(f) for f in run_folders]
    rows = [_compare_row(r) for r in runs]
    rows += [[f"{name} (paper)", PAPER_ATTENTION[name]] + [paper.get(k, "—") for k in PAPER_KEYS[2:]]
             for name, paper in PAPER_ROWS.items()]
    sources = "".join(f"<li><b>{escape(r.name)}</b>: <code>{escape(r.folder)}</code> (seed {escape(r.config.get('seed'))}, "
                      f"commit {escape((r.env.get('git_commit') or 'unknown')[:12])}){partial_note(r)}</li>" for r in runs)
    body = (f"<h1>interp_bayes: {len(runs)} models compared</h1><ul class=\"sub\">{sources}</ul>"
            "<h2>Claims × models</h2>" + verdict_legend() + L.matrix([(r.name, L.collect(r)) for r in runs]) +
            "<h2>Table 2 layout</h2><p class=\"note\">Shares at the last layer with 95% intervals and null "
            "means; key orthogonality over 10-90% of heads with the Gaussian null; grey rows: Paper III as "
            "printed.</p>"
            + table(COMPARE_HEADER, rows, ["ours"] + ["num"] * (len(COMPARE_HEADER) - 1),
                    [""] * len(runs) + ["paper"] * len(PAPER_ROWS), table_class="summary")
            + figure_sections(compare_figures(runs)))
    return atomic_write_text(Path(out_path), page("interp_bayes: model comparison", body))


_BUNDLE_SHOWN = False  # plotly.js goes into the first report shown in a kernel only (about 5 MB)


@dataclass
class Report:
    """A built report; in Jupyter it shows inline (summary and figures), with plotly.js sent once per kernel
    rather than with every output."""

    path: Path

    @classmethod
    def build(cls, run_folder: str | Path) -> "Report":
        return cls(build_report(run_folder))

    def _repr_html_(self) -> str:
        global _BUNDLE_SHOWN
        bundle = "" if _BUNDLE_SHOWN else plotly_bundle()
        _BUNDLE_SHOWN = True
        return f"{bundle}<div>{report_body(RunView.load(self.path.parent))}</div>{renderer_script()}"


def add_report_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Flags of ``interp-bayes report RUN``."""
    parser.add_argument("run", type=Path, help="run folder written by `interp-bayes sweep` (reports/<model>/<key>)")
    return parser


def report_main(args: argparse.Namespace) -> int:
    """Entry point for ``interp-bayes report``: build RUN/report.html and print its path."""
    print(build_report(args.run))
    return 0


def add_compare_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Flags of ``interp-bayes compare RUN [RUN ...] --out FILE``."""
    parser.add_argument("runs", type=Path, nargs="+", help="run folders to compare, one per model")
    parser.add_argument("--out", type=out_file_arg, required=True, help="HTML file to write")
    return parser


def compare_main(args: argparse.Namespace) -> int:
    """Entry point for ``interp-bayes compare``: build the cross-model page and print its path."""
    print(build_compare(args.runs, args.out))
    return 0
