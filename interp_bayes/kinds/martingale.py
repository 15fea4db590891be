"""Is the in-context learning Bayesian? (Falck, Wang, Holmes 2024.) On exchangeable data a Bayesian predictor's
prediction does not depend on the order of the examples, and its predictive is a martingale. Per k: the spread of
the model's predictive across orders of the same examples, and the martingale gap (the model's own next example
drawn from its predictive), the gap against a null from the predictor's own draws (the plug-in gap is biased up by
their noise, and that noise is the predictor's own), the exact predictor's value beside it as a reference. On SULA
or on a bijection wind tunnel (docs/rivals.md)."""

from __future__ import annotations

# plotly is imported inside the functions that draw: a run that only computes rows does not load it
from dataclasses import dataclass, field, replace
from typing import ClassVar

from ..core.errors import ConfigError
from ..core.results import Row, select
from ..core.registry import register
from ..core.plugin import Claim, Figure, Kind, Line, PlanItem, Result
from .common import sula_task
from .windtunnel import TunnelParams, load_windtunnel_task, tunnel_subject
from ..analyses.martingale import bijection_contexts, bijection_setup, martingale_test, sula_contexts, sula_setup
from ..core.figures import COLOURS, axis_titles, error_bars, layout
from ..stats import ledger as L
from ..windtunnel.tunnels import is_tunnel, open_tunnel


@dataclass(frozen=True)
class MartingaleParams(TunnelParams):
    tunnel_tasks: ClassVar[tuple[str, ...]] = ("bijection",)
    tunnel: str | None = None  # a bijection wind tunnel (name or trained folder); None: the sweep's model on SULA
    per_k: int = 20  # contexts per k
    ks: tuple[int, ...] = (1, 2, 4, 8)  # k of the contexts (SULA: any; those beyond 0, 1, 2, 4, 8 drawn after them)
    n_perms: int = 6  # orders of each context
    # draws of the model's own next example (the null is built from their spread: at least 2)
    n_draws: int = field(default=4, metadata={"least": 2})
    n_null: int = 100  # Monte-Carlo draws of the exact predictor's gap (the reference)
    n_boot: int = 1000
    seed: int = 42
    # m > 0: also the predictor averaged over m orderings of the same examples (Chlon et al.); 0: per order only
    orderings: int = field(default=0, metadata={"least": 0})
    order_seed: int = 0  # the orderings' seed

    def check(self, ctx, probe: str) -> None:
        """Every k a count of examples the task can show before its query (a bijection tunnel: below its pairs)."""
        most = None
        if self.tunnel is not None:
            if is_tunnel(self.tunnel):  # (a folder that is no checkpoint is the run's to refuse)
                n_pairs = getattr(open_tunnel(self.tunnel).task, "n_pairs", None)
                most = None if n_pairs is None else n_pairs - 1
        bad = [k for k in self.ks if k < 1 or (most is not None and k > most)]
        if bad or not self.ks:
            span = f"from 1 to {most} ({self.tunnel} shows {most + 1} pairs)" if most is not None else "at least 1"
            raise ConfigError(f"Parameter 'ks' of probe '{probe}' lists examples before the query, each {span}, "
                              f"not {list(self.ks)}.")


def run(ctx, p: MartingaleParams) -> Result:
    if p.tunnel is None:
        task, ids = sula_task(ctx, p.per_k)
        # extra ks are generated after the task's own, so the prompts of those (the default recipe's) do not change
        task = replace(task, ks=task.ks + tuple(sorted(set(p.ks) - set(task.ks))))
        setup, contexts, model = sula_setup(task, ids["main"]), sula_contexts(task, seed=p.seed, ks=p.ks), ctx.model
    else:
        model, task = load_windtunnel_task(p.tunnel)
        setup, contexts = bijection_setup(task), bijection_contexts(task, list(p.ks), p.per_k, seed=p.seed)
    report = martingale_test(model, setup, contexts, n_perms=p.n_perms, n_draws=p.n_draws, n_null=p.n_null,
                             n_boot=p.n_boot, seed=p.seed, batch_size=ctx.config.batch_size, n_orders=p.orderings,
                             order_seed=p.order_seed)
    return Result(report.rows(), dict(task=report.task))


def summary(rows: list[Row], p: MartingaleParams) -> list[Line]:
    out, where = [], tunnel_subject(p) or "sula"
    for metric, label, against in (
            ("order_sensitivity_js_bits", "order sensitivity (JS across orders, bits)", "exact"),
            ("martingale_gap_debiased_bits", "martingale gap, debiased (bits)", "martingale null"),
            ("martingale_gap_kl_bits", "martingale gap KL(m || m0), plug-in (bits)", "martingale null"),
            ("averaged_martingale_gap_debiased_bits", f"martingale gap averaged over {p.orderings} orderings, "
             "debiased (bits)", "martingale null"),
            ("expectation_gap_debiased_bits", "per-order minus averaged debiased gap (bits)", "paired null")):
        rs = sorted(select(rows, metric), key=lambda r: r.scope["k"])
        if rs:
            text = "; ".join(f"k={r.scope['k']}: {r.value:.4f} [{r.low:.4f}, {r.high:.4f}] vs {against} "
                             f"[{r.null_low:.4f}, {r.null_high:.4f}]" for r in rs)
            above = [r for r in rs if r.verdict() == "above null"]
            out.append(Line(f"{where}: {label}", text, f"above its null at {len(above)} of {len(rs)} k"))
    return out


def figures(probes) -> list[Figure]:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    out = []
    for p in probes:
        fig = make_subplots(rows=1, cols=2, subplot_titles=["order sensitivity (JS, bits)", "martingale gap (KL, bits)"])
        for col, metric in enumerate(("order_sensitivity_js_bits", "martingale_gap_kl_bits"), start=1):
            rs = sorted(select(p.rows, metric), key=lambda r: r.scope["k"])
            if not rs:
                continue
            k = [r.scope["k"] for r in rs]
            fig.add_trace(go.Scatter(x=k + k[::-1], y=[r.null_high for r in rs] + [r.null_low for r in rs[::-1]],
                                     fill="toself", fillcolor="rgba(150,150,150,0.25)", line=dict(width=0),
                                     name="null (order: exact predictor; gap: the model's own draws, 95%)",
                                     showlegend=col == 1), row=1, col=col)
            fig.add_trace(go.Scatter(x=k, y=[r.value for r in rs], mode="lines+markers", name="model",
                                     showlegend=col == 1, line=dict(color=COLOURS["observed"]),
                                     error_y=error_bars(rs)), row=1, col=col)
        axis_titles(fig, "k (examples in context)", None)
        out.append(Figure(f"martingale-{p.name}", "Martingale test", layout(
            fig, f"Is the in-context learning Bayesian? ({p.data.get('task')})"),
            "A Bayesian predictor sits in the grey band: for the gap, where the model's own plug-in gap would sit if "
            "it were a martingale with the noise of its own draws. A model above it depends on the order of "
            "exchangeable examples or drifts when fed its own predictions."))
        if select(p.rows, "averaged_martingale_gap_debiased_bits"):
            out.append(expectation_figure(p))
    return out


def expectation_figure(p) -> Figure:
    """The debiased gap against k, per order and averaged over orderings, each with its own null band and the
    exact predictor's value (exchangeable by construction) beside them: Bayes in expectation (Chlon et al.)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for metric, name, colour in (("martingale_gap_debiased_bits", "per order", COLOURS["observed"]),
                                 ("averaged_martingale_gap_debiased_bits", "averaged over orderings",
                                  COLOURS["matched"])):
        rs = sorted(select(p.rows, metric), key=lambda r: r.scope["k"])
        k = [r.scope["k"] for r in rs]
        fig.add_trace(go.Scatter(x=k + k[::-1], y=[r.null_high for r in rs] + [r.null_low for r in rs[::-1]],
                                 fill="toself", fillcolor="rgba(150,150,150,0.18)", line=dict(width=0, color=colour),
                                 name=f"null, {name} (its own draws, 95%)"))
        fig.add_trace(go.Scatter(x=k, y=[r.value for r in rs], mode="lines+markers", name=name,
                                 line=dict(color=colour),
                                 error_y=error_bars(rs)))
    exact = sorted(select(p.rows, "exact_martingale_gap_debiased_bits"), key=lambda r: r.scope["k"])
    fig.add_trace(go.Scatter(x=[r.scope["k"] for r in exact], y=[r.value for r in exact], mode="markers",
                             name="exact predictor", marker=dict(color=COLOURS["true"], symbol="x")))
    axis_titles(fig, "k (examples in context)", "debiased martingale gap (bits)", xaxis=dict(type="log"))
    orders = select(p.rows, "averaged_martingale_gap_debiased_bits")[0].scope.get("orders")
    return Figure(f"martingale-expectation-{p.name}", "Bayes in expectation", layout(
        fig, f"Martingale gap per order and averaged over {orders} orderings ({p.data.get('task')})"),
        "Chlon et al.: positional encodings break exchangeability, so the relevant predictor is the average over "
        "orderings of the same examples. Each curve sits against its own null (its own draws); the exact "
        "predictor is exchangeable by construction, its gap 0.")


def plan(ctx, p: MartingaleParams) -> list:
    """Forwards of the test: each context in ``n_perms`` orders, then ``n_draws`` draws of a next example, each
    predicted with and without it (``martingale.martingale_test``), plus the contexts themselves."""
    n = p.per_k * len(p.ks) * (p.n_perms + 2 * p.n_draws + 1)
    n += p.per_k * len(p.ks) * p.orderings * (1 + 4 * p.n_draws)  # averaged: each predicted context in m orders
    on = tunnel_subject(p)
    return [PlanItem("martingale", f"{p.per_k * len(p.ks)} contexts ({on or 'sula'}): {p.n_perms} orders and "
                     f"{p.n_draws} draws each", False, n, model=on)]


DELTA_BITS = 0.05  # the martingale claim's delta: a debiased gap this large (bits) is a violation it must see
# the order claim's delta: a JS divergence across orders of this many bits is an order dependence the claim must see;
# a tenth of the wind tunnels' calibration bound (windtunnel.CALIBRATED_BITS "holds" at 0.01 bits of entropy MAE)
ORDER_DELTA_BITS = 1e-3


def martingale_claim(rows: list[Row], metric: str) -> tuple[str, str] | None:
    """(verdict, evidence) of "predictions form a martingale" from the debiased gap pooled over k (``metric`` +
    "_over_k"): one decision with its own null and a sequential test. Rejected: "does not hold", naming the k whose
    own tests survive Holm over k (or none: a small gap at every k); undecided at the cap: "borderline"; not
    rejected: "holds" only when the test could have seen a pooled gap of ``DELTA_BITS`` (``ledger.detectable``),
    else "not testable here". None without the pooled row (a run from before it existed)."""
    pooled = next(iter(select(rows, f"{metric}_over_k")), None)
    if pooled is None:
        return None
    rejection = L.beyond_null(pooled)  # holds: the gap is beyond its null, i.e. the martingale claim fails
    verdict = {L.HOLDS: L.FAILS, L.FAILS: L.not_beyond_null(pooled, delta=DELTA_BITS)}.get(rejection, rejection)
    survive, _ = L.family(select(rows, metric))
    where = ", ".join(f"k={r.scope['k']}" for r in sorted(survive, key=lambda r: r.scope["k"])) or "no single k"
    evidence = f"pooled over k: {L.fmt(pooled)}; beyond its null after Holm over k: {where}"
    if verdict == L.UNTESTABLE:
        evidence += (f"; the test could see only a gap of {L.detectable(pooled):.3g} bits or more (claim: "
                     f"{DELTA_BITS:g})")
    return verdict, evidence


def ledger(probes) -> list:
    """Rivals of a Bayesian reading: predictions that depend on the order of the examples (the claim holds when no
    k clears its null), or that are not a martingale (one decision over k: ``martingale_claim``)."""
    out = []
    for p in probes:
        where = tunnel_subject(p.params_object())
        for metric, key, text in (("order_sensitivity_js_bits", "order", "Predictions do not depend on the order "
                                   "of the examples (JS across orders vs the exact predictor)"),
                                  ("martingale_gap_debiased_bits", "martingale", "Predictions form a martingale "
                                   "(debiased gap vs the martingale null)"),
                                  ("averaged_martingale_gap_debiased_bits", "martingale_expectation", "Predictions "
                                   "averaged over orderings of the examples form a martingale (Bayes in expectation; "
                                   "debiased gap vs its own martingale null)")):
            rs = sorted(select(p.rows, metric), key=lambda r: r.scope["k"])
            if not rs:
                continue
            decided = martingale_claim(p.rows, metric) if metric.endswith("martingale_gap_debiased_bits") else None
            if decided is None:
                hit, total = L.count_beyond(rs)
                worst = max(rs, key=lambda r: r.value - r.null_high)
                delta = ORDER_DELTA_BITS if metric == "order_sensitivity_js_bits" else None
                decided = L.none_beyond(rs, delta=delta), (f"above its null at {hit} of {total} k; largest at "
                                                           f"k={worst.scope['k']}: {L.fmt(worst)}")
                if decided[0] == L.UNTESTABLE and hit == 0:
                    decided = decided[0], decided[1] + (
                        f"; the null could see only a JS of {max(L.detectable(r) for r in rs):.3g} bits or more "
                        f"(claim: {delta:g})")
            out.append(Claim(key, text, *decided, subject=where, rival=True, section=f"fig-martingale-{p.name}"))
    return out


KIND = register(Kind("martingale", MartingaleParams, run, summary, figures, plan, doc=__doc__, ledger=ledger,
                     subject=tunnel_subject))
