"""The unembedding side of the entropy-neuron mechanism (Stolfo et al. 2024, ``analyses.neurons``), from the
weights alone: the unembedding's effective null space, each MLP neuron's write and its scores against it, and
token-frequency neurons.

Effective unembedding. The logits are W_U^T (g * P x / s + b) + b_U, with g the final norm's weight, P the centring
of LayerNorm (identity for RMSNorm) and s the norm scale (``ln_final.hook_scale``). Softmax ignores a constant added
to every logit, so the unembedding is also centred over the vocabulary (C). The effective unembedding is
U = P diag(g) W_U C ([d_model, vocab]): the authors' W_U as TransformerLens processes it by default (the final
norm folded in, ``center_unembed``, and for LayerNorm ``center_writing_weights``). The null space V0 is spanned by
U's k = max(10, 1% of d_model) bottom left-singular directions (within the centred subspace for LayerNorm, whose
all-ones direction the norm never sees). When the vocabulary is smaller than d_model (wind tunnels), U has an exact
kernel and the null space is at least that kernel. A model scored on a few tokens only (a wind tunnel's hypotheses)
has U restricted to their columns (``tokens``): its null space is what leaves their distribution unchanged.

A neuron's write is what the block adds to the residual stream when the neuron moves: c w_out (c its change of
activation) where the MLP's output is added as it is, and the measured change post(h + c w_out) - post(h) where the
block normalises its MLP's output first (Gemma 2/3's ``post_feedforward_layernorm``, TransformerLens's ``ln2_post``;
h the MLP's output): that change is not proportional to w_out and depends on h, so it is taken at every position of
the prompts with c the mean ablation's (mean - activation).

Per neuron (the authors' definitions, ``get_potential_entropy_neurons_udark`` in their ``utils.py``): ``rho`` =
|V0^T P w| / |P w|, the fraction of the write's *norm* in the null space (pooled over positions for a measured write:
sqrt(sum |V0^T P dx|^2 / sum |P dx|^2)); a random direction has rho about ``chance`` = sqrt(k / effective dimension);
``norm`` = |P w_out| (measured: sqrt(sum |P dx|^2 / sum c^2), the write per unit of activation); ``null_norm`` =
rho * norm (|V0^T P w|); ``logit_var`` = the variance over the vocabulary of the cosine between the write and each
token's unembedding column (the paper's LogitVar: low for entropy neurons). Candidates are the neurons with the
largest rho, as the authors rank them (no threshold on the norm).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from ..core.errors import UnsupportedModelError
from ..core.layers import layer_index
from ..model.read import tokenize
from ..stats.pca import correlations
from ..stats import as_float64, interval, percentile_of

def _gain(norm) -> np.ndarray:
    """A norm bridge's effective per-coordinate weight g (1 + w where the norm stores an offset, as Gemma's)."""
    w = as_float64(norm.original_component.weight.detach())
    return 1.0 + w if norm.uses_weight_offset else w


def _norm_weight(model) -> np.ndarray:
    """The final norm's effective per-coordinate weight g."""
    return _gain(model.ln_final)


def _centred(model) -> bool:
    """True for LayerNorm (the residual is centred before the scale), False for RMSNorm."""
    return not model.ln_final.uses_rms_norm


def _effective(w: np.ndarray, centred: bool) -> np.ndarray:
    """Rows of residual writes as the final norm sees them: centred over d_model for LayerNorm."""
    return w - w.mean(axis=-1, keepdims=True) if centred else w


@dataclass(frozen=True)
class PostNorm:
    """The RMSNorm a block applies to its MLP's output before adding it to the residual (Gemma 2/3):
    post(x) = g * x / r(x), r(x) = sqrt(mean(x^2) + eps). For x = h + c w the change is
    post(h + c w) - post(h) = g * (a h + b w) with a = 1 / r(h + c w) - 1 / r(h) and b = c / r(h + c w)."""

    gain: np.ndarray  # [d_model]
    eps: float

    def coefficients(self, h, c, w):
        """(a, b) for MLP outputs h [..., d], activation changes c [..., n] and output weights w [n, d]: [..., n]
        each (numpy float64 or torch tensors alike)."""
        d = h.shape[-1]
        hh = (h * h).sum(-1)[..., None]
        r = ((hh / d) + self.eps) ** 0.5
        r_new = ((hh + 2 * c * (h @ w.T) + c * c * (w * w).sum(-1)) / d + self.eps) ** 0.5
        return 1 / r_new - 1 / r, c / r_new


def post_mlp_norm(model, layer: int) -> PostNorm | None:
    """The norm ``layer``'s block applies to its MLP's output (TransformerLens's ``ln2_post``), or None where the MLP's
    output is added to the residual as it is."""
    norm = getattr(model.blocks[layer_index(layer, model.cfg.n_layers)], "ln2_post", None)
    if norm is None:
        return None
    if not norm.uses_rms_norm:
        raise UnsupportedModelError("This model normalises its MLP output with a LayerNorm; the entropy-neuron "
                                    "analyses support an RMSNorm there (Gemma 2/3) or none.")
    module = norm.original_component
    eps = getattr(module, "eps", None)
    return PostNorm(_gain(norm), float(getattr(module, "variance_epsilon", 1e-6) if eps is None else eps))


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
        """The root-mean-square rho of a uniformly random direction: sqrt(k / effective dimension)."""
        return math.sqrt(self.k / len(self.singular_values))

    def effective(self, w) -> np.ndarray:
        return _effective(as_float64(w), self.centred)

    def rho(self, w) -> np.ndarray:
        """|V0^T w| / |w| of the effective w (the authors' ``norm_fraction_on_U_entropy``), for a vector or the rows
        of a matrix."""
        w = self.effective(w)
        return np.linalg.norm(w @ self.basis, axis=-1) / np.linalg.norm(w, axis=-1)

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


def _scores_from_forms(sq, null_sq, gram_sq, mean_sq, unit_sq) -> dict[str, np.ndarray]:
    """Scores from pooled quadratic forms of the writes: |P w|^2, |V0^T w|^2, w^T N w, (w . mu)^2 and the squared
    activation changes they came from (1 for a weight)."""
    live = sq > 0  # a neuron that never leaves its mean writes nothing: no direction, scores 0
    safe = np.where(live, sq, 1.0)
    rho = np.where(live, np.sqrt(np.clip(null_sq, 0.0, None) / safe), 0.0)
    norm = np.where(live, np.sqrt(sq / np.where(unit_sq > 0, unit_sq, 1.0)), 0.0)
    return dict(norm=norm, rho=rho, null_norm=rho * norm, logit_var=np.where(live, (gram_sq - mean_sq) / safe, 0.0))


def _measured_write_forms(null: NullSpace, post: PostNorm, w: np.ndarray, means: np.ndarray, inputs):
    """Pooled quadratic forms of the measured writes dx = g * (a h + b w) over every position of the clean run's
    batches ``inputs`` ([(MLP activations [b, pos, n], MLP outputs [b, pos, d])]), without forming dx: each form of
    a h + b w expands into forms of h, of w and between them, products over d_model only."""
    y = null.effective(post.gain * w)  # [n, d]
    yv, yn, ym = y @ null.basis, y @ null.norm_gram, y @ null.norm_mean
    n = len(w)
    acc = {key: np.zeros(n) for key in ("sq", "null_sq", "gram_sq", "mean_sq", "unit_sq")}
    for act, h in inputs:
        act = as_float64(act).reshape(-1, n)  # [P, n]
        h = as_float64(h).reshape(len(act), -1)  # [P, d]
        c = means[None, :] - act
        a, b = post.coefficients(h, c, w)
        x = null.effective(post.gain * h)  # [P, d]
        xv, xm = x @ null.basis, x @ null.norm_mean
        for key, xx, xy, yy in (("sq", (x * x).sum(1), x @ y.T, (y * y).sum(1)),
                                ("null_sq", (xv * xv).sum(1), xv @ yv.T, (yv * yv).sum(1)),
                                ("gram_sq", ((x @ null.norm_gram) * x).sum(1), x @ yn.T, (yn * y).sum(1))):
            acc[key] += (a * a * xx[:, None] + 2 * a * b * xy + b * b * yy[None, :]).sum(0)
        acc["mean_sq"] += ((a * xm[:, None] + b * ym[None, :]) ** 2).sum(0)
        acc["unit_sq"] += (c * c).sum(0)
    return acc


def neuron_scores(model, layer: int = -1, null: NullSpace | None = None,
                  clean: dict | None = None) -> dict[str, np.ndarray]:
    """Per neuron of ``layer``'s MLP: norm, rho, null_norm and logit_var (module docstring), as float64 arrays, and
    ``write``: what they are of ("W_out", or "measured" through a post-MLP norm).

    Where the block normalises its MLP's output (``post_mlp_norm``) the write depends on the activations: ``clean``
    must then be ``final_norm_run``'s output for the prompts with ``keep_head_inputs=True`` (its MLP outputs and
    activations)."""
    idx = layer_index(layer, model.cfg.n_layers)
    null = null or unembedding_null_space(model)
    post = post_mlp_norm(model, idx)
    w = _w_out(model, idx)
    if post is None:
        we = null.effective(w)
        sq = (we**2).sum(axis=1)
        out = _scores_from_forms(sq, ((we @ null.basis) ** 2).sum(1), np.einsum("nd,de,ne->n", we, null.norm_gram, we),
                                 (we @ null.norm_mean) ** 2, np.ones(len(w)))
        return dict(out, write="W_out")
    if clean is None or not clean.get("head_inputs") or clean["head_inputs"][0][2] is None or clean.get("layer") != idx:
        raise ValueError(f"Layer {idx} normalises its MLP output, so a neuron's write depends on its activations: "
                         "pass clean=final_norm_run(model, prompts, layer=..., keep_head_inputs=True).")
    forms = _measured_write_forms(null, post, w, clean["means"], [(p, h) for _, p, h in clean["head_inputs"]])
    return dict(_scores_from_forms(**forms), write="measured")


# ---------------------------------------------------------------------------------------------------------------
# token frequency


def unigram_counts(model, texts_or_ids) -> np.ndarray:
    """[vocab] token counts over texts (tokenised with the checkpoint's own tokenizer) or token-id lists, e.g. the
    prompt pool or a ``datasets`` corpus's text column."""
    flat = [t for ids in tokenize(model, list(texts_or_ids)) for t in ids]
    return np.bincount(np.asarray(flat, dtype=np.int64), minlength=model.cfg.d_vocab).astype(np.float64)


def frequency_neurons(model, counts, *, layer: int = -1, top_n: int = 10, min_count: int = 1, n_random: int = 200,
                      seed: int = 0) -> dict:
    """Neurons whose logit effect U^T w_out follows log unigram frequency (Stolfo et al.'s token-frequency neurons).

    Over the tokens seen at least ``min_count`` times: the Pearson r of each neuron's logit effect with log
    frequency; the ``top_n`` by |r|, each with its percentile among all neurons; the null, r for ``n_random`` random
    residual directions; and the ceiling, r of the best direction (least squares of log frequency on U's columns).
    """
    idx = layer_index(layer, model.cfg.n_layers)
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
    return dict(layer=idx, n_tokens_seen=int(len(seen)), n_token_count=int(counts.sum()), min_count=min_count,
                top=[dict(neuron=int(j), r=float(r[j]), abs_percentile=percentile_of(abs(r[j]), np.abs(r)))
                     for j in top],
                null_range=interval(null), n_random=n_random,
                ceiling_r=correlations(u.T @ best, z)["pearson"], all_r=r.tolist())
