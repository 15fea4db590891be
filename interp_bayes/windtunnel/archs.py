"""The wind-tunnel architectures without a TransformerBridge adapter, as TransformerLens ``HookedRootModule``s: the
per-position MLP baseline, the context-seeing MLP and the LSTM. (Mamba is HF's ``Mamba2ForCausalLM``, which the
bridge boots like the transformer: ``configs.build_mamba``.)

Every one carries TransformerLens's hook names, so ``ib.collect``, ``ib.intervene`` and ``run_with_cache`` read
and edit it exactly as they do a bridge: ``hook_embed`` (the token embedding, [batch, pos, d_embed]),
``hook_pos_embed`` where there is a position table, and per layer ``blocks.{L}.hook_resid_pre`` /
``blocks.{L}.hook_resid_post`` ([batch, pos, d_model]: the stream a block reads and writes; for the LSTM the
hidden-state sequence entering and leaving layer L). A folder holds ``config.json`` (with a ``model_type`` of
``MODEL_TYPES``) and ``model.safetensors``, like an HF folder.

This module imports TransformerLens at import time; ``configs`` imports it only when one of these models is built
or loaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint


@dataclass(frozen=True)
class HookedConfig:
    """The ``cfg`` fields the collector and the edit sites read of a model (TransformerLens's names). Without
    attention, one "head" spans the stream, as the bridge reports for Mamba."""

    n_layers: int
    d_model: int
    n_ctx: int
    d_vocab: int
    model_name: str
    architecture: str
    n_heads: int = 1
    n_key_value_heads: int | None = None
    dtype: str = "float32"

    @property
    def d_head(self) -> int:
        return self.d_model


class HookedWindtunnel(HookedRootModule):
    """Base: the config dict saved as config.json, TransformerLens's hook dictionary (``setup``), HF-style
    ``forward`` arguments and the folder format. Subclasses build ``wte`` (the token embedding), ``blocks`` and
    ``ln_f``, and either ``wpe`` + ``hook_pos_embed`` for the default ``stream`` or their own ``stream`` (token
    embeddings [batch, pos, d_embed] -> the last block's output)."""

    model_type: ClassVar[str]

    def __init__(self, **config) -> None:
        super().__init__()
        self.config = dict(model_type=self.model_type, **config)
        self.hook_embed = HookPoint()

    def finish(self, n_ctx: int, d_model: int) -> None:
        """Set ``cfg`` and name every hook point (call once the modules exist)."""
        self.cfg = HookedConfig(n_layers=len(self.blocks), d_model=d_model, n_ctx=n_ctx,
                                d_vocab=self.wte.num_embeddings, model_name=self.model_type,
                                architecture=self.model_type)
        self.setup()

    def unembed(self, h: torch.Tensor) -> torch.Tensor:
        """Final stream [batch, pos, d_model] -> logits [batch, pos, vocab] (tied to the token embedding)."""
        return self.ln_f(h) @ self.wte.weight.T

    def stream(self, tok: torch.Tensor) -> torch.Tensor:
        """Token embeddings + the learned position table (``wpe``, hooked at ``hook_pos_embed``), then every block in
        turn: the per-position MLP's and the LSTM's stream (the context MLP has its own)."""
        h = tok + self.hook_pos_embed(self.wpe(torch.arange(tok.shape[1], device=tok.device)))
        for block in self.blocks:
            h = block(h)
        return h

    def forward(self, input_ids: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None,
                logits_to_keep: int = 0, **_: object) -> torch.Tensor:
        """``input_ids`` [batch, pos] (or token embeddings [batch, pos, d_embed], as HF's ``inputs_embeds``) ->
        logits [batch, pos, vocab]; ``logits_to_keep=k`` unembeds the last k positions only (HF's meaning; 0: all).
        Other HF keywords (``use_cache``) are accepted and ignored: there is no cache."""
        tok = self.hook_embed(self.wte(input_ids) if inputs_embeds is None else inputs_embeds)
        h = self.stream(tok)
        return self.unembed(h[:, -logits_to_keep:] if logits_to_keep else h)

    def save_pretrained(self, folder: str | Path) -> None:
        """config.json + model.safetensors, the same files an HF folder has."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(self.config, indent=2))
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        save_file(tensors, str(folder / "model.safetensors"))

    @classmethod
    def from_pretrained(cls, folder: str | Path) -> HookedWindtunnel:
        folder = Path(folder)
        conf = json.loads((folder / "config.json").read_text())
        conf.pop("model_type")
        model = cls(**conf)
        model.load_state_dict(load_file(str(folder / "model.safetensors")))
        return model.eval()


def normal_init(model: nn.Module, std: float = 0.02) -> None:
    """GPT-2's initialisation of every matrix (biases and norms keep PyTorch's)."""
    for p in model.parameters():
        if p.dim() >= 2:
            nn.init.normal_(p, std=std)


class MLPBlock(nn.Module):
    """h -> h + MLP(LN(h)) with the stream hooked on both sides. The MLP's modules are registered as "0".."3" (an
    ``nn.Sequential``'s names), so checkpoints saved before the hooks existed load unchanged."""

    def __init__(self, d_model: int, d_hidden: int) -> None:
        super().__init__()
        self.hook_resid_pre = HookPoint()
        for name, module in zip("0123", (nn.LayerNorm(d_model), nn.Linear(d_model, d_hidden), nn.GELU(),
                                         nn.Linear(d_hidden, d_model))):
            self.add_module(name, module)
        self.hook_resid_post = HookPoint()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = self.hook_resid_pre(h)
        y = h
        for name in "0123":
            y = self._modules[name](y)
        return self.hook_resid_post(h + y)


class MLPBaseline(HookedWindtunnel):
    """Per-position residual MLP over token + position embeddings, tied read-out; no mixing across positions.

    The capacity-matched control of Paper I: it can learn any function of (token, position) but not of the
    context, so the best it can do is a position-wise average belief.
    """

    model_type = "windtunnel_mlp"

    def __init__(self, vocab_size: int, n_positions: int, d_model: int, n_blocks: int, d_hidden: int,
                 init_std: float = 0.02) -> None:
        super().__init__(vocab_size=vocab_size, n_positions=n_positions, d_model=d_model, n_blocks=n_blocks,
                         d_hidden=d_hidden, init_std=init_std)
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(n_positions, d_model)
        self.hook_pos_embed = HookPoint()
        self.blocks = nn.ModuleList(MLPBlock(d_model, d_hidden) for _ in range(n_blocks))
        self.ln_f = nn.LayerNorm(d_model)
        normal_init(self, init_std)
        self.finish(n_positions, d_model)


class ContextMLP(HookedWindtunnel):
    """An MLP over the whole context: position t reads the token embeddings of positions t - n_ctx + 1 .. t, a
    window left-padded with zeros and flattened ([n_ctx * d_embed]; the number of padded slots tells it its
    position), projected to ``d_model`` and passed through ``n_blocks`` residual MLP blocks, then an untied read-out.

    Causal by construction and free to compute any function of the prefix, so a failure against the exact
    posterior is a failure of capacity or optimisation, not of what the model can see. ``hook_embed`` is the
    per-token embedding [batch, pos, d_embed]; ``blocks.0.hook_resid_pre`` already holds the projected window.
    """

    model_type = "windtunnel_mlp_context"

    def __init__(self, vocab_size: int, n_positions: int, d_embed: int, d_model: int, n_blocks: int,
                 d_hidden: int, init_std: float = 0.02) -> None:
        super().__init__(vocab_size=vocab_size, n_positions=n_positions, d_embed=d_embed, d_model=d_model,
                         n_blocks=n_blocks, d_hidden=d_hidden, init_std=init_std)
        self.n_window = n_positions
        self.wte = nn.Embedding(vocab_size, d_embed)
        self.window_proj = nn.Linear(n_positions * d_embed, d_model)
        self.blocks = nn.ModuleList(MLPBlock(d_model, d_hidden) for _ in range(n_blocks))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        normal_init(self, init_std)
        self.finish(n_positions, d_model)

    def windows(self, tok: torch.Tensor) -> torch.Tensor:
        """[batch, pos, d_embed] -> [batch, pos, n_window * d_embed]: row t is tokens t-W+1..t, zeros before 0."""
        b, t, d = tok.shape
        padded = F.pad(tok, (0, 0, self.n_window - 1, 0))  # [b, W - 1 + t, d]
        win = padded.unfold(1, self.n_window, 1)  # [b, t, d, W]
        return win.transpose(-1, -2).reshape(b, t, self.n_window * d)

    def stream(self, tok: torch.Tensor) -> torch.Tensor:
        h = self.window_proj(self.windows(tok))
        for block in self.blocks:
            h = block(h)
        return h

    def unembed(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln_f(h))


class LSTMBlock(nn.Module):
    """One LSTM layer with its input and output sequences hooked."""

    def __init__(self, d_in: int, d_model: int) -> None:
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.lstm = nn.LSTM(d_in, d_model, batch_first=True)
        self.hook_resid_post = HookPoint()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.hook_resid_post(self.lstm(self.hook_resid_pre(h))[0])


class LSTMWindtunnel(HookedWindtunnel):
    """The authors' LSTM (``experiments/paper1_*/train_lstm.py``): token + position embeddings, ``n_layers``
    stacked LSTM layers of width ``d_model``, a final LayerNorm and a read-out, here tied to the token embedding as
    the transformer's is and without dropout (fresh data every step). The layers are separate ``nn.LSTM`` modules
    so that the sequence between two layers is a hook point; stacked, they compute what one
    ``nn.LSTM(num_layers=n_layers)`` computes."""

    model_type = "windtunnel_lstm"

    def __init__(self, vocab_size: int, n_positions: int, d_model: int, n_layers: int, init_std: float = 0.02) -> None:
        super().__init__(vocab_size=vocab_size, n_positions=n_positions, d_model=d_model, n_layers=n_layers,
                         init_std=init_std)
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(n_positions, d_model)
        self.hook_pos_embed = HookPoint()
        self.blocks = nn.ModuleList(LSTMBlock(d_model, d_model) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        nn.init.normal_(self.wte.weight, std=init_std)  # the LSTM layers keep PyTorch's uniform init
        nn.init.normal_(self.wpe.weight, std=init_std)
        self.finish(n_positions, d_model)


MODEL_TYPES: dict[str, type[HookedWindtunnel]] = {
    cls.model_type: cls for cls in (MLPBaseline, ContextMLP, LSTMWindtunnel)}


def count_on_meta(build: Callable[[], nn.Module]) -> int:
    """Distinct parameters of the model ``build()`` makes, built on the meta device (no memory, no init cost)."""
    with torch.device("meta"):
        model = build()
    return sum(p.numel() for p in model.parameters())


def nearest_width(build: Callable[[int], nn.Module], target: int, *, hi: int = 1 << 14) -> int:
    """The width w (1..hi) whose ``build(w)`` has the parameter count nearest ``target`` (counts grow with w;
    bisection on the meta device)."""
    lo, top = 1, hi
    while lo < top:  # smallest w with count >= target
        mid = (lo + top) // 2
        if count_on_meta(lambda: build(mid)) >= target:
            top = mid
        else:
            lo = mid + 1
    return min({max(1, lo - 1), lo}, key=lambda w: abs(count_on_meta(lambda: build(w)) - target))


def within(count: int, target: int, tolerance: float = 0.02) -> bool:
    """Whether a parameter count matches the target to within ``tolerance`` (2%: the capacity match)."""
    return abs(count - target) <= tolerance * target


def solve_width(build: Callable[[int], nn.Module], target: int, *, what: str, hi: int = 1 << 14) -> int:
    """``nearest_width``, refused with one sentence unless its count is within 2% of ``target``."""
    best = nearest_width(build, target, hi=hi)
    got = count_on_meta(lambda: build(best))
    if not within(got, target):
        raise ValueError(f"The {what} has {got} parameters at its best width {best} vs a target of {target}: not "
                         "within 2%; change n_layers or d_model.")
    return best
