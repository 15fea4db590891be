"""Training configs, presets, tasks by name, the model families (an HF transformer; capacity-matched to it, the
per-position MLP, the context MLP, the LSTM and HF's Mamba-2: ``build_model``); a trained folder opens with
``tunnels.open_tunnel``.

The transformer is a plain ``GPT2LMHeadModel`` (learned absolute positions, LayerNorm, GELU MLP, tied embeddings:
the paper's architecture; absolute positions matter for the HMM, whose matrix entries are identified only by
where they sit in the header), so ``ib.load_model(folder)`` boots it in TransformerBridge like any LLM. With
``positions="rotary"`` it is a ``GPTNeoXForCausalLM`` of the same shape instead (GPT-2 with rotary positions on
every head dimension in place of the position table), for tasks whose lookup is relative: the bijection with
replacement must find an earlier copy of the current key, wherever it sits; ``positions="none"`` is that GPT-NeoX
with rotary on no dimension (NoPE: only the causal mask tells positions apart), the control of the martingale test
averaged over orderings. The MLP baseline has the same embeddings and read-out but no attention: each position sees
only its own token and index. The other families are in ``archs`` (hooked with TransformerLens's names) and
``build_mamba``.
"""

from __future__ import annotations

# ``archs`` (it imports TransformerLens, ~5 s) and Mamba-2's modeling code are imported inside the builders of the
# families that need them: a transformer tunnel loads neither
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from torch import nn
from transformers import AutoModelForCausalLM, GPT2Config, GPTNeoXConfig, Mamba2Config

from ..core.checks import count_problem, positive_problem, refuse, seed_problem
from ..core.errors import ConfigError
from ..tasks.bijection import BijectionTask
from ..tasks.hmm import HMMTask
from ..tasks.kalman import KalmanTask
from ..tasks.recall import RecallTask

TASKS = {"bijection": BijectionTask, "hmm": HMMTask, "kalman": KalmanTask, "recall": RecallTask}
ARCHS = ("transformer", "mlp", "mlp-context", "lstm", "mamba")
AUTOCAST = ("none", "bfloat16")  # TrainConfig.autocast


@dataclass
class TrainConfig:
    """Everything a wind-tunnel run needs; saved as windtunnel.json beside every checkpoint."""

    task: str = "bijection"
    task_kwargs: dict[str, Any] = field(default_factory=dict)
    arch: str = "transformer"  # one of ARCHS; every one but the transformer capacity-matched to it (build_model)
    positions: str = "learned"  # transformer positions: "learned" (GPT-2) | "rotary" (GPT-NeoX of the same shape)
    # | "none" (NoPE: that GPT-NeoX with rotary on no dimension; only the causal mask tells positions apart)
    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 64
    d_ff: int = 256
    # std of the normal init of the weight matrices (the transformer's HF initializer_range, GPT-2's 0.02; the
    # MLPs' matrices, the LSTM's embeddings; Mamba-2 keeps HF's own 0.1). Larger shortens the plateau before a
    # two-step circuit such as recall's binding forms (docs/windtunnels.md, issue 40).
    init_std: float = 0.02
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
        refuse(count_problem(cfg.steps), "The training's steps (--steps)", cfg.steps)
        refuse(seed_problem(cfg.seed), "The training's seed (--seed)", cfg.seed)
        refuse(positive_problem(cfg.init_std), "The initial weights' std (init_std, --init-std)", cfg.init_std)
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
# bijection transformer. cpu: 12 keys and values, 4 pairs, 4 filler (33 tokens), the bijection cpu model with its
# weights drawn at std 0.1: at GPT-2's 0.02 no run left the stored-values plateau in 8,000 steps; at 0.1 the binding
# circuit forms by step ~300 at most seeds (docs/windtunnels.md, issue 40).
PRESETS["recall"] = {
    "paper": PRESETS["bijection"]["paper"] | dict(
        task_kwargs=dict(n_keys=256, n_values=256, n_pairs=64, n_queries=3, n_filler=32)),
    "cpu": dict(n_layers=2, n_heads=4, d_model=64, d_ff=256, steps=2000, batch_size=64, lr=3e-3, warmup=200,
                weight_decay=0.01, loss="soft", checkpoints=[1000], init_std=0.1,
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
        pad_token_id=special, initializer_range=cfg.init_std,
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
        hidden_dropout=0.0, initializer_range=cfg.init_std,
        tie_word_embeddings=True, bos_token_id=special, eos_token_id=special, pad_token_id=special,
    )


def nope_config(cfg: TrainConfig, task: BijectionTask | HMMTask) -> GPTNeoXConfig:
    """NoPE: the rotary variant with rotary on no dimension, so attention sees no position signal; the last
    position of a one-layer model is then exactly invariant to the order of the tokens before it."""
    return neox_config(cfg, task, rotary_pct=0.0)


POSITION_CONFIGS = {"learned": gpt2_config, "rotary": neox_config, "none": nope_config}


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


def build_mlp(cfg: TrainConfig, task: BijectionTask | HMMTask, target_params: int | None = None) -> nn.Module:
    """MLP baseline with the transformer's embeddings and ``n_layers`` blocks, hidden width solved so that its
    parameter count matches ``target_params`` (default: the transformer of the same config) to within 2%."""
    from .archs import MLPBaseline

    target = target_params or n_params(build_transformer(cfg, task))
    vocab, npos, d, nb = len(task.vocab) + 1, n_positions(cfg, task), cfg.d_model, cfg.n_layers
    fixed = (vocab + npos) * d + 2 * d + nb * 3 * d  # embeddings, final LN, per-block LN + output bias
    hidden = max(1, round((target - fixed) / (nb * (2 * d + 1))))
    model = MLPBaseline(vocab, npos, d, nb, hidden, cfg.init_std)
    if abs(n_params(model) - target) > 0.02 * target:
        raise ValueError(f"MLP has {n_params(model)} params vs target {target}: not within 2%; change n_layers.")
    return model


CONTEXT_SHARE = 1 / 3  # the context MLP's window projection takes about this share of the parameters


def build_mlp_context(cfg: TrainConfig, task: BijectionTask | HMMTask, target_params: int | None = None) -> nn.Module:
    """The context-seeing MLP (``archs.ContextMLP``): a window over the whole context (``n_positions``), ``n_layers``
    residual blocks of width ``d_model``. The per-token embedding width is set so that the window projection takes
    about ``CONTEXT_SHARE`` of the target, then the blocks' hidden width is solved to match the target (default: the
    transformer of the same config) within 2%."""
    from .archs import ContextMLP, solve_width

    target = target_params or n_params(build_transformer(cfg, task))
    vocab, npos, d, nb = len(task.vocab) + 1, n_positions(cfg, task), cfg.d_model, cfg.n_layers
    d_embed = max(1, round(CONTEXT_SHARE * target / (npos * d)))
    hidden = solve_width(lambda h: ContextMLP(vocab, npos, d_embed, d, nb, h), target, what="context MLP")
    return ContextMLP(vocab, npos, d_embed, d, nb, hidden, cfg.init_std)


def build_lstm(cfg: TrainConfig, task: BijectionTask | HMMTask, target_params: int | None = None) -> nn.Module:
    """The LSTM (``archs.LSTMWindtunnel``) with the transformer's layer count (the authors' choice), its width
    solved to match ``target_params`` (default: the transformer of the same config) within 2%."""
    from .archs import LSTMWindtunnel, solve_width

    target = target_params or n_params(build_transformer(cfg, task))
    vocab, npos = len(task.vocab) + 1, n_positions(cfg, task)
    width = solve_width(lambda d: LSTMWindtunnel(vocab, npos, d, cfg.n_layers), target, what="LSTM")
    return LSTMWindtunnel(vocab, npos, width, cfg.n_layers, cfg.init_std)


MAMBA_HEAD_DIM = 16  # Mamba-2 head width: the model width moves in steps of 8, so that 2 * width / 16 heads fit
MAMBA_STATE = 16  # the authors' d_state; changed only where the width's steps of 8 miss the 2% match
# The pure-torch scan's chunk length. The chunked scan is exact at any length; 16 rather than HF's 64 because
# a 39-token bijection sequence padded to one 64-chunk spends most of the step on the padding's 64 x 64 decay
# matrices: 0.62 CPU s a bijection cpu training step against 1.14 at 64 (8: 0.63; hmm sticky-cpu, 16 and 32: 1.05).
MAMBA_CHUNK = 16


def mamba_config(cfg: TrainConfig, task: BijectionTask | HMMTask, d_model: int,
                 state: int = MAMBA_STATE) -> Mamba2Config:
    """HF's Mamba-2 with the authors' block settings (state 16, conv 4, expand 2) and the transformer's layer
    count, heads of ``MAMBA_HEAD_DIM``, tied embeddings, no position table (the recurrence sees order). Mamba-2, not
    Mamba-1: without the CUDA kernels, HF's Mamba-1 scans position by position and its backward pass costs ~60x the
    transformer's training step on CPU; Mamba-2's pure-torch path is chunked (~5x)."""
    special = len(task.vocab)
    return Mamba2Config(vocab_size=special + 1, hidden_size=d_model, num_hidden_layers=cfg.n_layers, state_size=state,
                        conv_kernel=4, expand=2, head_dim=MAMBA_HEAD_DIM, num_heads=2 * d_model // MAMBA_HEAD_DIM,
                        n_groups=1, chunk_size=MAMBA_CHUNK, tie_word_embeddings=True, use_cache=False,
                        bos_token_id=special, eos_token_id=special, pad_token_id=special)


def build_mamba(cfg: TrainConfig, task: BijectionTask | HMMTask, target_params: int | None = None) -> nn.Module:
    """A fresh ``Mamba2ForCausalLM`` (``mamba_config``) matched to ``target_params`` (default: the transformer of the
    same config) within 2%: the width (a multiple of 8) nearest the target at the authors' state size, or a
    neighbour of it; only where none of them is within 2%, the state size is solved per width and the width whose
    state lies nearest 16 is kept. Saved as an HF
    folder, it boots through ``ib.load_model`` (TransformerBridge's Mamba-2 adapter)."""
    from transformers import Mamba2ForCausalLM

    from .archs import count_on_meta, nearest_width, within

    target = target_params or n_params(build_transformer(cfg, task))

    def count(width: int, state: int = MAMBA_STATE) -> int:
        return count_on_meta(lambda: Mamba2ForCausalLM(mamba_config(cfg, task, width, state)))

    nearest = 8 * nearest_width(lambda w: Mamba2ForCausalLM(mamba_config(cfg, task, 8 * w)), target, hi=1 << 10)
    widths = [w for w in (nearest, nearest - 8, nearest + 8) if w > 0]
    matched = [w for w in widths if within(count(w), target)]
    if matched:
        return Mamba2ForCausalLM(mamba_config(cfg, task, matched[0]))
    # the state size nearest the target at each width; keep the width whose state lies nearest the authors' 16
    states = {w: nearest_width(lambda s: Mamba2ForCausalLM(mamba_config(cfg, task, w, s)), target, hi=1 << 9)
              for w in widths}
    width = min((w for w in widths if within(count(w, states[w]), target)), default=nearest,
                key=lambda w: abs(states[w] - MAMBA_STATE))
    state = states.get(width, MAMBA_STATE)
    if not within(count(width, state), target):
        raise ValueError(f"No Mamba width and state size come within 2% of {target} parameters; change n_layers or "
                         "d_model.")
    return Mamba2ForCausalLM(mamba_config(cfg, task, width, state))


BUILDERS = {"mlp": build_mlp, "mlp-context": build_mlp_context, "lstm": build_lstm, "mamba": build_mamba}


def build_model(cfg: TrainConfig, task: BijectionTask | HMMTask) -> nn.Module:
    """The model a config trains: the transformer, or another of ``ARCHS`` matched to its parameter count."""
    if cfg.arch == "transformer":
        return build_transformer(cfg, task)
    if cfg.arch not in BUILDERS:
        raise ConfigError(f"Unknown arch {cfg.arch!r}; use one of {', '.join(ARCHS)}.")
    return BUILDERS[cfg.arch](cfg, task)
