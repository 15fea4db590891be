"""The toolkit's long-standing reading functions, each a call of the one reader (``model.read.read``): ``collect``
(final-token readings and entropy of a prompt set), ``token_values`` (every position of each prompt) and
``query_readings`` (a task batch's query positions)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..core.errors import ConfigError
from ..core.layers import resolve_layers
from .read import REDUCTIONS, Activations, read, sites_of


def collect(
    model,
    prompts: Sequence[str] | Sequence[Sequence[int]] | torch.Tensor,
    *,
    layers: Sequence[int] = (-1,),
    readings: Sequence[str] = ("v",),
    label_tokens: Sequence[int] | None = None,
    batch_size: int | None = None,
    prepend_bos: bool | None = None,
    keep_logprobs: bool = False,
    progress: bool = True,
) -> Activations:
    """Run ``prompts`` through ``model`` and keep final-token readings and the next-token entropy:
    ``read(model, prompts, sites_of(layers, readings), at="final", ...)`` (see ``model.read.read`` for the readings,
    ``label_tokens`` and ``keep_logprobs``). ``layers`` default to the last one and are recorded in ``meta`` even
    when no reading is asked for (an entropy-only pass)."""
    unknown = set(readings) - set(REDUCTIONS)
    if unknown:
        raise ValueError(f"Unknown reading(s) {sorted(unknown)}; choose from {sorted(REDUCTIONS)}.")
    layer_idx = resolve_layers(layers, model.cfg.n_layers, (-1,))
    acts = read(model, prompts, sites_of(layer_idx, readings), "final", label_tokens=label_tokens,
                batch_size=batch_size, prepend_bos=prepend_bos, keep_logprobs=keep_logprobs, progress=progress)
    acts.meta["layers"] = layer_idx
    return acts


def token_values(model, prompts, layers: Sequence[int], *, site: str = "v",
                 batch_size: int | None = None) -> dict[int, list[torch.Tensor]]:
    """Per layer, every prompt's reading at ``site`` at every position: [len_i, dim] float32 on the CPU (heads
    concatenated), for edits that set per-prompt values (``model.edits.onmanifold_op``): ``read(..., at="all")``
    split by prompt, without the next-token distribution. Keyed by ``layers`` as spelled (negative: from the end)."""
    acts = read(model, prompts, [(layer, site) for layer in layers], "all", batch_size=batch_size,
                distribution=False)
    lengths = np.bincount(acts.groups).tolist()  # rows per prompt
    return {layer: list(acts.reading(site, layer).split(lengths)) for layer in layers}


PROBE_READINGS = ("resid", "v", "z")  # what the belief probes read by default
QUERY_READINGS = (*PROBE_READINGS, "resid_pre")  # what query_readings can read (resid_pre at 0: the embedding)


def query_readings(model, batch, *, layers: list[int] | None = None, readings: tuple[str, ...] = ("resid",),
                   batch_size: int = 250) -> dict[str, dict[int, torch.Tensor]]:
    """Activations at every query position of ``batch`` (a ``TaskBatch``), one forward pass per chunk of
    ``batch_size`` sequences: ``read(model, batch, ..., at="queries", distribution=False).readings``.

    Returns ``{reading: {layer: [n * Q, dim] float32}}``, rows in sequence-major order (row i * Q + q is sequence
    i, query q), heads concatenated as in ``collect``. ``readings``: any of ``"resid"`` (after the block),
    ``"resid_pre"`` (entering it; layer 0: the embedding output), ``"v"`` and ``"z"``; ``layers`` default to all.
    """
    unknown = set(readings) - set(QUERY_READINGS)
    if unknown:
        raise ConfigError(f"Unknown probe reading(s) {sorted(unknown)}; choose from {', '.join(QUERY_READINGS)}.")
    layers = resolve_layers(layers, model.cfg.n_layers, range(model.cfg.n_layers))
    return read(model, batch, sites_of(layers, readings), "queries", batch_size=batch_size,
                distribution=False).readings
