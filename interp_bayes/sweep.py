"""The sweep runner: one model, a list of probes, each a cached stage in a run folder.

A run folder is ``<out>/<model-slug>/<config digest>``, so rerunning the same config lands in the same folder and
skips every probe whose ``metrics.json`` exists; activations collected for one probe are cached under ``acts/`` and
shared with the others. The model is loaded only when something must be computed.

A probe is a YAML recipe (``probes/*.yaml`` or a path): ``kind`` picks the analysis, the other keys are its
parameters. Kinds: ``manifold``, ``keys``, ``focusing``, ``icl``, ``axis``, ``interventions``, ``windtunnel``.
"""

from __future__ import annotations

import html
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import yaml

from .axis import fit_entropy_axis
from .calibration import compare_to_bayes
from .config import ConfigError, SweepConfig
from .extract import Activations, collect
from .geometry import (attention_focusing, correlations, key_orthogonality, key_orthogonality_null,
                       manifold_report, resample_shares)
from .models import load_model, model_info
from .prompts import load_prompts, package_data_dir, stratified_sample
from .store import atomic_write_text, environment, read_json, write_json
from .tasks.icl import CONDITIONS, SULATask

PROBES_DIR = package_data_dir("probes")


@dataclass
class Probe:
    """A recipe: a name, the kind of analysis and its parameters."""

    name: str
    kind: str
    params: dict = field(default_factory=dict)


def builtin_probes() -> list[str]:
    return sorted(p.stem for p in PROBES_DIR.glob("*.yaml"))


def load_probe(name_or_path: str | Path) -> Probe:
    """A built-in probe by name or a YAML file with ``kind:`` and parameters."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROBES_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        raise ConfigError(f"No probe '{name_or_path}'; built-in probes: {', '.join(builtin_probes())} "
                          "(or pass a YAML path).")
    data = yaml.safe_load(path.read_text()) or {}
    kind = data.pop("kind", None)
    if kind not in PROBE_KINDS:
        raise ConfigError(f"Probe {path} has kind {kind!r}; known kinds: {', '.join(PROBE_KINDS)}.")
    return Probe(name=data.pop("name", path.stem), kind=kind, params=data)


@dataclass
class Run:
    """A run folder and what was computed in it."""

    folder: Path
    config: SweepConfig
    metrics: dict = field(default_factory=dict)  # probe name -> its metrics
    computed: list[str] = field(default_factory=list)  # probes computed by this call (the others were cached)

    def report(self):
        """Build (or rebuild) ``report.html`` from the run folder; the result shows inline in Jupyter."""
        from .report.html import Report

        return Report.build(self.folder)

    def figure(self):
        """PC shares of every value set against their nulls (plotly), from the run folder."""
        from .report.figures import RunData, pc_shares

        return pc_shares(RunData.load(self.folder))

    def _repr_html_(self) -> str:
        from .report.tables import summary_rows

        rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>"
                       for k, v in summary_rows(self.metrics))
        return (f"<b>Run</b> <code>{html.escape(str(self.folder))}</code><table><tr><th>measure</th>"
                f"<th>{html.escape(self.config.model)}</th></tr>{rows}</table>")


def run_folder(config: SweepConfig) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(config.model).name if Path(config.model).exists() else config.model)
    return Path(config.out) / slug / config.digest()


class Context:
    """What a probe sees: the config, the model (loaded on first use) and cached activation sets."""

    def __init__(self, folder: Path, config: SweepConfig, say: Callable[..., None]) -> None:
        self.folder, self.config, self.say = folder, config, say
        self.probe_folder = folder  # the running probe's own folder, set by run_sweep
        self._model = None

    @property
    def model(self):
        if self._model is None:
            t = time.perf_counter()
            self._model = load_model(self.config.model, dtype=self.config.dtype, device=self.config.device,
                                     revision=self.config.revision)
            self.say(f"loaded {self.config.model} in {time.perf_counter() - t:.1f}s")
        return self._model

    def layers(self, spec) -> list[int]:
        """Layer list from a probe parameter: explicit ints, ``"spread5"`` (five evenly spaced from a third of the
        depth to the last layer) or ``"middle"`` (the spread5 layer nearest half the depth)."""
        if spec in ("spread5", "middle"):
            n = self.n_layers()
            spread = sorted({int(round(x)) for x in np.linspace(n / 3, n - 1, 5)})
            return spread if spec == "spread5" else [min(spread, key=lambda x: abs(x - n / 2))]
        return list(spec if spec is not None else self.config.layers)

    def n_layers(self) -> int:
        meta = self.folder / "model.json"
        if not meta.exists():
            write_json(meta, dict(model_info(self.model).to_dict(), n_layers=self.model.cfg.n_layers))
        return read_json(meta)["n_layers"]

    def activations(self, key: str, prompts: Callable[[], list], model=None, **collect_kw) -> Activations:
        """The activation set ``key`` from ``acts/<key>``, collected (and saved) on first use, from the sweep's
        model or the given one."""
        path = self.folder / "acts" / key
        if (path / "activations.json").exists():
            return Activations.load(path)
        self.say(f"collecting {key}")
        acts = collect(model or self.model, prompts(), progress=not self.config.quiet,
                       batch_size=self.config.batch_size, **collect_kw)
        acts.save(path)
        return acts


def _pool(ctx: Context, prompts: str):
    """(final-token values at the configured layers for a whole prompt pool, the pool as a Dataset)."""
    ds = load_prompts(prompts)
    layers = sorted(set(ctx.layers(None)))
    acts = ctx.activations(f"pool-{Path(prompts).stem}", lambda: list(ds["text"]), layers=layers,
                           readings=("v",))
    return acts, ds


def manifold_probe(ctx: Context, p: dict) -> dict:
    """Stratified prompt set (per_bin per entropy quantile, optionally one domain) -> value-manifold report, with
    an interval over ``n_resample`` fresh stratified draws from the same pool beside the bootstrap."""
    acts, ds = _pool(ctx, p.get("prompts", ctx.config.prompts))
    domain = p.get("domain")
    pool_idx = np.arange(len(acts)) if domain is None else np.flatnonzero(np.array(ds["domain"]) == domain)
    if len(pool_idx) == 0:
        raise ConfigError(f"No prompts of domain {p['domain']!r} in {p.get('prompts', 'pool')}.")
    def draw(seed: int) -> np.ndarray:
        return pool_idx[stratified_sample(acts.entropy[pool_idx].numpy(), per_bin=p.get("per_bin", 15),
                                          n_bins=p.get("n_bins", 5), seed=seed)]

    chosen = draw(ctx.config.seed)
    redraws = [draw(ctx.config.seed + 1 + r) for r in range(p.get("n_resample", 200))]
    out = dict(domain=p.get("domain"), indices=chosen.tolist(), entropy=acts.entropy[chosen].tolist(),
               pool_size=int(len(pool_idx)), layers={})
    for layer in acts.layers:
        rep = manifold_report(acts.values(layer)[chosen], acts.entropy[chosen], n_boot=p.get("n_boot", 1000),
                              n_null=p.get("n_null", 200), seed=ctx.config.seed)
        rep["resample"] = resample_shares(acts.values(layer), redraws)
        out["layers"][str(layer)] = rep
    return out


def keys_probe(ctx: Context, p: dict) -> dict:
    """Key orthogonality per layer and KV head, with the Gaussian null of the same shape."""
    model = ctx.model
    scores = key_orthogonality(model)  # [layers, kv heads]
    return dict(per_head=scores.tolist(), layer_mean=scores.mean(axis=1).tolist(),
                band=[float(np.quantile(scores, 0.1)), float(np.quantile(scores, 0.9))],
                null=key_orthogonality_null(model.cfg.d_model, model.cfg.d_head, n_draws=p.get("n_null", 200),
                                            seed=ctx.config.seed))


def focusing_probe(ctx: Context, p: dict) -> dict:
    """Attention entropy of the final query per layer on a stratified mixed prompt set; reduction first -> last."""
    name = p.get("prompts", ctx.config.prompts)
    pool, ds = _pool(ctx, name)
    chosen = stratified_sample(pool.entropy.numpy(), per_bin=p.get("per_bin", 15), seed=ctx.config.seed)
    n = ctx.n_layers()
    acts = ctx.activations(f"focusing-{Path(p.get('prompts', 'pool')).stem}", lambda: [ds["text"][i] for i in chosen],
                           layers=list(range(n)), readings=("attn_entropy",))
    return attention_focusing(acts.readings["attn_entropy"], n_boot=p.get("n_boot", 1000), seed=ctx.config.seed)


def sula_task(ctx: Context, p: dict) -> tuple[SULATask, dict[str, list[int]]]:
    """The SULA task with label words that are single tokens for this model, chosen once per run and stored, and
    the label token ids per label pair (``main``, ``remap``)."""
    path = ctx.folder / "sula_task.json"
    if not path.exists():
        words = SULATask.for_tokenizer(ctx.model.tokenizer)
        write_json(path, dict(labels=words.labels, remap_labels=words.remap_labels,
                              ids={c: words.label_token_ids(ctx.model.tokenizer, c) for c in ("main", "remap")}))
    saved = read_json(path)
    task = SULATask(labels=tuple(saved["labels"]), remap_labels=tuple(saved["remap_labels"]), per_k=p.get("per_k", 50))
    return task, saved["ids"]


def _sula(ctx: Context, p: dict, condition: str) -> tuple[Activations, dict]:
    task, ids = sula_task(ctx, p)
    cols = task.generate(condition, seed=p.get("seed", 42))
    layers = sorted(set(ctx.layers(p.get("layers", "spread5")) + ctx.layers(None)))
    key = f"sula-{condition}-k{task.per_k}-s{p.get('seed', 42)}"
    acts = ctx.activations(key, lambda: cols["text"], layers=layers, readings=("v",),
                           label_tokens=ids["remap" if condition == "remap" else "main"])
    return acts, cols


def sula_behaviour(acts: Activations, cols: dict) -> dict:
    """Model vs Bayes on one SULA prompt set: per k and for k >= 1 (k = 0 is a formatting confound)."""
    cmp = compare_to_bayes(acts.entropy, cols["bayes_entropy"], groups=cols["k"],
                           predicted=acts.label_logprobs.argmax(-1).numpy(), latent=cols["latent"])
    return dict(per_k={str(k): b for k, b in cmp["per_group"].items()}, k_ge_1=cmp["k_ge_1"], overall=cmp["all"])


def icl_probe(ctx: Context, p: dict) -> dict:
    """SULA in-context task: calibration against the exact posterior per condition, and the value geometry
    (PC1 vs Bayes and model entropy) of the main condition at the last layer, for all k and for k >= 1."""
    out: dict = dict(conditions={})
    for condition in p.get("conditions", list(CONDITIONS)):
        acts, cols = _sula(ctx, p, condition)
        out["conditions"][condition] = sula_behaviour(acts, cols)
        if condition == "main":
            k = np.array(cols["k"])
            v = acts.values(-1)
            bayes = np.array(cols["bayes_entropy"])
            out["geometry_all_k"] = manifold_report(v, acts.entropy, bayes_entropy=bayes, n_boot=p.get("n_boot", 1000),
                                                    n_null=p.get("n_null", 200), seed=ctx.config.seed)
            sel = k >= 1
            out["geometry_k_ge_1"] = manifold_report(v[torch.from_numpy(sel)], acts.entropy[torch.from_numpy(sel)],
                                                     bayes_entropy=bayes[sel], n_boot=p.get("n_boot", 1000),
                                                     n_null=p.get("n_null", 200), seed=ctx.config.seed)
            out["corr_k_pc1"] = correlations(k, out["geometry_all_k"]["pc1_score"])
    return out


def axis_probe(ctx: Context, p: dict) -> dict:
    """Entropy axes (PC1 and ridge) at the probe's layers on the SULA main set: in-sample vs cross-fitted held-out
    correlation with model entropy, saved under ``axes/``."""
    acts, cols = _sula(ctx, p, "main")
    out = {}
    for layer in acts.layers:
        for method in p.get("methods", ["pc1", "ridge"]):
            axis = fit_entropy_axis(acts, layer, method, folds=p.get("folds", 5), seed=ctx.config.seed)
            axis.save(ctx.folder / "axes" / f"{method}-L{layer}")
            bayes = correlations(axis.project(acts.values(layer)), cols["bayes_entropy"])
            out[f"{method}-L{layer}"] = dict(layer=layer, method=method, sigma=axis.sigma, in_sample=axis.in_sample,
                                             held_out=axis.held_out, projection_vs_bayes=bayes)
    return out


def split_by_k(k: list[int], seed: int) -> tuple[list[int], list[int]]:
    """Two halves of the prompt indices, each holding half of every k (the fit / evaluation split)."""
    rng = np.random.default_rng(seed)
    fit, ev = [], []
    k = np.asarray(k)
    for kk in sorted(set(k.tolist())):
        idx = rng.permutation(np.flatnonzero(k == kk))
        fit += idx[: len(idx) // 2].tolist()
        ev += idx[len(idx) // 2:].tolist()
    return sorted(fit), sorted(ev)


def intervention_protocol(ctx: Context, p: dict, model, prompts: list, acts: Activations, cols: dict, *,
                          label_tokens: list[int], layer_sets: list[list[int]], fit_idx: list[int],
                          eval_idx: list[int]) -> dict:
    """Fit an entropy axis per layer on ``fit_idx``, run every edit of ``p`` on the ``eval_idx`` prompts against
    the control axes, write ``rows.json`` into the probe's folder, and return the summary."""
    from .interventions import run_interventions, summarize

    layers = sorted({x for s in layer_sets for x in s})
    axes = {layer: fit_entropy_axis(acts, layer, p.get("method", "pc1"), subset=fit_idx, folds=0,
                                    seed=ctx.config.seed) for layer in layers}
    task = {key: [cols[key][i] for i in eval_idx] for key in ("k", "latent", "bayes_entropy")}
    t = time.perf_counter()
    res = run_interventions(model, [prompts[i] for i in eval_idx], axes,
                            {layer: acts.values(layer)[fit_idx] for layer in layers}, task,
                            label_tokens=label_tokens, layer_sets=layer_sets,
                            ops=p.get("ops", ["cut", "only", "shift+", "shift-"]),
                            n_isotropic=p.get("n_isotropic", 20), n_matched=p.get("n_matched", 20),
                            n_pcs=p.get("n_pcs", 3), seed=ctx.config.seed, batch_size=ctx.config.batch_size,
                            progress=not ctx.config.quiet)
    write_json(ctx.probe_folder / "rows.json", res.rows)
    return dict(method=p.get("method", "pc1"), layer_sets=layer_sets, n_eval=len(eval_idx), n_fit=len(fit_idx),
                baseline={k: v for k, v in res.baseline.items() if k != "entropy"},
                summary=summarize(res, task, seed=ctx.config.seed), n_forward_prompts=res.n_forward_prompts,
                forward_seconds=time.perf_counter() - t,
                axis_sigma={str(layer): a.sigma for layer, a in axes.items()})


def interventions_probe(ctx: Context, p: dict) -> dict:
    """Paper III's causal test on SULA: cut / only / +-1 sigma shift of the entropy axis at single layers and a
    multi-layer set, against isotropic, variance-matched and PC control axes. The axes are fitted on one half of
    the prompts (half of every k) and the edits evaluated on the other half (``fit: in_sample`` fits on the
    evaluation half itself, as the paper did)."""
    acts, cols = _sula(ctx, p, "main")
    fit_idx, eval_idx = split_by_k(cols["k"], ctx.config.seed)
    if p.get("fit", "cross") == "in_sample":
        fit_idx = eval_idx
    n = ctx.n_layers()
    layer_sets = [ctx.layers(s) if isinstance(s, str) else [(int(x) + n) % n for x in s] for s in p["layer_sets"]]
    _, ids = sula_task(ctx, p)
    return dict(fit=p.get("fit", "cross"),
                **intervention_protocol(ctx, p, ctx.model, cols["text"], acts, cols, label_tokens=ids["main"],
                                        layer_sets=layer_sets, fit_idx=fit_idx, eval_idx=eval_idx))


WINDTUNNELS_DIR = Path(__file__).resolve().parent / "windtunnel" / "checkpoints"


def windtunnel_prompts(task, n_sequences: int, seed: int) -> tuple[list[list[int]], dict]:
    """One prompt per (sequence, query position): the prefix ending at the query, so the final token is the one
    whose next-token belief the exact posterior describes. Returns token ids and task columns (k = query number,
    latent = the realised hypothesis, bayes_entropy in bits)."""
    from .tasks.base import entropy_bits as posterior_entropy

    batch = task.sample(n_sequences, seed=seed)
    h = posterior_entropy(batch.posterior.double())  # [n, Q]
    prompts, cols = [], dict(k=[], latent=[], bayes_entropy=[])
    for i in range(n_sequences):
        for q, pos in enumerate(batch.query_pos.tolist()):
            prompts.append(batch.input_ids[i, : pos + 1].tolist())
            cols["k"].append(q + 1)
            cols["latent"].append(int(batch.labels[i, q]))
            cols["bayes_entropy"].append(float(h[i, q]))
    return prompts, cols


def windtunnel_probe(ctx: Context, p: dict) -> dict:
    """The same analyses on a wind-tunnel transformer, where the posterior is exact: calibration, the value
    manifold against Bayes entropy, cross-fitted entropy axes, keys, attention focusing and the intervention
    protocol (axes fitted on half of the prompts of every query position, edits evaluated on the other half)."""
    from .windtunnel.configs import TrainConfig, make_task

    name = p.get("checkpoint", "bijection-cpu")
    folder = WINDTUNNELS_DIR / name if (WINDTUNNELS_DIR / name).is_dir() else Path(name)
    model = load_model(folder)
    task = make_task(TrainConfig.from_dict(read_json(folder / "windtunnel.json")["config"]))
    prompts, cols = windtunnel_prompts(task, p.get("n_sequences", 40), p.get("seed", 2024))
    n = model.cfg.n_layers
    acts = ctx.activations(f"windtunnel-{Path(name).name}", lambda: prompts, model=model, layers=list(range(n)),
                           readings=("v", "attn_entropy"), label_tokens=task.hypothesis_ids)
    bayes = np.array(cols["bayes_entropy"])
    h_model = acts.entropy.double().numpy()
    fit_idx, eval_idx = split_by_k(cols["k"], ctx.config.seed)
    interventions = intervention_protocol(
        ctx, p, model, prompts, acts, cols, label_tokens=task.hypothesis_ids, fit_idx=fit_idx, eval_idx=eval_idx,
        layer_sets=[[(int(x) + n) % n for x in s] for s in p.get("layer_sets", [[-1]])])
    axis_fits = {}
    for layer in range(1, n):  # layer 0's final-token value depends on the final token alone
        for target, y in (("model", None), ("bayes", bayes)):
            a = fit_entropy_axis(acts, layer, "pc1", folds=p.get("folds", 5), entropy=y, seed=ctx.config.seed)
            axis_fits[f"pc1-L{layer}-{target}"] = dict(layer=layer, method="pc1", target=target,
                                                       in_sample=a.in_sample, held_out=a.held_out)
    k = np.array(cols["k"])
    return dict(
        checkpoint=str(name), task=task.name, n_prompts=len(prompts), model=model_info(model).to_dict(),
        calibration=dict(mae=float(np.abs(h_model - bayes).mean()),
                         per_k={str(kk): float(np.abs(h_model - bayes)[k == kk].mean()) for kk in sorted(set(k))}),
        manifold=manifold_report(acts.values(-1), acts.entropy, bayes_entropy=bayes, n_boot=p.get("n_boot", 1000),
                                 n_null=p.get("n_null", 200), seed=ctx.config.seed),
        axis=axis_fits, keys=dict(layer_mean=key_orthogonality(model).mean(axis=1).tolist(),
                                  null=key_orthogonality_null(model.cfg.d_model, model.cfg.d_head,
                                                              seed=ctx.config.seed)),
        focusing=attention_focusing(acts.readings["attn_entropy"], n_boot=p.get("n_boot", 1000),
                                    seed=ctx.config.seed),
        interventions=interventions,
    )


PROBE_KINDS: dict[str, Callable[[Context, dict], dict]] = dict(
    manifold=manifold_probe, keys=keys_probe, focusing=focusing_probe, icl=icl_probe, axis=axis_probe,
    interventions=interventions_probe, windtunnel=windtunnel_probe)


def run_sweep(config: SweepConfig, model=None) -> Run:
    """Run (or resume) every probe of ``config`` on its model; returns the run with its metrics.

    model: an already loaded bridge for ``config.model`` (saves a second load in a notebook).
    """
    probes = [load_probe(name) for name in (config.probes or builtin_probes())]
    folder = run_folder(config)
    folder.mkdir(parents=True, exist_ok=True)
    run = Run(folder, config)
    say = (lambda *_: None) if config.quiet else print
    atomic_write_text(folder / "config.yaml", config.to_yaml())
    if not (folder / "env.json").exists():
        write_json(folder / "env.json", environment(config.seed))
    if config.threads:
        torch.set_num_threads(config.threads)
    for stale in folder.rglob(".*.*"):  # temp files of atomic writes a killed run left behind
        if stale.is_file():
            stale.unlink()
    ctx = Context(folder, config, say)
    ctx._model = model
    for probe in probes:
        path = folder / "probes" / probe.name / "metrics.json"
        if path.exists():
            cached = read_json(path)
            if cached["_probe"]["kind"] == probe.kind and cached["_probe"]["params"] == probe.params:
                say(f"[cached] {probe.name}")
                run.metrics[probe.name] = cached
                continue
        torch.manual_seed(config.seed)
        t = time.perf_counter()
        ctx.probe_folder = path.parent
        metrics = PROBE_KINDS[probe.kind](ctx, probe.params)
        metrics["_probe"] = dict(kind=probe.kind, params=probe.params, seconds=time.perf_counter() - t)
        write_json(path, metrics)
        run.metrics[probe.name] = metrics
        run.computed.append(probe.name)
        say(f"[done] {probe.name} in {time.perf_counter() - t:.1f}s")
    write_json(folder / "metrics.json", run.metrics)
    return run
