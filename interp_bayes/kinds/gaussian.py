"""Beliefs about a Gaussian (Sarfati et al. 2026, docs/gaussian.md). On the Gaussian in-context task (the sweep's
model, ``tunnel: null``; ``tasks.gaussian``): the calibration of the model's next-number distribution against
the exact Student-t predictive (KL, predictive mean and sd), where the exact posterior mean and spread are
decodable from the residual stream per layer (folds of whole sequences), and the geometry of the final-token
states: PCA dimension against Isomap's, beside a null of flat Gaussian clouds matched to the states' mean and
covariance per n (so clusters by n alone are not read as curvature; ``geometry_null: matched`` matches the whole
cloud instead). On the
Kalman tunnel (``tunnel: <kalman checkpoint>``) the same three on its exact Gaussian beliefs N(m_t, P_t)
(``windtunnel.kalman.kalman_readings``; a one-dimensional state)."""

from __future__ import annotations

# plotly is imported inside the functions that draw: a run that only computes rows does not load it
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from ..core.errors import ConfigError
from ..core.plugin import Claim, Figure, Kind, Line, PlanItem, Result
from ..core.registry import register
from ..core.results import Row, select
from .common import check_folds
from .windtunnel import TunnelParams, check_layers, load_windtunnel_task, tunnel_prefix, tunnel_subject
from ..analyses.gaussian import manifold_curvature, normal_calibration, predictive_calibration
from ..core.figures import axis_titles, layout
from ..core.layers import resolve_layers
from ..stats import ledger as L
from ..stats.probe import scalar_probes
from ..tasks.gaussian import GaussianTask, number_token_ids
from ..windtunnel.kalman import kalman_readings
from ..windtunnel.tunnels import tunnel_config


@dataclass(frozen=True)
class GaussianParams(TunnelParams):
    tunnel_tasks: ClassVar[tuple[str, ...]] = ("kalman",)
    tunnel: str | None = None  # a Kalman wind tunnel (name or folder); None: the sweep's model on the Gaussian task
    layers: tuple[int, ...] | str = "spread5"  # layers read (the residual stream after each block)
    n_sequences: int = 60  # sequences (Gaussian task: one prompt per prefix length in ns; Kalman: every step)
    ns: tuple[int, ...] = (1, 2, 3, 5, 8, 12, 16, 24)  # Gaussian task: prefix lengths (numbers shown)
    seed: int = 42  # the sequence draws
    folds: int = 5
    n_null: int = 1000  # permutations of the calibration and decoding nulls, at most (drawn until settled)
    n_boot: int = 1000
    n_neighbors: int = 10  # Isomap's kNN graph
    d_max: int = 6  # embedding dimensions scored
    # matched-Gaussian clouds of the geometry null, at most: drawn until the curvature gap is settled against them
    # (50 when clearly inside, about 550 when clearly beyond; each cloud is one Isomap fit)
    n_null_geometry: int = 1000
    # "matched": flat clouds with the states' covariance; "matched_per_n": drawn per n (per step on the Kalman
    # tunnel) with that stratum's mean and covariance, so clusters by n alone are not read as curvature
    geometry_null: Literal["matched", "matched_per_n"] = "matched_per_n"

    def checkpoints(self) -> dict:
        """A Kalman tunnel of a one-dimensional state (the beliefs this kind reads), refused otherwise."""
        folders = super().checkpoints()
        # KalmanTask's state_dim defaults to 2: a config that names none is not one-dimensional
        if folders and tunnel_config(folders["tunnel"]).get("task_kwargs", {}).get("state_dim") != 1:
            raise ConfigError(f"The gaussian kind reads one-dimensional Gaussian beliefs; {self.tunnel} is a Kalman "
                              "tunnel of a larger state; name kalman-cpu (or a folder trained with state_dim 1).")
        return folders

    def check(self, ctx, probe: str) -> None:
        check_folds(probe, self.folds, self.n_sequences, "sequences", "n_sequences")
        check_layers(ctx, probe, self.tunnel, dict(layers=self.layers))


def _task_data(ctx, p: GaussianParams) -> dict:
    """Readings per layer [N, d_model], groups, strata (n or step), the belief targets, and the calibration."""
    if p.tunnel is None:
        task = GaussianTask(ns=tuple(p.ns))
        cols = task.generate(p.n_sequences, seed=p.seed)
        ids = number_token_ids(ctx.tokenizer, task.low, task.high)
        layers = ctx.layers(p.layers)
        acts = ctx.activations("gaussian-resid", cols["text"], layers=layers, readings=("resid",), label_tokens=ids)
        groups, strata = np.asarray(cols["sequence"]), np.asarray(cols["n"])
        calib = predictive_calibration(acts.label_logprobs.numpy(), task.exact_predictive(cols["numbers"]),
                                       np.arange(task.low, task.high + 1), groups=groups, strata=strata,
                                       n_boot=p.n_boot, n_null=p.n_null, seed=ctx.config.seed)
        top_is_number = float(np.isin(acts.next_token.numpy(), ids).mean())
        targets = {"posterior mean": np.asarray(cols["posterior_mean"]),
                   "posterior log sigma": np.asarray(cols["posterior_log_sigma"])}
        readings = {layer: acts.reading("resid", layer).numpy() for layer in layers}
        extra = dict(rejected=cols["rejected"][0], top_is_number=top_is_number, n_prompts=len(cols["text"]))
        return dict(readings=readings, groups=groups, strata=strata, targets=targets, calibration=calib,
                    extra=extra)
    bridge, task = load_windtunnel_task(p.tunnel)
    layers = resolve_layers(p.layers, bridge.cfg.n_layers, "all")
    acts, cols = kalman_readings(bridge, task, p.n_sequences, seed=p.seed, layers=layers, readings=("resid",))
    groups, strata = cols["sequence"], cols["k"]
    exact_mean, model_mean = cols["bayes_mean"][:, 0], cols["model_mean"][:, 0]
    exact_sd, model_sd = np.exp(0.5 * cols["bayes_logdet"]), np.exp(0.5 * cols["model_logdet"])
    calib = normal_calibration(model_mean, model_sd, exact_mean, exact_sd, groups=groups, strata=strata,
                               n_boot=p.n_boot, n_null=p.n_null, seed=ctx.config.seed)
    targets = {"posterior mean": exact_mean, "posterior log sd": np.log(exact_sd)}
    readings = {layer: acts.reading("resid", layer).numpy() for layer in layers}
    return dict(readings=readings, groups=groups, strata=strata, targets=targets, calibration=calib,
                extra=dict(n_prompts=len(groups)))


GEOMETRY = ("pca_dim_90", "pca_dim_95", "participation_ratio", "rv_pca", "rv_isomap", "curvature_gap")


def run(ctx, p: GaussianParams) -> Result:
    data = _task_data(ctx, p)
    groups, strata = data["groups"], data["strata"]
    n_groups = int(len(np.unique(groups)))
    rows: list[Row] = []
    for level, res in data["calibration"].items():
        scope = dict(k=level)
        kl = res["kl_bits"]
        rows.append(Row("gaussian_kl_bits", kl["value"], "bits", scope, *kl["ci"], "bootstrap 95% (sequences)",
                        *kl["null"], "another prompt's prediction, same n", res["n"], test=kl["test"]))
        if "kl_reference_bits" in res:
            rows.append(Row("gaussian_kl_uniform_bits", res["kl_reference_bits"], "bits", scope, n=res["n"]))
        for name in ("mean", "sd"):
            m = res[name]
            rows.append(Row(f"gaussian_{name}_error", m["error"], "", scope, *m["error_ci"],
                            "bootstrap 95% (sequences)", n=res["n"], note=f"model {m['model']:.3f}, exact "
                            f"{m['exact']:.3f} (averages)"))
            rows.append(Row(f"gaussian_{name}_r", m["r"], "", scope, *m["r_ci"], "bootstrap 95% (sequences)",
                            *m["r_null"], "permuted within n", res["n"]))
    geometry = {}
    for layer, x in data["readings"].items():
        dec = scalar_probes(x, data["targets"], groups=groups, strata=strata, folds=p.folds, n_null=p.n_null,
                            seed=ctx.config.seed)
        for target, res in dec.items():
            for adjust, key in (("raw", "raw"), ("within n", "within")):
                r = res[key]
                rows.append(Row("gaussian_decoding_r2", r["r2_held_out"], "",
                                dict(target=target, reading="resid", layer=layer, adjust=adjust),
                                null_low=r["null"][0], null_high=r["null"][1], null="permuted target",
                                n=n_groups, test=r["test"]))
        geo = manifold_curvature(x, d_max=p.d_max, n_neighbors=p.n_neighbors, n_null=p.n_null_geometry,
                                 strata=strata if p.geometry_null == "matched_per_n" else None, seed=ctx.config.seed)
        geometry[str(layer)] = {k: geo[k] for k in ("rv_pca", "rv_isomap")}
        for name in GEOMETRY:
            rows.append(Row(f"gaussian_{name}", geo[name], "", dict(reading="resid", layer=layer),
                            null_low=geo["null"][name][0], null_high=geo["null"][name][1],
                            null=f"{geo['null_kind']} ({geo['n_null']} clouds)", n=geo["n"],
                            note=f"d = {geo['d']}; kNN graph in {geo['graph_components']} piece(s)"
                            if name in ("rv_pca", "rv_isomap", "curvature_gap") else None,
                            test=geo["test"] if name == "curvature_gap" else None))
    return Result(rows, dict(task=p.tunnel or "gaussian", geometry=geometry, **data["extra"]))


def _kl_word(kl: Row) -> str:
    """The KL's place against another prompt's prediction, as its sequential test decided it."""
    below = L.beyond_null(kl, "below")
    return "below null" if below == L.HOLDS else L.BORDERLINE if below == L.BORDERLINE else kl.verdict()


def summary(rows: list[Row], p: GaussianParams) -> list[Line]:
    out = []
    where = tunnel_prefix(p)
    kl = next(iter(select(rows, "gaussian_kl_bits", k="all")), None)
    if kl is not None:
        out.append(Line(f"{where}KL(exact predictive || model), bits", f"{kl.value:.3f} [{kl.low:.3f}, {kl.high:.3f}]"
                        f"; another prompt's prediction [{kl.null_low:.3f}, {kl.null_high:.3f}]",
                        _kl_word(kl)))
    for name in ("mean", "sd"):
        r = next(iter(select(rows, f"gaussian_{name}_r", k="all")), None)
        if r is not None:
            out.append(Line(f"{where}predictive {name}: r(model, exact)", f"{r.value:.3f} [{r.low:.3f}, {r.high:.3f}]",
                            r.verdict()))
    for target in dict.fromkeys(r.scope["target"] for r in select(rows, "gaussian_decoding_r2")):
        for adjust in ("raw", "within n"):
            rs = [r for r in select(rows, "gaussian_decoding_r2", target=target, adjust=adjust)
                  if np.isfinite(r.value)]
            if rs:
                best = max(rs, key=lambda r: r.value)
                out.append(Line(f"{where}decodable {target} ({adjust}): best held-out R²",
                                f"{best.value:.2f} (L{best.scope['layer']}; null up to {best.null_high:.2f})",
                                best.verdict()))
    gaps = select(rows, "gaussian_curvature_gap")
    if gaps:
        text = "; ".join(f"L{r.scope['layer']}: {r.value:.3f} (null [{r.null_low:.3f}, {r.null_high:.3f}])"
                         for r in gaps)
        above = sum(r.verdict() == "above null" for r in gaps)
        out.append(Line(f"{where}curvature gap rv_PCA - rv_Isomap at d = 2", text,
                        f"above its null at {above} of {len(gaps)} layers"))
    return out


def figures(probes) -> list[Figure]:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    out = []
    for p in probes:
        fig = make_subplots(rows=1, cols=2, subplot_titles=["decodable belief (held-out R²)",
                                                            "curvature gap rv_PCA - rv_Isomap (d = 2)"])
        for target in dict.fromkeys(r.scope["target"] for r in select(p.rows, "gaussian_decoding_r2")):
            for adjust, dash in (("raw", "solid"), ("within n", "dot")):
                rs = sorted(select(p.rows, "gaussian_decoding_r2", target=target, adjust=adjust),
                            key=lambda r: r.scope["layer"])
                fig.add_trace(go.Scatter(x=[r.scope["layer"] for r in rs], y=[r.value for r in rs],
                                         mode="lines+markers", line=dict(dash=dash), name=f"{target}, {adjust}"),
                              row=1, col=1)
        gaps = sorted(select(p.rows, "gaussian_curvature_gap"), key=lambda r: r.scope["layer"])
        x = [r.scope["layer"] for r in gaps]
        fig.add_trace(go.Scatter(x=x + x[::-1], y=[r.null_high for r in gaps] + [r.null_low for r in gaps[::-1]],
                                 fill="toself", fillcolor="rgba(150,150,150,0.25)", line=dict(width=0),
                                 name="matched Gaussian null (95%)"), row=1, col=2)
        fig.add_trace(go.Scatter(x=x, y=[r.value for r in gaps], mode="lines+markers", name="states"), row=1, col=2)
        axis_titles(fig, "layer", None)
        out.append(Figure(f"gaussian-{p.name}", "Beliefs about a Gaussian", layout(
            fig, f"Where the posterior is decodable, and whether its states are curved ({p.data.get('task')})"),
            "Left: held-out ridge R² of the exact posterior mean and log spread from the residual stream, raw and "
            "within n (numbers shown). Right: how much better Isomap keeps the states' geodesic distances in 2 "
            "dimensions than PCA keeps their Euclidean ones; above the grey band of flat Gaussian clouds matched to "
            "the states (per n by default), the manifold is curved."))
    return out


def plan(ctx, p: GaussianParams) -> list:
    """The Gaussian prompts' residual streams at the probe's layers (or a Kalman tunnel's steps, seconds), then
    ridge decoders and Isomap (arithmetic)."""
    if p.tunnel is not None:
        return [PlanItem("gaussian", f"Kalman tunnel {p.tunnel}: {p.n_sequences} sequences, residual stream at every "
                         "step (seconds), then the Isomap nulls (minutes)", None, p.n_sequences,
                         model=tunnel_subject(p))]
    cols = GaussianTask(ns=tuple(p.ns)).generate(p.n_sequences, seed=p.seed)
    return [ctx.plan_acts("gaussian", "gaussian-resid", cols["text"], layers=ctx.layers(p.layers),
                          readings=("resid",), label_tokens=number_token_ids(ctx.tokenizer), dims=ctx.site_dims())]


def family_claim(rows: list[Row]) -> tuple[str, Row | None, str]:
    """(verdict, the surviving row or None, evidence) of a claim tested at every layer: one decision over the
    layers (``ledger.family``: Holm over the layers' sequential tests, above their nulls). Survivors: the one with
    the largest value decides with its own verdict (``ledger.beyond_null``), named when that holds; none:
    "borderline" when some layer's draws reached their cap undecided, else "does not hold", with the largest
    value's numbers and no layer named."""
    if not any(r.test for r in rows):  # a run from before the layers' sequential tests
        return L.UNTESTABLE, None, "no sequential test per layer in this run (rerun it)"
    survive, undecided = L.family(rows)
    if survive:
        best = max(survive, key=lambda r: r.value)
        verdict = L.beyond_null(best)  # its own draws may still be open at the cap: borderline, no layer named
        return verdict, best if verdict == L.HOLDS else None, L.fmt(best)
    best = max(rows, key=lambda r: r.value)
    where = f"; largest at L{best.scope['layer']}: " if len(rows) > 1 else ": "
    return (L.BORDERLINE if undecided else L.FAILS), None, \
        f"no layer survives Holm over {len(rows)} layers{where}{L.fmt(best)}"


def ledger(probes) -> list:
    """Sarfati et al.'s claims on this toolkit's models: the posterior's mean and spread are decodable, and the
    belief states lie on a curved manifold (the curvature gap beyond its flat null), each one decision over the
    layers (``family_claim``), the layer named only when it survives."""
    out = []
    for p in probes:
        where = tunnel_subject(p.params_object())
        for target in dict.fromkeys(r.scope["target"] for r in select(p.rows, "gaussian_decoding_r2")):
            rs = [r for r in select(p.rows, "gaussian_decoding_r2", target=target, adjust="within n")
                  if np.isfinite(r.value)]
            if rs:
                verdict, best, evidence = family_claim(rs)
                at = f"L{best.scope['layer']}" if best is not None else "no layer survives"
                out.append(Claim(f"gaussian-{target.replace(' ', '-')}", f"The {target} is decodable beyond the "
                                 f"number of examples shown (held-out R², within n, {at})",
                                 verdict, evidence, subject=where, rival=True, section=f"fig-gaussian-{p.name}"))
        gaps = [r for r in select(p.rows, "gaussian_curvature_gap") if np.isfinite(r.value)]
        if gaps:
            verdict, best, evidence = family_claim(gaps)
            at = f"L{best.scope['layer']}" if best is not None else "no layer survives"
            out.append(Claim("gaussian-curved", "Belief states lie on a curved manifold (Isomap beats PCA beyond "
                             f"flat matched clouds, {at})", verdict, evidence, subject=where, rival=True,
                             section=f"fig-gaussian-{p.name}"))
    return out


KIND = register(Kind("gaussian", GaussianParams, run, summary, figures, plan, doc=__doc__, ledger=ledger,
                     subject=tunnel_subject))
