"""An independent minimal recall trainer (issue 40; a run record, not part of the package).

A plain pre-LN transformer written here from torch alone (no HF model, no toolkit training loop), trained on
``RecallTask`` batches with cross-entropy over the value tokens at the query keys, to check that the effect of the
initial weights' scale is not a property of the toolkit's models. Every weight matrix (embeddings included) is
drawn from N(0, init^2). One line of JSON every 250 steps: the held-out (1,000 sequences, seed 2024) loss in nats
and recall; it stops once recall passes 0.99.

    python docs/runs/recall-issue40/minimal.py --init 0.1 --mlp 256 --steps 3000
"""

import argparse
import json
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from interp_bayes.tasks.recall import RecallTask

parser = argparse.ArgumentParser()
for name, kind, default in (("steps", int, 3000), ("bs", int, 64), ("lr", float, 1e-3), ("wd", float, 0.0),
                            ("d", int, 64), ("heads", int, 4), ("layers", int, 2), ("mlp", int, 0),
                            ("init", float, 0.02), ("pos", str, "learned"), ("keys", int, 12), ("pairs", int, 4),
                            ("queries", int, 3), ("filler", int, 4), ("warmup", int, 100), ("seed", int, 0)):
    parser.add_argument(f"--{name}", type=kind, default=default)
args = parser.parse_args()
torch.set_num_threads(1)
torch.manual_seed(args.seed)
task = RecallTask(n_keys=args.keys, n_values=args.keys, n_pairs=args.pairs, n_queries=args.queries,
                  n_filler=args.filler)
VOCAB, LENGTH, VALUES = len(task.vocab), task.seq_len(), torch.tensor(task.hypothesis_ids)
D_HEAD = args.d // args.heads


def rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = t[..., : D_HEAD // 2], t[..., D_HEAD // 2 :]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], -1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.qkv, self.out = nn.LayerNorm(args.d), nn.Linear(args.d, 3 * args.d), nn.Linear(args.d, args.d)
        self.ln2 = nn.LayerNorm(args.d)
        self.mlp = (nn.Sequential(nn.Linear(args.d, args.mlp), nn.GELU(), nn.Linear(args.mlp, args.d))
                    if args.mlp else None)

    def forward(self, x, cos, sin):
        n, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(n, t, 3, args.heads, D_HEAD).permute(2, 0, 3, 1, 4)
        if args.pos == "rotary":
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(y.transpose(1, 2).reshape(n, t, args.d))
        return x + self.mlp(self.ln2(x)) if self.mlp is not None else x


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.pos_embed = nn.Embedding(VOCAB, args.d), nn.Embedding(LENGTH, args.d)
        self.blocks = nn.ModuleList(Block() for _ in range(args.layers))
        self.ln_f, self.unembed = nn.LayerNorm(args.d), nn.Linear(args.d, VOCAB)
        for w in self.parameters():
            if w.dim() == 2:
                nn.init.normal_(w, std=args.init)
        angle = torch.arange(LENGTH)[:, None] * 10000 ** (-torch.arange(D_HEAD // 2) / (D_HEAD // 2))
        self.register_buffer("cos", angle.cos())
        self.register_buffer("sin", angle.sin())

    def forward(self, ids):
        x = self.embed(ids) + (self.pos_embed.weight[: ids.shape[1]] if args.pos == "learned" else 0)
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        return self.unembed(self.ln_f(x))


def value_logits(batch) -> torch.Tensor:
    return model(batch.input_ids)[:, batch.query_pos][..., VALUES]


model = Model()
opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.wd, betas=(0.9, 0.98))
schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1, (step + 1) / args.warmup))
held_out = task.sample(1000, seed=2024)
rng, start = np.random.default_rng(args.seed), time.process_time()
for step in range(args.steps + 1):
    if step % 250 == 0:
        with torch.no_grad():
            logits = value_logits(held_out)
        loss = F.cross_entropy(logits.reshape(-1, args.keys), held_out.labels.reshape(-1)).item()
        recall = (logits.argmax(-1) == held_out.labels).float().mean().item()
        print(json.dumps(dict(step=step, loss=round(loss, 4), recall=round(recall, 3),
                              cpu=round(time.process_time() - start, 1))), flush=True)
        if recall > 0.99:
            break
    batch = task.sample(args.bs, seed=rng)
    loss = F.cross_entropy(value_logits(batch).reshape(-1, args.keys), batch.labels.reshape(-1))
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    schedule.step()
