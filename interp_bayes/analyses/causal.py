"""Where the uncertainty is computed: distributed alignment search (DAS; Geiger et al. 2023/2024, pyvene's method)
at one site of one layer, beside the entropy axes.

An interchange intervention runs a base prompt with the d coordinates of its site vector (the residual stream after
a block, or the values at ``hook_v``, at the final position) in a subspace replaced by a source prompt's: with Q the
[dim, d] orthonormal basis of the subspace, ``h_base + (h_source - h_base) Q Q^T``, then the forward continues.
DAS learns Q (``torch.nn.utils.parametrizations.orthogonal`` on a d x dim map: only the span matters, so a
d-column orthonormal basis stands for the full rotation's first d rows) so that the intervened output matches a
target: the source's exact posterior, or the model's own output on the source; the loss is KL(target ||
intervened).

Evaluated on held-out pairs (``das_report``: folds of whole groups, a base and its source both held out, trained on
the other folds): the interchange-intervention accuracy (IIA), the share of the target's entropy difference from the
base that the intervention transfers (the least-squares slope through 0 of the intervened entropy change on the
target's, pooled over pairs: 1 moves the base's uncertainty all the way to the source's, 0 not at all), and the KL
to the target; against the same interchange on the span of the PC1 and ridge entropy axes (fitted on the training
folds, completed to d with random directions) and on random d-dim subspaces (a null drawn until settled,
``stats.sequential``). The principal angles between the DAS subspace and each axis are set against those of random
d-dim subspaces.

A site is model-agnostic (``Site``): the clean site vectors of every prompt and a continuation that runs base
prompts with new vectors at the site; ``model_site`` builds one for a TransformerLens bridge (a wind tunnel or an
LLM), replaying the blocks before the site from a captured residual (``model.prefix``), so a training step pays
only for the blocks after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from scipy.linalg import subspace_angles

from ..core.results import Row
from ..core.stop import check_stop
from ..model.hooks import reading_hook
from ..model.prefix import capture_residuals, replay_prefix
from ..model.read import final_logits, final_position_tail, length_batches, read, tokenize
from ..stats import as_float64, bootstrap_ratio, group_folds, interval, sequential_test
from ..stats.info import entropy_of_log_probs, kl
from .axis import fit_direction

SITES = ("resid", "v")
TARGETS = ("bayes", "model")  # the source's exact posterior, or the model's own output on the source


@dataclass
class Site:
    """One site of one layer, model-agnostic: every prompt's clean vector there and the continuation.

    ``run(base, new)``: the log-probabilities over the labels ([c * b, n_labels], differentiable in ``new``) of the
    base prompts ``base`` ([b] rows, all of one batch of ``batches``) with their site vector replaced by ``new``
    ([c * b, dim]: c stacked copies of the batch, copy j in rows j*b..(j+1)*b)."""

    h: torch.Tensor  # [n, dim] float32, clean site vectors at the final position
    run: Callable[[np.ndarray, torch.Tensor], torch.Tensor]
    batches: list[np.ndarray]  # rows that run together (equal token length)
    clean: torch.Tensor | None = None  # [n, n_labels] the unedited log-probabilities (computed on first use)

    def batch_of(self) -> np.ndarray:
        out = np.empty(len(self.h), dtype=np.int64)
        for j, rows in enumerate(self.batches):
            out[rows] = j
        return out

    def clean_logp(self) -> torch.Tensor:
        if self.clean is None:
            with torch.no_grad():
                parts = {}
                for rows in self.batches:
                    parts.update(zip(rows.tolist(), self.run(rows, self.h[rows])))
            self.clean = torch.stack([parts[i] for i in range(len(self.h))]).float()
        return self.clean


def log_target(p: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of a target distribution with zeros (an exact posterior), floored at 1e-30 so that a zero
    contributes 1e-30 (log 1e-30 - log q), below float32's resolution of any KL here, to ``stats.info.kl``."""
    return p.clamp_min(1e-30).log()


def orthonormal(x: np.ndarray) -> np.ndarray:
    """[dim, d] -> an orthonormal basis of its column span (QR in float64)."""
    return np.linalg.qr(as_float64(x))[0]


def random_subspaces(dim: int, d: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """[count, dim, d] orthonormal bases of uniformly random d-dim subspaces (QR of Gaussian matrices)."""
    return np.linalg.qr(rng.standard_normal((count, dim, d)))[0]


def completed(axes: np.ndarray, d: int, rng: np.random.Generator) -> np.ndarray:
    """[dim, d]: the first min(d, a) of the [dim, a] ``axes`` (their span), completed to d dimensions with random
    directions orthogonal to them."""
    a = orthonormal(axes[:, :min(d, axes.shape[1])])
    extra = rng.standard_normal((axes.shape[0], d - a.shape[1]))
    extra -= a @ (a.T @ extra)
    return orthonormal(np.column_stack([a, extra]))


def angles_deg(q: np.ndarray, axis: np.ndarray) -> float:
    """The principal angle (degrees) between the span of ``q`` ([dim, d]) and a direction (or the largest between
    two spans): ``scipy.linalg.subspace_angles``."""
    return float(np.degrees(subspace_angles(q, axis.reshape(len(axis), -1)).max()))


def draw_sources(base: np.ndarray, pool: np.ndarray, strata: np.ndarray, evidence: np.ndarray, groups: np.ndarray,
                 rng: np.random.Generator) -> np.ndarray:
    """For each base row, a source row from ``pool`` in its stratum (the same k or query position), with other
    evidence (another posterior) and from another group; -1 where none exists."""
    out = np.full(len(base), -1, dtype=np.int64)
    for i, b in enumerate(base):
        ok = pool[(strata[pool] == strata[b]) & (evidence[pool] != evidence[b]) & (groups[pool] != groups[b])]
        if len(ok):
            out[i] = rng.choice(ok)
    return out


def interchange(site: Site, base: np.ndarray, source: np.ndarray, bases: torch.Tensor,
                chunk_rows: int = 512) -> torch.Tensor:
    """[c, len(base), n_labels] log-probabilities of each base run with its vector in each of the c subspaces
    ``bases`` ([c, dim, d], orthonormal columns; differentiable) taken from its source. Runs per batch of equal
    length, up to ``chunk_rows`` stacked rows a forward."""
    c = bases.shape[0]
    out = [None] * len(base)
    batch = site.batch_of()[base]
    for j in np.unique(batch):
        check_stop()  # a SIGTERM stops here, between forwards
        where = np.flatnonzero(batch == j)
        b, s = base[where], source[where]
        hb, hs = site.h[b], site.h[s]  # [m, dim]
        new = hb[None] + torch.einsum("md,cde,cfe->cmf", hs - hb, bases, bases)  # [c, m, dim]
        per = max(1, chunk_rows // max(1, len(b)))
        parts = [site.run(b, new[k:k + per].reshape(-1, new.shape[-1])) for k in range(0, c, per)]
        lp = torch.cat(parts).reshape(c, len(b), -1)  # [c, m, n_labels]
        for t, i in enumerate(where):
            out[i] = lp[:, t]
    return torch.stack(out, 1)


@dataclass(frozen=True)
class Training:
    """How DAS trains a subspace: ``steps`` of Adam at ``lr`` on minibatches of up to ``batch`` pairs."""

    steps: int = 200
    lr: float = 0.01
    batch: int = 64


def train_das(site: Site, pool: np.ndarray, targets: torch.Tensor, d: int, *, strata, evidence, groups,
              training: Training = Training(), seed: int = 0, frozen: bool = False) -> np.ndarray:
    """[dim, d] orthonormal basis of the DAS subspace, trained by interchange interventions between rows of ``pool``
    (base and source drawn afresh each step: same stratum, other evidence, other group) to bring the intervened
    output to ``targets[source]`` ([n, n_labels] probabilities). ``frozen``: the rotation left at the identity (the
    first d coordinates), untrained: the control that the planted check must fail."""
    dim = site.h.shape[1]
    if frozen:
        return np.eye(dim, d)
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    layer = torch.nn.Linear(dim, d, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(d, dim, generator=gen))
    torch.nn.utils.parametrizations.orthogonal(layer)  # rows orthonormal: a rotation's first d rows
    opt = torch.optim.Adam(layer.parameters(), lr=training.lr)
    batch_of = site.batch_of()
    pool_batches = [pool[batch_of[pool] == j] for j in np.unique(batch_of[pool])]
    weights = np.array([len(p) for p in pool_batches], dtype=np.float64)
    for _ in range(training.steps):
        rows = pool_batches[rng.choice(len(pool_batches), p=weights / weights.sum())]
        base = rng.choice(rows, size=min(training.batch, len(rows)), replace=False)
        source = draw_sources(base, pool, strata, evidence, groups, rng)
        base, source = base[source >= 0], source[source >= 0]
        if not len(base):
            continue
        q = layer.weight.T  # [dim, d]
        lp = interchange(site, base, source, q[None])[0]
        loss = kl(log_target(targets[source]), lp).mean()
        opt.zero_grad()
        loss.backward(inputs=list(layer.parameters()))
        opt.step()
    return orthonormal(layer.weight.detach().T.double().numpy())


def transfer(lp: torch.Tensor, clean: torch.Tensor, target: torch.Tensor) -> tuple[np.ndarray, np.ndarray,
                                                                                   np.ndarray]:
    """Per pair: (ΔH_intervened · ΔH_target, ΔH_target², KL(target || intervened) in bits), the entropy changes taken
    from the base's clean output; the IIA is the ratio of the sums of the first two."""
    d_int = (entropy_of_log_probs(lp) - entropy_of_log_probs(clean)).double()
    d_tgt = (entropy_of_log_probs(log_target(target)) - entropy_of_log_probs(clean)).double()
    return (d_int * d_tgt).numpy(), (d_tgt ** 2).numpy(), kl(log_target(target), lp).double().numpy()


def iia_of(num: np.ndarray, den: np.ndarray) -> float:
    total = den.sum()
    return float(num.sum() / total) if total > 0 else float("nan")


@dataclass
class DASResult:
    """Per d, pooled over the held-out folds: the DAS subspace's IIA and KL, the entropy axes', the random null,
    and the principal angles to each axis with their random null."""

    rows: list[Row]
    bases: dict = field(default_factory=dict)  # d -> [folds] DAS bases [dim, d]


def das_report(site: Site, targets: np.ndarray, *, strata, evidence, groups, entropy, ds=(1, 2, 4, 8),
               folds: int = 2, training: Training = Training(), n_null: int = 250, n_angle_null: int = 2000,
               n_boot: int = 1000, seed: int = 0, scope: dict | None = None) -> DASResult:
    """DAS at one site for each d in ``ds``, evaluated on held-out pairs in ``folds`` folds of whole ``groups``.

    ``targets`` ([n, n_labels] probabilities) is what a source should make of a base; ``entropy`` ([n], bits) the
    model's entropy the entropy axes (``analyses.axis.fit_direction``: PC1, ridge) are fitted to on the training
    folds. Rows per d (``scope`` plus ``d``): ``iia`` (bootstrap interval over groups; random-subspace null drawn
    until the test against it is settled, at most ``n_null`` draws), ``iia_axes`` (the axes' span completed to d),
    ``kl_target`` (DAS, axes, and the null's range), ``angle_pc1`` / ``angle_ridge`` (degrees, the mean over folds,
    against random d-dim subspaces, at most ``n_angle_null`` draws)."""
    scope = dict(scope or {})
    strata, evidence, groups = np.asarray(strata), np.asarray(evidence), np.asarray(groups)
    t = torch.as_tensor(np.asarray(targets), dtype=torch.float32)
    clean = site.clean_logp()
    h = site.h.double().numpy()
    dim = h.shape[1]
    rng = np.random.default_rng(seed)
    split = []  # per fold: train rows, held-out bases and sources, axes [dim, 2]
    for train, test in group_folds(groups, folds, seed=seed):
        src = draw_sources(test, test, strata, evidence, groups, rng)
        axes = np.column_stack([fit_direction(h[train], entropy[train], m) for m in ("pc1", "ridge")])
        split.append((train, test[src >= 0], src[src >= 0], axes))
    base = np.concatenate([s[1] for s in split])
    pair_groups = groups[base]

    def scores(per_fold_bases) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Pooled (num, den, kl) per pair for one basis per fold ([folds] of [c, dim, d]): [c, pairs] each."""
        num, den, kl = [], [], []
        with torch.no_grad():
            for (_, b, s, _), q in zip(split, per_fold_bases):
                lp = interchange(site, b, s, torch.as_tensor(q, dtype=torch.float32))
                parts = [transfer(lp[j], clean[b], t[s]) for j in range(lp.shape[0])]
                num.append(np.stack([p[0] for p in parts]))
                den.append(np.stack([p[1] for p in parts]))
                kl.append(np.stack([p[2] for p in parts]))
        return np.concatenate(num, 1), np.concatenate(den, 1), np.concatenate(kl, 1)

    rows, bases = [], {}
    for d in ds:
        at = dict(scope, d=d)
        q_das = [train_das(site, tr, t, d, strata=strata, evidence=evidence, groups=groups, training=training,
                           seed=seed + 1000 * d + f) for f, (tr, *_) in enumerate(split)]
        bases[d] = q_das
        q_axes = [completed(ax, d, rng) for *_, ax in split]
        num, den, kl = scores([q[None] for q in q_das])
        num_a, den_a, kl_a = scores([q[None] for q in q_axes])
        null_rng = np.random.default_rng([seed, d])
        null_kl: list[float] = []

        def draw(b: int) -> np.ndarray:
            qs = [random_subspaces(dim, d, b, null_rng) for _ in split]
            n_, d_, k_ = scores(qs)
            null_kl.extend(k_.mean(1).tolist())
            return np.array([iia_of(n_[j], d_[j]) for j in range(b)])

        value, ci = bootstrap_ratio(num[0], den[0], pair_groups, n_boot=n_boot, seed=seed)
        test = sequential_test(draw, value, alternative="greater", cap=n_null, batch=min(50, n_null))
        n_pairs = len(base)
        rows.append(Row("iia", value, "share of ΔH", dict(at), ci[0], ci[1], "bootstrap 95%", *test.null,
                        f"random {d}-dim subspaces ({test.draws} draws)", n_pairs, test=test.as_dict()))
        value_a, ci_a = bootstrap_ratio(num_a[0], den_a[0], pair_groups, n_boot=n_boot, seed=seed)
        rows.append(Row("iia_axes", value_a, "share of ΔH", dict(at), ci_a[0], ci_a[1], "bootstrap 95%",
                        *test.null, f"random {d}-dim subspaces", n_pairs,
                        note="PC1 (and ridge from d = 2) entropy axes, completed to d with random directions"))
        kl_null = interval(null_kl)
        for metric, k in (("kl_target", kl), ("kl_target_axes", kl_a)):
            rows.append(Row(metric, float(k[0].mean()), "bits", dict(at), null_low=kl_null[0], null_high=kl_null[1],
                            null="random subspaces", n=n_pairs))
        for j, name in enumerate(("pc1", "ridge")):
            observed = float(np.mean([angles_deg(q, ax[:, j]) for q, (*_, ax) in zip(q_das, split)]))
            angle_rng = np.random.default_rng([seed, d, j])

            def draw_angles(b: int, j=j, angle_rng=angle_rng) -> np.ndarray:
                return np.array([np.mean([angles_deg(q, ax[:, j]) for q, (*_, ax) in
                                          zip(random_subspaces(dim, d, len(split), angle_rng), split)])
                                 for _ in range(b)])

            test_a = sequential_test(draw_angles, observed, alternative="less", cap=n_angle_null)
            rows.append(Row(f"angle_{name}", observed, "degrees", dict(at), null_low=test_a.null[0],
                            null_high=test_a.null[1], null=f"random {d}-dim subspaces ({test_a.draws} draws)",
                            n=folds, note="principal angle, mean over folds", test=test_a.as_dict()))
    return DASResult(rows, bases)


def model_site(model, prompts, layer: int, reading: str, label_tokens, *, batch_size: int | None = None) -> Site:
    """The ``Site`` of a TransformerLens bridge (an LLM or a wind tunnel) at ``layer`` (non-negative) and
    ``reading`` ("resid": after the block; "v": ``hook_v``, all key/value heads concatenated), final position.

    One clean pass per batch of equal length captures the residual entering the first block the edit can change
    (``model.prefix.capture_residuals``); each interchange replays it (``replay_prefix``) with the final position's
    vector replaced, so only the blocks from the site on compute. Log-probabilities are over ``label_tokens``."""
    token_ids = tokenize(model, prompts)
    device = next(model.parameters()).device
    labels = torch.tensor(list(label_tokens), device=device)
    start = layer + 1 if reading == "resid" else layer  # the first block an edit at the site changes
    batches = [np.asarray(b) for b in length_batches(token_ids, batch_size)]
    where = {}  # row -> (batch, position in it)
    captured, h = [], torch.empty(len(token_ids), 0)
    v_hook = reading_hook("v", layer)
    for j, rows in enumerate(batches):
        ids = torch.tensor([token_ids[i] for i in rows], device=device)
        # the clean pass of the batch: ``read`` keeps the site's vectors (blocks up to the site, whole), and the
        # residual entering ``start`` is captured for the replays
        with capture_residuals(model, [start]) as store:
            vec = read(model, ids, [(layer, reading)], batch_size=len(rows), distribution=False).reading(reading, layer)
        captured.append(store.get(start))
        if h.shape[1] == 0:
            h = torch.empty(len(token_ids), vec.shape[1])
        h[torch.as_tensor(rows)] = vec
        for p, i in enumerate(rows.tolist()):
            where[i] = (j, p)

    def run(base: np.ndarray, new: torch.Tensor) -> torch.Tensor:
        j = where[int(base[0])][0]
        pos = torch.tensor([where[int(i)][1] for i in base])
        copies = new.shape[0] // len(base)
        ids = torch.tensor([token_ids[i] for i in base], device=device).repeat(copies, 1)
        res = captured[j]
        hidden = res[0] if isinstance(res, tuple) else res
        if res is not None:
            hidden = hidden[pos.to(hidden.device)].repeat(copies, *([1] * (hidden.dim() - 1)))
        new = new.to(device)
        hooks = final_position_tail(model)
        if reading == "resid":
            hidden = torch.cat([hidden[:, :-1], new[:, None].to(hidden.dtype)], 1)
        else:
            def swap(act, hook):
                return torch.cat([act[:, :-1], new.reshape(act.shape[0], 1, *act.shape[2:]).to(act.dtype)], 1)
            hooks = [(v_hook, swap)] + hooks
        replay = None if res is None else ((hidden, *res[1:]) if isinstance(res, tuple) else hidden)
        with replay_prefix(model, start, replay), model.hooks(fwd_hooks=hooks):  # an edit: the new site vectors
            logits = final_logits(model, ids)
        return torch.log_softmax(logits.float()[:, labels], dim=-1).cpu()

    return Site(h, run, batches)
