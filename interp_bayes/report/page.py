"""What makes a page light: plotly.js inlined once as gzip + base64 (a third of its 4.8 MB), each figure's spec
inlined the same way, and a small script that unpacks them with the browser's own ``DecompressionStream`` and
draws each figure when it comes near the viewport (then the rest while the browser is idle). Nothing is fetched;
the page stays one self-contained file.

``<html data-ready>`` is set to the milliseconds since navigation when plotly is ready and the figures in the
first screen are drawn: what a load-time test waits for.
"""

from __future__ import annotations

# plotly is imported inside the function that packs plotly.js: the page's other helpers do not need it
import base64
import gzip
import html
import json
from functools import lru_cache

PLOTLY_CONFIG = dict(displaylogo=False, responsive=True, toImageButtonOptions=dict(format="svg"))


def pack(text: str) -> str:
    """gzip (mtime 0, so the same text gives the same bytes) then base64."""
    return base64.b64encode(gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0)).decode("ascii")


@lru_cache(maxsize=1)
def packed_plotly() -> str:
    import plotly.offline

    return pack(plotly.offline.get_plotlyjs())


def figure_spec(fig) -> str:
    """A plotly figure as the JSON that ``Plotly.newPlot`` takes (data, layout), packed."""
    spec = json.loads(fig.to_json())
    return pack(json.dumps(dict(data=spec.get("data", []), layout=spec.get("layout", {})), separators=(",", ":")))


def figure_div(fig, div_id: str) -> str:
    """A placeholder the renderer draws ``fig`` into, holding its packed spec (base64 needs no escaping)."""
    height = int(fig.layout.height or 450)
    return (f"<div class=\"plot\" id=\"{html.escape(div_id)}\" style=\"min-height:{height}px\" "
            f"data-spec=\"{figure_spec(fig)}\"></div>")


RENDERER = """
(function () {
  var CONFIG = %(config)s, plotly = null;
  function unpack(b64) {
    var bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"))).text();
  }
  function ensurePlotly() {  // unpacked when the first figure is about to be seen, once
    if (!plotly) {
      var packed = document.getElementById("ib-plotly");
      plotly = window.Plotly || !packed ? Promise.resolve() : unpack(packed.textContent).then(function (src) {
        var s = document.createElement("script"); s.text = src; document.head.appendChild(s); });
    }
    return plotly;
  }
  function draw(el) {
    if (el.dataset.drawn) return Promise.resolve();
    el.dataset.drawn = "1";
    return Promise.all([ensurePlotly(), unpack(el.dataset.spec)]).then(function (got) {
      var spec = JSON.parse(got[1]);
      el.style.minHeight = "";
      return Plotly.newPlot(el, spec.data, spec.layout, CONFIG);
    });
  }
  var plots = Array.prototype.slice.call(document.querySelectorAll("div.plot[data-spec]"));
  var root = document.documentElement, first = true;
  function rest() {  // then the figures further down, one per idle moment
    var next = plots.filter(function (el) { return !el.dataset.drawn; })[0];
    if (next) draw(next).then(function () { (window.requestIdleCallback || setTimeout)(rest); });
  }
  function ready() {
    root.dataset.ready = String(Math.round(performance.now()));
    (window.requestIdleCallback || setTimeout)(rest);
  }
  window.addEventListener("beforeprint", function () { plots.forEach(draw); });
  if (!("IntersectionObserver" in window)) { Promise.all(plots.map(draw)).then(ready); return; }
  if (!plots.length) { ready(); return; }
  var io = new IntersectionObserver(function (entries) {
    var shown = entries.filter(function (e) { return e.isIntersecting; }).map(function (e) {
      io.unobserve(e.target); return draw(e.target); });
    if (first) { first = false; Promise.all(shown).then(ready); }
  }, {rootMargin: "200px"});
  plots.forEach(function (el) { io.observe(el); });
})();
"""


def renderer_script() -> str:
    return f"<script>{RENDERER % dict(config=json.dumps(PLOTLY_CONFIG))}</script>"


def plotly_packed_script() -> str:
    """plotly.js, packed; a script of an unknown type, so the browser only keeps its text."""
    return f"<script type=\"application/gzip+base64\" id=\"ib-plotly\">{packed_plotly()}</script>"


FILTER_SCRIPT = """
<script>
(function () {
  var box = document.getElementById("rows-filter"), pick = document.getElementById("rows-subject");
  if (!box || !pick) return;
  function apply() {
    var words = box.value.toLowerCase().split(/\\s+/).filter(Boolean), want = pick.value, shown = 0;
    document.querySelectorAll("#all-rows tbody tr:not(.group)").forEach(function (tr) {
      var text = tr.textContent.toLowerCase();
      var ok = (!want || tr.dataset.subject === want) && words.every(function (w) { return text.indexOf(w) >= 0; });
      tr.style.display = ok ? "" : "none"; shown += ok ? 1 : 0;
    });
    document.querySelectorAll("#all-rows tbody tr.group").forEach(function (tr) {
      tr.style.display = (!want || tr.dataset.subject === want) ? "" : "none"; });
    document.getElementById("rows-count").textContent = shown + " rows shown";
  }
  box.addEventListener("input", apply); pick.addEventListener("change", apply);
})();
</script>
"""
