"""The rival to the value axis (Stolfo et al. 2024): entropy neurons, last-layer MLP neurons that write into the
unembedding's effective null space and change entropy through the final norm's scale. Scores of every neuron,
mean ablations of the top candidates beside random neurons (total, direct with the norm frozen, norm-mediated),
token-frequency neurons, the value axis's overlap with the null space against random value directions, the
final-norm scale's correlation with entropy (raw and deconfounded), and optionally the two mechanisms ablated side by
side on the in-context task (docs/rivals.md)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..results import Row, find, select
from . import register
from .base import Figure, Kind, Line, Params, Result
from .common import SULA_LAYERS, deconfounded_text, pool, sula, sula_task


@dataclass(frozen=True)
class EntropyNeuronsParams(Params):
    prompts: str | dict | None = None  # prompts the neurons are ablated on (None: the sweep's pool)
    n_prompts: int = 96  # a seeded sample of them
    layer: int = -1  # the MLP layer searched
    top_n: int = 5  # candidates ablated one by one
    n_random: int = 10  # random neurons of the same layer, ablated as the control
    n_boot: int = 1000
    frequency_top_n: int = 10  # token-frequency neurons listed
    n_random_directions: int = 200  # random value directions of the null-space overlap null
    per_k: int = 50  # the SULA prompts of the axis and of the scale-entropy correlation
    seed: int = 42
    covariates: tuple[str, ...] = ("length", "k", "log_k")
    n_perm: int = 1000
    compare: bool = False  # also ablate both mechanisms side by side on SULA (slow: minutes on SmolLM2)
    n_controls: int = 5  # control draws of that comparison


def run(ctx, p: EntropyNeuronsParams) -> Result:
    from ..axis import fit_entropy_axis
    from ..confounds import covariate_matrix, deconfounded_rows, nuisance_columns
    from ..mechanisms import axis_null_overlap, compare_mechanisms, scale_entropy
    from ..neurons import entropy_neurons, frequency_neurons, unembedding_null_space, unigram_counts

    model = ctx.model
    _, ds = pool(ctx, p.prompts)
    texts = list(ds["text"])
    chosen = sorted(np.random.default_rng(p.seed).choice(len(texts), min(p.n_prompts, len(texts)), replace=False))
    sample = [texts[i] for i in chosen]
    null = unembedding_null_space(model)
    report = entropy_neurons(model, sample, layer=p.layer, top_n=p.top_n, n_random=p.n_random, seed=p.seed,
                             batch_size=ctx.config.batch_size, n_boot=p.n_boot, progress=not ctx.config.quiet)
    rows = report.rows()
    freq = frequency_neurons(model, unigram_counts(model, texts), layer=p.layer, top_n=p.frequency_top_n,
                             seed=p.seed)
    rows += [Row("frequency_r", t["r"], "Pearson r", dict(layer=freq["layer"], neuron=t["neuron"], rank=rank),
                 null_low=freq["null_range"][0], null_high=freq["null_range"][1],
                 null=f"{freq['n_random']} random directions", note=f"ceiling r {freq['ceiling_r']:.3f}")
             for rank, t in enumerate(freq["top"], 1)]
    acts, cols = sula(ctx, "main", p.per_k, p.seed, SULA_LAYERS)
    axis = fit_entropy_axis(acts, -1, "pc1", folds=0, seed=ctx.config.seed)
    overlap = axis_null_overlap(model, axis.direction, axis.layer, null=null, n_random=p.n_random_directions,
                                seed=p.seed)
    rows.append(Row("axis_null_rho", overlap["rho"], "fraction of |r|^2", dict(layer=overlap["layer"]),
                    null_low=overlap["random_range"][0], null_high=overlap["random_range"][1],
                    null=f"{overlap['n_random']} random value directions",
                    note=f"percentile {overlap['percentile']:.3f}; chance {overlap['chance_rho']:.4f}"))
    _, ids = sula_task(ctx, p.per_k)
    k = np.array(cols["k"])
    cov = covariate_matrix({c: v for c, v in nuisance_columns([len(t) for t in acts.token_ids], k=k).items()
                            if c in p.covariates})
    scale = scale_entropy(model, cols["text"], label_tokens=ids["main"], covariates=cov, strata=k, n_perm=p.n_perm,
                          seed=p.seed, batch_size=ctx.config.batch_size, covariate_names=p.covariates,
                          strata_name="k")
    for target in ("entropy", "label_entropy"):
        rows += deconfounded_rows(scale[target]["deconfounded"], "corr_final_scale", dict(target=target,
                                                                                           prompts="sula"))
    data = dict(rho=report.scores.get("rho"), norm=report.scores.get("norm"),
                candidates=[c["neuron"] for c in report.candidates], null_dim=null.k)
    if p.compare:
        neurons = [c["neuron"] for c in report.candidates]
        task = dict(k=cols["k"], latent=cols["latent"], bayes_entropy=cols["bayes_entropy"])
        cmp = compare_mechanisms(model, cols["text"], neurons=neurons, axis=axis, neuron_layer=p.layer, task=task,
                                 label_tokens=ids["main"], n_controls=p.n_controls, seed=p.seed,
                                 batch_size=ctx.config.batch_size, progress=not ctx.config.quiet)
        rows += cmp.rows()
    return Result(rows, data)


def summary(rows: list[Row], p: EntropyNeuronsParams) -> list[Line]:
    out = []
    top = sorted(select(rows, "neuron_rho"), key=lambda r: r.scope["rank"])
    if top:
        chance = find(rows, "null_space_chance_rho")
        out.append(Line("entropy-neuron candidates: null-space fraction rho (rank: neuron rho)",
                        "; ".join(f"{r.scope['neuron']}: {r.value:.3f}" for r in top)
                        + f" (all neurons 2.5-97.5%: {top[0].null_low:.3f}-{top[0].null_high:.3f}; chance "
                          f"{chance.value:.3f})", top[0].verdict()))
    for key, label in (("ablation_total_entropy_candidates_mean", "total"),
                       ("ablation_mediated_entropy_candidates_mean", "norm-mediated")):
        r = find(rows, key)
        if r is not None:
            out.append(Line(f"entropy-neuron ablation, {label} effect on entropy (bits/token, mean of candidates)",
                            f"{r.value:+.4f} (random neurons {r.null_low:+.4f}, {r.null_high:+.4f})",
                            r.verdict().replace("null", "random neurons")))
    r = find(rows, "axis_null_rho")
    if r is not None:
        out.append(Line(f"value axis L{r.scope['layer']} in the unembedding's null space (rho)",
                        f"{r.value:.3f} (random value directions {r.null_low:.3f}-{r.null_high:.3f}; {r.note})",
                        r.verdict()))
    for target in ("entropy", "label_entropy"):
        text, claim = deconfounded_text(rows, "corr_final_scale", target=target, prompts="sula")
        if text:
            out.append(Line(f"final-norm scale vs {target.replace('_', ' ')} (SULA)", text, claim))
    for mechanism in ("entropy_neurons", "axis_cut"):
        r = find(rows, "d_entropy", mechanism=mechanism)
        if r is not None:
            out.append(Line(f"SULA: {mechanism.replace('_', ' ')} ablation, change in label entropy (bits)",
                            f"{r.value:+.4f} (controls {r.null_low:+.4f}, {r.null_high:+.4f})",
                            r.verdict().replace("null", "controls")))
    return out


def figures(probes) -> list[Figure]:
    import plotly.graph_objects as go

    from ..report.figures import COLOURS, layout

    out = []
    for p in probes:
        d = p.data
        if not d.get("rho"):
            continue
        rho, norm = np.asarray(d["rho"]), np.asarray(d["norm"])
        cand = set(d["candidates"])
        rest = [i for i in range(len(rho)) if i not in cand]
        fig = go.Figure([go.Scatter(x=norm[rest], y=rho[rest], mode="markers", name="neurons",
                                    marker=dict(size=4, color="rgba(31,78,121,0.35)"),
                                    hovertemplate="neuron %{text}<extra></extra>", text=[str(i) for i in rest]),
                         go.Scatter(x=norm[sorted(cand)], y=rho[sorted(cand)], mode="markers", name="candidates",
                                    marker=dict(size=11, color=COLOURS["true"], symbol="diamond"),
                                    text=[str(i) for i in sorted(cand)],
                                    hovertemplate="neuron %{text}<extra></extra>")])
        fig.update_xaxes(title_text="|w_out|")
        fig.update_yaxes(title_text="rho: fraction of |w_out|² in the unembedding's null space")
        out.append(Figure(f"entropy-neurons-{p.name}", "Entropy neurons", layout(
            fig, f"Last-layer neurons: output norm against null-space fraction (null space of {d['null_dim']} "
                 "dimensions)"),
            "Entropy neurons sit top right: large output norm mostly in the null space, so they change entropy "
            "through the final norm rather than the logits' ranking."))
    return out


KIND = register(Kind("entropy_neurons", EntropyNeuronsParams, run, summary, figures, doc=__doc__))
