"""The associative-recall circuit of a recall transformer (issue 40, item 2; ``analyses.recall_circuit``): per head,
the key look-back, the prefix-matching score, the attention from each query key to the matching key's value and
that value's share of the head's attention on the stored values, with bootstrap intervals over held-out sequences,
beside the held-out recall. With ``steps: true``, at every saved checkpoint of a trained folder
(``checkpoints/step_*``) and its final model: the induction-score curve of a run, which shows the circuit forming
when the run binds and what is missing when it does not."""

from __future__ import annotations

# plotly is imported inside the functions that draw: a run that only computes rows does not load it
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

from ..analyses.recall_circuit import recall_circuit_scores
from ..core.plugin import Claim, Figure, Kind, Line, Result
from ..core.registry import register
from ..core.results import Row, find, select
from ..model.read import patterns
from ..stats.ledger import fmt, interval_side
from ..windtunnel.recall import evaluate_recall
from ..windtunnel.tunnels import open_tunnel, saved_checkpoints
from .windtunnel import TunnelParams, tunnel_plan, tunnel_subject
from ..core.figures import axis_titles, error_bars, layout

BINDS = 0.5  # a binding head gives the queried key's value most of its attention on the stored values


@dataclass(frozen=True)
class RecallCircuitParams(TunnelParams):
    tunnel_tasks: ClassVar[tuple[str, ...]] = ("recall",)
    tunnel_archs: ClassVar[tuple[str, ...] | None] = ("transformer",)  # attention patterns
    tunnel: str = "recall-cpu"  # a packaged checkpoint's name or a trained folder
    steps: bool = False  # also every saved checkpoint of the folder (checkpoints/step_*), in order of step
    n: int = field(default=500, metadata={"least": 1})  # held-out sequences per checkpoint
    n_boot: int = field(default=200, metadata={"least": 1})
    seed: int = 2024  # the held-out sequences (the evaluator's stream) and the bootstrap

    def checkpoints(self) -> dict:
        """The folder, and with ``steps`` each saved checkpoint under its folder's name, so that the stage's key
        holds every model it reads."""
        named = super().checkpoints()
        if self.steps:
            named |= {f.name: f for f in saved_checkpoints(named["tunnel"]).values()}
        return named


def checkpoint_rows(folder: Path, p: RecallCircuitParams) -> list[Row]:
    """One checkpoint's rows, scoped by its training step: the four scores per (layer, head) and the recall."""
    tunnel = open_tunnel(folder)
    model, task = tunnel.model, tunnel.task
    batch = task.sample(p.n, seed=p.seed)
    rows = recall_circuit_scores(patterns(model, batch.input_ids), batch.input_ids, task, n_boot=p.n_boot,
                                 seed=p.seed)
    recall = evaluate_recall(model, task, n=p.n, lengths=[task.n_pairs], seed=p.seed, baselines=False)
    at = {"step": tunnel.step}
    return [replace(r, scope=at | r.scope) for r in rows] + [
        Row("recall_accuracy", recall[task.n_pairs]["recall_accuracy"], "share", dict(at, n_pairs=task.n_pairs),
            n=p.n, note="queries whose top value is the stored one")]


def run(ctx, p: RecallCircuitParams) -> Result:
    folder = p.checkpoints()["tunnel"]
    saved = saved_checkpoints(folder) if p.steps else {}
    # the saved steps in order, then the final model unless a saved checkpoint holds its step (as dynamics.frames)
    folders = [*saved.values()] + ([folder] if open_tunnel(folder).step not in saved else [])
    return Result([r for f in folders for r in checkpoint_rows(f, p)])


def steps_of(rows: list[Row]) -> list[int]:
    return sorted({r.scope["step"] for r in rows})


def best(rows: list[Row], metric: str, step: int) -> Row:
    """The head with the largest ``metric`` at ``step``."""
    return max(select(rows, metric, step=step), key=lambda r: r.value)


def claim_row(rows: list[Row]) -> tuple[Row, int]:
    """The final model's head with the largest value share, and the number of stored pairs N."""
    last = steps_of(rows)[-1]
    return best(rows, "recall_value_share", last), find(rows, "recall_accuracy", step=last).scope["n_pairs"]


def summary(rows: list[Row], p: RecallCircuitParams) -> list[Line]:
    where = tunnel_subject(p)
    out = []
    for step in steps_of(rows):
        heads = "; ".join(f"{m.removeprefix('recall_').replace('_', ' ')} {r.value:.3f} [{r.low:.3f}, {r.high:.3f}] "
                          f"(L{r.scope['layer']}H{r.scope['head']})"
                          for m in ("recall_key_lookback", "recall_prefix_matching", "recall_value_share")
                          for r in (best(rows, m, step),))
        out.append(Line(f"{where} at step {step}: recall, then each score's largest head",
                        f"recall {find(rows, 'recall_accuracy', step=step).value:.3f}; {heads}"))
    r, N = claim_row(rows)
    out.append(Line(f"{where}: a head binds (value share above {BINDS}; the stored-values shortcut gives 1/N = "
                    f"{1 / N:.3g})", f"{r.value:.3f} [{r.low:.3f}, {r.high:.3f}] (L{r.scope['layer']}H"
                    f"{r.scope['head']})", interval_side(r, "above", BINDS)))
    return out


def figures(probes) -> list[Figure]:
    """Per probe: the induction-score curve, every head's value share and key look-back against the training step,
    beside the recall."""
    import plotly.graph_objects as go

    out = []
    for pr in probes:
        fig = go.Figure()
        for metric, dash in (("recall_value_share", "solid"), ("recall_key_lookback", "dot")):
            heads = sorted({(r.scope["layer"], r.scope["head"]) for r in select(pr.rows, metric)})
            for layer, head in heads:
                rs = sorted(select(pr.rows, metric, layer=layer, head=head), key=lambda r: r.scope["step"])
                fig.add_scatter(x=[r.scope["step"] for r in rs], y=[r.value for r in rs], mode="lines+markers",
                                name=f"{metric.removeprefix('recall_').replace('_', ' ')} L{layer}H{head}",
                                line=dict(dash=dash), error_y=error_bars(rs))
        recall = sorted(select(pr.rows, "recall_accuracy"), key=lambda r: r.scope["step"])
        fig.add_scatter(x=[r.scope["step"] for r in recall], y=[r.value for r in recall], mode="lines+markers",
                        name="recall accuracy", line=dict(color="black", width=3))
        N = recall[-1].scope["n_pairs"]
        fig.add_hline(y=1 / N, line=dict(dash="dot", color="grey"), annotation_text=f"1/N = {1 / N:.3g}")
        axis_titles(fig, "training step", "attention share / recall", yaxis=dict(range=[0, 1.02]))
        where = tunnel_subject(pr.params_object())
        out.append(Figure(f"recall-circuit-{pr.name}", f"The recall circuit of {where}", layout(
            fig, "Value share (solid) and key look-back (dotted) per head over training, beside the recall"),
            "Bootstrap 95% intervals over sequences. A binding head's value share rises toward 1; at 1/N it spreads "
            "evenly over the stored values (the stored-values shortcut).", subject=where))
    return out


def plan(ctx, p: RecallCircuitParams) -> list:
    n = len(p.checkpoints())
    return tunnel_plan(p, f"attention patterns and recall of {p.n} held-out sequences at {n} "
                       f"checkpoint{'s' * (n > 1)} (a small model: seconds each)")


def ledger(probes) -> list:
    """Per probe: a head of the final model binds (its value share's interval above ``BINDS``)."""
    out = []
    for pr in probes:
        r, N = claim_row(pr.rows)
        out.append(Claim("recall-head-binds", f"A head binds: the queried key's value takes most of its attention on "
                         f"the stored values (value share above {BINDS}; 1/N = {1 / N:.3g} without binding)",
                         interval_side(r, "above", BINDS), f"{fmt(r)} at L{r.scope['layer']}H{r.scope['head']}, "
                         f"step {r.scope['step']}", subject=tunnel_subject(pr.params_object()),
                         section=f"fig-recall-circuit-{pr.name}"))
    return out


KIND = register(Kind("recall_circuit", RecallCircuitParams, run, summary, figures, plan, doc=__doc__, ledger=ledger,
                     subject=tunnel_subject))
