"""The figures' data: a colour set on every trace that shares a legend entry across panels, whole-layer ticks on a
two-layer model, one legend entry per edit in the per-k effects, no degenerate per-layer panel, a note on an
empty panel, titles unique within a page (naming the model or tunnel), all checked on the plotly figures the kinds
and the report build (planted rows, and the tiny runs of test_report)."""

import re

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from interp_bayes.core.plugin import Figure
from interp_bayes.core.registry import get_kind
from interp_bayes.core.figures import axis_titles, layout
from interp_bayes.report.html import unique_titles
from interp_bayes.report.view import ProbeView, RunView
from interp_bayes.core.results import Row

from tests.report.test_report import runs  # noqa: F401  (the module's run folders, a fixture)


def _probe(kind, rows=(), params=None, data=None, name=None, tmp_path=None):
    p = ProbeView(name or kind, kind, params or {}, tmp_path, rows=list(rows))
    if data is not None:
        p.__dict__["data"] = data  # the cached property, planted
    return p


def _decoding_rows():
    rows = []
    for target in ("model entropy", "bayes latent"):
        for adjust in ("raw", "deconfounded"):
            for reading in ("resid", "v", "z"):
                for layer in (0, 1):
                    rows.append(Row("decoding_r2", 0.3 + 0.1 * layer, scope=dict(target=target, adjust=adjust,
                                                                                  reading=reading, layer=layer)))
            for layer in (0, 1):
                rows.append(Row("axis_r", 0.5, scope=dict(target=target, adjust=adjust, reading="v", layer=layer)))
    return rows


def test_decoding_legend_matches_every_panel(tmp_path):
    (fig,) = get_kind("decoding").figures([_probe("decoding", _decoding_rows(), dict(readings=["resid", "v", "z"]),
                                                  tmp_path=tmp_path)])
    colours = {}
    for t in fig.content.data:
        assert t.line.color is not None, t.name  # plotly would pick its own colour per panel
        colours.setdefault(t.legendgroup, set()).add(t.line.color)
    assert all(len(c) == 1 for c in colours.values()) and len(colours) == 4  # 3 readings + the axis
    assert len({next(iter(c)) for c in colours.values()}) == 4
    # a two-layer model: ticks at whole layers only
    for name in ("xaxis", "xaxis2", "xaxis3", "xaxis4"):
        axis = fig.content.layout[name]
        assert axis.tickmode == "linear" and axis.dtick == 1 and axis.tick0 == 0


def test_axis_titles_is_the_plotly_calls_it_stands_for():
    """The kinds' axis titles (``core.figures.axis_titles``) give the figure the two ``update_*axes`` calls would, byte
    for byte: every panel or one, other properties beside the title, None leaving an axis as it was."""
    def two_panels():
        fig = make_subplots(rows=1, cols=2)
        fig.add_scatter(x=[0, 1], y=[1, 2], row=1, col=1)
        fig.add_scatter(x=[0, 1], y=[3, 4], row=1, col=2)
        fig.update_yaxes(title_text="kept")
        return fig

    plain, helped = two_panels(), two_panels()
    plain.update_xaxes(title_text="layer", type="category")
    plain.update_yaxes(title_text="bits", range=[0, 1], row=1, col=2)
    plain.update_xaxes(title_text="k", row=1, col=1)
    axis_titles(helped, "layer", None, xaxis=dict(type="category"))
    axis_titles(helped, None, "bits", yaxis=dict(range=[0, 1]), row=1, col=2)
    axis_titles(helped, "k", None, row=1, col=1)
    assert helped.to_json() == plain.to_json()
    assert (helped.layout.yaxis.title.text, helped.layout.yaxis2.title.text) == ("kept", "bits")
    assert (helped.layout.xaxis.title.text, helped.layout.xaxis2.title.text) == ("k", "layer")


def test_layer_ticks_and_empty_panels_in_the_house_layout():
    fig = make_subplots(rows=1, cols=3)
    fig.add_trace(go.Scatter(x=[0, 1], y=[0.2, 0.4]), row=1, col=1)
    fig.add_trace(go.Scatter(x=[0, 1], y=[float("nan"), float("nan")]), row=1, col=2)  # nothing finite
    fig.add_trace(go.Scatter(x=[0.5, 1.5], y=[1, 2]), row=1, col=3)  # not whole numbers: left alone
    fig.update_xaxes(title_text="layer")
    layout(fig, "t")
    assert fig.layout.xaxis.dtick == 1 and fig.layout.xaxis.tickmode == "linear"
    assert fig.layout.xaxis3.tickmode is None
    notes = [a for a in fig.layout.annotations if a.name == "empty-panel-note"]
    assert [(a.xref, a.yref) for a in notes] == [("x2 domain", "y2 domain")]
    deep = go.Figure(go.Scatter(x=list(range(60)), y=list(range(60))))
    deep.update_xaxes(title_text="layer")
    assert layout(deep, "t").layout.xaxis.dtick == 4  # 60 layers: a whole-number step, about 15 ticks


def test_intervention_effects_per_k_one_entry_per_edit(tmp_path):
    ks = (0, 1, 2)
    runs_data = []
    for layer_set in ("15", "10+15"):
        for op in ("cut", "only", "shift+", "shift-"):
            for fam, n in (("true", 1), ("isotropic", 2), ("matched", 2), ("pcs", 1)):
                runs_data += [dict(kind=fam, layer_set=layer_set, op=op, **{f"mae_k{k}": 0.2 + 0.01 * k for k in ks})
                              for _ in range(n)]
    base = {f"mae_k{k}": 0.2 for k in ks}
    p = _probe("interventions", data=dict(runs=runs_data, baseline=base), tmp_path=tmp_path)
    from interp_bayes.kinds.interventions import per_k_figure

    fig = per_k_figure(p).content
    shown = [t for t in fig.data if t.showlegend is not False]
    assert len(shown) == 8  # one per edit (2 layer sets x 4 ops), not 32
    assert len({t.line.color for t in shown}) == 8  # and each its own colour
    for t in fig.data:  # each edit's controls' mean in its group and colour
        assert t.line.color == next(s.line.color for s in shown if s.legendgroup == t.legendgroup)


def _manifold_rows(layers):
    out = []
    for layer in layers:
        out.append(Row("pc1_share", 0.06, scope=dict(layer=layer), low=0.05, high=0.07, null_low=0.03, null_high=0.04))
        for null in ("permuted", "gaussian"):
            out.append(Row("pc1_share_null_mean", 0.034, scope=dict(layer=layer, null=null), low=0.03, high=0.04))
    return out


def test_pc1_share_per_layer_panel_only_with_two_layers(tmp_path):
    kind = get_kind("manifold")
    one = next(f for f in kind.figures([_probe("manifold", _manifold_rows([29]), tmp_path=tmp_path)])
               if f.id == "shares").content
    assert "xaxis2" not in one.layout.to_plotly_json()  # no panel of a single point
    assert [a.text for a in one.layout.annotations] == ["PC1 share (last layer)"]
    two = next(f for f in kind.figures([_probe("manifold", _manifold_rows([0, 1]), tmp_path=tmp_path)])
               if f.id == "shares").content
    assert two.layout.xaxis2.title.text == "layer" and two.layout.xaxis2.dtick == 1


def test_unique_titles_name_the_subject():
    figs = [Figure("a", "Martingale test", None, subject=""), Figure("b", "Martingale test", None, subject="bij"),
            Figure("c", "Martingale test", None, subject="bij"), Figure("d", "Wind tunnel bij: calibration", None,
                                                                      subject="bij")]
    titles = unique_titles(figs, "smollm2")
    assert titles == ["Martingale test — smollm2", "Martingale test — bij", "Martingale test — bij (2)",
                      "Wind tunnel bij: calibration"]


def test_report_figures_of_a_run(runs):  # noqa: F811
    run = RunView.load(runs["full"])
    figs = run.figures()
    titles = unique_titles(figs, run.name)
    assert len(set(titles)) == len(titles)
    text = runs["report"].read_text()
    headings = re.findall(r"<h[23][^>]*>(.*?)</h[23]>", text)
    assert len(headings) == len(set(headings))  # titles unique within the page
    for f in figs:
        if isinstance(f.content, str):
            continue
        fig = f.content
        names = {k for k in fig.layout.to_plotly_json() if re.fullmatch(r"xaxis\d*", k)}
        for name in names:  # the tiny model has two layers: whole-layer ticks
            axis = fig.layout[name]
            if "layer" in str(axis.title.text or "").lower() and axis.type not in ("log", "category"):
                assert axis.dtick == 1, (f.id, name)
        groups = {}
        for t in fig.data:
            if t.type == "scatter" and t.legendgroup and t.mode and "lines" in t.mode:
                groups.setdefault(t.legendgroup, set()).add(t.line.color)
        assert all(len(c) == 1 for c in groups.values()), (f.id, groups)  # a legend entry, one colour
