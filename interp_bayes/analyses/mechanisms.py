"""Mechanism against mechanism: is the value-space entropy axis the mechanism, a readout of the final-norm (entropy
neuron) mechanism, or neither?

- ``axis_null_overlap``: the value axis u of layer L moved into the residual stream (shifting every value by u
  shifts each query head's attention output by its KV group's part of u, whatever the attention pattern, so the
  residual moves by r = sum_h u_g(h) W_O[h]) and rho = |V0^T r| / |r|, the fraction of its norm in the unembedding's
  null space (the entropy neurons' score, ``analyses.unembedding.NullSpace.rho``), beside random value directions
  mapped the same way. (A block that normalises its attention output, Gemma 2/3's ``post_attention_layernorm``, is not mapped
  through that norm.)
- ``scale_entropy``: the correlation of the final-norm scale (``ln_final.hook_scale``) at the final token with the
  entropy there, raw and with the nuisance covariates partialled out (within-stratum permutation null).
- ``compare_mechanisms``: the effect on entropy, on the KL from the unedited model and (SULA) on calibration against
  the exact posterior of (a) mean-ablating the entropy-neuron candidates together, beside random neuron sets of the
  same size, and (b) cutting the value axis, beside random axes.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from ..core.layers import layer_index
from ..core.progress import progress_bar
from ..core.results import Row
from ..model.collect import collect
from ..model.edits import AxisCut, intervene
from ..model.hooks import act_name
from ..stats.pca import correlations
from ..stats import as_float64, deconfounded_correlation, interval, percentile_of, sequential_test
from ..stats.info import entropy_of_log_probs, kl
from ..stats.sequential import BATCH
from .controls import isotropic_axes
from .interventions import calibration_measures
from .neurons import ablation_hook, final_norm_run
from .unembedding import NullSpace, unembedding_null_space


def value_axis_in_residual(model, direction, layer: int) -> np.ndarray:
    """[d_model] residual-stream image r = sum over query heads h of u_g(h) W_O[h] of a unit direction u in layer
    ``layer``'s value space (``n_kv_heads * d_head``, the space of ``hook_v`` and of ``EntropyAxis``)."""
    idx = layer_index(layer, model.cfg.n_layers)
    w_o = as_float64(model.blocks[idx].attn.W_O.detach())  # [n_heads, d_head, d_model]
    n_heads = w_o.shape[0]
    n_kv = model.cfg.n_key_value_heads or model.cfg.n_heads
    u = as_float64(getattr(direction, "direction", direction)).reshape(n_kv, -1)  # [n_kv, d_head]
    groups = np.arange(n_heads) // (n_heads // n_kv)  # query head -> its KV head (HF's repeat_kv order)
    return np.einsum("hd,hdm->m", u[groups], w_o)


def axis_null_overlap(model, direction, layer: int, *, null: NullSpace | None = None, n_random: int = 1000,
                      seed: int = 0) -> dict:
    """rho = |V0^T r| / |r| (the fraction of the residual image's norm in the null space) of the value axis, beside
    isotropic value directions orthogonal to it, mapped through W_O the same way: drawn in batches until rho's
    place among them is settled (``stats.sequential_test``, two-sided, ``n_random`` the cap; direction i is the
    same whatever the batches). ``test`` records the decision and ``n_random`` the directions drawn."""
    idx = layer_index(layer, model.cfg.n_layers)
    null = null or unembedding_null_space(model)
    u = as_float64(getattr(direction, "direction", direction))
    u = u / np.linalg.norm(u)
    rho = float(null.rho(value_axis_in_residual(model, u, idx)))
    drawn: list[float] = []

    def draw(b):
        randoms = isotropic_axes(u, b, layer=idx, seed=seed, start=len(drawn))
        drawn.extend(null.rho(value_axis_in_residual(model, d, idx)) for d in randoms)
        return drawn[-b:]

    test = sequential_test(draw, rho, cap=n_random, batch=min(BATCH, n_random))
    null_rho = np.asarray(drawn)
    return dict(layer=idx, rho=rho, random_mean=float(null_rho.mean()), random_range=interval(null_rho),
                percentile=percentile_of(rho, null_rho), n_random=len(drawn), chance_rho=null.chance,
                residual_norm=float(np.linalg.norm(value_axis_in_residual(model, u, idx))), test=test.as_dict())


def scale_entropy(model, prompts, *, label_tokens=None, covariates=None, strata=None, n_perm: int = 1000,
                  seed: int = 0, batch_size: int | None = None, clean: dict | None = None, covariate_names=(),
                  strata_name: str = "", targets: dict | None = None) -> dict:
    """Correlation of the final token's norm scale with its entropy (full vocabulary, and renormalised over
    ``label_tokens`` when given) and with any further per-prompt ``targets`` (name -> [n], e.g. the exact Bayes
    entropy): raw, and with ``covariates`` ([n, c]) the raw, partial and within-``strata`` correlations against a
    within-stratum permutation null (``stats.confounds.deconfounded_correlation``)."""
    clean = clean or final_norm_run(model, prompts, label_tokens=label_tokens, batch_size=batch_size, final_only=True)
    out = dict(n=len(clean["final_scale"]), scale_mean=float(clean["final_scale"].mean()),
               scale_sd=float(clean["final_scale"].std(ddof=1)))
    ys = dict(entropy=clean["final_entropy"])
    if label_tokens is not None:
        ys["label_entropy"] = clean["label_entropy"]
    ys.update({name: as_float64(y) for name, y in (targets or {}).items()})
    for name, h in ys.items():
        out[name] = dict(raw=correlations(clean["final_scale"], h))
        if covariates is not None:
            out[name]["deconfounded"] = deconfounded_correlation(
                clean["final_scale"], h, covariates, np.zeros(len(h)) if strata is None else strata, n_perm=n_perm,
                seed=seed, covariate_names=covariate_names, strata_name=strata_name)
    return out


@dataclass
class MechanismComparison:
    """One row per edit (and control draw) and the summary of each mechanism against its controls."""

    edits: list[dict]
    baseline: dict
    summary: list[dict]
    n_prompts: int

    def rows(self) -> list[Row]:
        """Tidy rows: each mechanism's effect per measure against its controls' 95% range."""
        return [Row(s["metric"], s["effect"], s["unit"], dict(mechanism=s["mechanism"], layer=s["layer"]),
                    null_low=s["control_range"][0], null_high=s["control_range"][1],
                    null=f"{s['n_controls']} control draws", n=self.n_prompts) for s in self.summary]


UNITS = dict(d_entropy="bits", d_full_entropy="bits", kl_bits="bits", d_mae_k_ge_1="bits", d_corr_bayes="Pearson r",
             d_accuracy="fraction")


def _measure(acts, base, task) -> dict:
    lp, base_lp = acts.logprobs.double(), base.logprobs.double()
    full = entropy_of_log_probs(lp)
    base_full = entropy_of_log_probs(base_lp)
    out = dict(d_entropy=float((acts.entropy.double() - base.entropy.double()).mean()),
               d_full_entropy=float((full - base_full).mean()),
               kl_bits=float(kl(lp, base_lp).mean()))
    if task is not None:
        now = calibration_measures(as_float64(acts.entropy), acts.label_logprobs.numpy(), task)
        ref = calibration_measures(as_float64(base.entropy), base.label_logprobs.numpy(), task)
        out.update({f"d_{m}": now[m] - ref[m] for m in ("mae_k_ge_1", "corr_bayes", "accuracy")})
    return out


def compare_mechanisms(model, prompts, *, neurons, axis, neuron_layer: int = -1, task: dict | None = None,
                       label_tokens=None, n_controls: int = 5, seed: int = 0, batch_size: int | None = None,
                       progress: bool = True) -> MechanismComparison:
    """Ablate the entropy-neuron set ``neurons`` of ``neuron_layer`` (mean ablation, means over these prompts) and
    cut the value axis ``axis`` (an ``EntropyAxis``, at its own layer), each beside ``n_controls`` controls (random
    neuron sets of the same size; isotropic value directions orthogonal to the axis).

    task: columns ``k``, ``latent`` and ``bayes_entropy`` of the prompts (SULA, a wind tunnel) to add calibration
    (MAE for k >= 1, correlation with Bayes entropy, accuracy); without it, entropy and KL only (a prompt pool).
    Entropy is renormalised over ``label_tokens`` when given (``d_entropy``) and over the full vocabulary
    (``d_full_entropy``); every number is the change from the unedited model."""
    idx = layer_index(neuron_layer, model.cfg.n_layers)
    neurons = [int(j) for j in neurons]
    clean = final_norm_run(model, prompts, layer=idx, batch_size=batch_size, final_only=True)
    means = torch.tensor(clean["means"], device=next(model.parameters()).device)
    rng = np.random.default_rng(seed)
    rest = np.setdiff1d(np.arange(len(clean["means"])), neurons)
    neuron_sets = [("entropy_neurons", "true", 0, neurons)] + \
        [("entropy_neurons", "control", i, sorted(rng.choice(rest, len(neurons), replace=False).tolist()))
         for i in range(n_controls)]
    controls = isotropic_axes(axis.direction, n_controls, layer=axis.layer, seed=seed)
    axis_edits = [("axis_cut", "true", 0, AxisCut(axis))] + \
        [("axis_cut", "control", i, AxisCut(torch.tensor(d, dtype=torch.float32))) for i, d in enumerate(controls)]

    def run(context):
        with context:
            return collect(model, prompts, readings=(), label_tokens=label_tokens, batch_size=batch_size,
                           keep_logprobs=True, progress=False)

    base = run(nullcontext())
    edits = []
    # edits: the neurons' mean ablation, the axis operators
    plan = [(m, kind, draw, model.hooks(fwd_hooks=[(act_name("post", idx), ablation_hook(s, means[s]))]),
             dict(neurons=s)) for m, kind, draw, s in neuron_sets] + \
        [(m, kind, draw, intervene(model, {axis.layer: op}), {})
         for m, kind, draw, op in axis_edits]
    for mechanism, kind, draw, context, extra in progress_bar(plan, desc="mechanisms", disable=not progress):
        edits.append(dict(mechanism=mechanism, kind=kind, draw=draw, **extra, **_measure(run(context), base, task)))
    baseline = dict(entropy=float(base.entropy.double().mean()))
    summary = []
    for mechanism in ("entropy_neurons", "axis_cut"):
        group = [e for e in edits if e["mechanism"] == mechanism]
        true = next(e for e in group if e["kind"] == "true")
        for metric in [m for m in UNITS if m in true]:
            ctrl = np.array([e[metric] for e in group if e["kind"] == "control"])
            summary.append(dict(mechanism=mechanism, metric=metric, effect=true[metric],
                                layer=idx if mechanism == "entropy_neurons" else axis.layer,
                                control_mean=float(ctrl.mean()), control_range=interval(ctrl),
                                percentile=percentile_of(true[metric], ctrl), n_controls=len(ctrl),
                                unit=UNITS[metric]))
    return MechanismComparison(edits, baseline, summary, len(clean["token_ids"]))
