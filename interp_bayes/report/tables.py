"""The paper's rows (Paper III Tables 1-2 and §5, methods.md §3.9), the summary and a run's rows as markdown."""

from __future__ import annotations

from ..core.results import records
from .ledger import collect, ledger_markdown
from .view import subject_of

# Paper III v1 numbers, as printed (Table 1 bootstrap means; Table 2; §5.1 Spearman; §5.2 SULA MAE).
PAPER_ROWS = {
    "Pythia-410M": {"mixed PC1": "79.6% (78.4, 80.8)", "mixed PC1+PC2": "99.7%", "math PC1": "58.0%",
                    "math PC1+PC2": "99.9%", "Spearman(PC1, H) mixed / math": "-0.32 / -0.14",
                    "key orthogonality": "0.11-0.13", "attention focusing": "82%", "SULA MAE": "0.44 bits"},
    "Phi-2": {"mixed PC1": "46.4% (43.9, 48.9)", "mixed PC1+PC2": "60.6%", "math PC1": "52.2%",
              "math PC1+PC2": "63.5%", "Spearman(PC1, H) mixed / math": "+0.34 / +0.16",
              "key orthogonality": "0.034-0.051", "attention focusing": "86%", "SULA MAE": "0.31 bits"},
    "Llama-3.2-1B": {"mixed PC1": "36.6% (34.8, 38.4)", "mixed PC1+PC2": "51.4%", "math PC1": "52.5%",
                     "math PC1+PC2": "73.6%", "Spearman(PC1, H) mixed / math": "+0.59 / -0.51",
                     "key orthogonality": "0.15-0.18", "attention focusing": "31%", "SULA MAE": "0.36 bits"},
}


PAPER_ATTENTION = {"Pythia-410M": "MHA", "Phi-2": "MHA", "Llama-3.2-1B": "GQA"}  # methods.md §3.9 Table 2


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
