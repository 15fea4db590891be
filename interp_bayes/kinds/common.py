"""What several probe kinds share: the prompt pool, the SULA task's prompt sets, the rows of a value-manifold
report, and the one figure per probe most kinds draw."""

from __future__ import annotations

# tasks.icl (torch) and the statistics (scipy) are imported inside functions: most kinds' modules import this one, and a
# kind's module is loaded to read its parameters, where no model runs
import functools
import json

import numpy as np

from ..core.errors import CacheError, ConfigError
from ..core.figures import layout
from ..core.plugin import Figure
from ..core.results import Row, find
from ..core.store import read_json, warn, write_json
from ..core.prompts import load_source, source_label

SULA_LAYERS = "spread5"  # the in-context probes collect five evenly spaced layers ending at the last


def pool(ctx, source):
    """(final-token values at the sweep's layers for a whole prompt source, the prompts as a Dataset)."""
    spec = source if source is not None else ctx.config.prompts
    ds = load_source(spec)
    acts = ctx.activations(f"pool-{source_label(spec)}", list(ds["text"]), layers=ctx.layers(None), readings=("v",))
    return acts.with_groups(np.arange(len(acts))), ds  # the prompts of a pool are its independent units


def sula_task(ctx, per_k: int):
    """The SULA task with label words that are single tokens for this model (chosen once per run folder and
    stored in ``sula_task.json``) and the label token ids per label pair (``main``, ``remap``)."""
    from ..tasks.icl import SULATask

    path = ctx.folder / "sula_task.json"
    words = SULATask.for_tokenizer(ctx.tokenizer)
    chosen = dict(labels=list(words.labels), remap_labels=list(words.remap_labels),
                  fixed_carriers=list(words.fixed_carriers),
                  ids={c: words.label_token_ids(ctx.tokenizer, c) for c in ("main", "remap")})
    try:
        saved = read_json(path) if path.exists() else None
    except CacheError as err:
        warn(f"{str(err).rstrip('.')}; choosing the label words again.")
        saved = None
    if saved is not None and saved != json.loads(json.dumps(chosen)):
        warn(f"{path} does not hold the label words this tokenizer gives; using the tokenizer's.")
        saved = None
    if saved is None:
        saved = chosen
        if not ctx.dry_run:  # a plan writes nothing
            write_json(path, saved)
    task = SULATask(labels=tuple(saved["labels"]), remap_labels=tuple(saved["remap_labels"]), per_k=per_k,
                    fixed_carriers=tuple(saved["fixed_carriers"]))
    return task, saved["ids"]


def sula_prompts(per_k: int) -> int:
    """How many prompts (each its own group) a SULA condition of ``per_k`` prompts per k holds."""
    from ..tasks.icl import SULATask

    return per_k * len(SULATask.ks)


def check_folds(probe: str, folds: int, n_groups: int, groups: str, fix: str) -> None:
    """Refuse, before anything is collected, more cross-fitting folds than independent groups (``groups``: what
    they are, e.g. "sequences"; ``fix``: the parameter that makes more of them)."""
    if folds > n_groups:
        raise ConfigError(f"Probe '{probe}' splits its {n_groups} {groups} into {folds} folds, and a fold needs at "
                          f"least one; use at most {n_groups} folds or raise {fix}.")


def sula_request(ctx, condition: str, per_k: int, seed: int, layers) -> dict:
    """The arguments of one SULA activation set (shared by the icl, axis and interventions kinds, so they collect
    it once): label, prompts, layers (the recipe's ``layers``, a layer spec), label tokens; and the task's columns."""
    task, ids = sula_task(ctx, per_k)
    cols = task.generate(condition, seed=seed)
    return dict(label=f"sula-{condition}", prompts=cols["text"], layers=ctx.layers(layers),
                label_tokens=ids["remap" if condition == "remap" else "main"], cols=cols)


def sula(ctx, condition: str, per_k: int, seed: int, layers):
    """(activations, task columns) of one SULA condition."""
    req = sula_request(ctx, condition, per_k, seed, layers)
    acts = ctx.activations(req["label"], req["prompts"], layers=req["layers"], readings=("v",),
                           label_tokens=req["label_tokens"])
    return acts.with_groups(sula_groups(req["cols"])), req["cols"]


def sula_groups(cols: dict) -> np.ndarray:
    """The unit of independence of SULA prompts: each prompt (its examples, carriers and query are drawn afresh
    for every prompt; no header is shared)."""
    return np.arange(len(cols["text"]))


def groups_of(acts, sel=None):
    """``acts.groups`` (None: independent prompts), restricted to the rows ``sel`` where given."""
    if acts.groups is None:
        return None
    return np.asarray(acts.groups) if sel is None else np.asarray(acts.groups)[sel]


def plan_sula(ctx, probe: str, conditions, per_k: int, seed: int, layers) -> list:
    """Dry-run lines of the SULA activation sets a probe needs."""
    out = []
    for condition in conditions:
        req = sula_request(ctx, condition, per_k, seed, layers)
        out.append(ctx.plan_acts(probe, req["label"], req["prompts"], layers=req["layers"],
                                 label_tokens=req["label_tokens"], dims=ctx.site_dims()))
    return out


def nuisance_matrix(lengths, k, names) -> tuple[np.ndarray, tuple[str, ...]]:
    """The covariate design of a probe's declared covariates (names among ``stats.confounds.nuisance_columns``'s: length,
    k, log_k; k enters as one indicator per value, which removes every function of k, length as a spline basis) and
    their names."""
    from ..stats.confounds import nuisance_columns, select_covariates

    return select_covariates(nuisance_columns(lengths, k=k), names), tuple(names)  # an unknown name is refused


def recipe_nuisances(p, lengths, k) -> tuple[np.ndarray, tuple[str, ...]]:
    """``nuisance_matrix`` of a recipe's ``covariates``."""
    return nuisance_matrix(lengths, k, p.covariates)


def deconfounded(x, y, columns: dict, covariates, strata, strata_name: str, *, n_perm: int, seed: int,
                 metric: str, scope: dict) -> list[Row]:
    """Rows of the raw, partial and within-stratum correlations of ``x`` with ``y`` (``confounds``), given the
    probe's declared covariates (names among ``columns``)."""
    from ..stats import deconfounded_correlation
    from ..stats.confounds import deconfounded_rows, select_covariates

    dec = deconfounded_correlation(x, y, select_covariates(columns, covariates), strata, covariate_names=covariates,
                                   strata_name=strata_name, n_perm=n_perm, seed=seed)
    return deconfounded_rows(dec, metric, scope)


def deconfounded_text(rows: list[Row], metric: str, **scope) -> tuple[str, str]:
    """'raw +0.79; partial +0.10 (null -0.12, +0.12); within ...' and the claim's verdict, from the rows."""
    parts, verdict = [], ""
    for kind in ("raw", "partial", "within"):
        r = find(rows, metric, deconfounded=kind, **scope)
        if r is None:
            return "", ""
        if r.value is None or np.isnan(r.value):
            parts.append(f"{kind} undefined (nothing varies within the confound)")
            continue
        parts.append(f"{kind} {r.value:+.2f}" + ("" if kind == "raw" else f" (null {r.null_low:+.2f}, "
                                                                            f"{r.null_high:+.2f})"))
        verdict = (r.note or "").rsplit("claim ", 1)[-1]
    return "; ".join(parts), verdict


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def manifold_rows(rep: dict, scope: dict, *, entropy_label: str = "entropy") -> list[Row]:
    """Tidy rows of a ``analyses.manifold.manifold_report`` (plus its ``resample`` interval when present).

    The shares carry their interval (over fresh prompt sets from the pool where the probe drew them, else the
    bootstrap) and the permuted null's range; the null means and the bootstrap mean (Paper III's Table 1 statistic,
    inflated by duplicated prompts) are rows of their own.
    """
    n, nulls = rep["n_prompts"], rep["nulls"]
    rows = []
    for which in ("pc1", "pc12"):
        if "resample" in rep:
            ci, kind, count = rep["resample"][f"{which}_ci"], "resampled 95%", rep["resample"]["n_resample"]
        else:
            ci, kind, count = rep["bootstrap"][f"{which}_ci"], "bootstrap 95%", rep["bootstrap"]["n_boot"]
        perm = nulls["permuted"]
        test = perm[f"{which}_test"]  # the share against the permuted null, drawn until settled
        rows.append(Row(f"{which}_share", rep[f"{which}_share"], "share", dict(scope), ci[0], ci[1], kind,
                        perm[f"{which}_range"][0], perm[f"{which}_range"][1], f"permuted ({test['draws']} draws)",
                        n, note=f"interval over {count} sets", test=test))
        boot = rep["bootstrap"]
        rows.append(Row(f"{which}_share_bootstrap_mean", boot[f"{which}_mean"], "share", dict(scope),
                        boot[f"{which}_ci"][0], boot[f"{which}_ci"][1], "bootstrap 95%", n=n))
        for null, d in nulls.items():
            rows.append(Row(f"{which}_share_null_mean", d[f"{which}_mean"], "share", dict(scope, null=null),
                            d[f"{which}_range"][0], d[f"{which}_range"][1], f"{null} null 95%", n=n))
    rows += [Row("participation_ratio", rep["participation_ratio"], "dims", dict(scope), n=n,
                 note=f"of {rep['dim']} dimensions"),
             Row("participation_ratio_top10", rep["participation_ratio_top10"], "dims", dict(scope), n=n),
             Row("dim", rep["dim"], "dims", dict(scope))]
    for key, target in (("pc1_vs_entropy", entropy_label), ("pc1_vs_bayes_entropy", "bayes entropy")):
        if key in rep:
            for stat in ("spearman", "pearson"):
                rows.append(Row(f"{stat}_pc1", rep[key][stat], "r" if stat == "pearson" else "rho",
                                dict(scope, target=target), n=n, note=rep[key].get("reason")))
    return rows


def share_text(rows: list[Row], which: str, **scope) -> tuple[str, str]:
    """'share (interval); bootstrap mean; null permuted / gaussian' and its verdict, from a manifold's rows."""
    obs = find(rows, f"{which}_share", **scope)
    boot = find(rows, f"{which}_share_bootstrap_mean", **scope)
    perm = find(rows, f"{which}_share_null_mean", null="permuted", **scope)
    gauss = find(rows, f"{which}_share_null_mean", null="gaussian", **scope)
    kind = (obs.interval or "").replace(" 95%", "")
    text = (f"{pct(obs.value)} ({kind} {100 * obs.low:.1f}, {100 * obs.high:.1f}); bootstrap mean {pct(boot.value)}; "
            f"null {pct(perm.value)} / {pct(gauss.value)}")
    return text, obs.verdict()


def last_layer(rows: list[Row], metric: str = "pc1_share") -> int | None:
    layers = [r.scope["layer"] for r in rows if r.metric == metric and "layer" in r.scope]
    return max(layers) if layers else None



def claims_from(probes, metric: str, claim) -> list:
    """The ledger entries of probes decided by one row each: ``claim(probe, row)`` -> Claim for every probe that
    has a ``metric`` row."""
    return [claim(p, row) for p in probes if (row := find(p.rows, metric)) is not None]


def figure_per_probe(stem: str, subject, **subplots):
    """Makes a kind's ``figures(probes)`` of ``draw(fig, probe, where)``, which draws one probe's rows into a fresh
    plotly figure (``subplots``: ``make_subplots``'s arguments; none: one panel) and returns its (title, heading,
    caption), or None where the probe has nothing to draw: one house-style figure per probe, id
    ``<stem>-<probe name>``, about ``where``, the probe's ``subject(params)``."""
    def decorate(draw):
        @functools.wraps(draw)
        def figures(probes) -> list[Figure]:
            import plotly.graph_objects as go  # heavy: only when a report is drawn
            from plotly.subplots import make_subplots

            out = []
            for pr in probes:
                where = subject(pr.params_object())
                fig = make_subplots(**subplots) if subplots else go.Figure()
                texts = draw(fig, pr, where)
                if texts is not None:
                    title, heading, caption = texts
                    out.append(Figure(f"{stem}-{pr.name}", title, layout(fig, heading), caption, subject=where))
            return out
        return figures
    return decorate
