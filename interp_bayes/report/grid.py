"""The grid page: one row per cell (model, revision, seed) with its headline numbers, and scaling figures of every
headline against parameter count and, for grids over training checkpoints, against training step. Built from run
folders alone (their tidy rows, config and model facts, read through ``RunView``), like the compare page.

A headline is read from rows by probe kind, metric and scope; a cell without such a row shows "—" (a probe that did
not run, or a statistic an older run did not write, such as the deconfounded axis correlations).
"""

from __future__ import annotations

# plotly, core.figures (numpy) and .html / .ledger (scipy) are imported inside the functions that build the grid page:
# `interp-bayes grid --help` imports this module
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..core.results import Row
from ..core.store import atomic_write_text
from .view import RunView
from ..core.plugin import Figure

STEP = re.compile(r"step[-_]?0*(\d+)")  # Pythia's "step1000"; a wind tunnel's checkpoints/step_000050


@dataclass(frozen=True)
class Headline:
    """A headline number of a run: rows of ``metric`` written by probes of ``kind`` whose scope holds ``scope``
    (a None value: the key must be absent); the last layer when the rows have layers, else the first row. One
    headline per probe of the kind when ``per_probe`` (several manifold domains)."""

    key: str
    label: str
    kind: str
    metric: str
    scope: dict = field(default_factory=dict)
    per_probe: bool = False


AXIS = dict(method="pc1", target="model entropy", fit="held-out")
HEADLINES = (
    Headline("pc1", "PC1 share", "manifold", "pc1_share", per_probe=True),
    Headline("axis_raw", "axis held-out r (raw)", "axis", "pearson_projection", dict(AXIS, deconfounded=None)),
    Headline("axis_partial", "axis held-out r (partial)", "axis", "pearson_projection",
             dict(AXIS, deconfounded="partial")),
    Headline("axis_within", "axis held-out r (within strata)", "axis", "pearson_projection",
             dict(AXIS, deconfounded="within")),
    Headline("sula_mae", "SULA MAE, k≥1 (bits)", "icl", "entropy_mae", dict(condition="main", subset="k>=1")),
    Headline("cut_effect", "axis cut: Δ MAE k≥1 vs controls (bits)", "interventions", "effect",
             dict(op="cut", measure="mae_k_ge_1", family="true")),
)


@dataclass
class CellView:
    """A run folder as a grid cell: its coordinates and its rows."""

    run: RunView
    rows_by_probe: dict[str, list[Row]]
    kinds: dict[str, str]  # probe name -> kind

    @classmethod
    def load(cls, folder: str | Path) -> "CellView":
        run = RunView.load(folder)
        probes = run.probes()
        return cls(run, {p.name: p.rows for p in probes}, {p.name: p.kind for p in probes})

    @property
    def model(self) -> str:
        return self.run.name

    @property
    def revision(self) -> str | None:
        return self.run.config.get("revision")

    @property
    def seed(self):
        return self.run.config.get("seed")

    @property
    def n_params(self) -> int | None:
        return self.run.model.get("n_params")

    @property
    def step(self) -> int | None:
        """The training step, from the revision (``step1000``) or else the model's name or folder."""
        for text in (self.revision, str(self.run.config.get("model", ""))):
            match = STEP.search(text or "")
            if match:
                return int(match.group(1))
        return None

    @property
    def series(self) -> str:
        """The model without its checkpoint (a folder: its last two parts), what a training-step figure draws as
        one line."""
        text = STEP.sub("", str(self.run.config.get("model", self.model))).rstrip("-_/")
        return "/".join(Path(text).parts[-2:]) if Path(text).is_absolute() else text or self.model


def headline_rows(cell: CellView, h: Headline) -> dict[str, Row]:
    """Column label -> the row of headline ``h`` in ``cell`` (per probe of the kind when ``h.per_probe``)."""
    out = {}
    for probe, rows in cell.rows_by_probe.items():
        if cell.kinds[probe] != h.kind:
            continue
        match = [r for r in rows if r.metric == h.metric and all(r.scope.get(k) == v for k, v in h.scope.items())]
        if not match:
            continue
        layered = [r for r in match if "layer" in r.scope]
        row = max(layered, key=lambda r: r.scope["layer"]) if layered else match[0]
        out[f"{h.label} ({probe})" if h.per_probe else h.label] = row
    return out


def columns(cells: list[CellView]) -> list[tuple[Headline, str]]:
    """(headline, column label) of every headline some cell has, plus the fixed ones no cell has (shown as "—")."""
    out = []
    for h in HEADLINES:
        labels = list(dict.fromkeys(label for c in cells for label in headline_rows(c, h)))
        out += [(h, label) for label in labels] or ([] if h.per_probe else [(h, h.label)])
    return out


def describe(row: Row | None) -> str:
    """'value (interval) · null [range] · verdict', or '—' without a row."""
    if row is None or row.value is None:
        return "—"
    text = f"{row.value:.4g}"
    if row.low is not None and row.high is not None:
        text += f" ({row.low:.4g}, {row.high:.4g})"
    if row.null_low is not None and row.null_high is not None:
        text += f" · null [{row.null_low:.4g}, {row.null_high:.4g}] · {row.verdict()}"
    if "layer" in row.scope:
        text += f" · L{row.scope['layer']}"
    elif "layer_set" in row.scope:
        text += f" · L{row.scope['layer_set']}"
    return text


def _whiskers(xs: list[float], lows: list, highs: list) -> tuple[list, list]:
    """x and y of vertical segments (low to high at each x), None-separated, for one line trace."""
    x, y = [], []
    for at, lo, hi in zip(xs, lows, highs):
        if lo is not None and hi is not None:
            x += [at, at, None]
            y += [lo, hi, None]
    return x, y


def _series(name: str, colour: str, points: list[tuple[float, float, Row]], null_legend: bool) -> list:
    """One series: its values as a line, its intervals as whiskers of its colour (drawn wherever they lie, also
    when a value falls outside its own interval) and its null ranges as wide grey bars. points: (x drawn, x, row)."""
    import plotly.graph_objects as go

    drawn, xs, rows = [p[0] for p in points], [p[1] for p in points], [p[2] for p in points]
    hover = [f"{name}<br>x = {x:,}<br>value {describe(r)}" for x, r in zip(xs, rows)]
    out = [go.Scatter(x=drawn, y=[r.value for r in rows], mode="lines+markers", name=name, legendgroup=name,
                      line=dict(color=colour), hovertext=hover, hoverinfo="text")]
    wx, wy = _whiskers(drawn, [r.low for r in rows], [r.high for r in rows])
    if wx:
        out.append(go.Scatter(x=wx, y=wy, mode="lines", line=dict(color=colour, width=1.5), legendgroup=name,
                              showlegend=False, hoverinfo="skip"))
    nx, ny = _whiskers(drawn, [r.null_low for r in rows], [r.null_high for r in rows])
    if nx:
        out.append(go.Scatter(x=nx, y=ny, mode="lines", line=dict(color="rgba(154,165,177,0.6)", width=7),
                              name="null 95% range", legendgroup="null", showlegend=null_legend, hoverinfo="skip"))
    return out


def scaling_figures(cells: list[CellView]) -> list:
    """Per headline column: the value (with its interval, and its null range in grey) against parameter count, one
    line per seed; and against training step, one line per model and seed, when the grid has two steps or more.
    Series at the same x are drawn a hair apart (log axis) so that their intervals stay visible."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative

    from ..core.figures import axis_titles, layout

    out = []
    for h, label in columns(cells):
        found = [(c, headline_rows(c, h).get(label)) for c in cells]
        found = [(c, r) for c, r in found if r is not None and r.value is not None]
        axes = [("params", "parameters", lambda c: c.n_params, lambda c: f"seed {c.seed}"),
                ("step", "training step", lambda c: c.step, lambda c: f"{c.series}, seed {c.seed}")]
        for tag, xlabel, x_of, series_of in axes:
            points = [(c, r) for c, r in found if x_of(c)]
            if len({x_of(c) for c, _ in points}) < 2:  # a scaling figure needs two sizes (or steps)
                continue
            fig = go.Figure()
            names = list(dict.fromkeys(series_of(c) for c, _ in points))
            null_legend = True
            for i, series in enumerate(names):
                nudge = 10 ** (0.006 * (i - (len(names) - 1) / 2))
                mine = sorted(((x_of(c) * nudge, x_of(c), r) for c, r in points if series_of(c) == series),
                              key=lambda p: p[0])
                traces = _series(series, qualitative.Plotly[i % len(qualitative.Plotly)], mine, null_legend)
                null_legend = null_legend and not any(t.name == "null 95% range" for t in traces)
                fig.add_traces(traces)
            unit = found[0][1].unit
            axis_titles(fig, xlabel, f"{label} [{unit}]" if unit else label, xaxis=dict(type="log"))
            slug = re.sub(r"[^a-z0-9]+", "-", f"{h.key}-{label}-{tag}".lower()).strip("-")
            where = " at the probe's last layer" if "layer" in found[0][1].scope else ""
            out.append(Figure(f"grid-{slug}", f"{label} vs {xlabel}", layout(fig, f"{label} against {xlabel}"),
                              f"Each point is one cell's {h.metric}{where}; thin bars are its interval where it has "
                              "one, wide grey bars the same statistic's null range where the probe has one."))
    return out


def grid_body(cells: list[CellView], page_path: Path, title: str) -> str:
    from . import ledger as L
    from ..core.figures import escape, table
    from .html import figure_sections, verdict_legend

    cols = columns(cells)
    header = ["model", "revision", "seed", "parameters", "probes"] + [label for _, label in cols]
    body = []
    for c in cells:
        done = [p for p in c.run.order if p in c.rows_by_probe]
        found = {label: row for h, _ in cols for label, row in headline_rows(c, h).items()}
        body.append([c.model, c.revision or "—", str(c.seed), f"{c.n_params:,}" if c.n_params else "?",
                     f"{len(done)}/{len(c.run.order)}"] + [describe(found.get(label)) for _, label in cols])
    links = "".join(
        f"<li><a href=\"{escape(os.path.relpath(c.run.folder / 'report.html', page_path.parent))}\">{escape(c.model)}"
        f"{'@' + escape(c.revision) if c.revision else ''}, seed {escape(c.seed)}</a> <code>{escape(c.run.folder)}</code></li>"
        for c in cells)
    return (f"<h1>interp_bayes grid: {escape(title)}</h1><p class=\"sub\">{len(cells)} cells; every number below is "
            "read from the cells' run folders (results.csv in each).</p>"
            "<h2>Headline numbers per cell</h2><p class=\"note\">Value (interval) · null range · verdict · layer. "
            "PC1 share: the manifold probes' share at the last layer, with its resampled interval and the permuted "
            "null. Axis: PC1 entropy axis, cross-fitted held-out Pearson r with model entropy, raw and deconfounded "
            "(partial: controlling the confound; within: inside its strata). SULA: mean |H model − H Bayes| over "
            "k ≥ 1, main condition. Cut: the change in that MAE when the axis is cut, with its bootstrap interval "
            "against the matched control axes' range. — : the cell has no such row.</p>"
            + table(header, body, ["ours"] + [""] * 4 + ["num"] * len(cols), table_class="summary")
            + "<h2>Claims × cells</h2>" + verdict_legend()
            + L.matrix([(f"{c.model}{'@' + c.revision if c.revision else ''} s{c.seed}", L.collect(c.run))
                        for c in cells])
            + f"<h2>Cells</h2><ul class=\"sub\">{links}</ul>" + figure_sections(scaling_figures(cells)))


def build_grid_page(run_folders: list[str | Path], out_path: str | Path, title: str = "grid") -> Path:
    """Write the grid page for ``run_folders`` to ``out_path`` (from the folders alone) and return its path."""
    from .html import page

    out_path = Path(out_path)
    cells = [CellView.load(f) for f in run_folders]
    return atomic_write_text(out_path, page(f"interp_bayes grid: {title}", grid_body(cells, out_path, title)))
