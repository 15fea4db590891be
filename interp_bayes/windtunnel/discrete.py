"""The tunnels with discrete hypotheses (bijection, HMM): the read-out restricted to the hypothesis tokens, its
training loss, its scoring against the exact posterior in bits, and their entries of the task table.

Metrics, with both entropy-MAE definitions labelled:

- per-sample entropy MAE: mean over sequences and positions of |H(model) - H(Bayes)| (jlens ``eval_entropy_mae``);
- mean-curve entropy MAE: average H over sequences first, then |mean H(model) - mean H(Bayes)| per position,
  averaged over positions (``src/utils/entropy.py``; errors can cancel, so it is the smaller number);
- KL(Bayes || model) in bits, mean over sequences and positions.
The model's distribution is its next-token softmax restricted to the task's hypothesis tokens.

Beside the model, the same sequences are scored for the shortcut baselines of ``interp_bayes.tasks.filters`` (the
uniform guess, the prior, the m-observation window filters, and the position-only entropy predictor), and the
model's KL is compared with the best window filter's by a paired bootstrap over sequences: a wind-tunnel result
counts only where the model beats the best window.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch
from torch import nn

from ..stats import as_float64, beyond, bootstrap_mean_draws
from ..stats.sequential import ACCEPT, BATCH, REJECT
from ..stats import info
from ..stats.calibration import compare_to_bayes
from ..tasks.base import TaskBatch
from ..tasks.filters import baseline_posteriors, position_entropy
from .entry import TaskEntry


def restricted_log_probs(model: nn.Module, batch: TaskBatch, hypothesis_ids: list[int]) -> torch.Tensor:
    """Log-probabilities over the hypothesis tokens at the query positions: [n, Q, H] float32.

    Works for an HF model (``.logits``), a TransformerBridge or the MLP baseline (a logits tensor); the result
    is on the model's device.
    """
    out = model(batch.input_ids.to(next(model.parameters()).device))
    logits = out if isinstance(out, torch.Tensor) else out.logits  # [n, T, vocab]
    sliced = logits[:, batch.query_pos][..., hypothesis_ids].float()  # [n, Q, H]
    return torch.log_softmax(sliced, dim=-1)


def loss_fn(logp: torch.Tensor, posterior: torch.Tensor, labels: torch.Tensor, kind: str) -> torch.Tensor:
    """Soft cross-entropy to the exact posterior, or hard cross-entropy to the realised hypothesis; nats."""
    if kind == "soft":
        return -(posterior * logp).sum(-1).mean()
    return -torch.gather(logp, -1, labels[..., None]).mean()


def discrete_loss(model: nn.Module, batch: TaskBatch, hyp: list[int], kind: str) -> torch.Tensor:
    """The training loss of a task with discrete hypotheses (``loss_fn`` on the read-out restricted to them)."""
    logp = restricted_log_probs(model, batch, hyp)
    return loss_fn(logp, batch.posterior.to(logp.device), batch.labels.to(logp.device), kind)


def summarise(h_model: torch.Tensor, posterior: torch.Tensor, logp: torch.Tensor | None = None) -> dict[str, Any]:
    """The three metrics, averaged and per position, from the model's entropies ``h_model`` [n, Q] (bits) and,
    for the KL, its log-probabilities ``logp`` [n, Q, H]; by ``stats.calibration.compare_to_bayes`` with the query
    position as the group. Without ``logp`` the KL is NaN (an entropy predictor has no distribution)."""
    n, Q, H = posterior.shape
    h_bayes = info.entropy(posterior.double())  # [n, Q]
    cmp = compare_to_bayes(h_model.reshape(-1), h_bayes.reshape(-1), by=np.tile(np.arange(Q), n),
                           model_logprobs=None if logp is None else logp.reshape(-1, H),
                           posterior=None if logp is None else posterior.reshape(-1, H))
    per = [cmp["per_group"][q] for q in range(Q)]
    nan = float("nan")
    return {
        "per_sample_entropy_mae_bits": cmp["all"]["mae"],
        "mean_curve_entropy_mae_bits": cmp["all"]["mean_curve_mae"],
        "kl_bits": cmp["all"].get("kl_bits", nan),
        "per_position": {
            "per_sample_entropy_mae_bits": [b["mae"] for b in per],
            "mean_curve_entropy_mae_bits": [abs(b["model_entropy"] - b["bayes_entropy"]) for b in per],
            "kl_bits": [b.get("kl_bits", nan) for b in per],
            "bayes_entropy_bits": [b["bayes_entropy"] for b in per],
            "model_entropy_bits": [b["model_entropy"] for b in per],
        },
    }


def score(logp: torch.Tensor, posterior: torch.Tensor) -> dict[str, Any]:
    """Per-position and averaged metrics from model log-probs and exact posteriors, both [n, Q, H]."""
    return summarise(info.entropy(logp.exp()), posterior, logp)


def paired_margin(baseline_kl: np.ndarray, model_kl: np.ndarray, *, n_boot: int = 2000,
                  seed: int = 0) -> dict[str, Any]:
    """Mean KL margin (baseline minus model, bits) over sequences with a 95% paired-bootstrap interval, drawn in
    batches until the interval is settled on one side of 0 (``stats.beyond``; ``n_boot`` the cap): ``beats`` is
    True when it lies above 0, False when settled not to, None when undecided at the cap (borderline); ``test``
    records the decision and the draws used.

    ``baseline_kl``, ``model_kl``: [n, Q] per sequence and position; sequences are the resampled unit (positions of
    one sequence are not independent)."""
    diff = (as_float64(baseline_kl) - as_float64(model_kl)).mean(1)  # [n] per-sequence margin
    rng = np.random.default_rng(seed)
    test = beyond(lambda b: bootstrap_mean_draws(diff, n_boot=b, seed=rng), 0.0, "above", cap=n_boot,
                  batch=min(BATCH, n_boot))
    return {"margin_bits": float(diff.mean()), "margin_ci": [float(x) for x in test.null],
            "n_sequences": len(diff), "n_boot": n_boot, "beats": {REJECT: True, ACCEPT: False}.get(test.decision),
            "test": test.as_dict()}


def compare_with_baselines(logp: torch.Tensor, batch: TaskBatch, task: Any, *, windows: tuple[int, ...] = (1, 2, 3, 4),
                           position_h: torch.Tensor | None = None, seed: int = 0) -> dict[str, Any]:
    """Score every shortcut baseline on ``batch`` and compare the model (``logp`` [n, Q, H]) with the best window.

    Returns ``baselines`` (name -> metrics, as ``score``, each with ``kl_margin``: its KL minus the model's, with
    the paired-bootstrap interval), and ``vs_best_window``: the window filter with the lowest KL, its KL and the
    model's, the margin with its interval and ``beats`` (``paired_margin``: the interval settled above 0)."""
    post = batch.posterior.double()
    beliefs = baseline_posteriors(task, batch, windows)
    model_kl = info.kl_from_probs(post, logp)  # [n, Q]
    out = {}
    for name, q in beliefs.items():
        out[name] = score(torch.log(q), post)
        out[name]["kl_margin"] = paired_margin(info.kl_from_probs(post, torch.log(q)), model_kl, seed=seed)
    if position_h is not None:
        out["position-only"] = summarise(position_h.expand(post.shape[:2]), post)
    best = min((name for name in out if name.startswith("window-")), key=lambda name: out[name]["kl_bits"])
    margin, model_kl = out[best]["kl_margin"], float(model_kl.mean())
    versus = {"best_window": best, "window_kl_bits": out[best]["kl_bits"], "model_kl_bits": model_kl, **margin,
              "kl_ratio": out[best]["kl_bits"] / model_kl if model_kl > 0 else float("inf")}
    return {"baselines": out, "vs_best_window": versus}


@torch.no_grad()
def held_out_log_probs(model: nn.Module, task: Any, n: int, *, length: int, seed: int,
                       batch_size: int) -> tuple[torch.Tensor, TaskBatch]:
    """The model's restricted log-probabilities [n, Q, H] (CPU) on ``n`` held-out sequences of ``length`` drawn in
    batches with seeds [seed, length, i], and those sequences as one batch."""
    logps, batches = [], []
    for i, start in enumerate(range(0, n, batch_size)):
        batch = task.sample(min(batch_size, n - start), seed=[seed, length, i], length=length)
        logps.append(restricted_log_probs(model, batch, task.hypothesis_ids).cpu())
        batches.append(batch)
    whole = TaskBatch(input_ids=torch.cat([b.input_ids for b in batches]), query_pos=batches[0].query_pos,
                      posterior=torch.cat([b.posterior for b in batches]),
                      labels=torch.cat([b.labels for b in batches]))
    return torch.cat(logps), whole


@torch.no_grad()
def evaluate_discrete(
    model: nn.Module,
    task: Any,
    n: int = 2000,
    *,
    lengths: list[int],
    seed: int = 2024,
    batch_size: int = 250,
    baselines: bool = True,
    windows: tuple[int, ...] = (1, 2, 3, 4),
) -> dict[int, dict[str, Any]]:
    """Score ``model`` on ``n`` held-out sequences per length; returns {length: metrics} (see module docstring).

    ``baselines`` adds ``baselines`` and ``vs_best_window`` (see ``compare_with_baselines``) on the same sequences;
    the position-only entropy is the mean exact entropy per position over ``n`` other sequences (seed + 1).
    """
    model.eval()
    results = {}
    for length in lengths:
        logp, whole = held_out_log_probs(model, task, n, length=length, seed=seed, batch_size=batch_size)
        results[length] = {"length": length, "n": n, **score(logp, whole.posterior)}
        if baselines:
            position_h = position_entropy(task, length, n=n, seed=seed + 1)
            results[length] |= compare_with_baselines(logp, whole, task, windows=windows, position_h=position_h,
                                                      seed=seed)
    return results


def final_summary(final: dict[int, dict[str, Any]], task: Any) -> str:
    """The three metrics and the best-window comparison at every evaluated length."""
    keys = ("per_sample_entropy_mae_bits", "mean_curve_entropy_mae_bits", "kl_bits")
    summary = {length: {k: m[k] for k in keys} | {"best_window": m["vs_best_window"]}
               for length, m in final.items()}
    return f"eval (bits): {json.dumps(summary)}"


def entry(lengths) -> TaskEntry:
    """The table entry of a discrete task evaluated by default at ``lengths(task)``."""
    return TaskEntry(
        loss=lambda model, task, batch, kind: discrete_loss(model, batch, task.hypothesis_ids, kind),
        held_out=lambda model, task, batch: score(restricted_log_probs(model, batch, task.hypothesis_ids).cpu(),
                                                  batch.posterior),
        evaluate=evaluate_discrete, lengths=lengths, summary=final_summary,
        batch_length=lambda batch: batch.input_ids.shape[1], progress=("mae", "per_sample_entropy_mae_bits"))


BIJECTION = entry(lambda task: [task.n_pairs])  # the training length
# the training length, plus 30 and 50 observations (length generalisation)
HMM = entry(lambda task: [task.n_steps] + [k for k in (30, 50) if k > task.n_steps])
