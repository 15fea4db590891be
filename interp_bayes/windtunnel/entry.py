"""What a wind-tunnel task supplies to the generic trainer (``train.py``) and evaluator (``evaluate.py``): one
``TaskEntry``, defined in the task's own module and listed in ``table.TASK_TABLE``.

In the signatures, ``task`` is the task object (``configs.make_task``) and ``batch`` one of its samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

Metrics = dict[str, Any]


@dataclass(frozen=True)
class TaskEntry:
    """A task's row of the table: its loss, its metrics, its evaluator and how its runs are logged."""

    loss: Callable[[nn.Module, Any, Any, str], torch.Tensor]  # (model, task, batch, cfg.loss) -> loss in nats
    held_out: Callable[[nn.Module, Any, Any], Metrics]  # (model, task, batch) -> metrics logged during training
    # (model, task, n, *, lengths, seed, **the task's own options) -> {length: metrics}
    evaluate: Callable[..., dict[int, Metrics]]
    lengths: Callable[[Any], list[int]]  # task -> the lengths it is evaluated at by default
    summary: Callable[[dict[int, Metrics], Any], str]  # (final evaluation, task) -> what is printed after training
    batch_length: Callable[[Any], int]  # batch -> the sequence length logged per step
    progress: tuple[str, str]  # (label, held-out metric) shown on the progress bar
