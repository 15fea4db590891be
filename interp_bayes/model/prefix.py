"""Many edited forward passes over one prompt set, paying only for the blocks each edit can change.

An edit at block L (or later) leaves blocks 0..L-1 as they were, so the residual entering block L can be captured
once per batch of prompts and replayed for every edit. The replay goes through the model's own forward: the
Hugging Face model still builds the embeddings, position embeddings (rotary, learned, partial rotary) and attention
masks (causal, sliding window) for the token ids, which costs next to nothing, while each block before L returns
the captured residual instead of computing. Nothing of any family's forward is re-implemented, so every family the
bridge supports works the same way, and blocks L.. compute exactly what they compute in a full pass.

Several edits run stacked in one forward (copies of the batch, each copy's edit applied to its slice). The last
block computes its attention output and MLP at the final position only, as in ``model.collect.collect``
(``model.collect.final_position_tail``); there, and in the unembedding, the rows of one copy are few, so those modules
run per copy (``per_copy``).

``edited_runs`` runs the unperturbed model and a list of edits that way (``fast=True``), or with a whole forward
pass per edit (``fast=False``, the reference). Both give the same numbers: bit for bit on CPU with MKL (see
``MIN_ROWS`` for what that takes), and to 1e-5 relative in the tests, on every family and on SmolLM2.

An operator that sets per-prompt values (``model.edits.AxisSet``: the on-manifold ablations) is bound to each batch's
prompt indices (``bind_edit``) on both paths: a copy's slice of the stacked batch holds the batch's prompts, in order.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch

from ..core.layers import layer_index
from ..core.stop import check_stop
from ..stats.info import kl
from .collect import collect
from .edits import bind_edit, intervene
from .hooks import reading_hook
from .read import (check_prompts, checked, final_logits, final_position_tail, length_batches, next_token_entropy,
                   reading_hooks, tokenize)

EDIT_TOKENS = 4096  # edits are stacked into one forward up to about this many tokens ...
EDIT_ROWS = 128  # ... and this many prompt copies (each keeps a row of full-vocabulary logits)
# A matrix product computes each row the same way whatever its number of rows from this many rows on (MKL takes
# another kernel for smaller matrices): copies are stacked only when one copy's batch has at least this many
# tokens, and the final-position modules, with one row per prompt, run per copy; so the fast path reproduces a
# whole forward pass bit for bit.
MIN_ROWS = 16


def _with_batch(output: Any, copies: int) -> Any:
    """A fresh copy of a block's output (a tensor, or a tuple whose first item is the hidden states) with its
    batch repeated ``copies`` times; fresh, so that a block writing into its input cannot alter the capture."""
    if isinstance(output, tuple):
        return (_with_batch(output[0], copies), *output[1:])
    return output.repeat(copies, *([1] * (output.dim() - 1)))


@contextmanager
def capture_residuals(model, layers: Iterable[int]) -> Iterator[dict[int, Any]]:
    """While active, every forward stores (per layer L in ``layers``, L >= 1) the output of block L-1: the
    residual entering block L. Yields the dict it fills (layer -> the block's output object)."""
    store: dict[int, Any] = {}
    handles = []
    for layer in sorted(set(layers)):
        if layer < 1:
            continue
        handles.append(model.blocks[layer - 1].register_forward_hook(
            lambda module, args, output, layer=layer: store.__setitem__(layer, output)))
    try:
        yield store
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def replay_prefix(model, start: int, residual: Any, copies: int = 1) -> Iterator[None]:
    """While active, blocks 0..start-1 do not compute: each returns ``residual`` (the output of block start-1 that
    ``capture_residuals`` stored, for the same token ids), its batch repeated ``copies`` times to match an input
    of ``copies`` stacked copies of those ids. Block ``start`` and later run as usual, hooks included."""
    if start < 1:
        yield
        return
    replay = _with_batch(residual, copies)
    skipped = list(model.blocks)[:start]
    for block in skipped:  # an instance attribute, set past the bridge's attribute forwarding to the HF module
        object.__setattr__(block, "forward", lambda *args, **kwargs: replay)
    try:
        yield
    finally:
        for block in skipped:
            object.__delattr__(block, "forward")


@contextmanager
def per_copy(modules: list[torch.nn.Module], copies: int) -> Iterator[None]:
    """While active, each of ``modules`` runs on the ``copies`` equal slices of its input's batch one at a time, so
    each copy's rows come out exactly as in a forward of that copy alone (a matrix product may round a row
    differently when the matrix has more rows)."""
    if copies == 1:
        yield
        return

    def split(run: Callable) -> Callable:
        return lambda x, *args, **kwargs: torch.cat([run(part, *args, **kwargs) for part in x.chunk(copies)])

    for module in modules:
        object.__setattr__(module, "forward", split(type(module).forward.__get__(module)))
    try:
        yield
    finally:
        for module in modules:
            object.__delattr__(module, "forward")


@dataclass
class EditedRun:
    """What one run (the unperturbed model or one edit) gave for every prompt."""

    entropy: torch.Tensor  # [n] bits, over the label tokens
    label_logprobs: torch.Tensor  # [n, n_labels]
    values: dict[int, torch.Tensor]  # layer (as the caller spelled it) -> [n, n_kv * d_head], final token
    kl: torch.Tensor | None = None  # [n] float64 KL(edited || unperturbed) in bits; None for the unperturbed run


def edited_runs(model, prompts: list, edits: list[dict[int, Callable]], *, layers: list[int],
                label_tokens: list[int], batch_size: int | None = None, fast: bool = True,
                tick: Callable[[int], object] = lambda n: None) -> list[EditedRun]:
    """The unperturbed run, then one run per edit (layer -> operator on ``hook_v``, layers non-negative, as
    ``model.edits.resolve_edits`` gives them): entropy over ``label_tokens``, their log-probabilities, KL from
    the unperturbed run and the final-token values at ``layers``. ``tick(n)`` reports n prompt runs done."""
    return (_fast_runs if fast else _naive_runs)(model, prompts, edits, layers=layers, label_tokens=label_tokens,
                                                 batch_size=batch_size, tick=tick)


def _naive_runs(model, prompts: list, edits: list[dict], *, layers: list[int], label_tokens: list[int],
                batch_size: int | None, tick: Callable[[int], object]) -> list[EditedRun]:
    """Each run a whole forward pass over every prompt: ``collect`` under ``intervene``."""
    def run(edit: dict) -> tuple[EditedRun, torch.Tensor]:
        if not any(hasattr(op, "bind") for op in edit.values()):
            with intervene(model, edit):
                acts = collect(model, prompts, layers=layers, readings=("v",), label_tokens=label_tokens,
                               batch_size=batch_size, keep_logprobs=True, progress=False)
            return EditedRun(acts.entropy, acts.label_logprobs, {layer: acts.values(layer) for layer in layers}), \
                acts.logprobs
        # per-prompt values: one whole forward per batch of equal length, the edit bound to that batch's prompts
        n = len(prompts)
        out = EditedRun(torch.empty(n), torch.empty(n, len(label_tokens)), {})
        logprobs = None
        for idx in length_batches(tokenize(model, prompts), batch_size):
            with intervene(model, {layer: bind_edit(op, idx) for layer, op in edit.items()}):
                acts = collect(model, [prompts[i] for i in idx], layers=layers, readings=("v",),
                               label_tokens=label_tokens, batch_size=len(idx), keep_logprobs=True, progress=False)
            index = torch.tensor(idx)
            out.entropy[index], out.label_logprobs[index] = acts.entropy, acts.label_logprobs
            for layer in layers:
                out.values.setdefault(layer, torch.empty(n, acts.values(layer).shape[1]))[index] = acts.values(layer)
            if logprobs is None:
                logprobs = torch.empty(n, acts.logprobs.shape[1])
            logprobs[index] = acts.logprobs
        return out, logprobs

    base, base_lp = run({})
    base_lp = base_lp.double()
    runs = [base]
    for edit in edits:
        out, lp = run(edit)
        out.kl = kl(lp.double(), base_lp)  # KL(edited || unperturbed), float64
        runs.append(out)
        tick(len(prompts))
    return runs


def _per_copy_hook(ops: list, rows: int) -> Callable:
    """A hook applying ``ops[j]`` (None: no edit) to rows j*rows..(j+1)*rows of a batch of stacked copies: each op
    sees exactly the tensor it would see in a run of its own."""
    def hook(v: torch.Tensor, hook) -> torch.Tensor:
        return torch.cat([v[j * rows:(j + 1) * rows] if op is None else op(v[j * rows:(j + 1) * rows])
                          for j, op in enumerate(ops)])
    return hook


@torch.no_grad()
def _fast_runs(model, prompts: list, edits: list[dict], *, layers: list[int], label_tokens: list[int],
               batch_size: int | None, tick: Callable[[int], object]) -> list[EditedRun]:
    """Per batch of prompts, the unperturbed forward keeps the residual entering the first edited block of every
    edit; the edits then run from there, several stacked into one forward. Readings before an edit's first block
    are the unperturbed ones."""
    token_ids = tokenize(model, prompts)
    check_prompts(token_ids, prompts, model.cfg.n_ctx)
    device = next(model.parameters()).device
    labels = torch.tensor(list(label_tokens), device=device)
    n = len(token_ids)
    runs = [EditedRun(torch.empty(n), torch.empty(n, len(labels)), {},
                      None if i == 0 else torch.empty(n, dtype=torch.float64)) for i in range(1 + len(edits))]
    starts: dict[int, list[int]] = {}  # first edited block -> the edits starting there
    for e, edit in enumerate(edits):
        starts.setdefault(min(edit), []).append(e)
    blocks = {layer: layer_index(layer, model.cfg.n_layers) for layer in layers}  # the caller's spelling -> block
    last = model.blocks[-1]
    one_row_per_prompt = [last.attn.o, last.mlp, model.unembed]  # the final position only: run per copy
    store: dict = {}

    def record(run: EditedRun, index: torch.Tensor, logits: torch.Tensor, values: dict[int, torch.Tensor],
               base_lp: torch.Tensor | None = None) -> None:
        run.entropy[index], run.label_logprobs[index] = next_token_entropy(logits, labels)
        for layer, v in values.items():
            run.values.setdefault(layer, torch.empty(n, v.shape[1]))[index] = v
        if base_lp is not None:
            run.kl[index] = kl(torch.log_softmax(logits.float(), dim=-1).cpu().double(), base_lp)

    for idx in length_batches(token_ids, batch_size):
        check_stop()
        ids = torch.tensor([token_ids[i] for i in idx], device=device)
        index, rows = torch.tensor(idx), len(idx)
        with capture_residuals(model, starts) as residual, model.hooks(
                fwd_hooks=reading_hooks(("v",), sorted(set(blocks.values())), store) + final_position_tail(model)):
            logits = final_logits(model, ids)
        checked(store, idx)
        base_values = {layer: store[("v", block)] for layer, block in blocks.items()}
        base_lp = torch.log_softmax(logits.float(), dim=-1).cpu().double()
        record(runs[0], index, logits, base_values)
        copies = max(1, min(EDIT_TOKENS // ids.numel(), EDIT_ROWS // rows)) if ids.numel() >= MIN_ROWS else 1
        for start, members in starts.items():
            later = sorted({block for block in blocks.values() if block >= start})
            for c in range(0, len(members), copies):
                chunk = members[c:c + copies]
                edited = sorted({layer for e in chunk for layer in edits[e]})
                hooks = [(reading_hook("v", layer), _per_copy_hook([bind_edit(edits[e].get(layer), idx)
                                                                    for e in chunk], rows)) for layer in edited]
                store.clear()
                with replay_prefix(model, start, residual.get(start), copies=len(chunk)), \
                        per_copy(one_row_per_prompt, len(chunk)), \
                        model.hooks(fwd_hooks=hooks + reading_hooks(("v",), later, store) + final_position_tail(model)):
                    logits = final_logits(model, ids.repeat(len(chunk), 1))
                checked(store, idx)
                for j, e in enumerate(chunk):
                    part = slice(j * rows, (j + 1) * rows)
                    values = {layer: store[("v", block)][part] if block >= start else base_values[layer]
                              for layer, block in blocks.items()}
                    record(runs[1 + e], index, logits[part], values, base_lp)
                tick(rows * len(chunk))
        store.clear()
    return runs
