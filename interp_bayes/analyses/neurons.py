"""Entropy neurons and the final-norm scale (Stolfo, Wu, Gurnee, Belinkov, Song, Sachan, Nanda, "Confidence
Regulation Neurons in Language Models", NeurIPS 2024, arXiv 2406.16254; Gurnee et al. 2024, arXiv 2401.12181).

The mechanism: a last-layer MLP neuron whose output write is large and lies in an effective null space of the
unembedding barely moves the logits directly, but it changes the residual norm, hence the final LayerNorm/RMSNorm
scale s, hence every logit by the factor 1/s: entropy moves, the ranking does not.

The unembedding's null space, the neurons' writes and their scores are ``analyses.unembedding``'s; here the forward
passes: the clean run with the final-norm scale observed, the ablations and ``entropy_neurons``, which ranks the
neurons and ablates the candidates.

Ablations (per neuron, mean ablation: its activation set to its mean over the prompts' positions, at every position):
the total effect on entropy and next-token loss (both in bits), and the direct effect with the final-norm scale
frozen at its clean value through a hook on ``ln_final.hook_scale`` (every family's bridge exposes it). The
norm-mediated effect is total minus direct. The clean run routes the scale through the same hook (a copy of the
scale), so clean and frozen runs use one arithmetic: an ablation that changes nothing has effect exactly 0. Beside
the signed effects, the authors' measure: the mean absolute change of the loss per token, total and direct, and the
share through the norm 1 - |direct| / |total| of it.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from ..core.errors import UnsupportedModelError
from ..core.layers import layer_index
from ..core.progress import progress_bar
from ..core.stop import check_stop
from ..core.results import Row
from ..model.hooks import act_name, module_input
from ..model.read import check_prompts, length_batches, tokenize
from ..stats import as_float64, bootstrap_ratio, interval, percentile_of
from ..stats.info import LN2, entropy_of_log_probs
from .unembedding import NullSpace, PostNorm, neuron_scores, post_mlp_norm, unembedding_null_space

TOKENS_PER_BATCH = 512  # full-vocabulary logits at every position: keep batches small
_NATIVE_EDIT = "A forward hook edited hook_scale"  # TransformerLens warns when an RMSNorm scale hook edits
PATHS = dict(head="rank-one head", post="head through the post-MLP norm", full="full passes")

# ---------------------------------------------------------------------------------------------------------------
# forward passes with the final-norm scale observed or frozen


def _log_probs(logits: torch.Tensor) -> torch.Tensor:
    """log_softmax in at least float32 (float64 models keep float64, so exact tests stay exact), written over
    ``logits`` where they have that dtype already: its callers pass full-vocabulary logits they never read again,
    and the same kernel into their buffer saves allocating another."""
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return torch.log_softmax(x, dim=-1, out=x)


@contextmanager
def _quiet_scale_edits():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NATIVE_EDIT)
        yield


def _label_entropy(label_logprobs: torch.Tensor) -> float:
    """Entropy in bits (float64) of one prompt's renormalised label log-probabilities."""
    lp = label_logprobs.double()
    return float(entropy_of_log_probs(lp))


def _batch_stats(logits: torch.Tensor, ids: torch.Tensor, label_tokens) -> dict[str, torch.Tensor]:
    """Per position: entropy (bits) and next-token loss (bits, positions with a next token); the final position's
    label log-probabilities renormalised over ``label_tokens``. ``logits`` are overwritten (``_log_probs``)."""
    logp = _log_probs(logits)  # [batch, pos, vocab]
    out = dict(entropy=entropy_of_log_probs(logp),
               loss=-logp[:, :-1].gather(-1, ids[:, 1:, None])[..., 0] / LN2)
    if label_tokens is not None:
        out["label_logprobs"] = torch.log_softmax(logp[:, -1, label_tokens], dim=-1)
    return out


def _prepare(model, prompts, batch_size):
    """Token ids (the checkpoint's own tokenizer) and their length buckets; refuses models without the hooks."""
    scale = act_name("scale")
    if scale not in model.hook_dict:
        raise UnsupportedModelError(f"This model has no '{scale}' hook (no final LayerNorm or RMSNorm); the final-norm "
                                    "analyses need one.")
    token_ids = tokenize(model, prompts)
    check_prompts(token_ids, prompts, model.cfg.n_ctx)
    return token_ids, list(length_batches(token_ids, batch_size, tokens_per_batch=TOKENS_PER_BATCH))


@torch.no_grad()
def final_norm_run(model, prompts, *, layer: int = -1, label_tokens: Sequence[int] | None = None,
                   batch_size: int | None = None, keep_head_inputs: bool = False, final_only: bool = False) -> dict:
    """One clean pass: per prompt the final position's norm scale, entropy (bits, full vocabulary) and, with
    ``label_tokens``, the renormalised label entropy; the mean activation of every neuron of ``layer``'s MLP over all
    positions (the mean-ablation values); per-prompt position-level entropy, loss and scale. ``keep_head_inputs``
    also keeps, per batch, the final residual (``ln_final.hook_in``), ``layer``'s MLP activations and, where the
    block normalises its MLP's output, that output before the norm (else None); ``final_only`` unembeds the final
    position alone (entropy there, no loss), which is all most callers need."""
    token_ids, batches = _prepare(model, prompts, batch_size)
    device = next(model.parameters()).device
    idx = layer_index(layer, model.cfg.n_layers)
    post_norm = post_mlp_norm(model, idx) is not None
    labels = torch.tensor(list(label_tokens), device=device) if label_tokens is not None else None
    n = len(token_ids)
    out = dict(token_ids=token_ids, batches=batches, entropy=[None] * n, loss=[None] * n, scale=[None] * n,
               label_entropy=np.full(n, np.nan), layer=idx)
    post_sum, count, seen = 0.0, 0, {}

    def keep(name):
        def hook(t, hook):
            seen[name] = t.detach()
            return t.clone() if name == "scale" else None  # the scale goes through the edit path (module docstring)
        return hook

    hooks = [(act_name("scale"), keep("scale")), (act_name("post", idx), keep("post")),
             (module_input("ln_final"), keep("resid"))] + ([(module_input("ln2_post", idx), keep("mlp_out"))]
                                                           if post_norm and keep_head_inputs else [])
    # not ``model.read``: the scale hook is an edit (the clean run takes the frozen runs' edit path); readings ride it
    with _quiet_scale_edits(), model.hooks(fwd_hooks=hooks):
        for b in batches:
            ids = torch.tensor([token_ids[i] for i in b], device=device)
            stats = _batch_stats(model(ids, logits_to_keep=1) if final_only else model(ids),
                                 ids[:, -1:] if final_only else ids, labels)
            post_sum = post_sum + seen["post"].double().sum(dim=(0, 1))
            count += seen["post"].shape[0] * seen["post"].shape[1]
            for j, i in enumerate(b):
                out["entropy"][i] = as_float64(stats["entropy"][j])
                out["loss"][i] = as_float64(stats["loss"][j])
                out["scale"][i] = as_float64(seen["scale"][j, :, 0])
                if labels is not None:
                    out["label_entropy"][i] = _label_entropy(stats["label_logprobs"][j])
            out.setdefault("scale_tensors", []).append(seen["scale"].clone())
            if keep_head_inputs:
                out.setdefault("head_inputs", []).append(
                    (seen["resid"].clone(), seen["post"].clone(), seen["mlp_out"].clone() if post_norm else None))
    out["means"] = as_float64(post_sum / count)
    out["final_scale"] = np.array([s[-1] for s in out["scale"]])
    out["final_entropy"] = np.array([h[-1] for h in out["entropy"]])
    return out


def ablation_hook(neurons: Sequence[int], values: torch.Tensor):
    """A hook on an MLP's activations (``hook_post``) setting those of ``neurons`` to ``values`` at every position
    (their means: a mean ablation)."""
    idx = list(neurons)

    def hook(act: torch.Tensor, hook) -> torch.Tensor:
        act = act.clone()
        act[..., idx] = values.to(act.dtype)
        return act
    return hook


def _head(model, resid: torch.Tensor, scale_hook) -> torch.Tensor:
    """Logits from a final residual through the model's own final norm (its scale via ``scale_hook``) and
    unembedding, before any soft cap (``_softcap``)."""
    with model.hooks(fwd_hooks=[(act_name("scale"), scale_hook)]):  # an edit: the scale set by scale_hook
        return model.unembed(model.ln_final(resid))


def _softcap(model, z: torch.Tensor) -> torch.Tensor:
    """The logits the model outputs from its unembedding's z: cap * tanh(z / cap) where it soft-caps them (Gemma 2),
    z itself elsewhere."""
    cap = getattr(model.cfg, "output_logits_soft_cap", None) or 0.0
    return cap * torch.tanh(z / cap) if cap > 0 else z


def _scale_of(model, resid: torch.Tensor) -> torch.Tensor:
    """The final norm's scale of ``resid`` ([..., 1]), from the model's own norm."""
    seen = {}  # a reading of one module on a given residual, not of a forward pass over inputs (``model.read``)
    with model.hooks(fwd_hooks=[(act_name("scale"), lambda t, hook: seen.__setitem__("scale", t.detach()))]):
        model.ln_final(resid)
    return seen["scale"]


def _unit_scale(scale: torch.Tensor, hook) -> torch.Tensor:
    """A scale hook setting the final norm's scale to 1: the head's affine parts."""
    return torch.ones_like(scale)


class _AffineHead:
    """The head's pre-cap logits for a final residual plus one neuron's write, without a matrix product over the
    vocabulary per ablation.

    At a fixed scale s the head is affine in its input: z(x) = G(x) / s + beta, with G linear (centring, the norm's
    weight, the unembedding) and beta = z(0) at scale 1 (the norm's and the unembedding's biases). For x = resid + dx
    with clean z0 = G(resid) / s0 + beta: direct (s frozen at s0) z0 + G(dx) / s0; total (s' the scale of x)
    r z0 + (1 - r) beta + G(dx) / s', r = s0 / s'. The write dx is c w_out (c per position): G(dx) = c G(w_out), one
    head pass of a single vector per neuron; through a post-MLP RMSNorm it is g * (a h + b w_out) (``PostNorm``),
    so G(dx) = a G(g h) + b G(g w_out), with G(g h) one more head pass per batch. An ablation then costs
    elementwise work instead of a [positions, d_model] x [d_model, vocab] product; c = 0 gives z0 exactly."""

    def __init__(self, model, w_out: torch.Tensor, post: PostNorm | None):
        self.model, self.w_out, self.write = model, w_out, {}
        self.post = None if post is None else (torch.tensor(post.gain, dtype=w_out.dtype, device=w_out.device),
                                               post)
        zero = torch.zeros(1, 1, w_out.shape[1], dtype=w_out.dtype, device=w_out.device)
        self.beta = _head(model, zero, _unit_scale)[0, 0]

    def g(self, vectors: torch.Tensor) -> torch.Tensor:
        """G of residual vectors [..., d] -> [..., vocab]."""
        shape = vectors.shape
        flat = vectors.reshape(1, -1, shape[-1])
        return (_head(self.model, flat, _unit_scale)[0] - self.beta).reshape(*shape[:-1], -1)

    def g_neuron(self, j: int) -> torch.Tensor:
        """G of neuron j's write per unit: w_out[j], or g * w_out[j] through a post-MLP norm: [vocab]."""
        if j not in self.write:
            w = self.w_out[j] if self.post is None else self.post[0] * self.w_out[j]
            self.write[j] = self.g(w[None])[0]
        return self.write[j]

    def batch(self, h: torch.Tensor | None) -> torch.Tensor | None:
        """G(g h) for a batch's MLP outputs h [b, pos, d] through a post-MLP norm (None without one)."""
        return None if self.post is None else self.g(self.post[0] * h)

    def logits(self, j: int, c: torch.Tensor, resid: torch.Tensor, z0: torch.Tensor, s0: torch.Tensor,
               freeze_scale: bool, h: torch.Tensor | None = None, gh: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [batch, pos, vocab] of resid + the write of c [batch, pos] on neuron j, scale frozen at s0 or its
        own; ``h`` and ``gh`` (``batch``) where a post-MLP norm applies."""
        w = self.w_out[j]
        if self.post is None:
            dx, gdx = c[..., None] * w, c[..., None].to(z0.dtype) * self.g_neuron(j)
        else:
            gain, post = self.post
            a, b = post.coefficients(h, c[..., None], w[None])  # [batch, pos, 1] each
            dx = gain * (a * h + b * w)
            gdx = a.to(z0.dtype) * gh + b.to(z0.dtype) * self.g_neuron(j)
        # gdx is this call's own: divided in place, and the sums built in one buffer, in the order of
        # z0 + gdx / s0 and r z0 + (1 - r) beta + gdx / s (the same float32 arithmetic, fewer [.., vocab] tensors)
        if freeze_scale:
            return _softcap(self.model, gdx.div_(s0).add_(z0))
        s = _scale_of(self.model, resid + dx)
        r = s0 / s
        out = r * z0
        out += (1 - r) * self.beta
        out += gdx.div_(s)
        return _softcap(self.model, out)


@dataclass
class AblationEffects:
    """Per neuron, per prompt: summed changes ``{total,direct}_{entropy,loss,final}`` (bits) from mean ablation and
    ``{total,direct}_abs_loss`` (summed |change of the loss|), and how they were computed: ``head`` (the final norm
    and unembedding's affine form on the edited residual), ``post`` (the same through a post-MLP norm) or ``full``
    passes (``PATHS``)."""

    per_neuron: dict[int, dict[str, np.ndarray]]
    path: str


@torch.no_grad()
def ablation_effects(model, prompts, neurons: Sequence[int], *, layer: int = -1, clean: dict | None = None,
                     label_tokens: Sequence[int] | None = None, batch_size: int | None = None,
                     progress: bool = True) -> AblationEffects:
    """Mean-ablate each neuron of ``neurons`` alone; per neuron and per prompt, the summed change of entropy over all
    positions, of the loss (and its absolute value) over positions with a next token and of the final position's
    entropy, for the ``total`` run and the ``direct`` run (final-norm scale frozen at its clean value); with
    ``label_tokens`` also ``label``, the change of the final position's entropy renormalised over them (the
    distribution a wind tunnel is trained and scored on). ``clean`` is ``final_norm_run``'s output for the same
    prompts and label tokens (computed when absent).

    In the last layer the neuron writes straight into the final residual, so the ablated residual is the clean one
    plus the write of c = mean - activation, and its logits follow from the clean ones through the head's affine
    form (``_AffineHead``: elementwise work per ablation, one or two unembeddings per batch), through a post-MLP
    RMSNorm too, and a soft cap after it. Full hooked passes check that shortcut for the first neuron on the first
    batch, and every pass is a full one if it does not hold. Other layers rerun the whole model with the ablation
    hooked on ``hook_post``."""
    idx = layer_index(layer, model.cfg.n_layers)
    last = idx == model.cfg.n_layers - 1
    post = post_mlp_norm(model, idx)
    if clean is None or (last and "head_inputs" not in clean):
        clean = final_norm_run(model, prompts, layer=idx, label_tokens=label_tokens, batch_size=batch_size,
                               keep_head_inputs=last)
    if label_tokens is not None and np.isnan(clean["label_entropy"]).any():
        raise ValueError("The clean run has no label entropy; pass the same label_tokens to final_norm_run.")
    token_ids, batches = clean["token_ids"], clean["batches"]
    device = next(model.parameters()).device
    labels = torch.tensor(list(label_tokens), device=device) if label_tokens is not None else None
    metrics = ("entropy", "loss", "final", "abs_loss") + (("label",) if labels is not None else ())
    means = torch.tensor(clean["means"], device=device)
    w_out = model.blocks[idx].mlp.W_out.detach()  # [d_mlp, d_model]
    n = len(token_ids)
    out = {int(j): {f"{cond}_{m}": np.zeros(n) for cond in ("total", "direct") for m in metrics} for j in neurons}
    head_only = last
    bar = progress_bar(total=len(neurons) * len(batches), desc="ablations", disable=not progress)
    with _quiet_scale_edits():
        head = _AffineHead(model, w_out, post) if last else None
        for step, (b, frozen) in enumerate(zip(batches, clean["scale_tensors"])):
            check_stop()
            ids = torch.tensor([token_ids[i] for i in b], device=device)
            if head_only:
                resid, act, h = clean["head_inputs"][step]
                z0 = _head(model, resid, lambda t, hook: t.clone())  # the clean run's arithmetic
                gh = head.batch(h)
            for j in neurons:
                ablate = (act_name("post", idx), ablation_hook([j], means[[j]]))
                for cond, scale_hook in (("total", lambda t, hook: t.clone()),
                                         ("direct", lambda t, hook, s=frozen: s.clone())):
                    full = None
                    if not head_only or (step == 0 and j == neurons[0]):  # the shortcut is checked once
                        with model.hooks(fwd_hooks=[ablate, (act_name("scale"), scale_hook)]):  # edits
                            full = model(ids)
                    if head_only:
                        logits = head.logits(j, means[j] - act[..., j], resid, z0, frozen,
                                             freeze_scale=cond == "direct", h=h, gh=gh)
                        if full is not None and not torch.allclose(logits, full, rtol=1e-4, atol=1e-4):
                            head_only = False  # the shortcut does not hold for this model: full passes from now on
                            logits = full
                    else:
                        logits = full
                    stats = _batch_stats(logits, ids, labels)
                    for r, i in enumerate(b):
                        dh = as_float64(stats["entropy"][r]) - clean["entropy"][i]
                        dl = as_float64(stats["loss"][r]) - clean["loss"][i]
                        out[int(j)][f"{cond}_entropy"][i] = dh.sum()
                        out[int(j)][f"{cond}_final"][i] = dh[-1]
                        out[int(j)][f"{cond}_loss"][i] = dl.sum()
                        out[int(j)][f"{cond}_abs_loss"][i] = np.abs(dl).sum()
                        if labels is not None:
                            out[int(j)][f"{cond}_label"][i] = (_label_entropy(stats["label_logprobs"][r])
                                                               - clean["label_entropy"][i])
                bar.update(1)
    bar.close()
    return AblationEffects(out, ("head" if post is None else "post") if head_only else "full")


def summarize_effects(effects: AblationEffects, clean: dict, *, n_boot: int = 1000, seed: int = 0) -> dict[int, dict]:
    """Per neuron: mean change per token (entropy, loss, |loss change|) or per prompt (final entropy, label
    entropy), total / direct / mediated, with bootstrap intervals over prompts, and the fraction of each effect
    mediated by the norm, 1 - |direct| / |total| (Stolfo et al.; on ``abs_loss`` their own measure, the mean
    absolute change of the loss per token)."""
    rng = np.random.default_rng(seed)
    counts = dict(entropy=np.array([len(h) for h in clean["entropy"]], dtype=float),
                  loss=np.array([len(x) for x in clean["loss"]], dtype=float), final=np.ones(len(clean["entropy"])),
                  label=np.ones(len(clean["entropy"])))
    counts["abs_loss"] = counts["loss"]
    out = {}
    for j, e in effects.per_neuron.items():
        s = {}
        for m in [m for m in counts if f"total_{m}" in e]:
            for cond in ("total", "direct"):
                s[f"{cond}_{m}"], s[f"{cond}_{m}_ci"] = bootstrap_ratio(e[f"{cond}_{m}"], counts[m],
                                                                        n_boot=n_boot, seed=rng)
            s[f"mediated_{m}"], s[f"mediated_{m}_ci"] = bootstrap_ratio(e[f"total_{m}"] - e[f"direct_{m}"],
                                                                        counts[m], n_boot=n_boot, seed=rng)
            total = abs(s[f"total_{m}"])
            s[f"mediated_fraction_{m}"] = 1 - abs(s[f"direct_{m}"]) / total if total > 0 else float("nan")
        out[j] = s
    return out


MEASURES = ("entropy", "loss", "final", "abs_loss")
LABEL_MEASURES = ("label",)  # with label tokens
UNITS = dict(entropy="bits per token", loss="bits per token", abs_loss="bits per token (|change|)",
             final="bits per prompt (final token)", label="bits per prompt (final token, over the label tokens)")


@dataclass
class EntropyNeuronReport:
    """Candidates ranked by rho (the authors' ranking), their scores against all neurons of the layer, and each
    one's mean-ablation effects beside those of random neurons of the same layer."""

    layer: int
    null_space: dict
    candidates: list[dict]  # neuron, scores, percentiles among all neurons, effects
    random: list[dict]  # the same for random neurons (the ablation control)
    distribution: dict  # quantiles of each score over all neurons
    n_prompts: int
    n_tokens: int
    ablation_path: str  # "head", "post" or "full" (``AblationEffects``, ``PATHS``)
    write: str = "W_out"  # what the scores are of: "W_out" or "measured" (``neuron_scores``)
    scores: dict = field(default_factory=dict, repr=False)  # score -> [d_mlp] list

    def random_range(self, key: str) -> list[float]:
        """The random neurons' 2.5-97.5% range of one effect (NaN without random neurons)."""
        rand = np.array([r["effects"][key] for r in self.random], dtype=float)
        return interval(rand)

    def rows(self) -> list[Row]:
        """Tidy rows: the null space's chance rho; per candidate its rho and norm against the distribution over all
        neurons (2.5-97.5%), and each ablation effect (total, direct, norm-mediated; bootstrap intervals over
        prompts) and its share through the norm, 1 - |direct| / |total|, each against the random neurons' range.
        Scope: layer, neuron, rank, and ``path``, which computation ran (``PATHS``)."""
        measures = MEASURES + (LABEL_MEASURES if "total_label" in self.candidates[0]["effects"] else ())
        write = "write (measured through the post-MLP norm)" if self.write == "measured" else "w_out"
        out = [Row("null_space_chance_rho", self.null_space["chance_rho"], "fraction of |w|", dict(layer=self.layer),
                   n=self.null_space["k"], note="the root-mean-square rho of a random direction: sqrt(k / d_model)")]
        nulls = f"{len(self.random)} random neurons, 95%"
        for rank, c in enumerate(self.candidates, 1):
            scope = dict(layer=self.layer, neuron=c["neuron"], rank=rank)
            for score, u in (("rho", "fraction of |w|"), ("norm", f"|{write}|")):
                d = self.distribution[score]
                out.append(Row(f"neuron_{score}", c[score], u, dict(scope), null_low=d["q025"], null_high=d["q975"],
                               null="all neurons of the layer, 2.5-97.5%", note=f"of the {write}"))
            e, ablation = c["effects"], dict(scope, path=self.ablation_path)
            for m in measures:
                for effect in ("total", "direct", "mediated"):
                    key = f"{effect}_{m}"
                    lo, hi = self.random_range(key)
                    out.append(Row(f"ablation_{key}", e[key], UNITS[m], dict(ablation), e[f"{key}_ci"][0],
                                   e[f"{key}_ci"][1], "bootstrap 95%", lo, hi, nulls, n=self.n_prompts))
                lo, hi = self.random_range(f"mediated_fraction_{m}")
                out.append(Row(f"ablation_mediated_fraction_{m}", e[f"mediated_fraction_{m}"],
                               "fraction (1 - |direct| / |total|)", dict(ablation), null_low=lo, null_high=hi,
                               null=nulls, n=self.n_prompts))
        return out


@dataclass(frozen=True)
class AblationProtocol:
    """Which neurons ``entropy_neurons`` ablates and how it reads them: the ``top_n`` candidates of ``layer``'s MLP
    (default the last) by rho, beside ``n_random`` other neurons of the layer drawn with ``seed``, each effect with a
    bootstrap interval of ``n_boot`` draws over prompts (seeded with ``seed`` too)."""

    layer: int = -1
    top_n: int = 5
    n_random: int = 5
    seed: int = 0
    n_boot: int = 1000


def entropy_neurons(model, prompts, protocol: AblationProtocol = AblationProtocol(), *, null: NullSpace | None = None,
                    label_tokens: Sequence[int] | None = None, batch_size: int | None = None,
                    progress: bool = True) -> EntropyNeuronReport:
    """Find and test entropy-neuron candidates in the MLP of ``protocol.layer``.

    Candidates are the ``protocol.top_n`` neurons with the largest rho = |V0^T w| / |w| (the authors' ranking; w
    the write, measured where a post-MLP norm applies); each is mean-ablated alone on ``prompts`` (texts or token
    ids), as are the protocol's random neurons, and the total, direct (final-norm scale frozen) and norm-mediated
    effects on entropy and loss (and, with ``label_tokens``, on the final position's entropy over them) are
    reported per neuron with bootstrap intervals over prompts. ``null``: the null space to rank by (default
    ``unembedding_null_space(model)``; pass ``unembedding_null_space(model, k)`` for another dimension). Works for
    LayerNorm and RMSNorm models, with or without a norm after the MLP.
    """
    top_n, n_random, seed, n_boot = protocol.top_n, protocol.n_random, protocol.seed, protocol.n_boot
    idx = layer_index(protocol.layer, model.cfg.n_layers)
    null = null or unembedding_null_space(model)
    post = post_mlp_norm(model, idx)
    clean = final_norm_run(model, prompts, layer=idx, label_tokens=label_tokens, batch_size=batch_size,
                           keep_head_inputs=idx == model.cfg.n_layers - 1 or post is not None)
    scores = neuron_scores(model, idx, null, clean=clean)
    write = scores.pop("write")
    order = np.argsort(-scores["rho"], kind="stable")
    cands = order[:top_n].tolist()
    rng = np.random.default_rng(seed)
    rest = np.setdiff1d(np.arange(len(order)), cands)
    rand = sorted(rng.choice(rest, size=min(n_random, len(rest)), replace=False).tolist())
    ablations = ablation_effects(model, prompts, cands + rand, layer=idx, clean=clean, label_tokens=label_tokens,
                                 batch_size=batch_size, progress=progress)
    effects = summarize_effects(ablations, clean, n_boot=n_boot, seed=seed)

    def describe(j: int) -> dict:
        return dict(neuron=int(j), **{s: float(v[j]) for s, v in scores.items()},
                    percentile={s: percentile_of(v[j], v) for s, v in scores.items()},
                    mean_activation=float(clean["means"][j]), effects=effects[j])

    dist = {s: dict(zip(("q025", "q975"), interval(v)), median=float(np.median(v)), max=float(v.max()))
            for s, v in scores.items()}
    return EntropyNeuronReport(layer=idx, null_space=null.summary(), candidates=[describe(j) for j in cands],
                               random=[describe(j) for j in rand], distribution=dist, n_prompts=len(clean["token_ids"]),
                               n_tokens=int(sum(map(len, clean["token_ids"]))), ablation_path=ablations.path,
                               write=write, scores={s: v.tolist() for s, v in scores.items()})


