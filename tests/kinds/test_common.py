"""What the kinds share (``kinds.common``, ``kinds.windtunnel``): one figure per probe and a tunnel's plan line."""

from __future__ import annotations

from types import SimpleNamespace

from interp_bayes.kinds.common import figure_per_probe
from interp_bayes.kinds.windtunnel import tunnel_plan, tunnel_prefix, tunnel_subject


def _probe(name: str, rows: list, tunnel: str | None):
    return SimpleNamespace(name=name, rows=rows, params_object=lambda: SimpleNamespace(tunnel=tunnel))


def test_figure_per_probe_draws_each_probe_into_its_own_figure_and_skips_one_with_nothing_to_draw():
    @figure_per_probe("demo", tunnel_subject)
    def figures(fig, pr, where):
        """One line per probe."""
        if not pr.rows:
            return None
        fig.add_scatter(x=list(range(len(pr.rows))), y=pr.rows)
        return f"Demo on {where}", "the heading", "the caption"

    drawn = figures([_probe("a", [1.0, 2.0], "some/dir/bijection-cpu"), _probe("b", [], "hmm-cpu"),
                     _probe("c", [3.0], None)])
    assert [(f.id, f.title, f.caption, f.subject) for f in drawn] == [
        ("demo-a", "Demo on bijection-cpu", "the caption", "bijection-cpu"), ("demo-c", "Demo on ", "the caption", "")]
    assert list(drawn[0].content.data[0].y) == [1.0, 2.0] and list(drawn[1].content.data[0].y) == [3.0]
    assert drawn[0].content.layout.title.text == "the heading"  # the house layout, applied once the traces are in
    assert figures.__doc__ == "One line per probe."


def test_figure_per_probe_passes_subplots_through():
    @figure_per_probe("two", tunnel_subject, rows=1, cols=2, subplot_titles=["left", "right"])
    def figures(fig, pr, where):
        fig.add_scatter(x=[0], y=[1], row=1, col=2)
        return "t", "h", "c"

    (fig,) = figures([_probe("p", [], "hmm-cpu")])
    assert fig.content.data[0].xaxis == "x2"
    assert [a.text for a in fig.content.layout.annotations][:2] == ["left", "right"]


def test_a_tunnel_probe_names_its_tunnel_by_folder_name_and_the_sweeps_model_by_nothing():
    on, off = SimpleNamespace(tunnel="runs/x/hmm-cpu", kind="demo"), SimpleNamespace(tunnel=None, kind="demo")
    assert (tunnel_subject(on), tunnel_prefix(on)) == ("hmm-cpu", "hmm-cpu: ")
    assert (tunnel_subject(off), tunnel_prefix(off)) == ("", "")
    (item,) = tunnel_plan(on, "3 sequences (seconds)", 12)
    assert (item.probe, item.what, item.cached, item.forwards, item.model) == (
        "demo", "wind tunnel runs/x/hmm-cpu: 3 sequences (seconds)", None, 12, "hmm-cpu")
