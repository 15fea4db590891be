"""What every wind-tunnel task returns: token ids plus the exact posterior at the positions the model is scored on."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch


@dataclass
class TaskBatch:
    """A batch of sequences with their exact Bayesian posteriors.

    The model's prediction at ``input_ids[:, query_pos[q]]`` (next-token logits, restricted to the task's
    hypothesis tokens) is compared with ``posterior[:, q]``.
    """

    input_ids: torch.Tensor  # [n, T] int64
    query_pos: torch.Tensor  # [Q] int64, the same positions for every sequence
    posterior: torch.Tensor  # [n, Q, H] float32, exact p(hypothesis | context)
    labels: torch.Tensor  # [n, Q] int64, the realised hypothesis (a sample from the posterior's generative process)


def as_rng(seed: int | Sequence[int] | np.random.Generator | None) -> np.random.Generator:
    """A numpy Generator from a seed (or the Generator itself), so every sampler is reproducible."""
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def sample_in_worker(task, n: int, seed: Sequence[int], length: int | None) -> tuple[type, dict]:
    """``task.sample`` for a worker process (module level, so that it pickles; here, so that a worker imports the
    tasks and not the trainer's libraries), one torch thread (the workers together fill the cores). Returns the
    batch's class and its fields with tensors as numpy arrays, which pickle by value: torch's own pickling of
    tensors between processes goes through shared memory, which a sandboxed machine may not offer.
    ``from_worker`` rebuilds the batch."""
    torch.set_num_threads(1)
    batch = task.sample(n, seed=seed, length=length)
    return type(batch), {f.name: (v.numpy() if isinstance(v := getattr(batch, f.name), torch.Tensor) else v)
                         for f in fields(batch)}


def from_worker(drawn: tuple[type, dict]):
    """The batch ``sample_in_worker`` returned, with its tensors back."""
    cls, values = drawn
    return cls(**{k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in values.items()})
