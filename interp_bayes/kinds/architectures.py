"""The architecture table (issue 27; Paper I v3's comparison): every committed wind-tunnel checkpoint of a discrete
tunnel (and any trained folder given) scored afresh against its tunnel's exact posterior at its training length:
KL to the exact posterior (bits), recall accuracy on associative recall, and the margin over the best window filter
(window KL minus model KL, positive when the model beats every window) with its paired bootstrap 95% interval over
sequences, beside Paper I v3's number where it gives one. The summary is the table, one line per architecture and
tunnel; a pair with no checkpoint says "not trained" and is never filled from elsewhere."""

from __future__ import annotations

# plotly is imported inside the functions that draw: a run that only computes rows does not load it
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import ConfigError
from ..core.plugin import Kind, Line, Params, PlanItem, Result
from ..core.registry import register
from ..core.results import Row, find, select
from ..stats.ledger import BORDERLINE
from ..stats.sequential import ACCEPT, REJECT
from ..windtunnel.configs import ARCHS  # the table's rows
from ..windtunnel.evaluate import evaluate_windtunnel
from ..windtunnel.table import task_entry
from ..windtunnel.tunnels import PACKAGED, open_tunnel, tunnel_config
from .common import figure_per_probe
from .windtunnel import DISCRETE_TASKS, tunnel_folder
from ..core.figures import axis_titles, error_bars

TUNNELS = ("bijection", "bijection-replacement", "hmm", "hmm-sticky", "recall")  # the table's columns
# Paper I v3 (issue 27): KL in bits for the bijection and the paper-family HMM, % correct for associative recall
PAPER = {
    ("transformer", "bijection"): "0.007", ("mamba", "bijection"): "0.010", ("lstm", "bijection"): "0.009",
    ("mlp", "bijection"): "1.85",
    ("transformer", "hmm"): "0.049", ("mamba", "hmm"): "0.024", ("lstm", "hmm"): "0.411", ("mlp", "hmm"): "≈ 0.40",
    ("transformer", "recall"): "100%", ("mamba", "recall"): "97.8%", ("lstm", "recall"): "0.5%",
}
SUBJECT = "architectures x tunnels"  # the report's section: many wind tunnels, none the sweep's model


@dataclass(frozen=True)
class ArchitecturesParams(Params):
    committed: bool = True  # score every committed checkpoint of a discrete tunnel (kalman has no window filter)
    folders: tuple[str, ...] = ()  # trained folders (`interp-bayes train`) scored after the committed ones
    n: int = field(default=2000, metadata={"least": 1})  # held-out sequences per checkpoint
    seed: int = 2024  # the held-out sequences and the bootstrap

    def checkpoints(self) -> dict:
        """Every folder scored, by name (a later folder of one architecture and tunnel takes the earlier one's
        summary line; both keep their rows); ConfigError when none is, or two share a name (the rows' scope)."""
        committed = [d for d in sorted(PACKAGED.iterdir()) if self.committed
                     and (tunnel_config(d) or {}).get("task") in DISCRETE_TASKS]
        folders = committed + [tunnel_folder(f, self.kind, DISCRETE_TASKS, param="folders") for f in self.folders]
        if not folders:
            raise ConfigError("The architectures kind has nothing to score: set committed: true or name trained "
                              "folders in folders:.")
        names = [f.name for f in folders]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"The architectures kind scores each checkpoint under its folder's name, and "
                              f"{', '.join(twice)} names two; rename one of the folders.")
        return {f.name: f for f in folders}


def tunnel_of(config) -> str:
    """The column a checkpoint belongs to, from its task and task options (a ``TrainConfig``)."""
    if config.task == "bijection":
        return "bijection-replacement" if config.task_kwargs.get("replacement") else "bijection"
    if config.task == "hmm":
        return "hmm-sticky" if config.task_kwargs.get("transitions") == "sticky" else "hmm"
    return config.task


def score_rows(folder: Path, n: int, seed: int) -> list[Row]:
    """One checkpoint's rows: a fresh evaluation of ``n`` held-out sequences at its training length, with the
    window filters beside it, and the training facts behind the number (parameters, steps, times)."""
    tunnel = open_tunnel(folder)
    task, config = tunnel.task, tunnel.config
    length = task_entry(task.name).lengths(task)[0]  # the first length: the one it was trained at
    m = evaluate_windtunnel(tunnel.model, task, n=n, lengths=[length], seed=seed, baselines=True)[length]
    vs = m["vs_best_window"]
    at = dict(checkpoint=folder.name, arch=config.arch, tunnel=tunnel_of(config), length=length)
    rows = [Row("kl_bits", m["kl_bits"], "bits", dict(at), n=n, note="KL(exact posterior || model)"),
            Row("margin_bits", vs["margin_bits"], "bits", dict(at, baseline=vs["best_window"]), *vs["margin_ci"],
                "paired bootstrap 95% over sequences", n=n, test=vs["test"],
                note="best window's KL minus the model's: positive when the model beats every window")]
    if "recall_accuracy" in m:
        rows.append(Row("recall_accuracy", m["recall_accuracy"], "share", dict(at), n=n,
                        note="queries whose top value is the stored one"))
    facts = (("n_params", tunnel.meta["n_params"], "parameters"), ("train_steps", tunnel.step, "steps"),
             ("planned_steps", config.steps, "steps"), ("train_wall_s", tunnel.meta.get("train_wall_s"), "s"),
             ("train_cpu_s", tunnel.meta.get("train_cpu_s"), "s"))
    return rows + [Row(metric, value, unit, dict(at), note=None if value is not None else "not recorded")
                   for metric, value, unit in facts]


def run(ctx, p: ArchitecturesParams) -> Result:
    return Result([r for folder in p.checkpoints().values() for r in score_rows(folder, p.n, p.seed)])


def subject(p: ArchitecturesParams) -> str:
    return SUBJECT


def beats(margin: Row) -> str:
    """The margin's decision against 0 (``windtunnel.discrete.paired_margin``), in words."""
    return {REJECT: "beats the best window", ACCEPT: "does not beat the best window"}.get(
        margin.test["decision"], BORDERLINE)


def cell(rows: list[Row], arch: str, tunnel: str) -> tuple[str, str]:
    """The table's cell for ``arch`` on ``tunnel`` (the last checkpoint of that pair) and its verdict."""
    paper = PAPER.get((arch, tunnel))
    paper = f"; paper {paper}" if paper else ""
    margins = select(rows, "margin_bits", arch=arch, tunnel=tunnel)
    if not margins:
        return f"not trained{paper}", ""
    margin = margins[-1]
    at = dict(checkpoint=margin.scope["checkpoint"])
    recall = find(rows, "recall_accuracy", **at)
    recall = f", recall {100 * recall.value:.1f}%" if recall is not None else ""
    steps, planned = find(rows, "train_steps", **at).value, find(rows, "planned_steps", **at).value
    stopped = f" (stopped at step {steps:,.0f} of {planned:,.0f})" if steps < planned else ""
    return (f"KL {find(rows, 'kl_bits', **at).value:.4g}{recall}; vs {margin.scope['baseline']} "
            f"{margin.value:+.4g} [{margin.low:+.4g}, {margin.high:+.4g}]{paper}{stopped}"), beats(margin)


def summary(rows: list[Row], p: ArchitecturesParams) -> list[Line]:
    return [Line(f"{arch} on {tunnel}", *cell(rows, arch, tunnel)) for arch in ARCHS for tunnel in TUNNELS]


@figure_per_probe("architectures", subject)
def figures(fig, pr, where):
    """Per probe: each checkpoint's margin over its best window filter with its interval, one trace per
    architecture across the tunnels."""
    for arch in ARCHS:
        rs = sorted(select(pr.rows, "margin_bits", arch=arch), key=lambda r: TUNNELS.index(r.scope["tunnel"]))
        if rs:
            fig.add_scatter(x=[r.scope["tunnel"] for r in rs], y=[r.value for r in rs], mode="markers", name=arch,
                            text=[r.scope["checkpoint"] for r in rs], error_y=error_bars(rs))
    fig.add_hline(y=0, line=dict(dash="dot", color="grey"))
    axis_titles(fig, "tunnel", "best window's KL minus the model's (bits)",
                xaxis=dict(type="category", categoryorder="array", categoryarray=list(TUNNELS)))
    return ("Architectures against the best window filter",
            "Margin over the best window filter, per architecture and tunnel",
            "Above 0: the model beats every window filter. Paired bootstrap 95% intervals over sequences; hover for "
            "the checkpoint.")


def plan(ctx, p: ArchitecturesParams) -> list:
    folders = p.checkpoints()
    return [PlanItem("architectures", f"{len(folders)} wind tunnels, each scored on {p.n} held-out sequences with "
                     "its window filters (small models: seconds each)", None, model=SUBJECT)]


KIND = register(Kind("architectures", ArchitecturesParams, run, summary, figures, plan, doc=__doc__,
                     subject=subject))
