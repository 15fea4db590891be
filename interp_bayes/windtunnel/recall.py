"""The associative-recall tunnel (``tasks/recall.py``): the discrete read-out and loss of ``discrete``, scored at the
query keys, plus the paper's metric, the share of queries recalled (the model's top value is the stored one).

Baselines on the same sequences: the uniform guess, the position-only belief (uniform: it equals the uniform
guess here, listed under its own name), the stored-values belief (1/N on each stored value: memory without
binding; ``binding`` compares the model with it as ``vs_best_window`` does with the windows) and the window
filters over the last m tokens, m = 1, 2, 4, ... below the first query's position (``recall_windows``). A
baseline's recall is the expected accuracy of its best guess, the mean of its largest probability (its belief is
the exact conditional given what it sees, so ties need no breaking rule). The model's KL is compared with the best
window's by the paired bootstrap of ``discrete.compare_with_baselines``.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from torch import nn

from ..tasks.filters import baseline_posteriors
from ..tasks.recall import RecallTask
from .discrete import compare_with_baselines, discrete_loss, held_out_log_probs, restricted_log_probs, score
from .entry import Metrics, TaskEntry


def recall_windows(task: RecallTask, length: int | None = None) -> tuple[int, ...]:
    """The default window sizes in tokens: powers of two below the first query's position. A window that long
    would show the first query every stored pair, i.e. be the exact posterior there."""
    first, out, m = int(task.query_positions(length)[0]), [], 1
    while m < first:
        out.append(m)
        m *= 2
    return tuple(out)


def recall_metrics(logp: torch.Tensor, batch: Any) -> Metrics:
    """``score`` plus the share of queries whose top value is the stored one, overall and per query."""
    hit = (logp.argmax(-1).cpu() == batch.labels).double()  # [n, M]
    return score(logp, batch.posterior) | {"recall_accuracy": float(hit.mean()),
                                           "recall_accuracy_per_query": hit.mean(0).tolist()}


@torch.no_grad()
def evaluate_recall(model: nn.Module, task: RecallTask, n: int = 2000, *, lengths: list[int], seed: int = 2024,
                    batch_size: int = 250, baselines: bool = True,
                    windows: tuple[int, ...] | None = None) -> dict[int, Metrics]:
    """Score ``model`` on ``n`` held-out sequences per length (stored pairs); {length: metrics} (module docstring).
    ``windows`` defaults to ``recall_windows``."""
    model.eval()
    results = {}
    for length in lengths:
        logp, whole = held_out_log_probs(model, task, n, length=length, seed=seed, batch_size=batch_size)
        results[length] = {"length": length, "n": n, **recall_metrics(logp, whole)}
        if baselines:
            sizes = windows or recall_windows(task, length)
            results[length] |= compare_with_baselines(logp, whole, task, windows=sizes, seed=seed)
            for name, belief in baseline_posteriors(task, whole, sizes).items():
                results[length]["baselines"][name]["recall_accuracy"] = float(belief.amax(-1).mean())
            bag = results[length]["baselines"]["stored-values"]
            results[length]["binding"] = {**bag["kl_margin"], "stored_values_kl_bits": bag["kl_bits"]}
    return results


def recall_summary(final: dict[int, Metrics], task: RecallTask) -> str:
    """KL, recall and the best-window comparison at every evaluated length."""
    summary = {length: {"kl_bits": m["kl_bits"], "recall_accuracy": m["recall_accuracy"]}
               | ({"best_window": m["vs_best_window"], "binding": m["binding"]} if "binding" in m else {})
               for length, m in final.items()}
    return f"eval (bits): {json.dumps(summary)}"


RECALL = TaskEntry(
    loss=lambda model, task, batch, kind: discrete_loss(model, batch, task.hypothesis_ids, kind),
    held_out=lambda model, task, batch: recall_metrics(restricted_log_probs(model, batch, task.hypothesis_ids).cpu(),
                                                       batch),
    evaluate=evaluate_recall, lengths=lambda task: [task.n_pairs], summary=recall_summary,
    batch_length=lambda batch: batch.input_ids.shape[1], progress=("acc", "recall_accuracy"))
