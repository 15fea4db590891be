"""Entropy neurons and the final-norm scale (Stolfo, Wu, Gurnee, Belinkov, Song, Sachan, Nanda, "Confidence
Regulation Neurons in Language Models", NeurIPS 2024, arXiv 2406.16254; Gurnee et al. 2024, arXiv 2401.12181).

The mechanism: a last-layer MLP neuron whose output weight w_out is large and lies in an effective null space of the
unembedding barely moves the logits directly, but it changes the residual norm, hence the final LayerNorm/RMSNorm
scale s, hence every logit by the factor 1/s: entropy moves, the ranking does not.

Effective unembedding. The logits are W_U^T (g * P x / s + b) + b_U, with g the final norm's weight, P the centring
of LayerNorm (identity for RMSNorm) and s the norm scale (``ln_final.hook_scale``). Softmax ignores a constant added
to every logit, so the unembedding is also centred over the vocabulary (C). The effective unembedding is
U = P diag(g) W_U C ([d_model, vocab]); a residual write w changes the logits by U^T w / s. The null space is spanned
by U's k = max(10, 1% of d_model) bottom left-singular directions (within the centred subspace for LayerNorm, whose
all-ones direction the norm never sees). When the vocabulary is smaller than d_model (wind tunnels), U has an exact
kernel and the null space is at least that kernel. A model scored on a few tokens only (a wind tunnel's hypotheses)
has U restricted to their columns (``tokens``): its null space is what leaves their distribution unchanged.

Per neuron: ``norm`` = |P w_out|; ``rho`` = the fraction of |P w_out|^2 in the null space (a random direction has
``chance`` = k / effective dimension); ``null_norm`` = sqrt(rho) |P w_out| (the size of the write that changes the
norm without changing the logits, the ranking score); ``logit_var`` = the variance over the vocabulary of the cosine
between w_out and each token's unembedding column (the paper's LogitVar: low for entropy neurons).

Ablations (per neuron, mean ablation: its activation set to its mean over the prompts' positions, at every position):
the total effect on entropy and next-token loss (both in bits), and the direct effect with the final-norm scale
frozen at its clean value through a hook on ``ln_final.hook_scale`` (every family's bridge exposes it). The
norm-mediated effect is total minus direct. The clean run routes the scale through the same hook (a copy of the
scale), so clean and frozen runs use one arithmetic: an ablation that changes nothing has effect exactly 0.
"""

from __future__ import annotations

import math
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from .errors import UnsupportedModelError
from .geometry import CI_LEVEL, as_float64, correlations
from .results import Row

LN2 = math.log(2.0)
SCALE_HOOK = "ln_final.hook_scale"
POST_HOOK = "blocks.{layer}.mlp.hook_post"
TOKENS_PER_BATCH = 512  # full-vocabulary logits at every position: keep batches small
_NATIVE_EDIT = "A forward hook edited hook_scale"  # TransformerLens warns when an RMSNorm scale hook edits


def _layer(model, layer: int) -> int:
    n = model.cfg.n_layers
    idx = layer + n if layer < 0 else layer
    if not 0 <= idx < n:
        raise ValueError(f"Layer {layer} is out of range for a model with {n} layers.")
    return idx


def _norm_weight(model) -> np.ndarray:
    """The final norm's effective per-coordinate weight g (1 + w where the norm stores an offset, as Gemma's)."""
    ln = model.ln_final
    w = as_float64(ln.original_component.weight.detach())
    return 1.0 + w if ln.uses_weight_offset else w


def _centred(model) -> bool:
    """True for LayerNorm (the residual is centred before the scale), False for RMSNorm."""
    return not model.ln_final.uses_rms_norm


def _effective(w: np.ndarray, centred: bool) -> np.ndarray:
    """Rows of residual writes as the final norm sees them: centred over d_model for LayerNorm."""
    return w - w.mean(axis=-1, keepdims=True) if centred else w


def _unembedding_columns(model, centred: bool, chunk: int = 8192, tokens: Sequence[int] | None = None):
    """Yield (column slice, U[:, slice]) of the effective unembedding U = P diag(g) W_U C in float64 chunks; with
    ``tokens``, of those columns only (C then centres over them: a softmax over them ignores their common shift)."""
    w_u = model.W_U.detach()  # [d_model, vocab]
    if tokens is not None:
        w_u = w_u[:, list(tokens)]  # [d_model, len(tokens)]
    g = _norm_weight(model)[:, None]
    mu = as_float64(w_u.mean(dim=1, dtype=torch.float64))[:, None]  # vocabulary centring
    for start in range(0, w_u.shape[1], chunk):
        cols = slice(start, min(start + chunk, w_u.shape[1]))
        u = g * (as_float64(w_u[:, cols]) - mu)
        yield cols, (u - u.mean(axis=0, keepdims=True) if centred else u)


@dataclass
class NullSpace:
    """The effective null space of the unembedding: an orthonormal basis and the spectrum it was cut from."""

    basis: np.ndarray  # [d_model, k] bottom left-singular directions of U
    singular_values: np.ndarray  # [d_eff] of U, descending
    centred: bool  # LayerNorm: directions live in the centred subspace
    exact_kernel: int  # singular values that are zero up to rounding (vocabulary smaller than d_model)
    norm_gram: np.ndarray = field(repr=False)  # [d, d] mean over tokens of u_v u_v^T / |u_v|^2 (LogitVar)
    norm_mean: np.ndarray = field(repr=False)  # [d] mean over tokens of u_v / |u_v|

    @property
    def k(self) -> int:
        return self.basis.shape[1]

    @property
    def chance(self) -> float:
        """The expected rho of a uniformly random direction: k over the effective dimension."""
        return self.k / len(self.singular_values)

    def effective(self, w) -> np.ndarray:
        return _effective(as_float64(w), self.centred)

    def rho(self, w) -> np.ndarray:
        """Fraction of |effective w|^2 in the null space, for a vector or the rows of a matrix."""
        w = self.effective(w)
        return (w @ self.basis) ** 2 @ np.ones(self.k) / (w**2).sum(axis=-1)

    def summary(self) -> dict:
        s = self.singular_values
        return dict(k=self.k, d_effective=len(s), chance_rho=self.chance, exact_kernel=self.exact_kernel,
                    centred=self.centred, sigma_max=float(s[0]), sigma_null_max=float(s[-self.k]),
                    sigma_null_min=float(s[-1]), sigma_next_above_null=float(s[-self.k - 1]) if len(s) > self.k
                    else float("nan"))


def unembedding_null_space(model, k: int | None = None, tokens: Sequence[int] | None = None) -> NullSpace:
    """The bottom-k singular directions of the effective unembedding (default k = max(10, 1% of d_model)),
    enlarged to U's exact kernel when that is bigger; computed from the float64 Gram matrix U U^T.

    tokens: the readout the model is scored on, when it is not the whole vocabulary (a wind tunnel's hypothesis
    tokens): U is then their columns alone, centred over them, and the null space is what leaves the distribution
    over those tokens unchanged (its kernel is d_model - len(tokens) + 1 dimensions, or one fewer for LayerNorm)."""
    d = model.cfg.d_model
    k = k or max(10, math.ceil(0.01 * d))
    centred = _centred(model)
    gram, norm_gram, norm_sum, vocab = np.zeros((d, d)), np.zeros((d, d)), np.zeros(d), 0
    for _, u in _unembedding_columns(model, centred, tokens=tokens):
        gram += u @ u.T
        un = u / np.maximum(np.linalg.norm(u, axis=0, keepdims=True), 1e-300)
        norm_gram += un @ un.T
        norm_sum += un.sum(axis=1)
        vocab += u.shape[1]
    if centred:  # restrict to the centred subspace: an orthonormal basis Q of the complement of all-ones
        q = np.linalg.eigh(np.eye(d) - 1.0 / d)[1][:, 1:]
    else:
        q = np.eye(d)
    evals, evecs = np.linalg.eigh(q.T @ gram @ q)  # ascending
    sing = np.sqrt(np.clip(evals, 0.0, None))[::-1]
    exact = int((sing <= 1e-6 * sing[0]).sum())
    k = min(max(k, exact), len(sing) - 1)
    return NullSpace(basis=q @ evecs[:, :k], singular_values=sing, centred=centred, exact_kernel=exact,
                     norm_gram=norm_gram / vocab, norm_mean=norm_sum / vocab)


def _w_out(model, layer: int) -> np.ndarray:
    return as_float64(model.blocks[layer].mlp.W_out.detach())  # [d_mlp, d_model]


def neuron_scores(model, layer: int = -1, null: NullSpace | None = None) -> dict[str, np.ndarray]:
    """Per neuron of ``layer``'s MLP: norm, rho, null_norm and logit_var (module docstring), as float64 arrays."""
    null = null or unembedding_null_space(model)
    w = null.effective(_w_out(model, _layer(model, layer)))
    sq = (w**2).sum(axis=1)
    rho = null.rho(w)
    logit_var = np.einsum("nd,de,ne->n", w, null.norm_gram, w) / sq - (w @ null.norm_mean) ** 2 / sq
    return dict(norm=np.sqrt(sq), rho=rho, null_norm=np.sqrt(rho * sq), logit_var=logit_var)


# ---------------------------------------------------------------------------------------------------------------
# forward passes with the final-norm scale observed or frozen


def _log_probs(logits: torch.Tensor) -> torch.Tensor:
    """log_softmax in at least float32 (float64 models keep float64, so exact tests stay exact)."""
    return torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)


@contextmanager
def _quiet_scale_edits():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NATIVE_EDIT)
        yield


def _label_entropy(label_logprobs: torch.Tensor) -> float:
    """Entropy in bits (float64) of one prompt's renormalised label log-probabilities."""
    lp = label_logprobs.double()
    return float(-(lp.exp() * lp).sum() / LN2)


def _batch_stats(logits: torch.Tensor, ids: torch.Tensor, label_tokens) -> dict[str, torch.Tensor]:
    """Per position: entropy (bits) and next-token loss (bits, positions with a next token); the final position's
    label log-probabilities renormalised over ``label_tokens``."""
    logp = _log_probs(logits)  # [batch, pos, vocab]
    out = dict(entropy=-(logp.exp() * logp).sum(-1) / LN2,
               loss=-logp[:, :-1].gather(-1, ids[:, 1:, None])[..., 0] / LN2)
    if label_tokens is not None:
        out["label_logprobs"] = torch.log_softmax(logp[:, -1, label_tokens], dim=-1)
    return out


def _prepare(model, prompts, batch_size):
    """Token ids (the checkpoint's own tokenizer) and their length buckets; refuses models without the hooks."""
    from .extract import check_prompts, length_batches, tokenize

    if SCALE_HOOK not in model.hook_dict:
        raise UnsupportedModelError(f"This model has no '{SCALE_HOOK}' hook (no final LayerNorm or RMSNorm); the "
                                    "final-norm analyses need one.")
    token_ids = tokenize(model, prompts)
    check_prompts(token_ids, prompts, model.cfg.n_ctx)
    return token_ids, list(length_batches(token_ids, batch_size, tokens_per_batch=TOKENS_PER_BATCH))


@torch.no_grad()
def final_norm_run(model, prompts, *, layer: int = -1, label_tokens: Sequence[int] | None = None,
                   batch_size: int | None = None, keep_head_inputs: bool = False, final_only: bool = False) -> dict:
    """One clean pass: per prompt the final position's norm scale, entropy (bits, full vocabulary) and, with
    ``label_tokens``, the renormalised label entropy; the mean activation of every neuron of ``layer``'s MLP over all
    positions (the mean-ablation values); per-prompt position-level entropy, loss and scale. ``keep_head_inputs``
    also keeps, per batch, the final residual (``ln_final.hook_in``) and ``layer``'s MLP activations;
    ``final_only`` unembeds the final position alone (entropy there, no loss), which is all most callers need."""
    token_ids, batches = _prepare(model, prompts, batch_size)
    device = next(model.parameters()).device
    idx = _layer(model, layer)
    labels = torch.tensor(list(label_tokens), device=device) if label_tokens is not None else None
    n = len(token_ids)
    out = dict(token_ids=token_ids, batches=batches, entropy=[None] * n, loss=[None] * n, scale=[None] * n,
               label_entropy=np.full(n, np.nan))
    post_sum, count, seen = 0.0, 0, {}

    def keep(name):
        def hook(t, hook):
            seen[name] = t.detach()
            return t.clone() if name == "scale" else None  # the scale goes through the edit path (module docstring)
        return hook

    hooks = [(SCALE_HOOK, keep("scale")), (POST_HOOK.format(layer=idx), keep("post")),
             ("ln_final.hook_in", keep("resid"))]
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
                out.setdefault("head_inputs", []).append((seen["resid"].clone(), seen["post"].clone()))
    out["means"] = as_float64(post_sum / count)
    out["final_scale"] = np.array([s[-1] for s in out["scale"]])
    out["final_entropy"] = np.array([h[-1] for h in out["entropy"]])
    return out


def _ablate(neurons: Sequence[int], values: torch.Tensor):
    idx = list(neurons)

    def hook(act: torch.Tensor, hook) -> torch.Tensor:
        act = act.clone()
        act[..., idx] = values.to(act.dtype)
        return act
    return hook


def _head(model, resid: torch.Tensor, scale_hook) -> torch.Tensor:
    """Logits from a final residual through the model's own final norm (its scale via ``scale_hook``) and
    unembedding: what the model computes after its last block."""
    with model.hooks(fwd_hooks=[(SCALE_HOOK, scale_hook)]):
        return model.unembed(model.ln_final(resid))


def _scale_of(model, resid: torch.Tensor) -> torch.Tensor:
    """The final norm's scale of ``resid`` ([..., 1]), from the model's own norm."""
    seen = {}
    with model.hooks(fwd_hooks=[(SCALE_HOOK, lambda t, hook: seen.__setitem__("scale", t.detach()))]):
        model.ln_final(resid)
    return seen["scale"]


def _unit_scale(scale: torch.Tensor, hook) -> torch.Tensor:
    """A scale hook setting the final norm's scale to 1: the head's affine parts."""
    return torch.ones_like(scale)


class _RankOneHead:
    """The head's logits for a final residual plus one neuron's write, without a matrix product over the vocabulary.

    At a fixed scale s the head is affine in its input: logits(x) = G(x) / s + beta, with G linear (centring, the
    norm's weight, the unembedding) and beta = logits(0) at scale 1 (the norm's and the unembedding's biases). For
    x = resid + c w_out (c per position) with clean logits L0 = G(resid) / s0 + beta:
    direct (s frozen at s0): L0 + (c / s0) G(w_out); total (s' the scale of x): r L0 + (1 - r) beta + (c / s') G(w_out)
    with r = s0 / s'. G(w_out) is one head pass of a single vector per neuron, so an ablation costs elementwise work
    instead of a [positions, d_model] x [d_model, vocab] product; c = 0 gives L0 exactly."""

    def __init__(self, model, w_out: torch.Tensor):
        self.model, self.w_out, self.write = model, w_out, {}
        zero = torch.zeros(1, 1, w_out.shape[1], dtype=w_out.dtype, device=w_out.device)
        self.beta = _head(model, zero, _unit_scale)[0, 0]

    def g(self, j: int) -> torch.Tensor:
        """G(w_out[j]): [vocab]."""
        if j not in self.write:
            self.write[j] = _head(self.model, self.w_out[j][None, None], _unit_scale)[0, 0] - self.beta
        return self.write[j]

    def logits(self, j: int, c: torch.Tensor, resid: torch.Tensor, clean: torch.Tensor, s0: torch.Tensor,
               freeze_scale: bool) -> torch.Tensor:
        """Logits [batch, pos, vocab] of resid + c w_out[j] (c: [batch, pos]), scale frozen at s0 or its own."""
        c = c[..., None].to(clean.dtype)
        if freeze_scale:
            return clean + (c / s0) * self.g(j)
        s = _scale_of(self.model, resid + c * self.w_out[j])
        r = s0 / s
        return r * clean + (1 - r) * self.beta + (c / s) * self.g(j)


@dataclass
class AblationEffects:
    """Per neuron, per prompt: summed changes ``{total,direct}_{entropy,loss,final}`` (bits) from mean ablation, and
    how they were computed: ``head`` (final norm and unembedding rerun on the edited residual) or ``full`` passes."""

    per_neuron: dict[int, dict[str, np.ndarray]]
    path: str


@torch.no_grad()
def ablation_effects(model, prompts, neurons: Sequence[int], *, layer: int = -1, clean: dict | None = None,
                     label_tokens: Sequence[int] | None = None, batch_size: int | None = None,
                     progress: bool = True) -> AblationEffects:
    """Mean-ablate each neuron of ``neurons`` alone; per neuron and per prompt, the summed change of entropy over all
    positions, of the loss over positions with a next token and of the final position's entropy, for the ``total``
    run and the ``direct`` run (final-norm scale frozen at its clean value); with ``label_tokens`` also ``label``,
    the change of the final position's entropy renormalised over them (the distribution a wind tunnel is trained
    and scored on). ``clean`` is ``final_norm_run``'s output for the same prompts and label tokens (computed when
    absent).

    In the last layer the neuron writes straight into the final residual, so the ablated residual is the clean one
    plus (mean - activation) w_out, and its logits follow from the clean ones through the head's affine form
    (``_RankOneHead``: elementwise work per ablation, one unembedding per batch). Full hooked passes check that
    shortcut for the first neuron on the first batch, and every pass is a full one if it does not hold, as for a
    model with a norm after its MLP. Other layers rerun the whole model with the ablation hooked on ``hook_post``."""
    from tqdm.auto import tqdm

    idx = _layer(model, layer)
    last = idx == model.cfg.n_layers - 1
    if clean is None or (last and "head_inputs" not in clean):
        clean = final_norm_run(model, prompts, layer=idx, label_tokens=label_tokens, batch_size=batch_size,
                               keep_head_inputs=last)
    if label_tokens is not None and np.isnan(clean["label_entropy"]).any():
        raise ValueError("The clean run has no label entropy; pass the same label_tokens to final_norm_run.")
    token_ids, batches = clean["token_ids"], clean["batches"]
    device = next(model.parameters()).device
    labels = torch.tensor(list(label_tokens), device=device) if label_tokens is not None else None
    metrics = ("entropy", "loss", "final") + (("label",) if labels is not None else ())
    means = torch.tensor(clean["means"], device=device)
    w_out = model.blocks[idx].mlp.W_out.detach()  # [d_mlp, d_model]
    n = len(token_ids)
    out = {int(j): {f"{cond}_{m}": np.zeros(n) for cond in ("total", "direct") for m in metrics} for j in neurons}
    head_only = last
    bar = tqdm(total=len(neurons) * len(batches), desc="ablations", disable=not progress)
    with _quiet_scale_edits():
        head = _RankOneHead(model, w_out) if last else None
        for step, (b, frozen) in enumerate(zip(batches, clean["scale_tensors"])):
            ids = torch.tensor([token_ids[i] for i in b], device=device)
            if head_only:
                resid, post = clean["head_inputs"][step]
                clean_logits = _head(model, resid, lambda t, hook: t.clone())  # the clean run's arithmetic
            for j in neurons:
                ablate = (POST_HOOK.format(layer=idx), _ablate([j], means[[j]]))
                for cond, scale_hook in (("total", lambda t, hook: t.clone()),
                                         ("direct", lambda t, hook, s=frozen: s.clone())):
                    full = None
                    if not head_only or (step == 0 and j == neurons[0]):  # the shortcut is checked once
                        with model.hooks(fwd_hooks=[ablate, (SCALE_HOOK, scale_hook)]):
                            full = model(ids)
                    if head_only:
                        logits = head.logits(j, means[j] - post[..., j], resid, clean_logits, frozen,
                                             freeze_scale=cond == "direct")
                        if full is not None and not torch.allclose(logits, full, rtol=1e-4, atol=1e-4):
                            head_only = False  # the shortcut does not hold for this model: full passes from now on
                            logits = full
                    else:
                        logits = full
                    stats = _batch_stats(logits, ids, labels)
                    for r, i in enumerate(b):
                        dh = as_float64(stats["entropy"][r]) - clean["entropy"][i]
                        out[int(j)][f"{cond}_entropy"][i] = dh.sum()
                        out[int(j)][f"{cond}_final"][i] = dh[-1]
                        out[int(j)][f"{cond}_loss"][i] = (as_float64(stats["loss"][r]) - clean["loss"][i]).sum()
                        if labels is not None:
                            out[int(j)][f"{cond}_label"][i] = (_label_entropy(stats["label_logprobs"][r])
                                                               - clean["label_entropy"][i])
                bar.update(1)
    bar.close()
    return AblationEffects(out, "head" if head_only else "full")


def _ratio_ci(num: np.ndarray, den: np.ndarray, n_boot: int, rng) -> tuple[float, list[float]]:
    """Token-weighted mean sum(num) / sum(den) over prompts, with a bootstrap interval over prompts."""
    boots = []
    for _ in range(n_boot):
        i = rng.integers(0, len(num), len(num))
        boots.append(num[i].sum() / max(den[i].sum(), 1))
    a = (1 - CI_LEVEL) / 2
    return float(num.sum() / max(den.sum(), 1)), [float(np.quantile(boots, a)), float(np.quantile(boots, 1 - a))]


def summarize_effects(effects: AblationEffects, clean: dict, *, n_boot: int = 1000, seed: int = 0) -> dict[int, dict]:
    """Per neuron: mean change per token (entropy, loss) or per prompt (final entropy, label entropy), total /
    direct / mediated, with bootstrap intervals over prompts, and the fraction of each effect mediated by the norm,
    1 - |direct| / |total| (Stolfo et al.)."""
    rng = np.random.default_rng(seed)
    counts = dict(entropy=np.array([len(h) for h in clean["entropy"]], dtype=float),
                  loss=np.array([len(x) for x in clean["loss"]], dtype=float), final=np.ones(len(clean["entropy"])),
                  label=np.ones(len(clean["entropy"])))
    out = {}
    for j, e in effects.per_neuron.items():
        s = {}
        for m in [m for m in counts if f"total_{m}" in e]:
            for cond in ("total", "direct"):
                s[f"{cond}_{m}"], s[f"{cond}_{m}_ci"] = _ratio_ci(e[f"{cond}_{m}"], counts[m], n_boot, rng)
            s[f"mediated_{m}"], s[f"mediated_{m}_ci"] = _ratio_ci(e[f"total_{m}"] - e[f"direct_{m}"], counts[m],
                                                                n_boot, rng)
            total = abs(s[f"total_{m}"])
            s[f"mediated_fraction_{m}"] = 1 - abs(s[f"direct_{m}"]) / total if total > 0 else float("nan")
        out[j] = s
    return out


def _percentile(values: np.ndarray, x: float) -> float:
    return float(np.mean(values <= x))


EFFECT_KEYS = ("total_entropy", "direct_entropy", "mediated_entropy", "total_loss", "direct_loss", "mediated_loss",
               "total_final", "direct_final", "mediated_final")
LABEL_EFFECT_KEYS = ("total_label", "direct_label", "mediated_label")  # with label tokens


@dataclass
class EntropyNeuronReport:
    """Candidates ranked by null-space write, their scores against all neurons of the layer, and their mean-ablation
    effects beside those of random neurons of the same layer."""

    layer: int
    null_space: dict
    candidates: list[dict]  # neuron, scores, percentiles among all neurons, effects
    random: list[dict]  # the same for random neurons (the ablation control)
    distribution: dict  # quantiles of each score over all neurons
    n_prompts: int
    n_tokens: int
    ablation_path: str  # "head" or "full" (``AblationEffects``)
    scores: dict = field(default_factory=dict, repr=False)  # score -> [d_mlp] list

    def group(self, key: str) -> dict:
        """Mean of an effect over the candidates, beside the random neurons' mean and 95% range."""
        cand = np.array([c["effects"][key] for c in self.candidates])
        rand = np.array([r["effects"][key] for r in self.random])
        a = (1 - CI_LEVEL) / 2
        return dict(candidates=float(cand.mean()), random_mean=float(rand.mean()) if len(rand) else float("nan"),
                    random_range=[float(np.quantile(rand, a)), float(np.quantile(rand, 1 - a))] if len(rand)
                    else [float("nan")] * 2, n_candidates=len(cand), n_random=len(rand))

    def rows(self) -> list[Row]:
        """Tidy rows: the null space's chance rho, each candidate's rho and norm against the distribution over all
        neurons (2.5-97.5%), its ablation effects with bootstrap intervals, and the candidates' mean effects against
        the random neurons' range."""
        unit = dict(entropy="bits per token", loss="bits per token", final="bits per prompt (final token)",
                    label="bits per prompt (final token, over the label tokens)")
        keys = EFFECT_KEYS + (LABEL_EFFECT_KEYS if "total_label" in self.candidates[0]["effects"] else ())
        out = [Row("null_space_chance_rho", self.null_space["chance_rho"], "fraction of |w|^2", dict(layer=self.layer),
                   n=self.null_space["k"], note="the rho of a random direction: k / d_model")]
        for rank, c in enumerate(self.candidates, 1):
            scope = dict(layer=self.layer, neuron=c["neuron"], rank=rank)
            for score, u in (("rho", "fraction of |w|^2"), ("norm", "|w_out|")):
                d = self.distribution[score]
                out.append(Row(f"neuron_{score}", c[score], u, dict(scope), null_low=d["q025"], null_high=d["q975"],
                               null="all neurons of the layer, 2.5-97.5%"))
            for key in keys:
                e = c["effects"]
                out.append(Row(f"ablation_{key}", e[key], unit[key.split("_")[1]], dict(scope), e[f"{key}_ci"][0],
                               e[f"{key}_ci"][1], "bootstrap 95%", n=self.n_prompts))
        for key in keys:
            g = self.group(key)
            out.append(Row(f"ablation_{key}_candidates_mean", g["candidates"], unit[key.split("_")[1]],
                           dict(layer=self.layer), null_low=g["random_range"][0], null_high=g["random_range"][1],
                           null=f"{g['n_random']} random neurons", n=g["n_candidates"]))
        return out


def entropy_neurons(model, prompts, *, layer: int = -1, top_n: int = 5, n_random: int = 5, null_dim: int | None = None,
                    null: NullSpace | None = None, label_tokens: Sequence[int] | None = None, seed: int = 0,
                    batch_size: int | None = None, n_boot: int = 1000, progress: bool = True) -> EntropyNeuronReport:
    """Find and test entropy-neuron candidates in ``layer``'s MLP (default the last).

    Candidates are the ``top_n`` neurons with the largest null-space write sqrt(rho) |w_out|; each is mean-ablated
    alone on ``prompts`` (texts or token ids), as are ``n_random`` other neurons drawn with ``seed``, and the total,
    direct (final-norm scale frozen) and norm-mediated effects on entropy and loss (and, with ``label_tokens``, on
    the final position's entropy over them) are reported with bootstrap intervals over prompts. ``null``: the null
    space to rank by (default ``unembedding_null_space(model, null_dim)``). Works for LayerNorm and RMSNorm models.
    """
    idx = _layer(model, layer)
    null = null or unembedding_null_space(model, null_dim)
    scores = neuron_scores(model, idx, null)
    order = np.argsort(-scores["null_norm"], kind="stable")
    cands = order[:top_n].tolist()
    rng = np.random.default_rng(seed)
    rest = np.setdiff1d(np.arange(len(order)), cands)
    rand = sorted(rng.choice(rest, size=min(n_random, len(rest)), replace=False).tolist())
    clean = final_norm_run(model, prompts, layer=idx, label_tokens=label_tokens, batch_size=batch_size,
                           keep_head_inputs=idx == model.cfg.n_layers - 1)
    ablations = ablation_effects(model, prompts, cands + rand, layer=idx, clean=clean, label_tokens=label_tokens,
                                 batch_size=batch_size, progress=progress)
    effects = summarize_effects(ablations, clean, n_boot=n_boot, seed=seed)

    def describe(j: int) -> dict:
        d = dict(neuron=int(j), **{s: float(v[j]) for s, v in scores.items()},
                 percentile={s: _percentile(v, v[j]) for s, v in scores.items()},
                 mean_activation=float(clean["means"][j]), effects=effects[j])
        return d

    dist = {s: dict(median=float(np.median(v)), q025=float(np.quantile(v, 0.025)),
                    q975=float(np.quantile(v, 0.975)), max=float(v.max())) for s, v in scores.items()}
    return EntropyNeuronReport(layer=idx, null_space=null.summary(), candidates=[describe(j) for j in cands],
                               random=[describe(j) for j in rand], distribution=dist, n_prompts=len(clean["token_ids"]),
                               n_tokens=int(sum(map(len, clean["token_ids"]))), ablation_path=ablations.path,
                               scores={s: v.tolist() for s, v in scores.items()})


# ---------------------------------------------------------------------------------------------------------------
# token frequency


def unigram_counts(model, texts_or_ids) -> np.ndarray:
    """[vocab] token counts over texts (tokenised with the checkpoint's own tokenizer) or token-id lists, e.g. the
    prompt pool or a ``datasets`` corpus's text column."""
    from .extract import tokenize

    flat = [t for ids in tokenize(model, list(texts_or_ids)) for t in ids]
    return np.bincount(np.asarray(flat, dtype=np.int64), minlength=model.cfg.d_vocab).astype(np.float64)


def frequency_neurons(model, counts, *, layer: int = -1, top_n: int = 10, min_count: int = 1, n_random: int = 200,
                      seed: int = 0) -> dict:
    """Neurons whose logit effect U^T w_out follows log unigram frequency (Stolfo et al.'s token-frequency neurons).

    Over the tokens seen at least ``min_count`` times: the Pearson r of each neuron's logit effect with log
    frequency; the ``top_n`` by |r|, each with its percentile among all neurons; the null, r for ``n_random`` random
    residual directions; and the ceiling, r of the best direction (least squares of log frequency on U's columns).
    """
    idx = _layer(model, layer)
    counts = as_float64(counts)
    seen = np.flatnonzero(counts >= min_count)
    centred = _centred(model)
    u = np.concatenate([cols_u[:, np.isin(np.arange(cols.start, cols.stop), seen)]
                        for cols, cols_u in _unembedding_columns(model, centred)], axis=1)  # [d, n_seen]
    logf = np.log(counts[seen] / counts.sum())
    z = (logf - logf.mean()) / logf.std()

    def corr(writes: np.ndarray) -> np.ndarray:  # [m, d] -> Pearson r of each row's logit effect with log f
        eff = writes @ u
        eff = (eff - eff.mean(1, keepdims=True)) / eff.std(1, keepdims=True)
        return eff @ z / len(z)

    r = corr(_effective(_w_out(model, idx), centred))
    rng = np.random.default_rng(seed)
    null = corr(_effective(rng.standard_normal((n_random, u.shape[0])), centred))
    best, *_ = np.linalg.lstsq(u.T, z, rcond=None)
    top = np.argsort(-np.abs(r), kind="stable")[:top_n]
    a = (1 - CI_LEVEL) / 2
    return dict(layer=idx, n_tokens_seen=int(len(seen)), n_token_count=int(counts.sum()), min_count=min_count,
                top=[dict(neuron=int(j), r=float(r[j]), abs_percentile=_percentile(np.abs(r), abs(r[j])))
                     for j in top],
                null_range=[float(np.quantile(null, a)), float(np.quantile(null, 1 - a))], n_random=n_random,
                ceiling_r=correlations(u.T @ best, z)["pearson"], all_r=r.tolist())
