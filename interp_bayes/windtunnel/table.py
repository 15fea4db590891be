"""The task table: wind-tunnel task name -> its ``entry.TaskEntry`` (loss, held-out metrics, evaluator, default
lengths, logging), each defined in the task's own module. ``train.py`` and ``evaluate.py`` look a task up here and
never name one; a new task adds its entry here, beside its task class (``configs.TASKS``) and presets."""

from __future__ import annotations

from ..core.errors import ConfigError
from .discrete import BIJECTION, HMM
from .entry import TaskEntry
from .kalman import KALMAN
from .recall import RECALL

TASK_TABLE: dict[str, TaskEntry] = {"bijection": BIJECTION, "hmm": HMM, "kalman": KALMAN, "recall": RECALL}


def task_entry(name: str) -> TaskEntry:
    """The entry of the task called ``name``; one sentence listing the known tasks when there is none."""
    if name not in TASK_TABLE:
        raise ConfigError(f"Unknown wind-tunnel task '{name}'; known tasks: {', '.join(sorted(TASK_TABLE))}.")
    return TASK_TABLE[name]
