"""The house style every figure is drawn in, and the small HTML pieces a kind's figures may hold: what a probe kind
draws with (the report lays the figures out; it never draws a probe's figure itself). Prompt text shown in hover
labels is HTML-escaped by the kinds (plotly renders hover text as HTML and decodes entities)."""

from __future__ import annotations

import html

import numpy as np

COLOURS = dict(observed="#1f4e79", permuted="#9aa5b1", gaussian="#d0d5db", true="#c0392b", isotropic="#7f8c8d",
               matched="#2e86c1", pcs="#27ae60")


LAYOUT = dict(template="plotly_white", height=420, margin=dict(l=60, r=30, t=110, b=50),
              font=dict(family="system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif", size=13))


def shorten(text: str, n: int = 100) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def error_bars(rows) -> dict:
    """Plotly's asymmetric error bars of ``rows``' intervals (``low`` to ``high`` around ``value``): ``error_y=``."""
    return dict(type="data", symmetric=False, array=[r.high - r.value for r in rows],
                arrayminus=[r.value - r.low for r in rows])


def axis_titles(fig, x: str | None, y: str | None, *, xaxis: dict | None = None, yaxis: dict | None = None,
                **at) -> None:
    """Title the x and y axes (None: leave that axis alone), with any other plotly properties of each (``xaxis``,
    ``yaxis``: e.g. ``type``, ``range``), on every panel or on the one ``at`` names (``row``, ``col``)."""
    if x is not None:
        fig.update_xaxes(title_text=x, **(xaxis or {}), **at)
    if y is not None:
        fig.update_yaxes(title_text=y, **(yaxis or {}), **at)


def layout(fig, title: str, **kw):
    """House style: the title on top, then a horizontal legend, both above the plot area (pixel positions, so
    they never overlap subplot titles); axis titles never clipped; layer axes ticked at whole layers; a panel with
    nothing to draw says so. Call it once the traces are in."""
    spec = {**LAYOUT, **kw}
    h = spec["height"]
    fig.update_layout(**spec, title=dict(text=title, x=0, xref="paper", y=1 - 14 / h, yanchor="top",
                                         font=dict(size=15)),
                      legend=dict(orientation="h", x=0, xref="paper", yref="container", y=1 - 46 / h, yanchor="top"))
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    integer_layer_ticks(fig)
    note_empty_panels(fig)
    return fig


def _axis_names(fig, letter: str) -> list[str]:
    """'xaxis', 'xaxis2', ... of a figure (layout keys)."""
    names = [k for k in fig.layout.to_plotly_json() if k == f"{letter}axis" or
             (k.startswith(f"{letter}axis") and k[5:].isdigit())]
    return sorted(names or [f"{letter}axis"], key=lambda k: int(k[5:] or 1))


def _ref(name: str) -> str:
    """'xaxis2' -> 'x2' (what a trace's xaxis property holds)."""
    return name[0] + name[5:]


def _finite_values(values) -> list[float]:
    out = []
    for v in values if values is not None else []:
        try:
            v = float(v)
        except (TypeError, ValueError):
            continue
        if np.isfinite(v):
            out.append(v)
    return out


def integer_layer_ticks(fig) -> None:
    """A layer axis whose traces sit at whole numbers gets ticks at whole layers only (a two-layer model would
    otherwise show 0.5, 1.5): every layer up to 15 of them, then a whole-number step."""
    for name in _axis_names(fig, "x"):
        axis = fig.layout[name]
        if "layer" not in str(axis.title.text or "").lower() or axis.type in ("log", "category"):
            continue
        xs = [x for t in fig.data if (getattr(t, "xaxis", None) or "x") == _ref(name)
              for x in _finite_values(getattr(t, "x", None))]
        if not xs or any(x != int(x) for x in xs):
            continue
        span = max(xs) - min(xs)
        axis.update(tickmode="linear", tick0=int(min(xs)), dtick=max(1, int(np.ceil(span / 15))))


def note_empty_panels(fig) -> None:
    """A panel (x / y axis pair) that no trace draws a finite value on gets a note in its middle, so an empty
    panel reads as "nothing here" rather than as a broken figure."""
    pairs = {}
    for name in _axis_names(fig, "x"):
        anchor = fig.layout[name].anchor
        pairs[_ref(name)] = anchor if anchor and anchor != "free" else "y" + _ref(name)[1:]
    for x, y in pairs.items():
        drawn = any((getattr(t, "xaxis", None) or "x") == x and (getattr(t, "yaxis", None) or "y") == y
                    and _finite_values(getattr(t, "y", None)) for t in fig.data)
        if not drawn:
            fig.add_annotation(text="nothing to draw here: no finite value (see the table of numbers)",
                               xref=f"{x} domain", yref=f"{y} domain", x=0.5, y=0.5, showarrow=False,
                               font=dict(color="#5b6b7c", size=12), name="empty-panel-note")


def escape(x) -> str:
    """Any value as HTML-escaped text."""
    return html.escape(str(x))


def table(header: list[str], rows: list[list[str]], classes: list[str] | None = None,
          row_classes: list[str] | None = None, table_class: str = "") -> str:
    """An HTML table; cells are escaped here, so pass raw strings."""
    classes = classes or [""] * len(header)
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join(
        f"<tr class=\"{(row_classes or [''] * len(rows))[i]}\">"
        + "".join(f"<td class=\"{c}\">{escape(v)}</td>" for v, c in zip(row, classes)) + "</tr>"
        for i, row in enumerate(rows))
    return f"<table class=\"{table_class}\"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
