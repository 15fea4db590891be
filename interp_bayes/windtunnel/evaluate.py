"""Scoring a wind-tunnel model against its task's exact posterior: the task's evaluator from the task table
(``table.TASK_TABLE``; the metrics are defined in the task's module: ``discrete``, ``kalman``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from ..core.errors import ConfigError
from .configs import TASKS
from .tunnels import open_tunnel
from .table import task_entry


def evaluate_windtunnel(
    model: nn.Module | str | Path,
    task: Any = None,
    n: int = 2000,
    *,
    lengths: list[int] | None = None,
    seed: int = 2024,
    **options: Any,
) -> dict[int, dict[str, Any]]:
    """Score ``model`` on ``n`` held-out sequences per length; returns {length: metrics}.

    ``model`` may be a trained folder (its task is then read from windtunnel.json); ``task`` a task object or a
    task name (the task with its default settings). ``lengths`` defaults to the task's own (its entry's
    ``lengths``); ``options`` go to the task's evaluator (every one takes ``batch_size``, ``baselines``: score the
    shortcut baselines beside the model, and ``windows``; defaults are the task's own: see
    ``discrete.evaluate_discrete`` and ``kalman.evaluate_kalman``).
    """
    if isinstance(model, (str, Path)):
        tunnel = open_tunnel(model)
        model, task = tunnel.model, task or tunnel.task
    if isinstance(task, str):
        if task not in TASKS:
            raise ConfigError(f"Unknown wind-tunnel task '{task}'; known tasks: {', '.join(sorted(TASKS))}.")
        task = TASKS[task]()
    if task is None:
        raise ConfigError("evaluate_windtunnel needs a task (a name or a task object) when given a model rather "
                          "than a trained folder.")
    entry = task_entry(task.name)
    return entry.evaluate(model, task, n, lengths=lengths or entry.lengths(task), seed=seed, **options)
