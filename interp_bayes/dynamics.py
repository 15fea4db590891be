"""Paper II: gradient dynamics of attention (methods.md §2), and the frame-precision dissociation (§1.7d).

Three parts:

1. **The laws in closed form.** One causal head, row convention: ``s = q k^T / sqrt(d_k)`` (future masked),
   ``alpha = softmax_j(s)``, ``o = alpha v``, upstream signal ``u_i = dL/do_i``, ``b_ij = u_i . v_j``. Then
   ``dL/ds_ij = alpha_ij (b_ij - E_alpha_i[b])`` (advantage routing), ``dL/dv_j = sum_i alpha_ij u_i``
   (responsibility-weighted values), ``dL/dq_i = sum_j dL/ds_ij k_j / sqrt(d_k)``, ``dL/dk_j = sum_i dL/ds_ij q_i /
   sqrt(d_k)``. With readout ``z = o W_O`` (``W_O`` [d_v, K]) and mean cross-entropy over N rows,
   ``u_i = (p_i - e_{y_i}) W_O^T / N``. ``law_errors`` checks all of it against autograd.
2. **Sticky chain: SGD vs EM.** The single-head model of §2.2 trained by plain SGD, the released "EM-like"
   schedule (10x learning rate on W_V), and a closed-form EM-style value update (``closed_form_value_step``), all
   from the same initial weights; ``sticky_comparison`` returns a tidy summary with paired statistics.
3. **Frame vs precision over training.** Metric curves over a checkpoint series and the step at which each
   stays 90% of the way to its final value (``frame_precision_from_checkpoints``, ``settle_step``,
   ``dissociation``).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy import stats

from interp_bayes.tasks.sticky import StickyChain, bayes_predictive, sample_sticky

PAPER_SEEDS = (42, 2024, 1337, 7777, 9999)
PAPER_SPEEDUP = 2.3  # EM-like vs SGD, repo:README.md (~430 vs 1000 steps)
METHODS = ("sgd", "em_like", "em_closed")

# ---------------------------------------------------------------------------------------------------------------
# 1. The gradient laws
# ---------------------------------------------------------------------------------------------------------------


def _mm(wide: torch.Tensor, thin: torch.Tensor) -> torch.Tensor:
    """``wide @ thin`` computed as ``(thin^T wide^T)^T``: same numbers, ~2x faster on CPU for [T, T] @ [T, d]."""
    return (thin.transpose(-1, -2) @ wide.transpose(-1, -2)).transpose(-1, -2)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal softmax attention of one head: ``alpha`` [..., Tq, Tk] and output ``alpha @ v`` [..., Tq, d_v].

    Query row i sits at position ``offset + i`` and sees keys ``0..offset + i`` (``offset`` > 0 for a block of
    queries against all keys up to its end).
    """
    s = (q / math.sqrt(q.shape[-1])) @ k.transpose(-1, -2)
    future = torch.ones(q.shape[-2], k.shape[-2] - offset, dtype=torch.bool, device=q.device).triu(1)
    s[..., offset:].masked_fill_(future, float("-inf"))
    alpha = torch.softmax(s, dim=-1)
    return alpha, _mm(alpha, v)


def routing_gradients(alpha: torch.Tensor, out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      u: torch.Tensor) -> dict[str, torch.Tensor]:
    """Paper II's laws given the forward pass (``alpha``, ``out``) and the upstream signal ``u = dL/dout``.

    Returns ``d_scores`` (zero where masked, since alpha is), ``d_q``, and ``d_v``, ``d_k`` summed over the given
    queries; the laws are sums over queries, so blocks of queries add up. ``E_alpha_i[b] = u_i . o_i``.
    """
    b_mean = (u * out).sum(-1, keepdim=True)  # E_alpha_i[b] = sum_j alpha_ij u_i.v_j = u_i.o_i
    d_scores = (u @ v.transpose(-1, -2)).sub_(b_mean).mul_(alpha)  # alpha_ij (b_ij - E[b]): advantage routing
    scale = 1.0 / math.sqrt(q.shape[-1])
    return {
        "d_scores": d_scores,
        "d_v": _mm(alpha.transpose(-1, -2), u),  # responsibility-weighted value update
        "d_q": _mm(d_scores, k) * scale,
        "d_k": _mm(d_scores.transpose(-1, -2), q) * scale,
    }


def attention_gradients(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, u: torch.Tensor,
                        offset: int = 0) -> dict[str, torch.Tensor]:
    """Forward pass and closed-form gradients of a loss with ``dL/dout = u`` through one causal head."""
    alpha, out = causal_attention(q, k, v, offset)
    return {"alpha": alpha, "out": out, **routing_gradients(alpha, out, q, k, v, u)}


def readout_signal(out: torch.Tensor, w_o: torch.Tensor, targets: torch.Tensor,
                   n: int | None = None) -> dict[str, torch.Tensor]:
    """Cross-entropy of ``out @ w_o`` summed over rows / ``n`` (default: mean) and its gradients.

    Returns ``loss``, ``log_probs``, ``residual`` = p - e_y, ``u`` = dL/dout = residual W_O^T / n, ``d_w_o``.
    """
    n = out.shape[0] if n is None else n
    log_p = torch.log_softmax(out @ w_o, -1)  # [N, K]
    residual = log_p.exp() - F.one_hot(targets, w_o.shape[-1]).to(out.dtype)
    return {
        "loss": -log_p.gather(-1, targets[:, None]).sum() / n,
        "log_probs": log_p,
        "residual": residual,
        "u": residual @ w_o.T / n,
        "d_w_o": out.T @ residual / n,
    }


def single_head_gradients(params: dict[str, torch.Tensor], x: torch.Tensor, targets: torch.Tensor,
                          block: int = 128, mixed_inputs: bool = False) -> dict[str, torch.Tensor]:
    """Loss and closed-form gradients of the §2.2 head ``causal-attn(x) @ W_O`` under mean cross-entropy.

    Computed in query blocks of ``block`` rows (each against the keys up to its end): half the T x T work of a dense
    pass, cache-sized, and identical up to rounding. Also returns ``values`` (x W_V), ``out``, ``u``, ``log_probs``,
    ``residual`` and, if asked, ``mixed_inputs`` (alpha x, for ``closed_form_value_step``).
    """
    q, k, v = x @ params["W_Q"], x @ params["W_K"], x @ params["W_V"]
    T = x.shape[0]
    grads = {n: torch.zeros_like(t) for n, t in (("d_q", q), ("d_k", k), ("d_v", v))}
    names = ("out", "u", "log_probs", "residual") + (("mixed_inputs",) if mixed_inputs else ())
    parts: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    loss = x.new_zeros(())
    for r0 in range(0, T, block):
        r1 = min(r0 + block, T)
        alpha, out = causal_attention(q[r0:r1], k[:r1], v[:r1], offset=r0)
        ro = readout_signal(out, params["W_O"], targets[r0:r1], n=T)
        g = routing_gradients(alpha, out, q[r0:r1], k[:r1], v[:r1], ro["u"])
        grads["d_q"][r0:r1] = g["d_q"]
        grads["d_k"][:r1] += g["d_k"]
        grads["d_v"][:r1] += g["d_v"]
        loss = loss + ro["loss"]
        ro["out"] = out
        if mixed_inputs:
            ro["mixed_inputs"] = _mm(alpha, x[:r1])
        for name in names:
            parts[name].append(ro[name])
    res = {n: torch.cat(t) for n, t in parts.items()}
    return {
        **res, **grads, "loss": loss, "values": v,
        "d_W_Q": x.T @ grads["d_q"], "d_W_K": x.T @ grads["d_k"], "d_W_V": x.T @ grads["d_v"],
        "d_W_O": res["out"].T @ res["residual"] / T,
    }


def relative_error(closed: torch.Tensor, auto: torch.Tensor) -> float:
    """``||closed - auto|| / ||auto||`` (absolute error when autograd's gradient is exactly zero)."""
    diff = float(torch.linalg.vector_norm(closed - auto))
    ref = float(torch.linalg.vector_norm(auto))
    return diff / ref if ref > 0 else diff


def law_errors(T: int, d_k: int, d_v: int, seed: int, *, readout: bool = False, d_x: int = 6,
               n_classes: int = 5) -> dict[str, float]:
    """Relative error of every closed-form gradient vs autograd, in float64, for one random head.

    Without readout the loss is ``sum_i u_i . o_i`` for a random ``u``; with readout it is the mean cross-entropy of
    ``(attn(x W_Q, x W_K, x W_V)) W_O`` on random targets, and the weight gradients are checked too. Entries are
    N(0, 1) (weights N(0, 1/fan_in)), so scores are O(1): in a saturated softmax (weights ~1e-16) both sides
    compute a difference of nearly equal numbers and agree only to rounding of the larger terms.
    """
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    if readout:
        x = randn(T, d_x)
        params = {n: (randn(*s) / math.sqrt(s[0])).requires_grad_() for n, s in
                  [("W_Q", (d_x, d_k)), ("W_K", (d_x, d_k)), ("W_V", (d_x, d_v)), ("W_O", (d_v, n_classes))]}
        targets = torch.randint(n_classes, (T,), generator=gen)
        q, k, v = x @ params["W_Q"], x @ params["W_K"], x @ params["W_V"]
    else:
        q, k, v = randn(T, d_k).requires_grad_(), randn(T, d_k).requires_grad_(), randn(T, d_v).requires_grad_()
        u = randn(T, d_v)
    for t in (q, k, v):
        t.retain_grad()
    s = q @ k.T / math.sqrt(d_k)
    s.retain_grad()
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    out = torch.softmax(s.masked_fill(future, float("-inf")), -1) @ v
    out.retain_grad()
    if readout:
        F.cross_entropy(out @ params["W_O"], targets).backward()
        model = single_head_gradients({n: p.detach() for n, p in params.items()}, x, targets, block=max(1, T // 3))
        pairs = {f"d_{n}": (model[f"d_{n}"], p.grad) for n, p in params.items()}
        u = readout_signal(out.detach(), params["W_O"].detach(), targets)["u"]
        pairs["u"] = (u, out.grad)
    else:
        (out * u).sum().backward()
        pairs = {}
    closed = attention_gradients(q.detach(), k.detach(), v.detach(), u)
    pairs.update({"d_scores": (closed["d_scores"], s.grad), "d_q": (closed["d_q"], q.grad),
                  "d_k": (closed["d_k"], k.grad), "d_v": (closed["d_v"], v.grad)})
    return {name: relative_error(c, a) for name, (c, a) in pairs.items()}


def law_check(n_cases: int = 200, seed: int = 0, max_T: int = 64, max_dim: int = 16) -> dict[str, dict[str, float]]:
    """Worst relative error of each gradient over ``n_cases`` random shapes, without and with readout + CE."""
    rng = np.random.default_rng(seed)
    worst: dict[str, dict[str, float]] = {"attention": {}, "readout_ce": {}}
    for case in range(n_cases):
        T, d_k, d_v, d_x, n_cls = (int(rng.integers(1, m + 1)) for m in (max_T, max_dim, max_dim, max_dim, max_dim))
        for kind, readout in (("attention", False), ("readout_ce", True)):
            errs = law_errors(T, d_k, d_v, seed * 100_003 + case, readout=readout, d_x=d_x, n_classes=max(n_cls, 2))
            for name, e in errs.items():
                worst[kind][name] = max(worst[kind].get(name, 0.0), e)
    return worst


# ---------------------------------------------------------------------------------------------------------------
# 2. Sticky chain: SGD, EM-like and closed-form EM from the same initial weights
# ---------------------------------------------------------------------------------------------------------------


def init_single_head(seed: int, d_x: int = 20, d_k: int = 10, d_v: int = 15, n_classes: int = 8,
                     std: float = 0.1) -> dict[str, torch.Tensor]:
    """N(0, std^2) weights drawn in the authors' order (W_Q, W_K, W_V, W_O) from ``seed`` (float32)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = {"W_Q": (d_x, d_k), "W_K": (d_x, d_k), "W_V": (d_x, d_v), "W_O": (d_v, n_classes)}
    return {n: torch.randn(*s, generator=gen) * std for n, s in shapes.items()}


def closed_form_value_step(mixed_inputs: torch.Tensor, w_o: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """Closed-form M-step for ``W_V`` with attention and ``W_O`` held fixed: the change ``dW_V`` [d_x, d_v].

    E-step: the responsibilities ``alpha`` (fixed). Each query i gets a value-space target
    ``t_i = o_i - 2 (p_i - e_{y_i}) W_O^T S^+`` with ``S = W_O C W_O^T`` and ``C = I - 11^T/K``: the exact minimiser of
    Böhning's quadratic upper bound on the cross-entropy (Hessian <= C/2). M-step: the values ``v_j = x_j W_V``
    minimising ``sum_i ||sum_j alpha_ij v_j - t_i||_S^2``; their normal equations ``sum_i alpha_ij S (o_i - t_i) = 0``
    make each value the responsibility-weighted prototype of the targets it serves (with one-hot attention and free
    values, ``v_j`` is exactly the mean target of the queries routed to it). Because the bound touches the loss at the
    current weights, the loss cannot increase (majorise-minimise, of which EM is a case). Solved by least squares on
    ``M = alpha x`` (``mixed_inputs``), minimum-norm in directions ``W_O`` cannot see. Unregularised, it fits the
    training chain through directions of x that attention averages away, so it overfits (docs/dynamics.md).
    """
    m = mixed_inputs.to(torch.float64)
    w = w_o.to(torch.float64)
    k = w.shape[1]
    centre = torch.eye(k, dtype=torch.float64) - 1.0 / k
    target_shift = -2.0 * residual.to(torch.float64) @ w.T @ torch.linalg.pinv(w @ centre @ w.T, hermitian=True)
    return torch.linalg.lstsq(m, target_shift, driver="gelsd").solution.to(w_o.dtype)  # SVD: rank-deficient safe


def pc1_share(x: torch.Tensor) -> float:
    """Share of variance on the first principal component (float64)."""
    x = x.to(torch.float64)
    ev = torch.linalg.eigvalsh(torch.cov(x.T).reshape(x.shape[1], x.shape[1]))
    return float(ev[-1] / ev.sum()) if ev.sum() > 0 else 0.0


def cv_r2(features: torch.Tensor, target: torch.Tensor, seed: int = 0, folds: int = 5) -> float:
    """Out-of-sample R^2 of a linear fit of ``target`` from ``features`` (k-fold, float64)."""
    from sklearn.linear_model import LinearRegression
    from sklearn.model_selection import KFold, cross_val_predict

    xf, yf = features.double().numpy(), target.double().numpy()
    pred = cross_val_predict(LinearRegression(), xf, yf, cv=KFold(folds, shuffle=True, random_state=seed))
    ss = float(((yf - yf.mean()) ** 2).sum())
    return 1.0 - float(((yf - pred) ** 2).sum()) / ss if ss > 0 else 0.0


def train_single_head(chain: StickyChain, method: str, init: dict[str, torch.Tensor], *, n_steps: int = 1000,
                      lr: float = 0.01, lr_value: float = 0.1, record_every: int = 50,
                      heldout: StickyChain | None = None) -> dict:
    """Full-batch training of the §2.2 head; ``losses[s]`` is the loss after ``s`` updates (``n_steps + 1`` values).

    ``method``: ``sgd`` (``lr`` on all weights), ``em_like`` (``lr_value`` on W_V, ``lr`` elsewhere: the released
    schedule) or ``em_closed`` (``lr`` on W_Q, W_K, W_O; W_V by ``closed_form_value_step`` at the same point).
    Every ``record_every`` steps the value manifold is measured: PC1 share of ``x W_V``, the cross-validated R^2
    of the model's predictive entropy (nats) from the value at the same position, and that entropy's spread (an R^2
    of a near-constant entropy means little). A ``heldout`` chain gives the final out-of-sample loss.
    """
    if method not in METHODS:
        raise ValueError(f"Unknown method {method!r}; use one of {METHODS}.")
    params = {n: p.clone() for n, p in init.items()}
    x, y = chain.inputs.to(init["W_Q"].dtype), chain.targets
    losses, record = [], {"step": [], "pc1_share": [], "entropy_r2": [], "entropy_sd": []}
    for step in range(n_steps + 1):
        g = single_head_gradients(params, x, y, mixed_inputs=method == "em_closed")
        losses.append(float(g["loss"]))
        if step % record_every == 0 or step == n_steps:
            entropy = -(g["log_probs"].exp() * g["log_probs"]).sum(-1)
            record["step"].append(step)
            record["pc1_share"].append(pc1_share(g["values"]))
            record["entropy_r2"].append(cv_r2(g["values"], entropy))
            record["entropy_sd"].append(float(entropy.std()))
        if step == n_steps:
            break
        if method == "em_closed":
            params["W_V"] += closed_form_value_step(g["mixed_inputs"], params["W_O"], g["residual"])
        for name in ("W_Q", "W_K", "W_O") if method == "em_closed" else ("W_Q", "W_K", "W_V", "W_O"):
            params[name] -= (lr_value if (name == "W_V" and method == "em_like") else lr) * g[f"d_{name}"]
    p = g["log_probs"].exp()
    held = {}
    if heldout is not None:
        hx, hy = heldout.inputs.to(x.dtype), heldout.targets
        held = {"heldout_loss": float(single_head_gradients(params, hx, hy)["loss"])}
    return {
        **held,
        "losses": losses,
        "final_loss": losses[-1],
        "final_entropy": float(-(p * g["log_probs"]).sum(-1).mean()),
        "final_accuracy": float((g["log_probs"].argmax(-1) == y).double().mean()),
        "manifold": record,
    }


def steps_to_reach(losses: Sequence[float], threshold: float) -> int | None:
    """First step whose loss is strictly below ``threshold`` (as the authors count), or None if never."""
    hits = np.flatnonzero(np.asarray(losses) < threshold)
    return int(hits[0]) if hits.size else None


def _log_interval(ratios: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Geometric mean and t-interval of positive ratios over seeds (on the log scale)."""
    logs = np.log(np.asarray(ratios, dtype=np.float64))
    centre = float(np.exp(logs.mean()))
    if logs.size < 2 or logs.std(ddof=1) == 0:
        return centre, centre, centre
    lo, hi = stats.t.interval(level, logs.size - 1, loc=logs.mean(), scale=stats.sem(logs))
    return centre, float(np.exp(lo)), float(np.exp(hi))


def sticky_seed(seed: int, *, T: int = 2000, n_steps: int = 1000, lr: float = 0.01, lr_value: float = 0.1,
                record_every: int = 50, dtype: torch.dtype = torch.float32) -> dict:
    """One seed of ``sticky_comparison``: the chain, a fresh chain (seed + 10000), Bayes floors, three trainings."""
    t0 = time.perf_counter()
    chain, heldout = sample_sticky(T, seed), sample_sticky(T, seed + 10_000)
    init = {n: p.to(dtype) for n, p in init_single_head(seed).items()}
    log_bayes = bayes_predictive(chain)
    run = {"seed": seed, "entropy_floor": chain.entropy_floor,
           "bayes_loss": float(-log_bayes.gather(1, chain.targets[:, None]).mean()),
           "bayes_heldout_loss": float(F.nll_loss(bayes_predictive(heldout), heldout.targets)),
           "bayes_entropy": float(-(log_bayes.exp() * log_bayes).sum(1).mean())}
    for method in METHODS:
        run[method] = train_single_head(chain, method, init, n_steps=n_steps, lr=lr, lr_value=lr_value,
                                        record_every=record_every, heldout=heldout)
    run["seconds"] = time.perf_counter() - t0
    return run


def _sticky_worker(seed: int, kwargs: dict) -> dict:
    torch.set_num_threads(1)
    return sticky_seed(seed, **kwargs)


def sticky_comparison(seeds: Sequence[int] = PAPER_SEEDS, *, jobs: int = 1,
                      progress: Callable[[str], None] | None = None, **kwargs) -> dict:
    """Run SGD, EM-like and closed-form EM per seed (same data and initial weights) and summarise (float64 stats).

    ``kwargs`` go to ``sticky_seed`` (T, n_steps, lr, lr_value, record_every, dtype); ``jobs`` > 1 runs seeds in
    that many processes (one torch thread each; results identical). Per seed the threshold is that seed's SGD final
    loss; speed-up = ``n_steps / steps_to_reach`` (a method that never reaches it is censored at ``n_steps``,
    flagged). Also reported: the authors' pooled figure (threshold = mean SGD final loss, speed-up = ``n_steps /
    mean steps``), a paired t-test of final losses vs SGD, the loss on a fresh chain (seed + 10000), final
    predictive entropy against H(Y_{t+1}|Y_t) and the exact Bayes filter, and the value-manifold curves.
    """
    def report(run: dict) -> dict:
        if progress:
            progress(f"seed {run['seed']}: " + ", ".join(f"{m} {run[m]['final_loss']:.4f}" for m in METHODS)
                     + f" ({run['seconds']:.0f} s)")
        return run

    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs) as pool:
            runs = [report(r) for r in pool.map(_sticky_worker, seeds, [kwargs] * len(seeds))]
    else:
        runs = [report(sticky_seed(seed, **kwargs)) for seed in seeds]
    return summarise_sticky(runs, kwargs.get("n_steps", 1000))


def summarise_sticky(runs: list[dict], n_steps: int) -> dict:
    """Tidy summary of ``sticky_comparison`` runs: per-method rows, per-seed rows and mean manifold curves."""
    sgd_final = np.array([r["sgd"]["final_loss"] for r in runs])
    methods = {}
    for m in METHODS:
        final = np.array([r[m]["final_loss"] for r in runs])
        row = {"final_loss_mean": float(final.mean()),
               "final_loss_sd": float(final.std(ddof=1)) if len(runs) > 1 else 0.0,
               "final_entropy_mean": float(np.mean([r[m]["final_entropy"] for r in runs])),
               "heldout_loss_mean": float(np.mean([r[m]["heldout_loss"] for r in runs])),
               "final_accuracy_mean": float(np.mean([r[m]["final_accuracy"] for r in runs]))}
        if m != "sgd":
            steps = [steps_to_reach(r[m]["losses"], r["sgd"]["final_loss"]) for r in runs]
            speed = [n_steps / max(s if s is not None else n_steps, 1) for s in steps]
            centre, lo, hi = _log_interval(speed)
            pooled = [steps_to_reach(r[m]["losses"], float(sgd_final.mean())) for r in runs]
            pooled_mean = float(np.mean([s if s is not None else n_steps for s in pooled]))
            t_res = stats.ttest_rel(final, sgd_final) if len(runs) > 1 else None
            row.update({
                "steps_to_sgd_final": steps, "reached_all": all(s is not None for s in steps),
                "speedup_geomean": centre, "speedup_ci95": [lo, hi], "speedup_per_seed": speed,
                "speedup_pooled_authors": n_steps / max(pooled_mean, 1.0),
                "paired_t": float(t_res.statistic) if t_res else math.nan,
                "paired_p": float(t_res.pvalue) if t_res else math.nan,
            })
        row["manifold"] = {"step": runs[0][m]["manifold"]["step"],
                           **{k: np.mean([r[m]["manifold"][k] for r in runs], 0).tolist()
                              for k in ("pc1_share", "entropy_r2", "entropy_sd")}}
        methods[m] = row
    return {
        "n_steps": n_steps,
        "seeds": [r["seed"] for r in runs],
        "entropy_floor": runs[0]["entropy_floor"],
        "bayes_loss_mean": float(np.mean([r["bayes_loss"] for r in runs])),
        "bayes_heldout_loss_mean": float(np.mean([r["bayes_heldout_loss"] for r in runs])),
        "bayes_entropy_mean": float(np.mean([r["bayes_entropy"] for r in runs])),
        "paper_speedup": PAPER_SPEEDUP,
        "methods": methods,
        "per_seed": [{"seed": r["seed"], "seconds": r["seconds"], "bayes_loss": r["bayes_loss"],
                      **{f"{m}_final_loss": r[m]["final_loss"] for m in METHODS},
                      **{f"{m}_heldout_loss": r[m]["heldout_loss"] for m in METHODS},
                      **{f"{m}_final_entropy": r[m]["final_entropy"] for m in METHODS}} for r in runs],
        "loss_curves": {m: np.mean([r[m]["losses"] for r in runs], 0).tolist() for m in METHODS},
        "seconds": float(sum(r["seconds"] for r in runs)),
    }


class DeepSticky(torch.nn.Module):
    """The ``--deep`` model of §2.2: input projection, pre-LN blocks (causal multi-head attention + GELU FFN,
    dropout on attention weights and FFN), final LN and readout. Input ``x`` [T, d_x] -> logits [T, n_classes]."""

    def __init__(self, d_x: int = 20, d_model: int = 64, n_layers: int = 4, n_heads: int = 4, d_ff: int = 256,
                 n_classes: int = 8, dropout: float = 0.1) -> None:
        super().__init__()
        nn = torch.nn
        self.n_heads, self.dropout = n_heads, dropout
        self.input_proj = nn.Linear(d_x, d_model)
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "ln1": nn.LayerNorm(d_model), "qkv": nn.Linear(d_model, 3 * d_model), "proj": nn.Linear(d_model, d_model),
            "ln2": nn.LayerNorm(d_model), "ff": nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Dropout(dropout),
                                                              nn.Linear(d_ff, d_model), nn.Dropout(dropout)),
        }) for _ in range(n_layers))
        self.ln_final = nn.LayerNorm(d_model)
        self.output_proj = nn.Linear(d_model, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.input_proj(x)  # [T, d_model]
        T, d = h.shape
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln1"](h)).view(T, 3, self.n_heads, d // self.n_heads).permute(1, 2, 0, 3)
            drop = self.dropout if self.training else 0.0
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop)
            h = h + blk["proj"](a.transpose(0, 1).reshape(T, d))
            h = h + blk["ff"](blk["ln2"](h))
        return self.output_proj(self.ln_final(h))


def train_deep(seed: int, *, T: int = 2000, n_steps: int = 2000, lr: float = 3e-4, weight_decay: float = 0.01,
               clip: float = 1.0, device: str = "cpu", **model_kwargs: int | float) -> dict:
    """Train ``DeepSticky`` (AdamW, cosine, clipping, full batch) on chain ``seed``; evaluate on chain ``seed + 10000``.

    Weights and dropout draw from a forked global RNG seeded with ``seed``, so the caller's RNG is untouched.
    About 2-4 s a step at T = 2000 on one CPU core (dropout forces the unfused attention path): the full
    protocol (2000 steps x 5 seeds) is a GPU job; pass ``device="cuda"`` there.
    """
    t0 = time.perf_counter()
    train, test = sample_sticky(T, seed), sample_sticky(T, seed + 10_000)
    x, y, tx = train.inputs.to(device), train.targets.to(device), test.inputs.to(device)
    with torch.random.fork_rng(devices=[] if device == "cpu" else None):
        torch.manual_seed(seed)
        model = DeepSticky(**model_kwargs).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, n_steps)
        losses = []
        for _ in range(n_steps):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            sched.step()
            losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        log_p = torch.log_softmax(model(tx), -1).cpu().double()
    log_bayes = bayes_predictive(test)
    return {
        "seed": seed, "n_steps": n_steps, "train_losses": losses,
        "test_loss": float(F.nll_loss(log_p, test.targets)),
        "test_entropy": float(-(log_p.exp() * log_p).sum(-1).mean()),
        "test_accuracy": float((log_p.argmax(-1) == test.targets).double().mean()),
        "entropy_floor": test.entropy_floor,
        "bayes_test_loss": float(F.nll_loss(log_bayes, test.targets)),
        "n_params": sum(p.numel() for p in model.parameters()),
        "seconds": time.perf_counter() - t0,
    }


# ---------------------------------------------------------------------------------------------------------------
# 3. Frame vs precision over a checkpoint series (methods.md §1.7d)
# ---------------------------------------------------------------------------------------------------------------

FRAME_METRICS = ("attention_similarity", "layer0_similarity", "key_orthogonality", "frame_head_match")
PRECISION_METRICS = ("entropy_mae", "pc1_share", "entropy_r2", "low_entropy_separation")
LOG_METRICS = ("entropy_mae",)  # errors spanning decades settle on a log scale (0.03 -> 0.0008 bits is progress)


@dataclass
class Snapshot:
    """What one checkpoint shows on a fixed evaluation batch."""

    patterns: list[torch.Tensor]  # per layer [batch, head, q, k]
    layer0_keys: torch.Tensor  # [n_hyp, kv_heads, d_head], hypothesis tokens alone at position 0
    values: torch.Tensor  # [N, kv_heads * d_head] last-layer hook_v at the scored positions
    model_entropy: torch.Tensor  # [N] bits, over the hypothesis tokens
    bayes_entropy: torch.Tensor  # [N] bits


def take_snapshot(model, batch, hypothesis_ids: Sequence[int]) -> Snapshot:
    """Run a hooked model (TransformerLens hook names; ``model.cfg.n_layers``) on a ``TaskBatch``.

    Layer-0 keys come from feeding each hypothesis token alone: with rotary positions, position 0 is unrotated, so
    this is ``norm(E_hyp) W_K`` without positions (methods.md §1.7a); absolute-position models add position 0.
    """
    n_layers = model.cfg.n_layers
    hyp = torch.as_tensor(list(hypothesis_ids))
    keep = lambda name: name.endswith(("hook_pattern", "hook_v", "hook_k"))  # noqa: E731
    with torch.no_grad():
        logits, cache = model.run_with_cache(batch.input_ids, names_filter=keep)
        _, key_cache = model.run_with_cache(hyp[:, None], names_filter=keep)
    log_p = torch.log_softmax(logits[:, batch.query_pos][..., hyp].double(), -1)  # [n, Q, H]
    values = cache[f"blocks.{n_layers - 1}.attn.hook_v"][:, batch.query_pos]  # [n, Q, kv, d_head]
    post = batch.posterior.double()
    return Snapshot(
        patterns=[cache[f"blocks.{layer}.attn.hook_pattern"].double() for layer in range(n_layers)],
        layer0_keys=key_cache["blocks.0.attn.hook_k"][:, 0].double(),
        values=values.flatten(2).flatten(0, 1).double(),
        model_entropy=(-(log_p.exp() * log_p).sum(-1) / math.log(2)).flatten(),
        bayes_entropy=(-torch.special.xlogy(post, post).sum(-1) / math.log(2)).flatten(),
    )


def key_orthogonality(keys: torch.Tensor) -> torch.Tensor:
    """Mean |cosine| over off-diagonal pairs of keys [n, heads, d] -> [heads] (0 = orthogonal frame)."""
    unit = F.normalize(keys.transpose(0, 1), dim=-1)  # [heads, n, d]
    cos = (unit @ unit.transpose(-1, -2)).abs()
    n = keys.shape[0]
    return (cos.sum((-1, -2)) - cos.diagonal(dim1=-2, dim2=-1).sum(-1)) / (n * (n - 1))


def attention_similarity(p: torch.Tensor, p_ref: torch.Tensor) -> float:
    """1 - mean Jensen-Shannon distance (base 2) between attention rows [..., q, k]: 1 = identical maps."""
    m = 0.5 * (p + p_ref)
    m = m.clamp_min(1e-300)
    js = 0.5 * (torch.special.xlogy(p, p / m) + torch.special.xlogy(p_ref, p_ref / m))
    return 1.0 - float(torch.sqrt((js.sum(-1) / math.log(2)).clamp(0, 1)).mean())


def _pc1_scores(values: torch.Tensor) -> torch.Tensor:
    centred = values - values.mean(0)
    return centred @ torch.linalg.svd(centred, full_matrices=False).Vh[0]


def low_entropy_separation(values: torch.Tensor, bayes_entropy: torch.Tensor, quantile: float = 0.25) -> float:
    """|Spearman rho| of PC1 with the Bayes entropy among the lowest-entropy ``quantile`` of states: 1 when PC1 orders
    small hypothesis sets, ~0 when they are collapsed together."""
    low = bayes_entropy <= torch.quantile(bayes_entropy, quantile)
    pc1, h = _pc1_scores(values)[low].numpy(), bayes_entropy[low].numpy()
    if np.ptp(pc1) == 0 or np.ptp(h) == 0:
        return 0.0
    return float(abs(stats.spearmanr(pc1, h).statistic))


def snapshot_metrics(snap: Snapshot, final: Snapshot) -> dict[str, float]:
    """Frame metrics (relative to the final checkpoint) and precision metrics of one snapshot."""
    orth = key_orthogonality(snap.layer0_keys)
    return {
        "attention_similarity": float(np.mean([attention_similarity(p, f)
                                               for p, f in zip(snap.patterns, final.patterns)])),
        "layer0_similarity": attention_similarity(snap.patterns[0], final.patterns[0]),
        "key_orthogonality": float(orth.min()),
        "frame_head_match": float(int(orth.argmin()) == int(key_orthogonality(final.layer0_keys).argmin())),
        "entropy_mae": float((snap.model_entropy - snap.bayes_entropy).abs().mean()),
        "pc1_share": pc1_share(snap.values),
        "entropy_r2": cv_r2(snap.values, snap.bayes_entropy),
        "low_entropy_separation": low_entropy_separation(snap.values, snap.bayes_entropy),
    }


def settle_step(steps: Sequence[int], values: Sequence[float], frac: float = 0.9, log: bool = False) -> int:
    """First step from which a metric stays at least ``frac`` of the way from its first value to its final one
    (on a log scale if ``log``; values must then be positive).

    Works for rising and falling metrics alike; a metric that never moves settles at the first step.
    """
    v = np.asarray(values, dtype=np.float64)
    v = np.log(np.maximum(v, 1e-12)) if log else v
    span = v[-1] - v[0]
    if span == 0:
        return int(steps[0])
    below = np.flatnonzero((v - v[0]) / span < frac)
    return int(steps[below[-1] + 1]) if below.size else int(steps[0])


def dissociation(steps: Sequence[int], curves: dict[str, Sequence[float]], frac: float = 0.9) -> dict:
    """Settle step of every metric, the median frame and precision settle steps, and their ratio.

    Metrics in ``LOG_METRICS`` settle on a log scale. The ratio divides by the frame step floored at the first
    positive checkpoint step (a frame fixed from initialisation would otherwise give infinity). Dissociation holds
    when the ratio is well above 1.
    """
    settle = {m: settle_step(steps, curves[m], frac, log=m in LOG_METRICS)
              for m in FRAME_METRICS + PRECISION_METRICS if m in curves}
    frame = float(np.median([settle[m] for m in FRAME_METRICS if m in settle]))
    precision = float(np.median([settle[m] for m in PRECISION_METRICS if m in settle]))
    floor = min(s for s in steps if s > 0)
    return {"settle": settle, "frame_step": frame, "precision_step": precision,
            "ratio": precision / max(frame, floor)}


def ratio_interval(ratios: Sequence[float], level: float = 0.95) -> dict[str, float]:
    """Geometric mean of per-seed dissociation ratios (or speed-ups) with a t-interval on the log scale."""
    centre, lo, hi = _log_interval(ratios, level)
    return {"geomean": centre, "lo": lo, "hi": hi, "n": len(ratios)}


def frame_precision_from_checkpoints(checkpoints: Sequence[tuple[int, str | Path]], batch,
                                     hypothesis_ids: Sequence[int], *, loader: Callable | None = None,
                                     frac: float = 0.9) -> dict:
    """Metric curves over a checkpoint series (``(step, folder)`` pairs) on one fixed ``TaskBatch``, and the
    dissociation. ``loader(folder)`` returns a hooked model (default: ``interp_bayes.models.load_model``)."""
    if loader is None:
        from interp_bayes.models import load_model as loader
    ordered = sorted(checkpoints, key=lambda c: c[0])
    if len(ordered) < 2 or ordered[-1][0] <= 0:
        raise ValueError("Need at least two checkpoints with a positive final step to measure settling.")
    final = take_snapshot(loader(ordered[-1][1]), batch, hypothesis_ids)
    rows = [snapshot_metrics(final if step == ordered[-1][0] else take_snapshot(loader(path), batch, hypothesis_ids),
                             final) for step, path in ordered]
    steps = [step for step, _ in ordered]
    curves = {m: [r[m] for r in rows] for m in FRAME_METRICS + PRECISION_METRICS}
    return {"steps": steps, "curves": curves, **dissociation(steps, curves, frac)}


def checkpoint_series(run: str | Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` pairs of a wind-tunnel run: ``RUN/checkpoints/step_NNNNNN`` plus the final model in ``RUN``
    (its step from ``windtunnel.json``: ``step`` if recorded, else the configured ``steps``)."""
    run = Path(run)
    series = {int(f.name.split("_")[1]): f for f in sorted((run / "checkpoints").glob("step_*")) if f.is_dir()}
    meta = run / "windtunnel.json"
    if meta.exists():
        d = json.loads(meta.read_text())
        series.setdefault(int(d.get("step", d["config"]["steps"])), run)
    if len(series) < 2:
        raise ValueError(f"{run} holds fewer than two checkpoints; train with checkpoints (windtunnel) first.")
    return sorted(series.items())


def frame_precision_run(run: str | Path, *, n_eval: int = 64, seed: int = 0, loader: Callable | None = None) -> dict:
    """``frame_precision_from_checkpoints`` on a wind-tunnel run folder, with ``n_eval`` fresh sequences of its task."""
    from interp_bayes.windtunnel.configs import TrainConfig, make_task

    series = checkpoint_series(run)
    cfg = TrainConfig.from_dict(json.loads((series[0][1] / "windtunnel.json").read_text())["config"])
    task = make_task(cfg)
    res = frame_precision_from_checkpoints(series, task.sample(n_eval, seed=seed), task.hypothesis_ids, loader=loader)
    return {"run": str(run), "task": cfg.task, **res}


# ---------------------------------------------------------------------------------------------------------------
# Command line: `interp-bayes dynamics`
# ---------------------------------------------------------------------------------------------------------------


def add_dynamics_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Flags of ``interp-bayes dynamics``; the defaults are the paper's protocol."""
    parser.add_argument("--seeds", type=int, nargs="+", default=list(PAPER_SEEDS))
    parser.add_argument("--steps", type=int, default=1000, help="training steps per optimiser (single head)")
    parser.add_argument("--T", type=int, default=2000, help="chain length")
    parser.add_argument("--record-every", type=int, default=50, help="steps between value-manifold measurements")
    parser.add_argument("--law-cases", type=int, default=200, help="random shapes for the gradient-law check")
    parser.add_argument("--deep", action="store_true", help="also train the 4-layer variant (slow on CPU)")
    parser.add_argument("--deep-steps", type=int, default=2000)
    parser.add_argument("--deep-seeds", type=int, nargs="+", default=list(PAPER_SEEDS))
    parser.add_argument("--deep-device", default="cpu", help="device for the deep variant (cuda recommended)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--jobs", type=int, default=1, help="processes for the sticky seeds (one thread each)")
    parser.add_argument("--frames", type=Path, nargs="+", default=[],
                        help="wind-tunnel run folders (one per seed): frame-precision curves and dissociation ratio")
    parser.add_argument("--frames-only", action="store_true", help="skip the laws and the sticky chain")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--quiet", action="store_true")
    return parser


def _fmt(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}"


def _law_lines(results: dict) -> list[str]:
    laws = results["laws"]
    lines = [f"Gradient laws vs autograd (float64, worst relative error over {results['law_cases']} random shapes):",
             "", "| gradient | attention only | + readout & CE |", "|---|---|---|"]
    for name in sorted(set(laws["attention"]) | set(laws["readout_ce"])):
        cells = [f"{laws[k][name]:.1e}" if name in laws[k] else "–" for k in ("attention", "readout_ce")]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    return lines


def _sticky_lines(s: dict) -> list[str]:
    lines = ["", f"Sticky chain, single head, {len(s['seeds'])} seeds, {s['n_steps']} steps; H(Y'|Y) = "
             f"{_fmt(s['entropy_floor'])} nats; exact Bayes-filter CE {_fmt(s['bayes_loss_mean'])} (training chain), "
             f"{_fmt(s['bayes_heldout_loss_mean'])} (fresh chain) nats:", "",
             "| optimiser | final loss (mean ± sd) | held-out loss | final entropy | accuracy | steps to SGD final "
             "(per seed) | speed-up (geomean, 95% CI) | authors' pooled speed-up | paired t (p) vs SGD |",
             "|---|---|---|---|---|---|---|---|---|"]
    for m, row in s["methods"].items():
        base = (f"| {m} | {_fmt(row['final_loss_mean'], 4)} ± {_fmt(row['final_loss_sd'], 4)} | "
                f"{_fmt(row['heldout_loss_mean'], 4)} | {_fmt(row['final_entropy_mean'], 4)} | "
                f"{_fmt(row['final_accuracy_mean'])} |")
        if m == "sgd":
            lines.append(base + f" {s['n_steps']} | 1 | 1 | – |")
        else:
            steps = ", ".join("never" if x is None else str(x) for x in row["steps_to_sgd_final"])
            lo, hi = row["speedup_ci95"]
            lines.append(base + f" {steps} | {_fmt(row['speedup_geomean'], 2)} ({_fmt(lo, 2)}–{_fmt(hi, 2)}) | "
                         f"{_fmt(row['speedup_pooled_authors'], 2)} | {_fmt(row['paired_t'], 2)} "
                         f"({row['paired_p']:.1e}) |")
    lines += ["", "Value manifold over training (mean over seeds): PC1 share of x W_V / cross-validated R² of the "
              "predictive entropy from the value / sd of that entropy (nats)", "",
              "| step | " + " | ".join(s["methods"]) + " |", "|---" * (len(s["methods"]) + 1) + "|"]
    first = next(iter(s["methods"].values()))["manifold"]
    for i, step in enumerate(first["step"]):
        cells = [f"{_fmt(r['manifold']['pc1_share'][i], 2)} / {_fmt(r['manifold']['entropy_r2'][i], 2)} / "
                 f"{_fmt(r['manifold']['entropy_sd'][i], 3)}" for r in s["methods"].values()]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return lines


def _deep_lines(deep: list[dict]) -> list[str]:
    lines = ["", "Deep variant (4 layers, AdamW), evaluated on a fresh chain:", "",
             "| seed | steps | test loss | test entropy | accuracy | Bayes-filter test CE | H(Y'|Y) | s |",
             "|---|---|---|---|---|---|---|---|"]
    for d in deep:
        lines.append(f"| {d['seed']} | {d['n_steps']} | {_fmt(d['test_loss'], 4)} | {_fmt(d['test_entropy'], 4)} | "
                     f"{_fmt(d['test_accuracy'])} | {_fmt(d['bayes_test_loss'], 4)} | {_fmt(d['entropy_floor'])} | "
                     f"{d['seconds']:.0f} |")
    return lines


def _frame_lines(frames: list[dict], summary: dict) -> list[str]:
    metrics = FRAME_METRICS + PRECISION_METRICS
    lines = ["", "Frame vs precision: step at which each metric stays 90% of the way to its final value", "",
             "| run | " + " | ".join(metrics) + " | frame step | precision step | ratio |",
             "|---" * (len(metrics) + 4) + "|"]
    for f in frames:
        lines.append(f"| {Path(f['run']).name} | " + " | ".join(str(f["settle"][m]) for m in metrics)
                     + f" | {f['frame_step']:.0f} | {f['precision_step']:.0f} | {_fmt(f['ratio'], 2)} |")
    lines.append(f"\nDissociation ratio (geomean over {summary['n']} runs, 95% CI): {_fmt(summary['geomean'], 2)} "
                 f"({_fmt(summary['lo'], 2)}–{_fmt(summary['hi'], 2)})")
    return lines


def markdown_tables(results: dict) -> str:
    """Markdown tables of a ``run_dynamics`` result (whichever sections it has) and the wall times."""
    lines = _law_lines(results) if results.get("laws") else []
    if results.get("sticky"):
        lines += _sticky_lines(results["sticky"])
    if results.get("deep"):
        lines += _deep_lines(results["deep"])
    if results.get("frames"):
        lines += _frame_lines(results["frames"], results["frames_summary"])
    times = ", ".join(f"{k} {v:.0f} s" for k, v in results["seconds"].items() if v)
    lines += ["", f"Wall time: {times} ({results['threads']} torch thread(s))."]
    return "\n".join(lines)


def run_dynamics(args: argparse.Namespace) -> dict:
    """Everything ``interp-bayes dynamics`` measures, as one JSON-ready dict."""
    if args.threads:
        torch.set_num_threads(args.threads)
    say = (lambda msg: None) if args.quiet else (lambda msg: print(msg, flush=True))
    res: dict = {"threads": torch.get_num_threads(), "config": {k: str(v) for k, v in vars(args).items()},
                 "law_cases": args.law_cases, "seconds": {}}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        res["seconds"][name] = time.perf_counter() - clock
        clock = time.perf_counter()

    if not args.frames_only:
        res["laws"] = law_check(args.law_cases)
        lap("laws")
        say(f"gradient laws: worst relative error {max(max(v.values()) for v in res['laws'].values()):.1e}")
        res["sticky"] = sticky_comparison(args.seeds, T=args.T, n_steps=args.steps, record_every=args.record_every,
                                          jobs=args.jobs, progress=say)
        lap("sticky")
    if args.deep:
        res["deep"] = []
        for seed in args.deep_seeds:
            res["deep"].append(train_deep(seed, T=args.T, n_steps=args.deep_steps, device=args.deep_device))
            say(f"deep seed {seed}: test loss {res['deep'][-1]['test_loss']:.4f} ({res['deep'][-1]['seconds']:.0f} s)")
        lap("deep")
    if args.frames:
        res["frames"] = [frame_precision_run(run) for run in args.frames]
        res["frames_summary"] = ratio_interval([f["ratio"] for f in res["frames"]])
        lap("frames")
    return res


def dynamics_main(args: argparse.Namespace) -> int:
    """Entry point for ``interp-bayes dynamics``: run, print the markdown tables, optionally write JSON."""
    results = run_dynamics(args)
    print(markdown_tables(results))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp.write_text(json.dumps(results, indent=1, default=float))
        tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    parser = add_dynamics_arguments(argparse.ArgumentParser(prog="interp-bayes dynamics"))
    raise SystemExit(dynamics_main(parser.parse_args()))
