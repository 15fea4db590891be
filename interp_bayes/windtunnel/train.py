"""Training loop for wind-tunnel models, the same for every task (its loss, held-out metrics and evaluation come
from its entry of ``table.TASK_TABLE``): fresh batches every step (optionally a curriculum over lengths or task
variants), AdamW with transformers' warm-up + cosine schedule, clipping, checkpoints on a dense-early schedule (each
a loadable HF folder), a progress bar and a JSONL metrics log (wall and CPU time).

Output folder::

    OUT/config.json, model.safetensors, tokenizer.json, ...   final model (boots with ib.load_model(OUT))
    OUT/windtunnel.json                                         TrainConfig, seed, parameter count, final eval
    OUT/metrics.jsonl                                           one JSON line per logged step
    OUT/checkpoints/step_000050/ ...                            same files, one folder per checkpoint
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import shutil
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch import nn
from transformers import get_cosine_with_min_lr_schedule_with_warmup

from ..core.checks import count_arg, device_arg, device_problem, out_folder_arg, positive_arg, refuse, seed_arg
from ..core.errors import ConfigError
from ..core.progress import progress_bar
from ..core.store import atomic_write_text
from ..core.stop import check_stop
from ..tasks.base import from_worker, sample_in_worker
from .configs import (ARCHS, PRESETS, TrainConfig, build_model, curriculum_tasks, make_config, make_task, n_params,
                      n_positions)
from .evaluate import evaluate_windtunnel
from .table import task_entry
from .tokenizer import save_tokenizer


def task_at(step: int, task: Any, curriculum: list[tuple[int, Any]]) -> Any:
    """Curriculum: the first task whose ``until_step`` lies beyond ``step``, else the final ``task``."""
    return next((t for until, t in curriculum if step < until), task)


def length_at(step: int, cfg: TrainConfig) -> int | None:
    """Curriculum: the sequence length in force at ``step`` (None: the task default)."""
    current = None
    for start, length in sorted(cfg.length_schedule):
        if step >= start:
            current = length
    return current


def save_folder(model: nn.Module, cfg: TrainConfig, task: Any, folder: Path, extra: dict[str, Any]) -> None:
    """Weights + HF config + tokenizer + windtunnel.json: a folder ``tunnels.open_tunnel`` opens."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    save_tokenizer(task.vocab, folder)
    meta = {"config": cfg.to_dict(), "n_params": n_params(model), **extra}
    atomic_write_text(folder / "windtunnel.json", json.dumps(meta, indent=2))


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW (no weight decay on biases and norms) with transformers' schedule: linear warm-up from 0 over
    ``warmup`` steps, then cosine decay to ``lr * min_lr_frac`` at ``steps``."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=cfg.betas,
    )
    return opt, get_cosine_with_min_lr_schedule_with_warmup(opt, num_warmup_steps=cfg.warmup,
                                                            num_training_steps=cfg.steps, min_lr_rate=cfg.min_lr_frac)


def optimizer_step(model: nn.Module, opt: torch.optim.Optimizer, sched: Any, loss: torch.Tensor, clip: float) -> float:
    """Backward, clip, step the optimiser and the schedule; returns the gradient norm before clipping."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), clip).item()
    opt.step()
    sched.step()
    return grad_norm


def train_step(
    model: nn.Module, opt: torch.optim.Optimizer, sched: Any, batch: Any, cfg: TrainConfig, task: Any
) -> tuple[float, float]:
    """One optimiser step on ``batch`` of ``task`` with the loss of its entry; returns (loss in nats, gradient norm
    before clipping)."""
    loss = task_entry(cfg.task).loss(model, task, batch, cfg.loss)
    return loss.item(), optimizer_step(model, opt, sched, loss, cfg.clip)


def batches(cfg: TrainConfig, sample: Callable[[int, np.random.Generator], Any],
            draw: Callable[[int], tuple[Any, int | None]] | None) -> Iterator[Any]:
    """The training batches in step order. ``data_workers == 0``: ``sample(step, rng)`` in turn from one stream
    seeded [seed, 1]. Otherwise batch ``step`` is ``task.sample(batch_size, seed=[seed, 1, step], length=length)``
    with ``(task, length) = draw(step)``, drawn by that many spawned processes, ``2 * data_workers`` steps ahead
    (spawned, not forked: the parent may hold CUDA state; so a script that trains with workers needs the
    ``if __name__ == "__main__":`` guard)."""
    if cfg.data_workers == 0 or draw is None:
        rng = np.random.default_rng([cfg.seed, 1])
        for step in range(cfg.steps):
            yield sample(step, rng)
        return
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(cfg.data_workers, mp_context=ctx) as pool:
        pending: deque = deque()
        ahead = iter(range(cfg.steps))
        for step in ahead:
            pending.append(pool.submit(sample_in_worker, *_drawn(draw, step, cfg)))
            if len(pending) >= 2 * cfg.data_workers:
                break
        for step in range(cfg.steps):
            batch = from_worker(pending.popleft().result())
            nxt = next(ahead, None)
            if nxt is not None:
                pending.append(pool.submit(sample_in_worker, *_drawn(draw, nxt, cfg)))
            try:
                yield batch
            except GeneratorExit:  # closed early (a failed step): drop the batches drawn ahead
                pool.shutdown(cancel_futures=True)
                raise


def _drawn(draw: Callable[[int], tuple[Any, int | None]], step: int, cfg: TrainConfig) -> tuple:
    task, length = draw(step)
    return task, cfg.batch_size, [cfg.seed, 1, step], length


@contextlib.contextmanager
def autocast(model: nn.Module, cfg: TrainConfig) -> Iterator[None]:
    """The forward's precision: nothing for ``autocast="none"``; for "bfloat16", torch's bf16 autocast with the
    output head (``get_output_embeddings``, where the model has one) kept in float32, since a bf16 logit of size 8
    is rounded to 1/16, a KL floor near 1e-4 bits, the size of the differences the HMM tunnels are judged by."""
    if cfg.autocast == "none":
        yield
        return
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    device_type = next(model.parameters()).device.type
    if head is not None:
        original = head.forward

        def forward(x: torch.Tensor) -> torch.Tensor:
            with torch.autocast(device_type, enabled=False):
                return original(x.float())

        head.forward = forward
    try:
        with torch.autocast(device_type, dtype=torch.bfloat16):
            yield
    finally:
        if head is not None:
            del head.forward  # the class's own forward again


def fit(model: nn.Module, cfg: TrainConfig, task: Any, out: Path, *, sample: Callable[[int, np.random.Generator], Any],
        step_loss: Callable[[Any], torch.Tensor], evaluate: Callable[[], dict], length: Callable[[Any], int],
        postfix: tuple[str, str], quiet: bool,
        draw: Callable[[int], tuple[Any, int | None]] | None = None) -> tuple[float, float]:
    """The loop every wind tunnel shares: a fresh batch per step (``sample(step, rng)``, or with ``data_workers``
    from worker processes: see ``batches``), AdamW with the schedule, clipping, checkpoints, the forward under the
    config's ``autocast``, one JSON line per logged step (``length(batch)`` tokens, wall and CPU time) with the
    held-out metrics of ``evaluate()`` (float32) every ``eval_every`` steps, and a bar showing ``postfix`` =
    (label, metric). Returns (wall, CPU) seconds: wall time is inflated on shared cores, CPU time is not."""
    opt, sched = make_optimizer(model, cfg)
    ckpts = set(cfg.checkpoint_steps())
    start, cpu_start = time.perf_counter(), time.process_time()
    bar = progress_bar(range(cfg.steps), disable=quiet, desc=f"{cfg.task}/{cfg.arch}")
    with contextlib.closing(batches(cfg, sample, draw)) as stream, (out / "metrics.jsonl").open("w") as log:
        for step in bar:
            check_stop()
            if step in ckpts:
                save_folder(model, cfg, task, out / "checkpoints" / f"step_{step:06d}", {"step": step})
            batch = next(stream)
            with autocast(model, cfg):
                loss = step_loss(batch)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"{cfg.task} training loss is {loss.item()} at step {step}; lower lr or "
                                         "raise warmup.")
            grad_norm = optimizer_step(model, opt, sched, loss, cfg.clip)
            last = step == cfg.steps - 1
            if step % cfg.log_every == 0 or last:
                rec = {"step": step, "loss": loss.item(), "lr": sched.get_last_lr()[0], "grad_norm": grad_norm,
                       "length": length(batch), "elapsed_s": round(time.perf_counter() - start, 2),
                       "cpu_s": round(time.process_time() - cpu_start, 2)}
                if step % cfg.eval_every == 0 or last:
                    with torch.no_grad():
                        model.eval()
                        rec |= {k: v for k, v in evaluate().items() if k != "per_position"}
                        model.train()
                    bar.set_postfix(loss=f"{rec['loss']:.4f}", **{postfix[0]: f"{rec[postfix[1]]:.4f}"})
                log.write(json.dumps(rec) + "\n")
                log.flush()
    return time.perf_counter() - start, time.process_time() - cpu_start


def train_task(model: nn.Module, cfg: TrainConfig, task: Any, out: Path, *, quiet: bool) -> tuple[float, float, dict]:
    """Train ``model`` on ``task`` (with the config's curriculum) with the loss and held-out metrics of the task's
    entry; (wall s, CPU s, the final evaluation at every default length that fits the model's positions)."""
    entry = task_entry(cfg.task)
    curriculum = curriculum_tasks(cfg)
    eval_batch = task.sample(cfg.eval_n, seed=[cfg.seed, 2])  # held out: a different seed stream
    wall, cpu = fit(
        model, cfg, task, out, quiet=quiet, step_loss=lambda batch: entry.loss(model, task, batch, cfg.loss),
        sample=lambda step, rng: task_at(step, task, curriculum).sample(cfg.batch_size, seed=rng,
                                                                        length=length_at(step, cfg)),
        draw=lambda step: (task_at(step, task, curriculum), length_at(step, cfg)),
        evaluate=lambda: entry.held_out(model, task, eval_batch), length=entry.batch_length, postfix=entry.progress)
    model.eval()
    npos = n_positions(cfg, task)
    final = evaluate_windtunnel(model, task, n=cfg.final_eval_n,
                                lengths=[k for k in entry.lengths(task) if task.seq_len(k) <= npos])
    if not quiet:
        print(f"done in {wall:.0f} s ({cpu:.0f} s CPU); {entry.summary(final, task)}")
    return wall, cpu, final


def train_windtunnel(
    task: str,
    *,
    preset: str = "cpu",
    out: str | Path,
    seed: int = 0,
    device: str | None = None,
    quiet: bool = False,
    overwrite: bool = False,
    **overrides: Any,
) -> Path:
    """Train a wind-tunnel model on ``task`` (a name of the task table) with one of its presets (``PRESETS``:
    "paper" | "cpu" | "tiny", and the task's own).

    ``overrides`` replace TrainConfig fields (``arch="mlp"`` trains the capacity-matched baseline). Returns the
    output folder, which holds the final model, its checkpoints and the metrics log. ``device`` defaults to CUDA
    when available; the saved folders hold float32 weights either way. A non-empty ``out`` is refused (its
    checkpoints would sit beside the new model's) unless ``overwrite``, which empties it first.
    """
    cfg = make_config(task, preset, seed=seed, **overrides)
    if device is not None:
        refuse(device_problem(device), "The training's device (--device)", device)
    out = Path(out)
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise ConfigError(f"{out} is not empty (an earlier training's files would mix with this one's); pass "
                              "--overwrite (overwrite=True) to empty it first, or choose another --out.")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    the_task = make_task(cfg)
    model = build_model(cfg, the_task).to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.train()
    if not quiet:
        print(f"{cfg.task}/{preset} {cfg.arch}: {n_params(model):,} parameters")
    wall, cpu, final = train_task(model, cfg, the_task, out, quiet=quiet)
    save_folder(model, cfg, the_task, out, {"step": cfg.steps, "train_wall_s": round(wall, 1),
                                            "train_cpu_s": round(cpu, 1), "preset": preset, "eval": final,
                                            "torch_threads": torch.get_num_threads()})
    return out


def add_train_args(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``interp-bayes train TASK --preset P --out DIR``."""
    parser.add_argument("task", choices=sorted(PRESETS), help="wind-tunnel task")
    parser.add_argument("--preset", default="cpu",
                        help="; ".join(f"{task}: {' | '.join(presets)}" for task, presets in sorted(PRESETS.items())))
    parser.add_argument("--out", type=out_folder_arg, required=True,
                        help="output folder (model, checkpoints, metrics.jsonl); must be empty or new")
    parser.add_argument("--overwrite", action="store_true", help="empty a non-empty --out first")
    parser.add_argument("--seed", type=seed_arg, default=0,
                        help="seed of the initial weights and of every training and evaluation batch (default 0)")
    parser.add_argument("--arch", choices=ARCHS, default="transformer",
                        help="model family; all but the transformer are matched to its parameter count")
    parser.add_argument("--steps", type=count_arg(), default=None, help="override the preset's step count")
    parser.add_argument("--init-std", type=positive_arg, default=None,
                        help="override the preset's std of the initial weights (GPT-2's 0.02; recall cpu: 0.1)")
    parser.add_argument("--device", type=device_arg, default=None, help="cpu | cuda (default: cuda when available)")
    parser.add_argument("--threads", type=count_arg(), default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run_train(args: argparse.Namespace) -> int:
    """Run a training from parsed ``add_train_args`` arguments; returns an exit status."""
    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = {"arch": args.arch} | {key: value for key in ("steps", "init_std")
                                       if (value := getattr(args, key)) is not None}
    train_windtunnel(args.task, preset=args.preset, out=args.out, seed=args.seed, device=args.device,
                     quiet=args.quiet, overwrite=args.overwrite, **overrides)
    return 0


def train_main(argv: list[str] | None = None) -> int:
    """Stand-alone entry: ``python -m interp_bayes.windtunnel.train TASK --preset P --out DIR``."""
    parser = argparse.ArgumentParser(prog="interp-bayes train", description=train_main.__doc__)
    add_train_args(parser)
    return run_train(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(train_main())
