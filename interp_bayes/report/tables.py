"""A run's summary, claims ledger and rows as markdown (``interp-bayes results RUN --format markdown``)."""

from __future__ import annotations

from ..core.results import records
from .ledger import collect, ledger_markdown
from .view import subject_of

def markdown_summary(lines: list, model: str) -> str:
    """A markdown table of a run's summary lines (label, value, verdict)."""
    out = [f"| measure | {model} | verdict |", "|---|---|---|"]
    out += [f"| {line.label} | {line.value} | {line.verdict} |" for line in lines]
    return "\n".join(out)


def _cell(x) -> str:
    """A markdown table cell: numbers to 4 significant digits, None empty, a pipe escaped."""
    if x is None:
        return ""
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x).replace("|", "\\|")


def markdown_results(run) -> str:
    """What ``interp-bayes results RUN --format markdown`` prints: the claims ledger (``ledger.ledger_markdown``),
    then per finished probe of ``run`` (a ``report.view.RunView``), its summary lines (``markdown_summary``), then one
    table per metric of its rows (``core.results.records``: scope keys as columns; columns empty in every row left
    out)."""
    out = [f"# {run.name}: {run.folder.name}", "\n## Claims ledger\n", ledger_markdown(collect(run), run.name)]
    for p in run.probes():
        kind, where = p.kind_object(), subject_of(p)
        out.append(f"\n## {p.name} (kind {p.kind}{', on ' + where if where else ''})\n")
        if kind is not None:
            out.append(markdown_summary(kind.summary(p.rows, p.params_object()), where or run.name))
        for metric in dict.fromkeys(r.metric for r in p.rows):
            recs = records([r for r in p.rows if r.metric == metric])
            cols = [c for c in recs[0] if c not in ("probe", "kind", "metric")
                    and any(rec[c] not in (None, "") for rec in recs)]
            out += [f"\n`{metric}`\n", "| " + " | ".join(cols) + " |", "|---" * len(cols) + "|"]
            out += ["| " + " | ".join(_cell(rec[c]) for c in cols) + " |" for rec in recs]
    return "\n".join(out) + "\n"
