"""The one activation reader: ``read(model, inputs, sites, at=final | queries | all) -> Activations``.

Every reading of activations in the toolkit is a forward pass of this module: hooks on the requested sites
(``(layer, reading)`` pairs, TransformerLens's hook points: ``model.hooks.reading_hook``) that keep, detached to CPU
float32, one row per read position, beside the model's next-token distribution there. ``model.collect`` keeps its
public functions as calls of ``read``, and ``run.sweep.Context.activations`` caches its sets by content. Whole
attention patterns, [n, heads, T, T] per layer, are no rows of a position (their key axis grows with it): ``patterns``
reads them with the same hook names, batching and refusals.

Inputs are either prompts (text or token ids), grouped into buckets of equal token length so that no prompt is ever
padded and a prompt's numbers do not depend on which other prompts share its batch (tests compare single and batched
runs), or a batch of equal-length sequences with query positions (``TaskBatch``: token ids; ``KalmanBatch``:
continuous features, entering as soft tokens through ``continuous_inputs``).
"""

from __future__ import annotations

# plotly is imported inside ``Activations.figure``, the one method that draws: reading and caching activations never do
import hashlib
import html
import json
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import safetensors.torch
import torch
from torch import nn

from ..core.errors import NonFiniteActivationError, PromptError
from ..core.layers import layer_index
from ..core.progress import progress_bar
from ..core.store import MANIFEST, atomic_write_bytes, atomic_write_text, read_json, seal, unseal
from ..core.stop import check_stop
from ..stats.info import entropy, entropy_of_log_probs
from ..stats.pca import pca
from .hooks import act_name, module_input, reading_hook
from .loading import checkpoint_tokenizer, model_info, tokenizer_policy

AT = ("final", "queries", "all")  # where ``read`` reads: the final token, a batch's query positions, every position


def _final_flat(act: torch.Tensor) -> torch.Tensor:
    """[batch, pos, ...] -> the final position with head axes flattened: [batch, dim]."""
    return act[:, -1].reshape(act.shape[0], -1)


def _final_query_entropy(pattern: torch.Tensor) -> torch.Tensor:
    """[batch, heads, q, k] attention -> entropy in bits of each head's final-query row: [batch, heads]."""
    p = pattern[:, :, -1].float()
    return entropy(p)


# reading -> its reduction to one row per prompt (the hook it is taken from: ``model.hooks.reading_hook``)
REDUCTIONS = {
    "v": _final_flat,  # hook_v [batch, pos, n_kv_heads, d_head] -> n_kv_heads * d_head
    "k": _final_flat,  # hook_k [batch, pos, n_kv_heads, d_head] -> n_kv_heads * d_head
    "z": _final_flat,  # hook_z [batch, pos, n_heads, d_head] -> n_heads * d_head
    "resid": _final_flat,  # hook_resid_post [batch, pos, d_model]
    "resid_pre": _final_flat,  # hook_resid_pre [batch, pos, d_model]; layer 0: the embedding output
    "attn_entropy": _final_query_entropy,  # hook_pattern -> n_heads, bits
}
TOKENS_PER_BATCH = 2048  # automatic batch size: about this many tokens per forward pass


def _rows_at(name: str, act: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """A reading at positions ``pos`` [P]: [batch * P, dim], batch-major, head axes flattened (``hook_pattern``
    [batch, heads, q, k]: the entropy in bits of each head's row at each read query)."""
    if name == "attn_entropy":
        t = entropy(act[:, :, pos].float()).transpose(1, 2)  # [batch, P, heads]
    else:
        t = act[:, pos]
    return t.reshape(t.shape[0] * t.shape[1], -1)


@dataclass
class Activations:
    """Readings of a prompt set at some layers, with the model's predictive entropy: one row per read position.

    A row is the final token of a prompt (``read(at="final")``), or a position inside a sequence (``at="queries"`` or
    ``"all"``): then its ``token_ids`` are the prefix ending there (empty for continuous inputs), and ``groups`` the
    sequence it comes from. ``readings[name][layer]`` is ``[n_rows, dim]`` float32 (layers stored non-negative; look
    them up with ``values(-1)`` style negative indices). ``entropy`` is in bits, over the full vocabulary or
    renormalised over ``meta['label_tokens']`` (None, like ``next_token``, for readings alone:
    ``read(distribution=False)``); ``label_logprobs`` ([n_rows, n_labels], natural log, renormalised)
    is set when label tokens were given, ``logits`` ([n_rows, len(meta['logit_ids'])], the model's dtype) when logit
    ids were.
    """

    readings: dict[str, dict[int, torch.Tensor]]
    entropy: torch.Tensor | None  # [n_prompts] bits
    token_ids: list[list[int]]
    meta: dict
    label_logprobs: torch.Tensor | None = None
    next_token: torch.Tensor | None = field(default=None)  # [n_prompts] argmax over the full vocabulary
    logprobs: torch.Tensor | None = field(default=None, repr=False)  # [n_prompts, vocab], only with keep_logprobs
    # [n_prompts] the unit of independence of each prompt (a wind tunnel's sequence); None: every prompt its own.
    # Analyses take it from here for every resampling, so a probe cannot forget it (``with_groups`` sets it).
    groups: np.ndarray | None = field(default=None, repr=False)
    logits: torch.Tensor | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.token_ids)

    def with_groups(self, groups) -> "Activations":
        """Set ``groups`` (one label per prompt: the sequence a prefix comes from, the prompt itself in a pool) and
        return self."""
        g = np.asarray(groups)
        if g.shape != (len(self),):
            raise ValueError(f"groups need one label per prompt: got shape {g.shape} for {len(self)} prompts.")
        self.groups = g
        return self

    @property
    def layers(self) -> list[int]:
        return list(self.meta["layers"])

    def layer_index(self, layer: int) -> int:
        """A non-negative layer index (``core.layers.layer_index``: negative ones count from the model's last
        layer) of a collected layer; KeyError otherwise."""
        idx = layer_index(layer, self.meta["n_layers"], error=KeyError)
        if idx not in self.meta["layers"]:
            raise KeyError(f"Layer {layer} was not collected; collected layers: {self.meta['layers']}.")
        return idx

    def reading(self, name: str, layer: int = -1) -> torch.Tensor:
        if name not in self.readings:
            raise KeyError(f"Reading '{name}' was not collected; collected: {sorted(self.readings)}.")
        return self.readings[name][self.layer_index(layer)]

    def values(self, layer: int = -1) -> torch.Tensor:
        """Final-token value vectors, concatenated over key/value heads: [n_prompts, n_kv_heads * d_head]."""
        return self.reading("v", layer)

    def figure(self, layer: int = -1):
        """Plotly scatter of PC1 vs PC2 of the standardised values at ``layer``, coloured by entropy (bits)."""
        import plotly.graph_objects as go

        ratios, _, scores = pca(self.values(layer))
        texts = self.meta.get("texts") or [f"prompt {i}" for i in range(len(self))]
        marker = {} if self.entropy is None else dict(color=self.entropy.numpy(), colorscale="Viridis",
                                                      colorbar=dict(title="entropy (bits)"))
        fig = go.Figure(go.Scatter(x=scores[:, 0], y=scores[:, 1], mode="markers",
                                   text=[html.escape(t[:100]) for t in texts], marker=marker))
        return fig.update_layout(template="plotly_white", xaxis_title=f"PC1 ({ratios[0]:.1%})",
                                 yaxis_title=f"PC2 ({ratios[1]:.1%})",
                                 title=f"{self.meta['model']['name']}: values at layer {self.layer_index(layer)}")

    def _repr_html_(self) -> str:
        m = self.meta
        dims = ", ".join(f"{name}: {t[self.layers[-1]].shape[1]}" for name, t in self.readings.items())
        entropy = ("no next-token distribution" if self.entropy is None else
                   f"entropy over the {m['entropy_over']} (bits), mean {self.entropy.mean():.3f}")
        return (f"<b>Activations</b> of {html.escape(str(m['model']['name']))}: {len(self)} prompts, layers "
                f"{m['layers']}, dims ({dims}), {entropy}")

    def save(self, path: str | Path) -> Path:
        """Write ``path/activations.safetensors`` and ``path/activations.json`` (atomically)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / MANIFEST).unlink(missing_ok=True)  # an overwritten set is incomplete until sealed again
        tensors = {f"{name}.{layer}": t.contiguous() for name, by_layer in self.readings.items() for layer, t in by_layer.items()}
        if self.entropy is not None:
            tensors["entropy"] = self.entropy
        flat = [t for ids in self.token_ids for t in ids]
        tensors["token_ids"] = torch.tensor(flat, dtype=torch.int64)
        tensors["token_lengths"] = torch.tensor([len(ids) for ids in self.token_ids], dtype=torch.int64)
        if self.label_logprobs is not None:
            tensors["label_logprobs"] = self.label_logprobs
        if self.next_token is not None:
            tensors["next_token"] = self.next_token
        if self.logits is not None:
            tensors["logits"] = self.logits.contiguous()
        if self.groups is not None:
            tensors["groups"] = torch.as_tensor(np.unique(self.groups, return_inverse=True)[1].reshape(-1))
        atomic_write_bytes(path / "activations.safetensors", safetensors.torch.save(tensors))
        atomic_write_text(path / "activations.json", json.dumps(self.meta, indent=2))
        seal(path, MANIFEST, {})
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Activations":
        """Read a saved set back after checking every file against the digests ``save`` recorded (CacheError when
        one is missing, truncated or changed)."""
        path = Path(path)
        unseal(path, MANIFEST)
        tensors = safetensors.torch.load((path / "activations.safetensors").read_bytes())
        meta = read_json(path / "activations.json")
        lengths = tensors.pop("token_lengths").tolist()
        flat = tensors.pop("token_ids").tolist()
        offsets = [0, *torch.tensor(lengths).cumsum(0).tolist()]
        token_ids = [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
        entropy = tensors.pop("entropy", None)
        label_logprobs = tensors.pop("label_logprobs", None)
        next_token = tensors.pop("next_token", None)
        groups = tensors.pop("groups", None)
        logits = tensors.pop("logits", None)
        readings: dict[str, dict[int, torch.Tensor]] = defaultdict(dict)
        for key, t in tensors.items():
            name, layer = key.rsplit(".", 1)
            readings[name][int(layer)] = t
        return cls(dict(readings), entropy, token_ids, meta, label_logprobs, next_token,
                   groups=None if groups is None else groups.numpy(), logits=logits)


def logit_entropy_bits(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in bits of softmax(logits) over the last axis, computed from float32 log_softmax."""
    return entropy_of_log_probs(torch.log_softmax(logits.float(), dim=-1))


def tokenize(model, prompts: Sequence[str] | Sequence[Sequence[int]] | torch.Tensor,
             prepend_bos: bool | None = None) -> list[list[int]]:
    """Token ids per prompt. Text goes through the checkpoint's own tokenizer with its own special-token policy
    (not TransformerLens's rebuilt one, which always adds BOS), unless ``prepend_bos`` forces BOS on or off."""
    if isinstance(prompts, torch.Tensor):
        return [row.tolist() for row in prompts]
    if len(prompts) == 0:
        raise PromptError("The prompt list is empty; pass at least one prompt.")
    if not isinstance(prompts[0], str):
        return [list(map(int, p)) for p in prompts]
    tok = checkpoint_tokenizer(model)
    out = []
    for text in prompts:
        check_stop()  # a tokenizer's finalisers would swallow a handler's exception (core.stop)
        ids = tok(text, add_special_tokens=True)["input_ids"]
        bos = tok.bos_token_id
        if prepend_bos is True and bos is not None and (not ids or ids[0] != bos):
            ids = [bos, *ids]
        elif prepend_bos is False and bos is not None and ids and ids[0] == bos:
            ids = ids[1:]
        out.append(ids)
    return out


def check_prompts(token_ids: list[list[int]], prompts, n_ctx: int) -> None:
    if not token_ids:
        raise PromptError("The prompt list is empty; pass at least one prompt.")
    for i, ids in enumerate(token_ids):
        if not ids:
            raise PromptError(f"Prompt {i} tokenises to nothing; remove it or give it text.")
        if len(ids) > n_ctx:
            shown = prompts[i][:60] + "..." if isinstance(prompts[i], str) else f"#{i}"
            raise PromptError(f"Prompt {i} ({shown!r}) has {len(ids)} tokens, more than the model's context of "
                              f"{n_ctx}; shorten or drop it.")


def length_batches(token_ids: list[list[int]], batch_size: int | None,
                   tokens_per_batch: int = TOKENS_PER_BATCH) -> Iterable[list[int]]:
    """Indices grouped by equal token length (no padding), each group cut into batches of ``batch_size`` prompts
    (None: about ``tokens_per_batch`` tokens), longest first."""
    buckets: dict[int, list[int]] = defaultdict(list)
    for i, ids in enumerate(token_ids):
        buckets[len(ids)].append(i)
    for length in sorted(buckets, reverse=True):
        size = batch_size or max(1, tokens_per_batch // length)
        idx = buckets[length]
        for s in range(0, len(idx), size):
            yield idx[s:s + size]


def prompt_digest(token_ids: list[list[int]]) -> str:
    """A short content hash of a tokenised prompt set: provenance for axes and cached stages."""
    return hashlib.sha256(json.dumps(token_ids).encode()).hexdigest()[:16]


def reading_hooks(readings: Sequence[str], layers: Sequence[int], store: dict[tuple[str, int], torch.Tensor],
                  positions: torch.Tensor | None = None) -> list[tuple[str, Callable]]:
    """Forward hooks that put each reading's rows, float32 on the CPU, into ``store[(name, layer)]`` on every
    forward: the final position's, [batch, dim], or with ``positions`` [P] those at each of them, [batch * P, dim]
    (``_rows_at``); they observe and never edit."""
    def keep(name: str, layer: int) -> Callable:
        def reduce(act):
            return REDUCTIONS[name](act) if positions is None else _rows_at(name, act, positions)

        def hook(act: torch.Tensor, hook) -> None:
            store[(name, layer)] = reduce(act.detach()).to("cpu", torch.float32)
        return hook

    return [(reading_hook(name, layer), keep(name, layer)) for name in readings for layer in layers]


def checked(store: dict[tuple[str, int], torch.Tensor], idx: Sequence[int]) -> dict[tuple[str, int], torch.Tensor]:
    """``store`` after refusing a non-finite reading, naming it and the first prompts of the batch."""
    for (name, layer), t in store.items():
        if not torch.isfinite(t).all():
            raise NonFiniteActivationError(
                f"Non-finite values in reading '{name}' at layer {layer} (prompts {list(idx[:5])}...); "
                "check the dtype (try float32) or the weights of that layer.")
    return store


def _final_position(act: torch.Tensor, hook) -> torch.Tensor:
    return act[:, -1:]


def final_position_tail(model) -> list[tuple[str, Callable]]:
    """Forward hooks that compute the last block's attention output projection and MLP at the final position only
    (their inputs cut to [batch, 1, ...]; keys and values still come from every position, and the block's residual
    additions broadcast, so its other positions hold partial sums that nothing reads). Registered after any edit of
    the last block's ``hook_z`` or MLP input, so that edits see every position."""
    last = model.cfg.n_layers - 1
    names = (act_name("z", last), module_input("mlp", last))
    return [(name, _final_position) for name in names if name in model.hook_dict]  # none without attention


def final_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """[batch, vocab] next-token logits at the final position: the unembedding runs there only, and no key/value
    cache is built."""
    return model(ids, logits_to_keep=1, use_cache=False)[:, -1]


def next_token_entropy(logits: torch.Tensor, labels: torch.Tensor | None,
                       logprobs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """([batch] entropy in bits, [batch, n_labels] label log-probabilities or None) of final-position logits:
    over the vocabulary (``logprobs``, the float32 log_softmax, is reused when given), or renormalised over
    ``labels``."""
    if labels is None:
        logprobs = torch.log_softmax(logits.float(), dim=-1) if logprobs is None else logprobs
        return entropy_of_log_probs(logprobs).cpu(), None
    lp = torch.log_softmax(logits.float()[:, labels], dim=-1)
    return entropy_of_log_probs(lp).cpu(), lp.cpu()




def input_embedding(model: nn.Module) -> torch.Tensor:
    """The token-embedding matrix [vocab, d_model] of a bridge (``W_E``), an HF model, or the MLP baseline."""
    if hasattr(model, "W_E"):
        return model.W_E
    if hasattr(model, "get_input_embeddings"):
        return model.get_input_embeddings().weight
    return model.wte.weight


def soft_token_embeddings(model: nn.Module, features: torch.Tensor) -> torch.Tensor:
    """features [batch, pos, F] -> embeddings [batch, pos, d_model]: the weighted sum of the F feature tokens."""
    w_e = input_embedding(model)
    return features.to(device=w_e.device, dtype=w_e.dtype) @ w_e[: features.shape[-1]]


@contextmanager
def continuous_inputs(bridge: nn.Module, features: torch.Tensor) -> Iterator[torch.Tensor]:
    """Run a TransformerBridge on continuous inputs: inside the block ``hook_embed`` returns the soft-token
    embedding of ``features`` [batch, pos, F]; the yielded placeholder ids [batch, pos] (the special token) only
    give the shape. Use them as ``bridge(ids)`` or ``bridge.run_with_cache(ids)``."""
    emb = soft_token_embeddings(bridge, features)
    ids = torch.full(features.shape[:2], bridge.cfg.d_vocab - 1, dtype=torch.long, device=emb.device)

    def replace(act: torch.Tensor, hook: Any) -> torch.Tensor:
        if act.shape != emb.shape:
            raise ValueError(f"hook_embed has shape {tuple(act.shape)} but the features give {tuple(emb.shape)}; "
                             "run the bridge on the ids this context yields.")
        return emb.to(act.dtype)

    with bridge.hooks(fwd_hooks=[("hook_embed", replace)]):
        yield ids


@dataclass
class Sequences:
    """Equal-length sequences read at ``query_pos``: token ids [n, T] or continuous ``features`` [n, T, F] (one of
    the two). ``TaskBatch`` and ``KalmanBatch`` are read as they are; this spells one by hand."""

    query_pos: torch.Tensor  # [Q] int64, the same positions for every sequence
    input_ids: torch.Tensor | None = None
    features: torch.Tensor | None = None


def is_sequences(inputs) -> bool:
    """Whether ``inputs`` is a batch of equal-length sequences (``Sequences``, ``TaskBatch``, ``KalmanBatch``) rather
    than prompts."""
    return hasattr(inputs, "query_pos")


def _content(batch) -> torch.Tensor:
    """A batch's token ids [n, T], else its continuous features [n, T, F]."""
    ids = getattr(batch, "input_ids", None)
    return ids if ids is not None else batch.features


def sequences_digest(batch) -> str:
    """A short content hash of a batch's sequences (token ids, else the bytes of its features)."""
    ids = getattr(batch, "input_ids", None)
    if ids is not None:
        return prompt_digest(ids.tolist())
    return hashlib.sha256(batch.features.numpy().tobytes()).hexdigest()[:16]


def sites_of(layers: Iterable[int], readings: Iterable[str]) -> list[tuple[int, str]]:
    """The sites of every reading at every layer, reading-major: ``[(layer, reading), ...]``."""
    layers = list(layers)
    return [(layer, name) for name in readings for layer in layers]


def _chunks(model, inputs, at: str, batch_size: int | None, prepend_bos: bool | None):
    """(token ids per row, row count per sequence, meta, an iterator of (row indices [b * P], context yielding the
    ids [b, T], positions [P] or None for the final token)) of prompts or a batch of sequences."""
    if not is_sequences(inputs):
        if at == "queries":
            raise ValueError("Prompts have no query positions; read them at 'final' or 'all', or pass a batch of "
                             "sequences (TaskBatch, KalmanBatch, Sequences) to read at 'queries'.")
        token_ids = tokenize(model, inputs, prepend_bos)
        check_prompts(token_ids, inputs, model.cfg.n_ctx)
        device = next(model.parameters()).device
        lengths = [1 if at == "final" else len(ids) for ids in token_ids]
        starts = np.cumsum([0, *lengths])
        rows = token_ids if at == "final" else [ids[:t + 1] for ids in token_ids for t in range(len(ids))]
        tok = checkpoint_tokenizer(model) if getattr(model, "tokenizer", None) is not None else None
        policy = tokenizer_policy(tok) if tok is not None else None
        bos = policy["bos_token_id"] if policy else None
        meta = dict(tokenizer=policy, bos_token_id=bos, prepend_bos=prepend_bos, prompt_digest=prompt_digest(token_ids),
                    bos_prepended=[bool(ids) and ids[0] == bos for ids in token_ids] if bos is not None else None)
        if isinstance(inputs, (list, tuple)) and isinstance(inputs[0], str):
            meta["texts"] = list(inputs)  # so a run folder shows its prompts without the prompt files

        def batches():
            for idx in length_batches(token_ids, batch_size):
                ids = torch.tensor([token_ids[i] for i in idx], device=device)
                pos = None if at == "final" else torch.arange(ids.shape[1])
                index = torch.tensor(idx) if at == "final" else torch.cat(
                    [torch.arange(starts[i], starts[i + 1]) for i in idx])
                yield index, nullcontext(ids), pos
        return rows, lengths, meta, batches()

    content = _content(inputs)
    n, T = content.shape[:2]
    pos = None if at == "final" else inputs.query_pos if at == "queries" else torch.arange(T)
    P = 1 if pos is None else len(pos)
    ends = [T] if pos is None else (pos + 1).tolist()
    ids = getattr(inputs, "input_ids", None)
    rows = [[] for _ in range(n * P)] if ids is None else [row[:e] for row in ids.tolist() for e in ends]
    meta = dict(prompt_digest=sequences_digest(inputs), positions=None if pos is None else pos.tolist())
    size = batch_size or max(1, TOKENS_PER_BATCH // T)
    device = next(model.parameters()).device

    def batches():
        for start in range(0, n, size):
            part = content[start:start + size]
            context = nullcontext(part.to(device)) if ids is not None else continuous_inputs(model, part)
            yield torch.arange(start * P, (start + len(part)) * P), context, pos
    return rows, [P] * n, meta, batches()


@torch.no_grad()
def read(
    model,
    inputs,
    sites: Iterable[tuple[int, str]] = ((-1, "v"),),
    at: str = "final",
    *,
    label_tokens: Sequence[int] | None = None,
    logit_ids: Sequence[int] | None = None,
    batch_size: int | None = None,
    prepend_bos: bool | None = None,
    keep_logprobs: bool = False,
    distribution: bool = True,
    progress: bool = False,
) -> Activations:
    """Run ``inputs`` through ``model`` and keep the readings at ``sites`` and the next-token distribution, one row
    per read position.

    ``inputs``: prompts (text, through the checkpoint's own tokenizer, or token ids) or a batch of equal-length
    sequences (``TaskBatch``, ``KalmanBatch``, ``Sequences``). ``sites``: ``(layer, reading)`` pairs (``sites_of``),
    readings among ``"v"`` (value vectors, per KV head, concatenated), ``"k"`` (key vectors, likewise), ``"z"``
    (attention output per query head, concatenated), ``"resid"`` (residual stream after the block), ``"resid_pre"``
    (before it; at layer 0 the embedding output) and ``"attn_entropy"`` (entropy in bits of each query head's attention row); negative layers
    count from the end. ``at``: ``"final"`` (the final token of each prompt or sequence), ``"queries"`` (a batch's
    ``query_pos``, rows sequence-major) or ``"all"`` (every position, rows sequence-major).

    ``label_tokens`` renormalises the next-token distribution over those ids for the entropy; ``logit_ids`` keeps
    the raw logits of those ids (``acts.logits``); ``keep_logprobs`` keeps the full next-token log-probabilities in
    memory (``acts.logprobs``, [rows, vocab]; not saved). Prompts are batched by equal length (``batch_size`` prompts,
    None: about ``TOKENS_PER_BATCH`` tokens), a batch of sequences in chunks of ``batch_size`` sequences.

    At ``"final"`` only the final position is computed where nothing else is needed: the unembedding, and the last
    block's attention output projection and MLP (``final_position_tail``; hooks of the caller on those see the final
    position only). Elsewhere the whole forward runs.

    ``distribution=False``: the readings alone, for callers that do not use the next-token distribution (no
    entropy, next token, label log-probabilities or logits: ``acts.entropy`` and ``acts.next_token`` are None).
    Blocks up to the deepest site then run whole at every position and the forward stops after it (TransformerLens's
    ``stop_at_layer``; the toolkit's own LSTM / MLP tunnels, which have none, run on and unembed the final position
    only), so the readings are those of a whole forward, bit for bit.
    """
    if at not in AT:
        raise ValueError(f"Unknown read position {at!r}; choose from {', '.join(AT)}.")
    n_layers = model.cfg.n_layers
    sites = [(layer_index(layer, n_layers), name) for layer, name in sites]
    unknown = {name for _, name in sites} - set(REDUCTIONS)
    if unknown:
        raise ValueError(f"Unknown reading(s) {sorted(unknown)}; choose from {sorted(REDUCTIONS)}.")
    if not distribution and (not sites or label_tokens is not None or logit_ids is not None or keep_logprobs):
        raise ValueError("read(distribution=False) keeps readings alone: give it sites, and no label_tokens, "
                         "logit_ids or keep_logprobs (those read the next-token distribution).")
    rows, lengths, meta, batches = _chunks(model, inputs, at, batch_size, prepend_bos)
    device = next(model.parameters()).device
    labels = torch.tensor(list(label_tokens), device=device) if label_tokens is not None else None
    keep = torch.tensor(list(logit_ids), device=device) if logit_ids is not None else None

    n = len(rows)
    out: dict[str, dict[int, torch.Tensor]] = {name: {} for _, name in sites}
    entropy = torch.empty(n) if distribution else None
    next_token = torch.empty(n, dtype=torch.int64) if distribution else None
    stop = None if distribution else max(layer for layer, _ in sites) + 1  # readings alone: blocks before stop
    label_logprobs = torch.empty(n, len(labels)) if labels is not None else None
    logprobs = logits_kept = None
    current: dict[tuple[str, int], torch.Tensor] = {}
    bar = progress_bar(total=len(lengths), desc="read", unit="prompt", disable=not progress)
    for index, context, pos in batches:
        check_stop()
        hooks = [hook for layer, name in sites for hook in reading_hooks((name,), (layer,), current, pos)]
        tail = final_position_tail(model) if pos is None and distribution else []
        with context as ids, model.hooks(fwd_hooks=hooks + tail):
            if not distribution:
                model(ids, stop_at_layer=stop if stop < n_layers else None, logits_to_keep=1, use_cache=False)
            elif pos is None:
                logits = final_logits(model, ids)  # [b, vocab]
            else:
                logits = model(ids)[:, pos.to(device)]
                logits = logits.reshape(-1, logits.shape[-1])  # [b * P, vocab]
        for (name, layer), t in checked(current, index.tolist()).items():
            out[name].setdefault(layer, torch.empty(n, t.shape[1]))[index] = t
        current.clear()
        bar.update(len(index) // (1 if pos is None else len(pos)))
        if not distribution:
            continue
        next_token[index] = logits.argmax(-1).cpu()
        logp = torch.log_softmax(logits.float(), dim=-1) if keep_logprobs or labels is None else None
        if keep_logprobs:
            if logprobs is None:
                logprobs = torch.empty(n, logits.shape[-1])
            logprobs[index] = logp.cpu()
        if keep is not None:
            if logits_kept is None:
                logits_kept = torch.empty(n, len(keep), dtype=logits.dtype)
            logits_kept[index] = logits[:, keep].cpu()
        entropy[index], lp = next_token_entropy(logits, labels, logp)
        if lp is not None:
            label_logprobs[index] = lp
    bar.close()
    if entropy is not None and not torch.isfinite(entropy).all():
        raise NonFiniteActivationError("Non-finite next-token entropy (the final layer's logits); check the dtype "
                                       "(try float32) or the model weights.")

    cfg = model.cfg
    layers = list(dict.fromkeys(layer for layer, _ in sites))
    meta = dict(
        model=model_info(model).to_dict(), layers=layers, n_layers=n_layers, readings=list(out),
        n_heads=cfg.n_heads, n_kv_heads=cfg.n_key_value_heads or cfg.n_heads, d_head=cfg.d_head,
        label_tokens=list(map(int, label_tokens)) if label_tokens is not None else None,
        logit_ids=list(map(int, logit_ids)) if logit_ids is not None else None,
        entropy_over=None if not distribution else "labels" if labels is not None else "vocabulary",
        entropy_unit="bits", n_prompts=n, at=at,
        **meta)
    acts = Activations(out, entropy, rows, meta, label_logprobs, next_token, logprobs, logits=logits_kept)
    if at != "final":  # the positions of a sequence are not independent: it is the unit
        acts.with_groups(np.repeat(np.arange(len(lengths)), lengths))
    return acts


@torch.no_grad()
def patterns(model, input_ids: torch.Tensor, layers: Iterable[int] | None = None, *,
             batch_size: int | None = None) -> list[torch.Tensor]:
    """Attention patterns ``hook_pattern`` [n, heads, T, T] (rows: query positions), float32 on the CPU, one per
    layer in ``layers`` (None: every layer; negative ones count from the end), of equal-length token sequences
    ``input_ids`` [n, T], in chunks of ``batch_size`` sequences (None: about ``TOKENS_PER_BATCH`` tokens)."""
    n_layers = model.cfg.n_layers
    layers = [layer_index(layer, n_layers) for layer in (range(n_layers) if layers is None else layers)]
    ids = torch.as_tensor(input_ids)
    n, T = ids.shape
    size = batch_size or max(1, TOKENS_PER_BATCH // T)
    device = next(model.parameters()).device
    current: dict[tuple[str, int], torch.Tensor] = {}

    def keep(layer: int) -> Callable:
        def hook(act: torch.Tensor, hook) -> None:
            current[("pattern", layer)] = act.detach().to("cpu", torch.float32)
        return hook

    parts: dict[int, list[torch.Tensor]] = {layer: [] for layer in layers}
    for start in range(0, n, size):
        check_stop()
        with model.hooks(fwd_hooks=[(act_name("pattern", layer), keep(layer)) for layer in layers]):
            model(ids[start:start + size].to(device))
        for (_, layer), t in checked(current, range(start, min(n, start + size))).items():
            parts[layer].append(t)
        current.clear()
    return [torch.cat(parts[layer]) for layer in layers]
