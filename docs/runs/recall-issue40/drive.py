"""The driver of the issue-40 recall runs (a run record, not part of the package).

    python docs/runs/recall-issue40/drive.py train RUN OUT     train the run RUN of runs.json into the folder OUT
    python docs/runs/recall-issue40/drive.py circuit OUT JSON  the recall-circuit scores of OUT's checkpoints

``train``: ``train_windtunnel("recall", preset="cpu", seed=0, eval_every=100, log_every=25, **entry)`` (the
entry's seed wins) with one torch thread, where ``entry`` is the run's entry of runs.json less the keys that only
describe it (``stopped_at_step``, ``lookback_steps``). An entry with ``lookback_steps: S`` trains through the same loop
(``train.fit``) with the look-back curriculum: for its first S steps the loss is the cross-entropy, at each stored
value, of the key two tokens back (over the key tokens), the first step of the binding circuit; then the recall loss,
plus that look-back loss where the entry has ``lookback_held: true`` (the first step held in place).

``circuit``: per checkpoint (and the final model), the four scores of ``analyses.recall_circuit`` per layer and
head and the recall, on 300 held-out sequences (seed 2024), as the kind ``recall_circuit`` computes them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from interp_bayes.kinds.recall_circuit import RecallCircuitParams, checkpoint_rows
from interp_bayes.windtunnel.configs import build_model, make_config, make_task, n_params
from interp_bayes.windtunnel.discrete import loss_fn
from interp_bayes.windtunnel.evaluate import evaluate_windtunnel
from interp_bayes.windtunnel.table import task_entry
from interp_bayes.windtunnel.train import fit, save_folder, train_windtunnel
from interp_bayes.windtunnel.tunnels import open_tunnel, saved_checkpoints

RUNS = json.loads(Path(__file__).with_name("runs.json").read_text())
DESCRIBE_ONLY = ("stopped_at_step", "lookback_steps", "lookback_held")


def lookback_loss(logits: torch.Tensor, input_ids: torch.Tensor, task) -> torch.Tensor:
    """Cross-entropy (nats) of each stored pair's key, read at its value's position, over the key tokens."""
    N = task.pairs_in(input_ids)
    at_values = logits[:, 3 : 4 * N : 4, task.key_offset : task.value_offset]  # [n, N, keys]
    keys = input_ids[:, 1 : 4 * N : 4] - task.key_offset  # [n, N]
    return torch.nn.functional.cross_entropy(at_values.reshape(-1, task.n_keys), keys.reshape(-1))


def recall_loss(logits: torch.Tensor, batch, task, kind: str) -> torch.Tensor:
    """The recall entry's loss (``discrete.discrete_loss``, the same operations) from logits already computed."""
    logp = torch.log_softmax(logits[:, batch.query_pos][..., task.hypothesis_ids].float(), dim=-1)
    return loss_fn(logp, batch.posterior, batch.labels, kind)


def train_lookback(out: Path, lookback_steps: int, held: bool, **overrides) -> None:
    """``train.train_task`` with the look-back phase first (module docstring)."""
    cfg = make_config("recall", "cpu", **overrides)
    out.mkdir(parents=True, exist_ok=False)
    torch.manual_seed(cfg.seed)
    task, entry = make_task(cfg), task_entry("recall")
    model = build_model(cfg, task)
    model.train()
    eval_batch = task.sample(cfg.eval_n, seed=[cfg.seed, 2])

    def step_loss(drawn):
        step, batch = drawn
        logits = model(batch.input_ids).logits
        if step < lookback_steps:
            return lookback_loss(logits, batch.input_ids, task)
        loss = recall_loss(logits, batch, task, cfg.loss)
        return loss + lookback_loss(logits, batch.input_ids, task) if held else loss

    wall, cpu = fit(model, cfg, task, out, quiet=True, step_loss=step_loss,
                    sample=lambda step, rng: (step, task.sample(cfg.batch_size, seed=rng)),
                    evaluate=lambda: entry.held_out(model, task, eval_batch),
                    length=lambda drawn: drawn[1].input_ids.shape[1], postfix=entry.progress)
    model.eval()
    final = evaluate_windtunnel(model, task, n=cfg.final_eval_n, lengths=[task.n_pairs])
    save_folder(model, cfg, task, out, {"step": cfg.steps, "train_wall_s": round(wall, 1), "train_cpu_s": round(cpu, 1),
                                        "preset": "cpu", "eval": final, "torch_threads": torch.get_num_threads(),
                                        "lookback_steps": lookback_steps, "lookback_held": held})
    print(f"{n_params(model):,} parameters; done in {wall:.0f} s ({cpu:.0f} s CPU)")


def train(run: str, out: Path) -> None:
    entry = dict(RUNS[run])
    overrides = {"seed": 0, "eval_every": 100, "log_every": 25} | {k: v for k, v in entry.items()
                                                                   if k not in DESCRIBE_ONLY}
    if "lookback_steps" in entry:
        train_lookback(out, entry["lookback_steps"], entry.get("lookback_held", False), **overrides)
    else:
        train_windtunnel("recall", preset="cpu", out=out, quiet=True, **overrides)


def circuit(out: Path, dest: Path) -> None:
    """Write [{step, recall, scores: {metric: [layer][head]}}] for each saved checkpoint and the final model
    (skipping a checkpoint not yet complete, so that a running training can be read)."""
    folders = [f for f in saved_checkpoints(out).values() if (f / "windtunnel.json").exists()]
    if (out / "windtunnel.json").exists() and open_tunnel(out).step not in saved_checkpoints(out):
        folders.append(out)
    params = RecallCircuitParams(tunnel=str(out), n=300)
    table = []
    for folder in folders:
        rows = checkpoint_rows(folder, params)
        step = rows[0].scope["step"]
        recall = next(r.value for r in rows if r.metric == "recall_accuracy")
        scores: dict = {}
        for r in rows:
            if r.metric != "recall_accuracy":
                per_layer = scores.setdefault(r.metric, [])
                while len(per_layer) <= r.scope["layer"]:
                    per_layer.append([])
                per_layer[r.scope["layer"]].append(r.value)
        table.append({"step": step, "recall": recall, "scores": scores})
        print(step, f"recall {recall:.3f}", flush=True)
    dest.write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    torch.set_num_threads(1)
    command, first, second = sys.argv[1:4]
    if command == "train":
        train(first, Path(second))
    else:
        circuit(Path(first), Path(second))
