"""Benchmark: run_interventions' fast path against the naive one (a whole forward pass per edit), side by side.

Models: SmolLM2-135M (offline) and a random-init Llama-architecture model of about 0.5B parameters (24 layers,
d_model 896, 14 query / 2 key-value heads, MLP 4864, vocabulary 151,936: Qwen2.5-0.5B's shape; the time does not
depend on the weights); ``--models`` also takes local HF folders. Protocol: the sweep's (``interp_bayes.run.sweep``):
SULA prompts (per_k 50) split in halves by k, PC1 axes fitted per layer on one half, the 125 others evaluated; layer
sets ``middle`` and ``spread5``; the four operators; value readings at every axis layer.

Per layer set and repeat, alternating: the naive path on the true axis' four edits (``--naive-draws`` isotropic
draws more), then the fast path on the edits of the default recipe (``--draws`` per control family, pcs 1).
A naive run is a whole forward pass whatever the edit, so its time per run times (1 + edits) is what the naive path
would take on the fast path's edits: the ratio fast / naive is taken on equal edit counts. The fast path's time
per edit beyond its unperturbed run extrapolates to the full protocol (20 + 20 + 3 draws, both layer sets).
torch's FLOP count of the unperturbed run and of one edit, against the GFLOP/s of a large matrix product measured in
the same process, gives how close the fast path runs to this machine's peak, and the least time any implementation
of the two recipes' forward passes could take here.
Medians over repeats, with the ratio of every repeat, in wall-clock time and in this process's CPU time (the
steadier of the two on a shared machine). One thread by default (``--threads``). ``--full`` instead times the
whole protocol once on the fast path (20 + 20 + 3 draws, four operators, both layer sets), as a recipe would.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

QWEN05_SHAPE = dict(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                    num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                    tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6)


def llama_05b(tokenizer_folder: str, seed: int = 0):
    """A random-init Llama-architecture bridge of Qwen2.5-0.5B's shape (about 494M parameters, float32), with the
    tokenizer of ``tokenizer_folder``; built in memory (only its config is written, to a temporary folder)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transformer_lens.model_bridge import TransformerBridge

    from interp_bayes import run_native_when_unobserved

    torch.manual_seed(seed)
    config = LlamaConfig(**QWEN05_SHAPE)
    hf = LlamaForCausalLM(config).eval()
    folder = Path(tempfile.mkdtemp(prefix="llama-05b-"))
    config.save_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    tokenizer.save_pretrained(folder)
    bridge = TransformerBridge.boot_transformers(str(folder), hf_model=hf, tokenizer=tokenizer, device="cpu")
    run_native_when_unobserved(bridge)  # as load_model does
    return bridge.eval()


def protocol(model, name: str, seed: int = 0) -> dict:
    """The sweep's intervention protocol on SULA (the ``interventions`` kind): prompts, axes, fit values, task
    columns, label ids and the two layer sets."""
    from interp_bayes.analyses.axis import fit_entropy_axis
    from interp_bayes.run.config import SweepConfig
    from interp_bayes.kinds.common import sula, sula_task
    from interp_bayes.kinds.interventions import split_by_k
    from interp_bayes.run.sweep import Context

    # the activation cache lives in a fresh temporary folder: the name identifies the model there
    ctx = Context(Path(tempfile.mkdtemp(prefix="bench-interventions-")), SweepConfig(model=name, seed=seed, quiet=True),
                  lambda *_: None, model=model, identity=dict(bench=name))
    per_k, task_seed, split_seed = 50, 42, 0  # the recipe's
    acts, cols = sula(ctx, "main", per_k, task_seed, "spread5")
    fit_idx, eval_idx = split_by_k(cols["k"], split_seed)
    layer_sets = {spec: ctx.layers(spec) for spec in ("middle", "spread5")}
    layers = sorted({x for s in layer_sets.values() for x in s})
    axes = {layer: fit_entropy_axis(acts, layer, "pc1", subset=fit_idx, folds=0, seed=seed) for layer in layers}
    return dict(prompts=[cols["text"][i] for i in eval_idx], axes=axes,
                fit_values={layer: acts.values(layer)[fit_idx] for layer in layers},
                task={k: [cols[k][i] for i in eval_idx] for k in ("k", "latent", "bayes_entropy")},
                label_tokens=sula_task(ctx, per_k)[1]["main"], layer_sets=layer_sets)


def counted_flops(fn) -> int:
    """Floating-point operations of ``fn()`` as torch counts them (matrix products and attention)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def matmul_peak(model) -> float:
    """GFLOP/s of this machine on a large matrix product of the model's MLP shape ([4096, d_model] x [d_model,
    d_mlp]), the best of five: what a forward pass could reach at most here."""
    d, d_mlp = model.cfg.d_model, model.cfg.d_mlp
    x, w = torch.randn(4096, d), torch.randn(d_mlp, d)
    torch.nn.functional.linear(x, w)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        torch.nn.functional.linear(x, w)
        best = min(best, time.perf_counter() - t)
    return 2 * 4096 * d * d_mlp / best / 1e9


def bench_model(model, name: str, args) -> dict:
    """Per layer set: median seconds per naive run, fast seconds for the recipe's edits, ratio and spread."""
    from interp_bayes.model.edits import OPS
    from interp_bayes.analyses.interventions import EditProtocol, run_interventions
    from interp_bayes.run.sweep import load_probe

    t = time.perf_counter()
    proto = protocol(model, name)
    print(f"\n{name}: {model.cfg.n_layers} layers, d_model {model.cfg.d_model}; protocol set up in "
          f"{time.perf_counter() - t:.0f}s ({len(proto['prompts'])} evaluation prompts)", flush=True)
    recipe = {"isotropic": args.draws, "matched": args.draws, "pcs": 1}
    n_fast = len(OPS) * (1 + sum(recipe.values()))
    n_naive = len(OPS) * (1 + args.naive_draws)
    common = dict(label_tokens=proto["label_tokens"], progress=False)

    def timed(layer_sets, controls, ops=OPS, fast=True) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        run_interventions(model, proto["prompts"], proto["axes"], proto["fit_values"], proto["task"],
                          EditProtocol(layer_sets, ops, controls), fast=fast, **common)
        return time.perf_counter() - wall, time.process_time() - cpu

    peak = matmul_peak(model)
    print(f"  matrix-product peak here: {peak:.0f} GFLOP/s ({args.threads} thread(s))", flush=True)
    out, work = {}, {}  # work: layer set -> (FLOPs of the unperturbed run, FLOPs per edit)
    for spec, layer_set in proto["layer_sets"].items():
        # FLOPs do not depend on how edits are stacked: the unperturbed run, then the same count per edit
        base_flops, one_edit_flops = (counted_flops(lambda ops=ops: timed(layer_sets=[layer_set], controls={}, ops=ops))
                                      for ops in ([], ["cut"]))
        per_edit_flops = one_edit_flops - base_flops
        work[spec] = base_flops, per_edit_flops
        naive_run, fast, ratios = {"wall": [], "cpu": []}, {"wall": [], "cpu": []}, {"wall": [], "cpu": []}
        for _ in range(args.repeats):
            naive = timed(layer_sets=[layer_set], controls={"isotropic": args.naive_draws}, fast=False)
            quick = timed(layer_sets=[layer_set], controls=recipe, fast=True)
            for clock, n, f in zip(("wall", "cpu"), naive, quick):
                naive_run[clock].append(n / (1 + n_naive))
                fast[clock].append(f)
                ratios[clock].append(f / (naive_run[clock][-1] * (1 + n_fast)))
        out[spec] = {}
        for clock in ("wall", "cpu"):
            run, f = statistics.median(naive_run[clock]), statistics.median(fast[clock])
            per_edit = (f - run) / n_fast  # the fast path's unperturbed run is one whole forward pass
            out[spec][clock] = dict(naive_run=run, fast=f, per_edit=per_edit, ratio=statistics.median(ratios[clock]),
                                    full=run + len(OPS) * 44 * per_edit)
            print(f"  {spec:8s} {clock:4s} layers {layer_set}: naive {run:.2f}s per run (x{1 + n_fast} = "
                  f"{run * (1 + n_fast):.0f}s) | fast {f:.0f}s for the unperturbed run + {n_fast} edits "
                  f"({per_edit:.2f}s per edit) | fast/naive {out[spec][clock]['ratio']:.3f} (repeats "
                  f"{', '.join(f'{r:.3f}' for r in ratios[clock])})", flush=True)
        rate = (base_flops + n_fast * per_edit_flops) / statistics.median(fast["wall"]) / 1e9
        print(f"  {spec:8s} work: {base_flops / 1e12:.3f} TFLOP unperturbed + {per_edit_flops / 1e12:.3f} per edit; "
              f"fast path at {rate:.0f} GFLOP/s wall = {rate / peak:.2f} of the matrix-product peak", flush=True)
    for clock in ("wall", "cpu"):
        runs = [r[clock] for r in out.values()]
        total = sum(r["fast"] for r in runs) / sum(r["naive_run"] * (1 + n_fast) for r in runs)
        print(f"  {clock}: both layer sets, {n_fast} edits each: fast/naive {total:.3f}; full protocol (20+20+3 "
              f"draws, 4 ops, both sets: {2 * len(OPS) * 44} edits) extrapolated: fast "
              f"{sum(r['full'] for r in runs) / 60:.1f} min, naive "
              f"{sum(r['naive_run'] * (1 + len(OPS) * 44) for r in runs) / 60:.1f} min", flush=True)
    for recipe_name in ("interventions", "interventions_full"):
        controls = load_probe(recipe_name).params.controls
        label = f"{recipe_name} ({'+'.join(str(n) for n in controls.values())} draws)"
        total = sum(base + len(OPS) * (1 + sum(controls.values())) * edit for base, edit in work.values()) / 1e9
        print(f"  {label}, both layer sets: {total / 1e3:.0f} TFLOP, at least {total / peak:.0f}s at this machine's "
              f"matrix-product peak", flush=True)
    return out


def time_full_protocol(model, name: str) -> None:
    """The whole protocol once on the fast path (20 + 20 + 3 draws, four operators, both layer sets), beside two
    naive runs for scale, as ``interventions_full`` would run it inside a sweep."""
    from interp_bayes.analyses.interventions import EditProtocol, run_interventions, summarize

    proto = protocol(model, name)
    args = (model, proto["prompts"], proto["axes"], proto["fit_values"], proto["task"])
    t = time.perf_counter()
    run_interventions(*args, EditProtocol([proto["layer_sets"]["middle"]], ["cut"], {}),
                      label_tokens=proto["label_tokens"], fast=False, progress=False)
    naive_run = (time.perf_counter() - t) / 2
    t = time.perf_counter()
    result = run_interventions(*args, EditProtocol(list(proto["layer_sets"].values())),  # the paper's controls
                               label_tokens=proto["label_tokens"], fast=True)
    summary = summarize(result, proto["task"])
    seconds = time.perf_counter() - t
    print(f"\n{name}: full protocol ({len(result.rows)} edits + the unperturbed run, summary included) on the fast "
          f"path: {seconds:.0f}s = {seconds / 60:.1f} min; a naive run takes {naive_run:.2f}s here, so the naive path "
          f"would take {naive_run * (1 + len(result.rows)) / 60:.1f} min ({len(summary)} summary rows)", flush=True)


def model_parser(doc: str) -> argparse.ArgumentParser:
    """The options every two-model benchmark takes: --models, --repeats, --threads."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["smollm2-135m", "llama-0.5b"],
                        help="smollm2-135m, llama-0.5b (random init) and/or local HF folders")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    return parser


def bench_models(args):
    """(name, bridge) for each of ``args.models``, after setting the threads and printing the setting."""
    torch.set_num_threads(args.threads)
    import interp_bayes as ib

    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.repeats} repeats, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    smollm2 = ib.load_model("smollm2-135m")
    for name in args.models:
        yield name, (smollm2 if name == "smollm2-135m" else
                     llama_05b(ib.model_info(smollm2).source) if name == "llama-0.5b" else ib.load_model(name))
    print(f"load average at the end {os.getloadavg()[0]:.1f}", file=sys.stderr)


def main() -> None:
    parser = model_parser(__doc__)
    parser.add_argument("--draws", type=int, default=3, help="isotropic and matched draws of the fast run (pcs: 1)")
    parser.add_argument("--naive-draws", type=int, default=0, help="isotropic draws of the naive run")
    parser.add_argument("--full", action="store_true", help="time the full protocol once instead (fast path only)")
    args = parser.parse_args()
    for name, model in bench_models(args):
        if args.full:
            time_full_protocol(model, name)
        else:
            bench_model(model, name, args)


if __name__ == "__main__":
    main()
