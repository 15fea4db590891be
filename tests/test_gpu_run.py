"""The prepared GPU run (bench/gpu_run.sh, issue 29) and the trainer's GPU mechanics it uses: bf16 autocast with
the output head kept in float32, and batches drawn by worker processes from per-step seeds. The end-to-end run in
tiny mode (CPU) takes a few minutes on a 2-core machine, so it is marked slow; the mechanics are tested fast."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from interp_bayes.core.errors import ConfigError
from interp_bayes.windtunnel.configs import build_model, make_config, make_task, n_params
from interp_bayes.windtunnel.train import autocast, batches

ROOT = Path(__file__).resolve().parents[1]


def tiny_model(**overrides):
    cfg = make_config("hmm", "tiny", **overrides)
    task = make_task(cfg)
    torch.manual_seed(0)
    return build_model(cfg, task).eval(), cfg, task


def test_autocast_runs_the_body_in_bf16_and_the_output_head_in_float32():
    model, cfg, task = tiny_model(autocast="bfloat16")
    ids = task.sample(3, seed=0).input_ids
    seen = {}
    hooks = [model.transformer.h[0].mlp.c_fc.register_forward_hook(lambda m, i, o: seen.__setitem__("body", o)),
             model.transformer.ln_f.register_forward_hook(lambda m, i, o: seen.__setitem__("ln_f", o))]
    with torch.no_grad(), autocast(model, cfg):
        logits = model(ids).logits
    for h in hooks:
        h.remove()
    assert seen["body"].dtype == torch.bfloat16  # autocast is on inside the blocks
    assert logits.dtype == torch.float32
    # the head's product, recomputed in float32 from what the final norm handed it
    expected = torch.nn.functional.linear(seen["ln_f"].float(), model.lm_head.weight)
    torch.testing.assert_close(logits, expected, rtol=1e-6, atol=1e-6)
    head = model.get_output_embeddings()
    assert "forward" not in vars(head)  # the class's own forward is back
    with torch.no_grad():
        assert model(ids).logits.dtype == torch.float32


def test_autocast_none_changes_nothing():
    model, cfg, task = tiny_model()
    ids = task.sample(3, seed=0).input_ids
    with torch.no_grad():
        plain = model(ids).logits
        with autocast(model, cfg):
            inside = model(ids).logits
    assert torch.equal(plain, inside)


def test_unknown_autocast_and_negative_workers_are_refused():
    with pytest.raises(ConfigError, match="autocast"):
        make_config("hmm", "tiny", autocast="float16")
    with pytest.raises(ConfigError, match="data_workers"):
        make_config("hmm", "tiny", data_workers=-1)


def test_worker_batches_are_the_per_step_seeded_ones_in_step_order():
    cfg = make_config("hmm", "tiny", data_workers=2, steps=5, batch_size=4)
    task = make_task(cfg)
    drawn = list(batches(cfg, sample=None, draw=lambda step: (task, 3 + step % 2)))
    assert len(drawn) == cfg.steps
    for step, batch in enumerate(drawn):
        ref = task.sample(cfg.batch_size, seed=[cfg.seed, 1, step], length=3 + step % 2)
        assert torch.equal(batch.input_ids, ref.input_ids) and torch.equal(batch.labels, ref.labels)
        assert torch.equal(batch.posterior, ref.posterior) and torch.equal(batch.query_pos, ref.query_pos)


def test_without_workers_batches_come_from_one_stream_in_turn():
    cfg = make_config("hmm", "tiny", steps=3, batch_size=4)
    task = make_task(cfg)
    drawn = list(batches(cfg, sample=lambda step, rng: task.sample(cfg.batch_size, seed=rng), draw=None))
    rng = np.random.default_rng([cfg.seed, 1])
    for batch in drawn:
        assert torch.equal(batch.input_ids, task.sample(cfg.batch_size, seed=rng).input_ids)


@pytest.mark.parametrize("preset", ["gpu", "sticky-gpu"])
def test_gpu_presets_fit_the_device_and_score_every_length(preset):
    cfg = make_config("hmm", preset)
    task = make_task(cfg)
    model = build_model(cfg, task)
    assert n_params(model) * 4 < 15 * 2**20  # float32 weights in one returned file of at most 16 MiB
    assert task.seq_len(50) <= cfg.n_positions and cfg.autocast == "bfloat16" and cfg.checkpoint_steps() == []


@pytest.mark.slow
def test_gpu_run_tiny_end_to_end(tmp_path):
    from interp_bayes.windtunnel.evaluate import evaluate_windtunnel

    out = tmp_path / "out"
    env = dict(os.environ, PY=sys.executable, OUT=str(out))
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_run.sh"), "--tiny", "--work", str(tmp_path / "work")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = {p.name for p in out.iterdir()}
    assert files == {"gpu_run.json", "gpu_run.md", "gpu_run.log", "hmm-gpu.tar", "hmm-sticky-gpu.tar"}
    results = json.loads((out / "gpu_run.json").read_text())
    assert results["tiny"] and not results["skipped"]
    for name in ("hmm-gpu", "hmm-sticky-gpu"):
        entry = results["windtunnels"][name]
        assert set(entry["eval"]) == {"8", "30", "50"} and entry["packed"]["fits_device_limit"]
        with tarfile.open(out / f"{name}.tar") as tar:
            tar.extractall(tmp_path / "unpacked", filter="data")
        folder = tmp_path / "unpacked" / name
        meta = json.loads((folder / "windtunnel.json").read_text())
        assert meta["config"]["autocast"] == "bfloat16" and meta["step"] == entry["steps"]
        assert (folder / "command.txt").read_text().strip() == entry["command"]
        # the packed model is the one scored: its evaluation again, on the same sequences, gives the same KL
        again = evaluate_windtunnel(folder, n=64, lengths=[8], baselines=False)
        assert again[8]["kl_bits"] == pytest.approx(entry["eval"]["8"]["kl_bits"], rel=1e-5)
    for name in ("pythia-1.4b-shape", "llama-3-8b-shape"):
        entry = results["benchmarks"][name]
        assert entry["collect"]["ratio"] > 0 and entry["interventions"]["ratio_fast_over_naive"] > 0
    big = results["benchmarks"]["llama-3-8b-shape"]
    assert big["placement"]["bitwise_equal"] and "disk" in big["placement"]["devices"]
    assert big["interventions"]["default_protocol"]["edits"] == 4 * 2 * 2  # 4 operators, 2 layer sets, axis + 1
    page = (out / "gpu_run.md").read_text()
    assert "| hmm-gpu |" in page and "collect / bare HF sdpa" in page
    assert "== hmm-sticky-gpu" in (out / "gpu_run.log").read_text()
