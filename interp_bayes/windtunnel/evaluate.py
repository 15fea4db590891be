"""Scoring a wind-tunnel model against the exact posterior, in bits, with both entropy-MAE definitions labelled.

- per-sample entropy MAE: mean over sequences and positions of |H(model) - H(Bayes)| (jlens ``eval_entropy_mae``);
- mean-curve entropy MAE: average H over sequences first, then |mean H(model) - mean H(Bayes)| per position,
  averaged over positions (``src/utils/entropy.py``; errors can cancel, so it is the smaller number);
- KL(Bayes || model) in bits, mean over sequences and positions.
The model's distribution is its next-token softmax restricted to the task's hypothesis tokens.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from interp_bayes.tasks.base import TaskBatch, entropy_bits
from interp_bayes.errors import ConfigError
from interp_bayes.windtunnel.configs import MLP_MODEL_TYPE, TASKS, MLPBaseline, TrainConfig, make_task

LN2 = math.log(2.0)


def restricted_log_probs(model: nn.Module, batch: TaskBatch, hypothesis_ids: list[int]) -> torch.Tensor:
    """Log-probabilities over the hypothesis tokens at the query positions: [n, Q, H] float32.

    Works for an HF model (``.logits``), a TransformerBridge or the MLP baseline (a logits tensor); the result
    is on the model's device.
    """
    out = model(batch.input_ids.to(next(model.parameters()).device))
    logits = out if isinstance(out, torch.Tensor) else out.logits  # [n, T, vocab]
    sliced = logits[:, batch.query_pos][..., hypothesis_ids].float()  # [n, Q, H]
    return torch.log_softmax(sliced, dim=-1)


def load_windtunnel(folder: str | Path) -> tuple[nn.Module, TrainConfig]:
    """A trained folder's model (the transformer booted through ``ib.load_model``, or the MLP) and its config."""
    folder = Path(folder)
    cfg = TrainConfig.from_dict(json.loads((folder / "windtunnel.json").read_text())["config"])
    if json.loads((folder / "config.json").read_text()).get("model_type") == MLP_MODEL_TYPE:
        return MLPBaseline.from_pretrained(folder), cfg
    from interp_bayes.models import load_model

    return load_model(str(folder)), cfg


def default_lengths(task: Any) -> list[int]:
    """Evaluation lengths: the training length, plus 30 and 50 observations for the HMM (length generalisation)."""
    if task.name == "bijection":
        return [task.n_pairs]
    return [task.n_steps] + [k for k in (30, 50) if k > task.n_steps]


def score(logp: torch.Tensor, posterior: torch.Tensor) -> dict[str, Any]:
    """Per-position and averaged metrics from model log-probs and exact posteriors, both [n, Q, H]."""
    h_model = entropy_bits(logp.exp())  # [n, Q]
    h_bayes = entropy_bits(posterior)  # [n, Q]
    kl = (torch.special.xlogy(posterior, posterior) - posterior * logp).sum(-1) / LN2  # [n, Q]
    per_sample = (h_model - h_bayes).abs().mean(0)  # [Q]
    mean_curve = (h_model.mean(0) - h_bayes.mean(0)).abs()  # [Q]
    return {
        "per_sample_entropy_mae_bits": per_sample.mean().item(),
        "mean_curve_entropy_mae_bits": mean_curve.mean().item(),
        "kl_bits": kl.mean().item(),
        "per_position": {
            "per_sample_entropy_mae_bits": per_sample.tolist(),
            "mean_curve_entropy_mae_bits": mean_curve.tolist(),
            "kl_bits": kl.mean(0).tolist(),
            "bayes_entropy_bits": h_bayes.mean(0).tolist(),
            "model_entropy_bits": h_model.mean(0).tolist(),
        },
    }


@torch.no_grad()
def evaluate_windtunnel(
    model: nn.Module | str | Path,
    task: Any = None,
    n: int = 2000,
    *,
    lengths: list[int] | None = None,
    seed: int = 2024,
    batch_size: int = 250,
) -> dict[int, dict[str, Any]]:
    """Score ``model`` on ``n`` held-out sequences per length; returns {length: metrics} (see module docstring).

    ``model`` may be a trained folder (its task is then read from windtunnel.json); ``task`` a task object or a
    task name (``"bijection"``, ``"hmm"``: the task with its default settings).
    ``lengths`` defaults to the task's training length, plus 30 and 50 for the HMM (length generalisation).
    """
    if isinstance(model, (str, Path)):
        model, cfg = load_windtunnel(model)
        task = task or make_task(cfg)
    if getattr(task, "name", task) == "kalman":  # Gaussian beliefs: W2, KL and entropy error per step
        from interp_bayes.windtunnel.kalman import evaluate_kalman

        return evaluate_kalman(model, TASKS[task]() if isinstance(task, str) else task, n, lengths=lengths, seed=seed)
    if isinstance(task, str):
        if task not in TASKS:
            raise ConfigError(f"Unknown wind-tunnel task '{task}'; known tasks: {', '.join(sorted(TASKS))}.")
        task = TASKS[task]()
    if task is None:
        raise ConfigError("evaluate_windtunnel needs a task (a name or a task object) when given a model rather "
                          "than a trained folder.")
    model.eval()
    results = {}
    for length in lengths or default_lengths(task):
        logps, posts = [], []
        for i, start in enumerate(range(0, n, batch_size)):
            batch = task.sample(min(batch_size, n - start), seed=[seed, length, i], length=length)
            logps.append(restricted_log_probs(model, batch, task.hypothesis_ids).cpu())
            posts.append(batch.posterior)
        results[length] = {"length": length, "n": n, **score(torch.cat(logps), torch.cat(posts))}
    return results
