"""Training configs, presets, tasks by name, the two model families (an HF transformer and an MLP baseline), and
loading a trained folder.

The transformer is a plain ``GPT2LMHeadModel`` (learned absolute positions, LayerNorm, GELU MLP, tied embeddings:
the paper's architecture; absolute positions matter for the HMM, whose matrix entries are identified only by
where they sit in the header), so ``ib.load_model(folder)`` boots it in TransformerBridge like any LLM. With
``positions="rotary"`` it is a ``GPTNeoXForCausalLM`` of the same shape instead (GPT-2 with rotary positions on
every head dimension in place of the position table), for tasks whose lookup is relative: the bijection with
replacement must find an earlier copy of the current key, wherever it sits; ``positions="none"`` is that GPT-NeoX
with rotary on no dimension (NoPE: only the causal mask tells positions apart), the control of the martingale test
averaged over orderings. The MLP baseline has the same embeddings and read-out but no attention: each position sees
only its own token and index.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModelForCausalLM, GPT2Config, GPTNeoXConfig

from ..core.errors import ConfigError
from ..tasks.bijection import BijectionTask
from ..tasks.hmm import HMMTask
from ..tasks.kalman import KalmanTask
from ..tasks.recall import RecallTask

TASKS = {"bijection": BijectionTask, "hmm": HMMTask, "kalman": KalmanTask, "recall": RecallTask}
MLP_MODEL_TYPE = "windtunnel_mlp"
AUTOCAST = ("none", "bfloat16")  # TrainConfig.autocast


@dataclass
class TrainConfig:
    """Everything a wind-tunnel run needs; saved as windtunnel.json beside every checkpoint."""

    task: str = "bijection"
    task_kwargs: dict[str, Any] = field(default_factory=dict)
    arch: str = "transformer"  # "transformer" | "mlp"
    positions: str = "learned"  # transformer positions: "learned" (GPT-2) | "rotary" (GPT-NeoX of the same shape)
    # | "none" (NoPE: that GPT-NeoX with rotary on no dimension; only the causal mask tells positions apart)
    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 64
    d_ff: int = 256
    n_positions: int = 0  # 0: the task's longest training sequence
    steps: int = 1000
    batch_size: int = 128
    lr: float = 1e-3
    warmup: int = 100
    min_lr_frac: float = 0.05  # cosine decays to lr * min_lr_frac
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    clip: float = 1.0
    loss: str = "soft"  # "soft": cross-entropy to the exact posterior; "hard": to the realised hypothesis
    length_schedule: list[tuple[int, int]] = field(default_factory=list)  # [(from_step, length)], curriculum
    # [(until_step, task_kwargs)]: train on these variants of the task first, in order, then on task_kwargs itself
    task_curriculum: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)  # steps to save; empty: 50 * 2**i below steps
    eval_every: int = 250
    eval_n: int = 512
    final_eval_n: int = 2000  # held-out sequences per length of the final evaluation (windtunnel.json)
    log_every: int = 25
    seed: int = 0
    autocast: str = "none"  # "none": float32 throughout | "bfloat16": forward under bf16 autocast, output head in fp32
    # 0: batches drawn in turn from one seeded stream; N > 0: batch ``step`` drawn from seed [seed, 1, step] by N
    # worker processes ahead of the step (another stream: a GPU consumes batches faster than one core draws them)
    data_workers: int = 0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """Rebuild from a windtunnel.json dict (lists back to tuples where the field is a tuple)."""
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"Unknown TrainConfig fields {sorted(unknown)}; known: {sorted(known)}.")
        d = dict(d)
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        for key in ("length_schedule", "task_curriculum"):
            if key in d:
                d[key] = [tuple(x) for x in d[key]]
        cfg = cls(**d)
        if cfg.autocast not in AUTOCAST:
            raise ConfigError(f"Unknown autocast {cfg.autocast!r}; use one of {', '.join(AUTOCAST)}.")
        if cfg.data_workers < 0:
            raise ConfigError(f"data_workers={cfg.data_workers}: give 0 (draw batches in the training process) or a "
                              "positive number of worker processes.")
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def checkpoint_steps(self) -> list[int]:
        """Dense early, sparse late: the explicit list, or 50, 100, 200, ... below ``steps``."""
        if self.checkpoints:
            return sorted(s for s in self.checkpoints if 0 <= s < self.steps)
        out, s = [], 50
        while s < self.steps:
            out.append(s)
            s *= 2
        return out


PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "bijection": {
        # Paper I: 6 layers, 6 heads, d 192, d_ff 768 (2.68M); the authors' production recipe (hard labels).
        "paper": dict(n_layers=6, n_heads=6, d_model=192, d_ff=768, steps=50_000, batch_size=256, lr=3e-4,
                      warmup=2000, weight_decay=0.1, loss="hard", eval_every=1000, log_every=100,
                      checkpoints=[100, 200, 300, 400, 500, 750, 1000, 1500, 2000, 3000, 5000, 10_000, 20_000]),
        "cpu": dict(n_layers=2, n_heads=4, d_model=64, d_ff=256, steps=4000, batch_size=128, lr=3e-3,
                    warmup=200, weight_decay=0.01, loss="soft",
                    checkpoints=[50, 100, 200, 300, 400, 600, 800, 1000, 1500, 2000, 3000]),
        "tiny": dict(n_layers=1, n_heads=2, d_model=32, d_ff=64, steps=300, batch_size=64, lr=3e-3, warmup=30,
                     eval_every=100, eval_n=128, log_every=10, checkpoints=[100]),
        # keys drawn with replacement: the exact entropy then varies at a fixed position (0 at a repeated key,
        # log2 of the unseen values otherwise), so entropy and position can be told apart. Rotary positions: with
        # GPT-2's learned positions, or without the curriculum, the output stays uniform (loss ln 20) for
        # thousands of steps.
        # Curriculum: 8, 14, then 20 pairs, keys from 5 symbols per sequence (repeats common) for 900 steps.
        "cpu_replacement": dict(n_layers=2, n_heads=4, d_model=64, d_ff=256, steps=4000, batch_size=128, lr=3e-3,
                                warmup=200, weight_decay=0.01, loss="soft", task_kwargs=dict(replacement=True),
                                positions="rotary", length_schedule=[(0, 8), (400, 14), (600, 20)],
                                task_curriculum=[(900, dict(replacement=True, key_pool=5))],
                                checkpoints=[200, 1000]),
    },
    "hmm": {
        # Paper I HMM size per methods.md §1.5 (9 layers, 8 heads, d 256, d_ff 1024; the code's count, ~7.2M,
        # not the paper's 2.68M); positions to 1024 as the authors' GPTMini, so K = 50 is in range.
        "paper": dict(n_layers=9, n_heads=8, d_model=256, d_ff=1024, n_positions=1024, steps=50_000,
                      batch_size=64, lr=3e-4, warmup=1000, weight_decay=0.01, loss="soft", eval_every=1000,
                      log_every=100,
                      checkpoints=[100, 200, 300, 400, 500, 750, 1000, 1500, 2000, 3000, 5000, 10_000, 20_000]),
        "cpu": dict(n_layers=3, n_heads=4, d_model=64, d_ff=256, n_positions=160, steps=4000, batch_size=64,
                    lr=3e-3, warmup=200, weight_decay=0.01, loss="soft",
                    checkpoints=[50, 100, 200, 300, 400, 600, 800, 1000, 1500, 2000, 3000]),
        "tiny": dict(n_layers=1, n_heads=2, d_model=32, d_ff=64, n_positions=80, steps=300, batch_size=32,
                     lr=3e-3, warmup=30, eval_every=100, eval_n=64, log_every=10, checkpoints=[100],
                     task_kwargs=dict(n_steps=8)),
    },
    "kalman": {  # continuous inputs and a Gaussian head (windtunnel/kalman.py); soft = expected Gaussian NLL
        "paper": dict(n_layers=6, n_heads=6, d_model=192, d_ff=768, steps=50_000, batch_size=256, lr=3e-4,
                      warmup=2000, weight_decay=0.01, loss="soft", eval_every=1000, log_every=100,
                      checkpoints=[100, 200, 500, 1000, 2000, 5000, 10_000, 20_000]),
        "cpu": dict(n_layers=3, n_heads=4, d_model=64, d_ff=256, steps=6000, batch_size=64, lr=3e-3,
                    warmup=200, weight_decay=0.01, loss="soft", checkpoints=[250, 500, 1000, 2000, 4000],
                    task_kwargs=dict(state_dim=1, obs_dim=1)),
        "tiny": dict(n_layers=1, n_heads=2, d_model=32, d_ff=64, steps=300, batch_size=64, lr=3e-3, warmup=30,
                     eval_every=100, eval_n=128, log_every=10, checkpoints=[100],
                     task_kwargs=dict(state_dim=1, obs_dim=1, n_steps=8)),
    },
}
# Associative recall (tasks/recall.py). Paper: the authors' generator defaults (256 keys and values, 64 pairs,
# 32 filler, 3 queries; 329 tokens); their repository has no recall training script, so the model is Paper I's
# bijection transformer. cpu: 12 keys and values, 4 pairs, 4 filler (33 tokens), the bijection cpu model.
PRESETS["recall"] = {
    "paper": PRESETS["bijection"]["paper"] | dict(
        task_kwargs=dict(n_keys=256, n_values=256, n_pairs=64, n_queries=3, n_filler=32)),
    "cpu": dict(n_layers=2, n_heads=4, d_model=64, d_ff=256, steps=2000, batch_size=64, lr=3e-3, warmup=200,
                weight_decay=0.01, loss="soft", checkpoints=[1000],
                task_kwargs=dict(n_keys=12, n_values=12, n_pairs=4, n_queries=3, n_filler=4)),
    "tiny": dict(n_layers=1, n_heads=2, d_model=32, d_ff=64, steps=300, batch_size=64, lr=3e-3, warmup=30,
                 eval_every=100, eval_n=128, log_every=10, checkpoints=[100],
                 task_kwargs=dict(n_keys=6, n_values=6, n_pairs=3, n_queries=2, n_filler=2)),
}
# NoPE control of the martingale test averaged over orderings: cpu_replacement without any position signal (at
# step 1000 its held-out KL was 1.30 bits vs rotary's 0.37; docs/rivals.md).
PRESETS["bijection"]["cpu_replacement_nope"] = PRESETS["bijection"]["cpu_replacement"] | dict(positions="none")
# Sticky HMM (self-transition 0.90..0.98 per state, t_mix(1/4) median 24 steps vs 2 for the paper's family) with
# emissions peaked on the state's own symbol (0.50..0.70): the variant where the last four observations are not
# enough and the matrices sit at fixed header positions (docs/windtunnels.md). Same shapes as the HMM presets.
STICKY = dict(transitions="sticky", emissions="peaked", peak_cents=[50, 70], symbol_map="identity")
# One GPU, about 3 minutes a run (bench/gpu_run.py caps ``steps`` by the step time it measures): the paper's stated
# 2.68M-parameter size (6 layers, d 192: the paper-shape 7.4M model would not come back from the device machine,
# which returns files of at most 16 MiB), bf16 autocast, batches of 1024 fresh HMMs drawn by 12 worker processes,
# positions to 160 so that K = 50 (153 tokens) is in range; no intermediate checkpoints (-1 is never reached).
GPU = dict(n_layers=6, n_heads=6, d_model=192, d_ff=768, n_positions=160, steps=8000, batch_size=1024, lr=1e-3,
           warmup=300, weight_decay=0.01, loss="soft", eval_every=500, log_every=50, checkpoints=[-1],
           autocast="bfloat16", data_workers=12)
PRESETS["hmm"] |= {
    "sticky-paper": PRESETS["hmm"]["paper"] | dict(task_kwargs=STICKY),
    "sticky-cpu": PRESETS["hmm"]["cpu"] | dict(task_kwargs=STICKY),
    "sticky-tiny": PRESETS["hmm"]["tiny"] | dict(task_kwargs=STICKY | dict(n_steps=8)),
    "gpu": GPU,
    "sticky-gpu": GPU | dict(task_kwargs=STICKY),
}


def make_config(task: str, preset: str = "cpu", **overrides: Any) -> TrainConfig:
    """The preset's TrainConfig for ``task`` with keyword overrides (e.g. ``steps=200``, ``arch="mlp"``)."""
    if task not in PRESETS:
        raise ConfigError(f"Unknown task {task!r}; known tasks: {', '.join(sorted(PRESETS))}.")
    if preset not in PRESETS[task]:
        raise ConfigError(f"Unknown preset {preset!r} for {task}; known presets: {', '.join(sorted(PRESETS[task]))}.")
    return TrainConfig.from_dict({"task": task, **PRESETS[task][preset], **overrides})


def make_task(cfg: TrainConfig) -> BijectionTask | HMMTask:
    """The task object a config trains on (after any curriculum) and is evaluated on."""
    return TASKS[cfg.task](**cfg.task_kwargs)


def curriculum_tasks(cfg: TrainConfig) -> list[tuple[int, BijectionTask | HMMTask]]:
    """[(until_step, task)] of the task curriculum, each checked to share the final task's vocabulary."""
    final = make_task(cfg)
    out = []
    for until, kwargs in sorted(cfg.task_curriculum, key=lambda entry: entry[0]):
        task = TASKS[cfg.task](**kwargs)
        if task.vocab != final.vocab:
            raise ConfigError(f"The curriculum task {kwargs} has another vocabulary than the task {cfg.task_kwargs}; "
                              "give it the same token range (e.g. min_cents=0 for an HMM).")
        out.append((until, task))
    return out


def n_positions(cfg: TrainConfig, task: BijectionTask | HMMTask) -> int:
    """Position-embedding rows: the config's value, or the longest sequence the run trains on."""
    return cfg.n_positions or max([task.seq_len()] + [task.seq_len(n) for _, n in cfg.length_schedule])


def gpt2_config(cfg: TrainConfig, task: BijectionTask | HMMTask) -> GPT2Config:
    """The HF config of the transformer: task vocabulary + one special token, no dropout (fresh data every step)."""
    special = len(task.vocab)
    return GPT2Config(
        vocab_size=special + 1, n_positions=n_positions(cfg, task), n_embd=cfg.d_model, n_layer=cfg.n_layers,
        n_head=cfg.n_heads, n_inner=cfg.d_ff, activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, tie_word_embeddings=True, bos_token_id=special, eos_token_id=special,
        pad_token_id=special,
    )


def neox_config(cfg: TrainConfig, task: BijectionTask | HMMTask, rotary_pct: float = 1.0) -> GPTNeoXConfig:
    """The rotary variant: GPT-NeoX with GPT-2's choices (sequential residual, LayerNorm, GELU, biases, tied
    embeddings, no dropout) and rotary positions on ``rotary_pct`` of each head's dimensions (all of them; none for
    NoPE) instead of a position table. (transformers reads rotary_pct only when the config is built.)"""
    special = len(task.vocab)
    return GPTNeoXConfig(
        vocab_size=special + 1, max_position_embeddings=n_positions(cfg, task), hidden_size=cfg.d_model,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, intermediate_size=cfg.d_ff,
        hidden_act="gelu", rotary_pct=rotary_pct, use_parallel_residual=False, attention_dropout=0.0,
        hidden_dropout=0.0,
        tie_word_embeddings=True, bos_token_id=special, eos_token_id=special, pad_token_id=special,
    )


def nope_config(cfg: TrainConfig, task: BijectionTask | HMMTask) -> GPTNeoXConfig:
    """NoPE: the rotary variant with rotary on no dimension, so attention sees no position signal; the last
    position of a one-layer model is then exactly invariant to the order of the tokens before it."""
    return neox_config(cfg, task, rotary_pct=0.0)


POSITION_CONFIGS = {"learned": gpt2_config, "rotary": neox_config, "none": nope_config}


class MLPBaseline(nn.Module):
    """Per-position residual MLP over token + position embeddings, tied read-out; no mixing across positions.

    The capacity-matched control of Paper I: it can learn any function of (token, position) but not of the
    context, so the best it can do is a position-wise average belief.
    """

    def __init__(self, vocab_size: int, n_positions: int, d_model: int, n_blocks: int, d_hidden: int) -> None:
        super().__init__()
        self.config = dict(model_type=MLP_MODEL_TYPE, vocab_size=vocab_size, n_positions=n_positions,
                           d_model=d_model, n_blocks=n_blocks, d_hidden=d_hidden)
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(n_positions, d_model)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, d_hidden), nn.GELU(),
                          nn.Linear(d_hidden, d_model))
            for _ in range(n_blocks)
        )
        self.ln_f = nn.LayerNorm(d_model)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, input_ids: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """``input_ids`` [batch, pos] (or their embeddings [batch, pos, d], as HF's) -> logits [batch, pos, vocab]."""
        tok = self.wte(input_ids) if inputs_embeds is None else inputs_embeds
        h = tok + self.wpe(torch.arange(tok.shape[1], device=tok.device))
        for block in self.blocks:
            h = h + block(h)
        return self.ln_f(h) @ self.wte.weight.T

    def save_pretrained(self, folder: str | Path) -> None:
        """config.json + model.safetensors, the same files an HF folder has."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(self.config, indent=2))
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        save_file(tensors, str(folder / "model.safetensors"))

    @classmethod
    def from_pretrained(cls, folder: str | Path) -> MLPBaseline:
        folder = Path(folder)
        conf = json.loads((folder / "config.json").read_text())
        conf.pop("model_type")
        model = cls(**conf)
        model.load_state_dict(load_file(str(folder / "model.safetensors")))
        return model.eval()


def load_windtunnel(folder: str | Path) -> tuple[nn.Module, TrainConfig]:
    """A trained folder's model (the transformer booted through ``ib.load_model``, or the MLP) and its config."""
    folder = Path(folder)
    cfg = TrainConfig.from_dict(json.loads((folder / "windtunnel.json").read_text())["config"])
    if json.loads((folder / "config.json").read_text()).get("model_type") == MLP_MODEL_TYPE:
        return MLPBaseline.from_pretrained(folder), cfg
    from ..model.loading import load_model

    return load_model(str(folder)), cfg


def n_params(model: nn.Module) -> int:
    """Distinct trainable parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())


def build_transformer(cfg: TrainConfig, task: BijectionTask | HMMTask) -> nn.Module:
    """A freshly initialised GPT2LMHeadModel, or GPTNeoXForCausalLM with ``positions="rotary"`` (SDPA attention
    for training speed; the bridge uses eager)."""
    if cfg.positions not in POSITION_CONFIGS:
        raise ConfigError(f"Unknown positions {cfg.positions!r}; use 'learned' (GPT-2), 'rotary' (GPT-NeoX) or "
                          "'none' (GPT-NeoX without rotary).")
    return AutoModelForCausalLM.from_config(POSITION_CONFIGS[cfg.positions](cfg, task), attn_implementation="sdpa")


def build_mlp(cfg: TrainConfig, task: BijectionTask | HMMTask, target_params: int | None = None) -> MLPBaseline:
    """MLP baseline with the transformer's embeddings and ``n_layers`` blocks, hidden width solved so that its
    parameter count matches ``target_params`` (default: the transformer of the same config) to within 2%."""
    target = target_params or n_params(build_transformer(cfg, task))
    vocab, npos, d, nb = len(task.vocab) + 1, n_positions(cfg, task), cfg.d_model, cfg.n_layers
    fixed = (vocab + npos) * d + 2 * d + nb * 3 * d  # embeddings, final LN, per-block LN + output bias
    hidden = max(1, round((target - fixed) / (nb * (2 * d + 1))))
    model = MLPBaseline(vocab, npos, d, nb, hidden)
    if abs(n_params(model) - target) > 0.02 * target:
        raise ValueError(f"MLP has {n_params(model)} params vs target {target}: not within 2%; change n_layers.")
    return model


def build_model(cfg: TrainConfig, task: BijectionTask | HMMTask) -> nn.Module:
    """The model a config trains: transformer or capacity-matched MLP."""
    if cfg.arch == "transformer":
        return build_transformer(cfg, task)
    if cfg.arch == "mlp":
        return build_mlp(cfg, task)
    raise ValueError(f"unknown arch {cfg.arch!r}; use 'transformer' or 'mlp'.")
