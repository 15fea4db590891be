"""Frame vs precision over training (methods.md §1.7d): metric curves over a wind-tunnel checkpoint series and the
step at which each stays 90% of the way to its final value (``frame_precision_from_checkpoints``, ``settle_step``,
``dissociation``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..core.errors import ConfigError
from ..model.read import patterns, read
from ..stats import as_float64, is_constant
from ..stats.pca import mean_abs_offdiag_cos, pca, spearman
from ..stats import info

from ..windtunnel.tunnels import is_tunnel, load_model, open_tunnel, saved_checkpoints
from .measures import cv_r2, geometric_mean_interval, pc1_share

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
    groups: np.ndarray  # [N] the sequence of each row (its scored positions are not independent)


def take_snapshot(model, batch, hypothesis_ids: Sequence[int]) -> Snapshot:
    """Run a hooked model (TransformerLens hook names; ``model.cfg.n_layers``) on a ``TaskBatch``.

    Layer-0 keys come from feeding each hypothesis token alone: with rotary positions, position 0 is unrotated, so
    this is ``norm(E_hyp) W_K`` without positions (methods.md §1.7a); absolute-position models add position 0.
    """
    n_layers = model.cfg.n_layers
    hyp = list(hypothesis_ids)
    n, Q = len(batch.input_ids), len(batch.query_pos)
    # one forward pass of the whole batch, as the snapshot always took: its numbers do not depend on a chunking
    acts = read(model, batch, [(n_layers - 1, "v")], at="queries", logit_ids=hyp, batch_size=n)
    keys = read(model, [[h] for h in hyp], [(0, "k")])
    log_p = torch.log_softmax(acts.logits.double(), -1).reshape(n, Q, len(hyp))  # [n, Q, H]
    return Snapshot(
        patterns=[p.double() for p in patterns(model, batch.input_ids, batch_size=n)],
        layer0_keys=keys.reading("k", 0).reshape(len(hyp), keys.meta["n_kv_heads"], -1).double(),
        values=acts.values().double(),  # [n * Q, kv_heads * d_head], sequence-major
        model_entropy=info.entropy_of_log_probs(log_p).flatten(),
        bayes_entropy=info.entropy(batch.posterior.double()).flatten(),
        groups=acts.groups,
    )


def key_orthogonality(keys: torch.Tensor) -> torch.Tensor:
    """Mean |cosine| over off-diagonal pairs of keys [n, heads, d] -> [heads] (0 = orthogonal frame)."""
    return torch.from_numpy(mean_abs_offdiag_cos(as_float64(keys.permute(1, 2, 0))))  # keys as columns [heads, d, n]


def attention_similarity(p: torch.Tensor, p_ref: torch.Tensor) -> float:
    """1 - mean Jensen-Shannon distance (base 2) between attention rows [..., q, k]: 1 = identical maps."""
    m = 0.5 * (p + p_ref)
    m = m.clamp_min(1e-300)
    js = 0.5 * (torch.special.xlogy(p, p / m) + torch.special.xlogy(p_ref, p_ref / m))
    return 1.0 - float(torch.sqrt((js.sum(-1) / info.LN2).clamp(0, 1)).mean())


def low_entropy_separation(values: torch.Tensor, bayes_entropy: torch.Tensor, quantile: float = 0.25) -> float:
    """|Spearman rho| of PC1 with the Bayes entropy among the lowest-entropy ``quantile`` of states: 1 when PC1 orders
    small hypothesis sets, ~0 when they are collapsed together."""
    low = bayes_entropy <= torch.quantile(bayes_entropy, quantile)
    pc1, h = pca(values, standardize=False)[2][:, 0][low.numpy()], bayes_entropy[low].numpy()
    if is_constant(pc1) or is_constant(h):
        return 0.0
    return abs(spearman(pc1, h))


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
        "entropy_r2": cv_r2(snap.values, snap.bayes_entropy, snap.groups),
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
    centre, lo, hi = geometric_mean_interval(ratios, level)
    return {"geomean": centre, "lo": lo, "hi": hi, "n": len(ratios)}


def frame_precision_from_checkpoints(checkpoints: Sequence[tuple[int, str | Path]], batch,
                                     hypothesis_ids: Sequence[int], *, loader: Callable | None = None,
                                     frac: float = 0.9) -> dict:
    """Metric curves over a checkpoint series (``(step, folder)`` pairs) on one fixed ``TaskBatch``, and the
    dissociation. ``loader(folder)`` returns a hooked model (default: ``ib.load_model``, which opens a wind tunnel of any
    architecture)."""
    loader = loader or load_model
    ordered = sorted(checkpoints, key=lambda c: c[0])
    if len(ordered) < 2 or ordered[-1][0] <= 0:
        raise ConfigError("Need at least two checkpoints with a positive final step to measure settling.")
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
    series = saved_checkpoints(run)
    if is_tunnel(run):
        series.setdefault(open_tunnel(run).step, run)
    if len(series) < 2:
        raise ConfigError(f"{run} holds fewer than two checkpoints; train with checkpoints (windtunnel) first.")
    return sorted(series.items())


def frame_precision_run(run: str | Path, *, n_eval: int = 64, seed: int = 0, loader: Callable | None = None) -> dict:
    """``frame_precision_from_checkpoints`` on a wind-tunnel run folder, with ``n_eval`` fresh sequences of its task."""
    series = checkpoint_series(run)
    tunnel = open_tunnel(series[0][1])
    cfg, task = tunnel.config, tunnel.task
    res = frame_precision_from_checkpoints(series, task.sample(n_eval, seed=seed), task.hypothesis_ids, loader=loader)
    return {"run": str(run), "task": cfg.task, **res}

