"""The views of the claims ledger: the top of report.html, the compare / grid matrix and the sweep's last lines in
the terminal, each verdict shown with a colour and a symbol. The rules that give the verdicts are
``stats.ledger``."""

from __future__ import annotations

import html

from ..stats.ledger import BORDERLINE, FAILS, HOLDS, INSEPARABLE, UNTESTABLE, VERDICTS, WEAK
from .paper import PAPER_ROWS

# symbol, colour (text on a white page, AA contrast), short class name
STYLE = {HOLDS: ("✔", "#1e7b34", "holds"), WEAK: ("◐", "#9a6700", "weak"), FAILS: ("✘", "#b42318", "fails"),
         INSEPARABLE: ("≈", "#5b3fb8", "insep"), BORDERLINE: ("?", "#a0522d", "borderline"),
         UNTESTABLE: ("–", "#5b6b7c", "untestable")}
# the order in which the papers state their claims (keys of the kinds' Claims; others follow, then the rivals)
CLAIM_ORDER = ("dominant-axis", "domain", "pc1-entropy", "pc1-posterior", "orthogonal-keys", "attention-focuses",
               "readout", "readout-resample", "readout-mean", "calibration", "wt-calibration", "wt-pc1-bayes")



def collect(run) -> list:
    """The ledger of a run (``RunView``): every kind that ran contributes its claims, in run order, with the
    model's claims first and then each wind tunnel's."""
    claims, seen = [], []
    for p in run.probes():
        if p.kind not in seen:
            seen.append(p.kind)
    for name in seen:
        kind = run.probes(name)[0].kind_object()
        if kind is not None:
            claims += kind.ledger(run.probes(name))
    subjects = {s: (s != "", i) for i, s in enumerate(dict.fromkeys(c.subject for c in claims))}
    rank = {k: i for i, k in enumerate(CLAIM_ORDER)}
    return sorted(claims, key=lambda c: (subjects[c.subject], c.rival, rank.get(c.key.split("-")[0] if
                                                                                 c.key.startswith("domain-")
                                                                                 else c.key, len(rank))))


def badge(verdict: str) -> str:
    """The verdict as an HTML cell body: symbol and word in the verdict's colour."""
    symbol, _, cls = STYLE.get(verdict, STYLE[UNTESTABLE])
    return f"<span class=\"v v-{cls}\">{symbol} {html.escape(verdict)}</span>"


def paper_text(paper: str) -> str:
    """A claim's paper number: a key of ``paper.PAPER_ROWS`` spelled out per paper model, or the text itself."""
    if not paper:
        return ""
    found = [f"{model} {row[paper]}" for model, row in PAPER_ROWS.items() if paper in row]
    if found:
        return " · ".join(found)
    return paper if any(ch.isdigit() for ch in paper) else ""  # a literal number; a key no paper prints: none


def ledger_css() -> str:
    return "".join(f".v-{cls} {{ color: {colour}; font-weight: 600; white-space: nowrap; }} "
                   for _, colour, cls in STYLE.values()) + ".matrix .scope { font-size: 0.85em; color: #5b6b7c; } "


def ledger_table(claims: list, model: str) -> str:
    """The ledger as an HTML table: claim, subject, verdict, decisive number, paper (a column only when some claim
    has a paper number), link to its section."""
    if not claims:
        return "<p class=\"note\">No finished probe tests a claim of the papers yet.</p>"
    with_paper = any(c.paper for c in claims)
    head = ["claim", "about", "verdict", "decisive number (interval; null)"] + (["paper"] if with_paper else []) + \
        ["see"]
    out = ["<table class=\"ledger\"><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"]
    for c in claims:
        subject = c.subject or model
        link = f"<a href=\"#{html.escape(c.section)}\">section</a>" if c.section else ""
        rival = " <span class=\"tag\">rival</span>" if c.rival else ""
        cells = [f"{html.escape(c.claim)}{rival}", html.escape(subject), badge(c.verdict),
                 f"<span class=\"num\">{html.escape(c.evidence)}</span>"]
        if with_paper:
            cells.append(f"<span class=\"paper\">{html.escape(paper_text(c.paper))}</span>")
        cells.append(link)
        symbol = STYLE.get(c.verdict, STYLE[UNTESTABLE])[2]
        out.append(f"<tr class=\"r-{symbol}\">" + "".join(f"<td>{x}</td>" for x in cells) + "</tr>")
    return "".join(out) + "</tbody></table>"


def ledger_markdown(claims: list, model: str) -> str:
    """The ledger as a markdown table (``interp-bayes results RUN --format markdown``): claim, subject, verdict with
    its symbol, decisive number."""
    if not claims:
        return "No finished probe tests a claim of the papers yet."
    out = ["| claim | about | verdict | decisive number (interval; null) |", "|---|---|---|---|"]
    for c in claims:
        cells = (f"{c.claim}{' (rival)' if c.rival else ''}", c.subject or model,
                 f"{STYLE.get(c.verdict, STYLE[UNTESTABLE])[0]} {c.verdict}", c.evidence)
        out.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(out)


def ledger_lines(claims: list, model: str, width: int = 118) -> list[str]:
    """The ledger for a terminal: the model's claims one line each (symbol, verdict, claim, number), then one line
    per wind tunnel counting its verdicts."""
    out = [f"claims ledger: {model}"]
    mine = [c for c in claims if not c.subject]
    for c in mine:
        symbol = STYLE.get(c.verdict, STYLE[UNTESTABLE])[0]
        line = f"  {symbol} {c.verdict:17s} {c.claim}{' (rival)' if c.rival else ''}: {c.evidence}"
        out.append(line if len(line) <= width else line[: width - 1] + "…")
    for subject in dict.fromkeys(c.subject for c in claims if c.subject):
        theirs = [c for c in claims if c.subject == subject]
        counts = ", ".join(f"{STYLE[v][0]} {v} {n}" for v in VERDICTS
                           if (n := sum(c.verdict == v for c in theirs)))
        out.append(f"  wind tunnel {subject}: {len(theirs)} claims: {counts}")
    return out


def common_frame(texts: list[str]) -> tuple[str, str, list[str]]:
    """(prefix, suffix, middles) of texts that differ only in part, e.g. a claim stated at each run's own layer:
    the longest prefix and suffix all share, cut at word boundaries, and what each text holds between them (all
    "" when the texts are equal)."""
    first, short = texts[0], min(map(len, texts))
    n = 0
    while n < short and all(t[n] == first[n] for t in texts):
        n += 1
    if all(len(t) == n for t in texts):
        return first, "", [""] * len(texts)
    while n > 0 and first[n - 1].isalnum():  # back to the start of the word it falls in
        n -= 1
    m = 0
    while m < short - n and all(t[-1 - m] == first[-1 - m] for t in texts):
        m += 1
    while 0 < m < len(first) and first[-m].isalnum() and first[-m - 1].isalnum():  # on to the end of the word
        m -= 1
    return first[:n], first[len(first) - m:], [t[n:len(t) - m] for t in texts]


def matrix(runs_claims: list[tuple[str, list]]) -> str:
    """The claims x models matrix of the compare and grid pages: one row per claim (key and subject), one column
    per run, each cell the verdict; a row whose verdicts differ across runs is marked, so flips stand out. A claim
    stated at each run's own scope (its layer: one model's L29 is another's L1) shows the common text in the row
    and each run's part under its verdict."""
    if not any(claims for _, claims in runs_claims):
        return "<p class=\"note\">No run holds a finished probe that tests a claim.</p>"
    keys = list(dict.fromkeys((c.key, c.subject) for _, claims in runs_claims for c in claims))
    head = "<th>claim</th>" + "".join(f"<th>{html.escape(name)}</th>" for name, _ in runs_claims)
    body = []
    for key in keys:
        found = [next((c for c in claims if (c.key, c.subject) == key), None) for _, claims in runs_claims]
        texts = [c.claim for c in found if c is not None]
        prefix, suffix, middles = common_frame(texts)
        label = prefix + ("…" if any(middles) else "") + suffix + (f" ({key[1]})" if key[1] else "")
        own = iter(middles)
        cells, seen = [], set()
        for c in found:
            if c is None:
                cells.append(f"<td>{badge(UNTESTABLE)}</td>")
                continue
            seen.add(c.verdict)
            scope = next(own)
            scope = f"<br><span class=\"scope\">{html.escape(scope)}</span>" if scope else ""
            cells.append(f"<td title=\"{html.escape(c.evidence)}\">{badge(c.verdict)}{scope}</td>")
        flip = len(seen) > 1
        mark = " <span class=\"tag\">differs</span>" if flip else ""
        cls = " class=\"flip\"" if flip else ""
        body.append(f"<tr{cls}><td>{html.escape(label)}{mark}</td>{''.join(cells)}</tr>")
    return (f"<table class=\"ledger matrix\"><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
            "<p class=\"note\">A cell's tooltip holds its decisive number; “differs”: the runs disagree on the "
            "claim; “not testable here”: the run has no probe (or no finished probe) that tests it; “…” in a "
            "claim: the part each run states at its own scope (a layer), shown under its verdict.</p>")


