"""Batched forward passes that keep only what the analyses need: final-token readings and predictive entropy.

Prompts are grouped into buckets of equal token length, so no prompt is ever padded and a prompt's numbers do
not depend on which other prompts share its batch (tests compare single and batched runs). Only the requested
hook points are hooked, and each hook keeps the final position only, detached to CPU float32.
"""

from __future__ import annotations

import hashlib
import html
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from ..core.errors import ConfigError, NonFiniteActivationError, PromptError
from ..core.layers import layer_index, resolve_layers
from ..core.store import MANIFEST, read_json, seal, unseal
from ..core.stop import check_stop
from ..stats.info import entropy, entropy_of_log_probs
from .hooks import act_name, module_input, reading_hook
from .loading import checkpoint_tokenizer, model_info, tokenizer_policy



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
    "z": _final_flat,  # hook_z [batch, pos, n_heads, d_head] -> n_heads * d_head
    "resid": _final_flat,  # hook_resid_post [batch, pos, d_model]
    "resid_pre": _final_flat,  # hook_resid_pre [batch, pos, d_model]; layer 0: the embedding output
    "attn_entropy": _final_query_entropy,  # hook_pattern -> n_heads, bits
}
TOKENS_PER_BATCH = 2048  # automatic batch size: about this many tokens per forward pass


@dataclass
class Activations:
    """Final-token readings of a prompt set at some layers, with the model's predictive entropy.

    ``readings[name][layer]`` is ``[n_prompts, dim]`` float32 (layers stored non-negative; look them up with
    ``values(-1)`` style negative indices). ``entropy`` is in bits, over the full vocabulary or renormalised over
    ``meta['label_tokens']``; ``label_logprobs`` ([n_prompts, n_labels], natural log, renormalised) is set when
    label tokens were given.
    """

    readings: dict[str, dict[int, torch.Tensor]]
    entropy: torch.Tensor  # [n_prompts] bits
    token_ids: list[list[int]]
    meta: dict
    label_logprobs: torch.Tensor | None = None
    next_token: torch.Tensor | None = field(default=None)  # [n_prompts] argmax over the full vocabulary
    logprobs: torch.Tensor | None = field(default=None, repr=False)  # [n_prompts, vocab], only with keep_logprobs
    # [n_prompts] the unit of independence of each prompt (a wind tunnel's sequence); None: every prompt its own.
    # Analyses take it from here for every resampling, so a probe cannot forget it (``with_groups`` sets it).
    groups: np.ndarray | None = field(default=None, repr=False)

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

        from ..stats.pca import pca

        ratios, _, scores = pca(self.values(layer))
        texts = self.meta.get("texts") or [f"prompt {i}" for i in range(len(self))]
        fig = go.Figure(go.Scatter(
            x=scores[:, 0], y=scores[:, 1], mode="markers", text=[html.escape(t[:100]) for t in texts],
            marker=dict(color=self.entropy.numpy(), colorscale="Viridis", colorbar=dict(title="entropy (bits)"))))
        return fig.update_layout(template="plotly_white", xaxis_title=f"PC1 ({ratios[0]:.1%})",
                                 yaxis_title=f"PC2 ({ratios[1]:.1%})",
                                 title=f"{self.meta['model']['name']}: values at layer {self.layer_index(layer)}")

    def _repr_html_(self) -> str:
        m = self.meta
        dims = ", ".join(f"{name}: {t[self.layers[-1]].shape[1]}" for name, t in self.readings.items())
        return (f"<b>Activations</b> of {html.escape(str(m['model']['name']))}: {len(self)} prompts, layers "
                f"{m['layers']}, dims ({dims}), entropy over the {m['entropy_over']} (bits), mean "
                f"{self.entropy.mean():.3f}")

    def save(self, path: str | Path) -> Path:
        """Write ``path/activations.safetensors`` and ``path/activations.json`` (atomically)."""
        import safetensors.torch

        from ..core.store import atomic_write_bytes, atomic_write_text

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / MANIFEST).unlink(missing_ok=True)  # an overwritten set is incomplete until sealed again
        tensors = {f"{name}.{layer}": t.contiguous() for name, by_layer in self.readings.items() for layer, t in by_layer.items()}
        tensors["entropy"] = self.entropy
        flat = [t for ids in self.token_ids for t in ids]
        tensors["token_ids"] = torch.tensor(flat, dtype=torch.int64)
        tensors["token_lengths"] = torch.tensor([len(ids) for ids in self.token_ids], dtype=torch.int64)
        if self.label_logprobs is not None:
            tensors["label_logprobs"] = self.label_logprobs
        if self.next_token is not None:
            tensors["next_token"] = self.next_token
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
        from safetensors.torch import load

        path = Path(path)
        unseal(path, MANIFEST)
        tensors = load((path / "activations.safetensors").read_bytes())
        meta = read_json(path / "activations.json")
        lengths = tensors.pop("token_lengths").tolist()
        flat = tensors.pop("token_ids").tolist()
        offsets = [0, *torch.tensor(lengths).cumsum(0).tolist()]
        token_ids = [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
        entropy = tensors.pop("entropy")
        label_logprobs = tensors.pop("label_logprobs", None)
        next_token = tensors.pop("next_token", None)
        groups = tensors.pop("groups", None)
        readings: dict[str, dict[int, torch.Tensor]] = defaultdict(dict)
        for key, t in tensors.items():
            name, layer = key.rsplit(".", 1)
            readings[name][int(layer)] = t
        return cls(dict(readings), entropy, token_ids, meta, label_logprobs, next_token,
                   groups=None if groups is None else groups.numpy())


def logit_entropy_bits(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in bits of softmax(logits) over the last axis, computed from float32 log_softmax."""
    return _bits(torch.log_softmax(logits.float(), dim=-1))


def _bits(logp: torch.Tensor) -> torch.Tensor:
    """Entropy in bits from log-probabilities over the last axis."""
    return entropy_of_log_probs(logp)


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


def reading_hooks(readings: Sequence[str], layers: Sequence[int],
                  store: dict[tuple[str, int], torch.Tensor]) -> list[tuple[str, Callable]]:
    """Forward hooks that put each reading's final-position row, [batch, dim] float32 on the CPU, into
    ``store[(name, layer)]`` on every forward; they observe and never edit."""
    def keep(name: str, layer: int) -> Callable:
        reduce = REDUCTIONS[name]

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
        return _bits(torch.log_softmax(logits.float(), dim=-1) if logprobs is None else logprobs).cpu(), None
    lp = torch.log_softmax(logits.float()[:, labels], dim=-1)
    return _bits(lp).cpu(), lp.cpu()


@torch.no_grad()
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
    """Run ``prompts`` through ``model`` and keep final-token readings and the next-token entropy.

    readings: any of ``"v"`` (value vectors, per KV head, concatenated), ``"z"`` (attention output per query head,
    concatenated), ``"resid"`` (residual stream after the block), ``"resid_pre"`` (before it; at layer 0 the
    embedding layer) and ``"attn_entropy"`` (entropy in bits of each
    query head's attention from the final token). ``label_tokens`` renormalises the next-token
    distribution over those ids (e.g. the two labels of an in-context task) for the entropy. ``keep_logprobs``
    keeps the full next-token log-probabilities in memory (``acts.logprobs``, [n, vocab]; not saved), e.g. for the
    KL divergence of an intervention from the unperturbed model.

    Only the final position is computed where nothing else is needed: the unembedding, and the last block's
    attention output projection and MLP (``final_position_tail``; hooks of the caller on those see the final
    position only).
    """
    from ..core.progress import progress_bar

    unknown = set(readings) - set(REDUCTIONS)
    if unknown:
        raise ValueError(f"Unknown reading(s) {sorted(unknown)}; choose from {sorted(REDUCTIONS)}.")
    cfg = model.cfg
    n_layers = cfg.n_layers
    layer_idx = resolve_layers(layers, n_layers, (-1,))
    token_ids = tokenize(model, prompts, prepend_bos)
    check_prompts(token_ids, prompts, cfg.n_ctx)
    device = next(model.parameters()).device
    labels = torch.tensor(list(label_tokens), device=device) if label_tokens is not None else None

    n = len(token_ids)
    out: dict[str, dict[int, torch.Tensor]] = {name: {} for name in readings}
    entropy = torch.empty(n)
    next_token = torch.empty(n, dtype=torch.int64)
    label_logprobs = torch.empty(n, len(labels)) if labels is not None else None
    logprobs = None
    current: dict[tuple[str, int], torch.Tensor] = {}
    bar = progress_bar(total=n, desc="collect", unit="prompt", disable=not progress)
    with model.hooks(fwd_hooks=reading_hooks(readings, layer_idx, current) + final_position_tail(model)):
        for idx in length_batches(token_ids, batch_size):
            check_stop()
            ids = torch.tensor([token_ids[i] for i in idx], device=device)
            logits = final_logits(model, ids)
            index = torch.tensor(idx)
            for (name, layer), t in checked(current, idx).items():
                out[name].setdefault(layer, torch.empty(n, t.shape[1]))[index] = t
            current.clear()
            next_token[index] = logits.argmax(-1).cpu()
            logp = torch.log_softmax(logits.float(), dim=-1) if keep_logprobs or labels is None else None
            if keep_logprobs:
                if logprobs is None:
                    logprobs = torch.empty(n, logits.shape[-1])
                logprobs[index] = logp.cpu()
            entropy[index], lp = next_token_entropy(logits, labels, logp)
            if lp is not None:
                label_logprobs[index] = lp
            bar.update(len(idx))
    bar.close()
    if not torch.isfinite(entropy).all():
        raise NonFiniteActivationError("Non-finite next-token entropy (the final layer's logits); check the dtype "
                                       "(try float32) or the model weights.")

    info = model_info(model)
    tok = checkpoint_tokenizer(model) if getattr(model, "tokenizer", None) is not None else None
    policy = tokenizer_policy(tok) if tok is not None else None
    bos = policy["bos_token_id"] if policy else None
    meta = dict(
        model=info.to_dict(), layers=layer_idx, n_layers=n_layers, readings=list(readings),
        n_heads=cfg.n_heads, n_kv_heads=cfg.n_key_value_heads or cfg.n_heads, d_head=cfg.d_head,
        tokenizer=policy, bos_token_id=bos,
        bos_prepended=[bool(ids) and ids[0] == bos for ids in token_ids] if bos is not None else None,
        prepend_bos=prepend_bos, label_tokens=list(map(int, label_tokens)) if label_tokens is not None else None,
        entropy_over="labels" if labels is not None else "vocabulary", entropy_unit="bits",
        prompt_digest=prompt_digest(token_ids), n_prompts=n,
    )
    if isinstance(prompts, (list, tuple)) and isinstance(prompts[0], str):
        meta["texts"] = list(prompts)  # so a run folder shows its prompts without the prompt files
    return Activations(out, entropy, token_ids, meta, label_logprobs, next_token, logprobs)


@torch.no_grad()
def token_values(model, prompts, layers: Sequence[int], *, site: str = "v",
                 batch_size: int | None = None) -> dict[int, list[torch.Tensor]]:
    """Per layer, every prompt's reading at ``site`` at every position: [len_i, dim] float32 on the CPU (heads
    concatenated), for edits that set per-prompt values (``model.edits.onmanifold_op``). One unperturbed forward
    per batch of equal length; keyed by ``layers`` as spelled (negative: from the end)."""
    blocks = {layer: layer_index(layer, model.cfg.n_layers) for layer in layers}
    token_ids = tokenize(model, prompts)
    check_prompts(token_ids, prompts, model.cfg.n_ctx)
    device = next(model.parameters()).device
    out: dict[int, list] = {layer: [None] * len(token_ids) for layer in layers}
    got: dict[int, torch.Tensor] = {}

    def keep(layer: int) -> Callable:
        def hook(act: torch.Tensor, hook) -> None:  # observes only
            got[layer] = act.detach().to("cpu", torch.float32).reshape(*act.shape[:2], -1)
        return hook

    with model.hooks(fwd_hooks=[(reading_hook(site, blocks[layer]), keep(layer)) for layer in layers]):
        for idx in length_batches(token_ids, batch_size):
            check_stop()
            final_logits(model, torch.tensor([token_ids[i] for i in idx], device=device))
            for layer in layers:
                if not torch.isfinite(got[layer]).all():
                    raise NonFiniteActivationError(f"Non-finite values at {reading_hook(site, layer)}; check the "
                                                   "dtype (try float32) or the model weights.")
                for r, i in enumerate(idx):
                    out[layer][i] = got[layer][r].clone()
    return out


PROBE_READINGS = ("resid", "v", "z")  # what the belief probes read by default
QUERY_READINGS = (*PROBE_READINGS, "resid_pre")  # what query_readings can read (resid_pre at 0: the embedding)


@torch.no_grad()
def query_readings(model, batch, *, layers: list[int] | None = None, readings: tuple[str, ...] = ("resid",),
                   batch_size: int = 250) -> dict[str, dict[int, torch.Tensor]]:
    """Activations at every query position of ``batch`` (a ``TaskBatch``), one forward pass per chunk of sequences.

    Returns ``{reading: {layer: [n * Q, dim] float32}}``, rows in sequence-major order (row i * Q + q is sequence
    i, query q), heads concatenated as in ``model.collect.collect``. ``readings``: any of ``"resid"`` (after the
    block), ``"resid_pre"`` (entering it; layer 0: the embedding output), ``"v"`` and ``"z"``; ``layers`` default
    to all.
    """
    unknown = set(readings) - set(QUERY_READINGS)
    if unknown:
        raise ConfigError(f"Unknown probe reading(s) {sorted(unknown)}; choose from {', '.join(QUERY_READINGS)}.")
    n_layers = model.cfg.n_layers
    layers = resolve_layers(layers, n_layers, range(n_layers))
    device = next(model.parameters()).device
    pos = batch.query_pos.to(device)
    got: dict[tuple[str, int], list[torch.Tensor]] = {(r, layer): [] for r in readings for layer in layers}

    def keep(reading: str, layer: int):
        def hook(act: torch.Tensor, hook) -> None:  # observes only
            picked = act[:, pos].detach().to("cpu", torch.float32)  # [b, Q, ...]
            got[(reading, layer)].append(picked.reshape(picked.shape[0] * picked.shape[1], -1))
        return hook

    fwd_hooks = [(reading_hook(r, layer), keep(r, layer)) for r in readings for layer in layers]
    with model.hooks(fwd_hooks=fwd_hooks):
        for start in range(0, batch.input_ids.shape[0], batch_size):
            check_stop()
            model(batch.input_ids[start : start + batch_size].to(device))
    return {r: {layer: torch.cat(got[(r, layer)]) for layer in layers} for r in readings}
