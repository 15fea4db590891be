"""The single head of §2.2 on the sticky chain: plain SGD, the released "EM-like" schedule (10x learning rate on
W_V) and a closed-form EM-style value update (``closed_form_value_step``), all from the same initial weights;
``sticky_comparison`` returns a tidy summary with paired statistics."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F
from scipy import stats

from ..core.errors import ConfigError
from ..core.stop import check_stop
from ..tasks.sticky import StickyChain, bayes_predictive, sample_sticky

from .laws import single_head_gradients
from ..stats.info import entropy_of_log_probs
from .measures import cv_r2, geometric_mean_interval, pc1_share

PAPER_SEEDS = (42, 2024, 1337, 7777, 9999)
PAPER_SPEEDUP = 2.3  # EM-like vs SGD, repo:README.md (~430 vs 1000 steps)
METHODS = ("sgd", "em_like", "em_closed")


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
        raise ConfigError(f"Unknown method {method!r}; use one of {METHODS}.")
    params = {n: p.clone() for n, p in init.items()}
    x, y = chain.inputs.to(init["W_Q"].dtype), chain.targets
    losses, record = [], {"step": [], "pc1_share": [], "entropy_r2": [], "entropy_sd": []}
    for step in range(n_steps + 1):
        check_stop()
        g = single_head_gradients(params, x, y, mixed_inputs=method == "em_closed")
        losses.append(float(g["loss"]))
        if step % record_every == 0 or step == n_steps:
            entropy = entropy_of_log_probs(g["log_probs"], "nats")
            record["step"].append(step)
            record["pc1_share"].append(pc1_share(g["values"]))
            record["entropy_r2"].append(cv_r2(g["values"], entropy, None))  # one chain: no whole sequences to hold out
            record["entropy_sd"].append(float(entropy.std()))
        if step == n_steps:
            break
        if method == "em_closed":
            params["W_V"] += closed_form_value_step(g["mixed_inputs"], params["W_O"], g["residual"])
        for name in ("W_Q", "W_K", "W_O") if method == "em_closed" else ("W_Q", "W_K", "W_V", "W_O"):
            params[name] -= (lr_value if (name == "W_V" and method == "em_like") else lr) * g[f"d_{name}"]
    held = {}
    if heldout is not None:
        hx, hy = heldout.inputs.to(x.dtype), heldout.targets
        held = {"heldout_loss": float(single_head_gradients(params, hx, hy)["loss"])}
    return {
        **held,
        "losses": losses,
        "final_loss": losses[-1],
        "final_entropy": float(entropy_of_log_probs(g["log_probs"], "nats").mean()),
        "final_accuracy": float((g["log_probs"].argmax(-1) == y).double().mean()),
        "manifold": record,
    }


def steps_to_reach(losses: Sequence[float], threshold: float) -> int | None:
    """First step whose loss is strictly below ``threshold`` (as the authors count), or None if never."""
    hits = np.flatnonzero(np.asarray(losses) < threshold)
    return int(hits[0]) if hits.size else None


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
           "bayes_entropy": float(entropy_of_log_probs(log_bayes, "nats").mean())}
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
            centre, lo, hi = geometric_mean_interval(speed)
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

