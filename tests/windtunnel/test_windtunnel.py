"""Wind-tunnel models: HF folders that boot in TransformerBridge, the capacity-matched MLP, training, evaluation."""

import json
import math
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from interp_bayes.model.loading import load_model
from interp_bayes.tasks.bijection import BijectionTask
from interp_bayes.windtunnel.configs import (PRESETS, TASKS, build_mlp, build_model, build_transformer,
    make_config, make_task, n_params)
from interp_bayes.windtunnel.discrete import BIJECTION, restricted_log_probs
from interp_bayes.windtunnel.entry import TaskEntry
from interp_bayes.windtunnel.evaluate import evaluate_windtunnel
from interp_bayes.windtunnel.table import TASK_TABLE, task_entry
from interp_bayes.windtunnel.tokenizer import build_tokenizer
from interp_bayes.windtunnel.tunnels import open_tunnel
from interp_bayes.core.errors import ConfigError
from interp_bayes.windtunnel.configs import curriculum_tasks
from interp_bayes.windtunnel.train import (
    length_at,
    make_optimizer,
    save_folder,
    task_at,
    train_main,
    train_step,
    train_windtunnel,
)

torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
CHECKPOINTS = Path(__file__).resolve().parents[2] / "interp_bayes" / "windtunnel" / "checkpoints"


def test_tokenizer_maps_task_symbols_to_their_ids():
    task = make_task(make_config("hmm", "tiny"))
    tok = build_tokenizer(task.vocab)
    assert tok("[TRANS] 0.05 1.00 [OBS] o3 s4")["input_ids"] == [96, 0, 95, 99, 103, 109]
    assert len(tok) == len(task.vocab) + 1


@pytest.mark.parametrize("task", ["bijection", "hmm"])
@pytest.mark.parametrize("preset", ["paper", "cpu", "tiny"])
def test_mlp_is_capacity_matched(task, preset):
    cfg = make_config(task, preset)
    t = make_task(cfg)
    n_tr, n_mlp = n_params(build_transformer(cfg, t)), n_params(build_mlp(cfg, t))
    print(f"{task}/{preset}: transformer {n_tr:,} MLP {n_mlp:,}")
    assert abs(n_mlp - n_tr) <= 0.02 * n_tr


def test_paper_bijection_size_is_the_papers():
    cfg = make_config("bijection", "paper")
    assert abs(n_params(build_transformer(cfg, make_task(cfg))) - 2.68e6) < 0.01e6


def test_mlp_sees_no_other_position():
    cfg = make_config("bijection", "tiny")
    mlp = build_mlp(cfg, make_task(cfg)).eval()
    ids = make_task(cfg).sample(2, seed=0).input_ids
    edited = ids.clone()
    edited[:, 5] = (edited[:, 5] + 1) % 20
    diff = (mlp(ids) - mlp(edited)).abs().amax(-1)  # [batch, pos]
    assert (diff[:, 5] > 0).all() and diff[:, :5].max() == 0 and diff[:, 6:].max() == 0


@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_transformer_folder_boots_in_the_bridge_with_hooks(tmp_path, positions):
    cfg = make_config("hmm", "tiny", positions=positions)
    task = make_task(cfg)
    torch.manual_seed(0)
    hf = build_transformer(cfg, task).eval()
    assert type(hf).__name__ == {"learned": "GPT2LMHeadModel", "rotary": "GPTNeoXForCausalLM"}[positions]
    save_folder(hf, cfg, task, tmp_path, {"step": 0})
    bridge = load_model(tmp_path)
    batch = task.sample(3, seed=1)
    logits, cache = bridge.run_with_cache(batch.input_ids)
    eager = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    torch.testing.assert_close(logits, eager(batch.input_ids).logits, atol=1e-5, rtol=0)
    T = batch.input_ids.shape[1]
    assert cache["blocks.0.attn.hook_v"].shape == (3, T, cfg.n_heads, cfg.d_model // cfg.n_heads)
    pattern = cache["blocks.0.attn.hook_pattern"]
    torch.testing.assert_close(pattern.sum(-1), torch.ones(3, cfg.n_heads, T))
    # the read-out slice is the LM head over the state tokens, identical through bridge and HF
    torch.testing.assert_close(restricted_log_probs(bridge, batch, task.hypothesis_ids),
                               restricted_log_probs(eager, batch, task.hypothesis_ids), atol=1e-5, rtol=0)


def test_unknown_positions_are_refused():
    cfg = make_config("bijection", "tiny", positions="alibi")
    with pytest.raises(ConfigError, match="positions"):
        build_transformer(cfg, make_task(cfg))


def test_training_drives_loss_well_below_uniform(tmp_path):
    V = 8
    out = train_windtunnel("bijection", preset="tiny", out=tmp_path, seed=0, quiet=True, steps=250,
                           task_kwargs={"n_symbols": V}, checkpoints=[0, 100], eval_every=50, final_eval_n=256)
    logs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    uniform = math.log(V)  # soft cross-entropy of the uniform guess, nats
    bayes = math.lgamma(V + 1) / V  # mean posterior entropy: (1/V) sum_k ln(V-k+1), nats
    assert logs[0]["loss"] > uniform - 0.05
    assert logs[-1]["loss"] < uniform - 0.5 * (uniform - bayes)
    assert logs[-1]["per_sample_entropy_mae_bits"] < 0.5 * logs[0]["per_sample_entropy_mae_bits"]
    meta = json.loads((out / "windtunnel.json").read_text())
    cfg = make_config("bijection", "tiny", task_kwargs={"n_symbols": V})
    assert meta["n_params"] == n_params(build_transformer(cfg, make_task(cfg)))
    ckpt = out / "checkpoints" / "step_000100"
    assert {"config.json", "model.safetensors", "tokenizer.json", "windtunnel.json"} <= {p.name for p in ckpt.iterdir()}
    early = evaluate_windtunnel(out / "checkpoints" / "step_000000", n=200)[V]
    late = evaluate_windtunnel(out, n=200)[V]
    assert late["kl_bits"] < early["kl_bits"]


def test_hmm_training_drives_kl_well_below_its_start(tmp_path):
    # two states, two symbols, four steps: the smallest HMM with a transition matrix to read (a sticky or larger
    # HMM sits on the uniform plateau for hundreds of steps: docs/windtunnels.md)
    kw = {"n_states": 2, "n_obs": 2, "n_steps": 4}
    out = train_windtunnel("hmm", preset="tiny", out=tmp_path, seed=1, quiet=True, steps=300, task_kwargs=kw,
                           checkpoints=[], eval_every=100, eval_n=512, final_eval_n=256)
    evals = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "kl_bits" in r]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == 299
    assert evals[-1]["kl_bits"] < 0.5 * evals[0]["kl_bits"]
    final = json.loads((out / "windtunnel.json").read_text())["eval"]["4"]
    assert final["n"] == 256
    assert final["vs_best_window"]["best_window"] == "window-4"  # the whole sequence: the exact filter
    assert final["baselines"]["uniform"]["kl_bits"] > final["kl_bits"]


def test_every_task_has_an_entry_in_the_table():
    assert set(TASK_TABLE) == set(TASKS) == set(PRESETS)
    with pytest.raises(ConfigError, match="Unknown wind-tunnel task 'ising'; known tasks: bijection, hmm, kalman"):
        task_entry("ising")


@pytest.mark.parametrize("task", sorted(TASK_TABLE))
def test_train_step_takes_the_loss_of_the_tasks_entry(task):
    cfg = make_config(task, "tiny", batch_size=4)
    the_task = make_task(cfg)
    torch.manual_seed(0)
    model = build_model(cfg, the_task).train()
    opt, sched = make_optimizer(model, cfg)
    batch = the_task.sample(4, seed=0)
    expected = TASK_TABLE[task].loss(model, the_task, batch, cfg.loss).item()
    loss, grad_norm = train_step(model, opt, sched, batch, cfg, the_task)
    assert loss == expected and grad_norm > 0 and sched.last_epoch == 1


class ToyTask(BijectionTask):
    name = "toy"


def test_a_new_task_plugs_in_with_its_entry_alone(tmp_path, monkeypatch):
    """A task the trainer and evaluator have never heard of: its class, presets and one table entry, whose
    held-out metrics and evaluator are the ones the generic loop logs and saves."""
    calls = {"held_out": 0, "evaluate": []}

    def held_out(model, task, batch):
        calls["held_out"] += 1
        return BIJECTION.held_out(model, task, batch) | {"toy_metric": 1.0}

    def evaluate(model, task, n, *, lengths, seed, **options):
        calls["evaluate"].append((n, lengths, seed, options))
        return {length: {"length": length, "n": n, "toy": True} for length in lengths}

    entry = TaskEntry(loss=BIJECTION.loss, held_out=held_out, evaluate=evaluate, lengths=lambda task: [3],
                      summary=lambda final, task: "toy", batch_length=BIJECTION.batch_length,
                      progress=("toy", "toy_metric"))
    monkeypatch.setitem(TASKS, "toy", ToyTask)
    monkeypatch.setitem(PRESETS, "toy", PRESETS["bijection"])
    monkeypatch.setitem(TASK_TABLE, "toy", entry)
    out = train_windtunnel("toy", preset="tiny", out=tmp_path, quiet=True, steps=3, eval_every=2, log_every=1,
                           checkpoints=[], final_eval_n=5, task_kwargs={"n_symbols": 4})
    logs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logs if "toy_metric" in r] == [0, 2] and calls["held_out"] == 2
    assert json.loads((out / "windtunnel.json").read_text())["eval"] == {"3": {"length": 3, "n": 5, "toy": True}}
    assert evaluate_windtunnel(out, n=7, batch_size=2) == {3: {"length": 3, "n": 7, "toy": True}}
    assert calls["evaluate"] == [(5, [3], 2024, {}), (7, [3], 2024, {"batch_size": 2})]


def old_lr_factor(step: int, cfg) -> float:
    """The hand-written schedule the package used before transformers' (issue 11), kept here as the reference."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def test_schedule_is_transformers_cosine_with_the_old_numbers_after_warmup():
    cfg = make_config("hmm", "tiny", steps=100, warmup=10, min_lr_frac=0.1)
    opt, sched = make_optimizer(torch.nn.Linear(3, 2), cfg)
    factors = []
    for _ in range(cfg.steps):
        factors.append(opt.param_groups[0]["lr"] / cfg.lr)  # the rate the step at this index uses
        opt.step()
        sched.step()
    # from the end of the warm-up on, every step's rate is the old formula's to the last bit
    assert factors[cfg.warmup:] == pytest.approx([old_lr_factor(s, cfg) for s in range(cfg.warmup, cfg.steps)],
                                                 rel=1e-12, abs=0)
    # transformers' warm-up starts at 0 and reaches the old formula's value one step later
    assert factors[: cfg.warmup] == pytest.approx([0.0] + [old_lr_factor(s - 1, cfg) for s in range(1, cfg.warmup)],
                                                  rel=1e-12, abs=0)
    assert all(a >= b for a, b in zip(factors[cfg.warmup:], factors[cfg.warmup + 1:]))
    assert factors[-1] == pytest.approx(0.1, abs=1e-3)


def test_length_curriculum():
    cfg = make_config("hmm", "tiny", steps=100, length_schedule=[(0, 3), (50, 6)])
    assert [length_at(s, cfg) for s in (0, 49, 50, 99)] == [3, 3, 6, 6]


def test_task_curriculum_moves_between_hmm_families_with_one_vocabulary():
    fast = {"transitions": "dirichlet", "min_cents": 0}
    cfg = make_config("hmm", "sticky-tiny", task_curriculum=[(20, fast)])
    final = make_task(cfg)
    curriculum = curriculum_tasks(cfg)
    assert [task_at(s, final, curriculum).transitions for s in (0, 19, 20, 99)] == ["dirichlet"] * 2 + ["sticky"] * 2
    assert curriculum[0][1].vocab == final.vocab
    with pytest.raises(ConfigError, match="another vocabulary"):
        curriculum_tasks(make_config("hmm", "sticky-tiny", task_curriculum=[(20, {})]))  # 0.05.. tokens
    # the round trip through windtunnel.json keeps the curriculum
    assert type(cfg).from_dict(json.loads(json.dumps(cfg.to_dict()))).task_curriculum == [(20, fast)]


def test_cli_trains_the_mlp_baseline(tmp_path):
    argv = ["hmm", "--preset", "tiny", "--arch", "mlp", "--steps", "3", "--out", str(tmp_path), "--quiet"]
    assert train_main(argv) == 0
    tunnel = open_tunnel(tmp_path)
    model, cfg = tunnel.model, tunnel.config
    assert cfg.arch == "mlp" and cfg.steps == 3
    res = evaluate_windtunnel(model, make_task(cfg), n=16, lengths=[4, 8])
    assert set(res) == {4, 8} and all(r["kl_bits"] > 0 for r in res.values())


COMMITTED = sorted(p for p in CHECKPOINTS.glob("*") if (p / "windtunnel.json").exists()) if CHECKPOINTS.exists() else []


@pytest.mark.parametrize("folder", COMMITTED, ids=[p.name for p in COMMITTED])
def test_committed_checkpoint_meets_its_recorded_mae(folder):
    meta = json.loads((folder / "windtunnel.json").read_text())
    length, recorded = next(iter(meta["eval"].items()))
    got = evaluate_windtunnel(folder, n=recorded["n"], lengths=[int(length)], baselines=False)[int(length)]
    for key in ("per_sample_entropy_mae_bits", "kl_bits"):
        assert got[key] <= recorded[key] * 1.01 + 1e-5, key


def test_checkpoints_are_committed_within_budget():
    assert COMMITTED, "no committed wind-tunnel checkpoints found"
    total = sum(f.stat().st_size for f in CHECKPOINTS.rglob("*") if f.is_file())
    # 32 MiB: the four transformers' checkpoint series (15 MiB) and one final model per architecture and tunnel of
    # the architecture table (0.5-0.9 MiB each); a paper-size model (10+ MiB) does not belong in the package
    assert total <= 32 * 2**20
