"""Where ``ib.collect``'s time goes beside a bare HF forward: ``python bench/collect_overhead.py`` (SmolLM2 on the
CPU) or ``--shape pythia-1.4b`` / ``llama-3-8b`` (random init, bf16, on the GPU; the shapes of bench/gpu_run.py).

Over bench/extract.py's 64 prompts in collect's equal-length batches, alternated batch by batch (ratio of medians
of 3 repeats, each against the bare HF sdpa forward): HF with eager attention (the kernels the bridge loads), the
bridge's forward without hooks, the bridge with collect's final-position tail, ``read`` with the value reading
(collect itself); then the same prompts cut to one length as one batch of 64 (the per-call cost spread over a full
batch). On the GPU a profile of one collect pass counts its device-to-host copies and synchronisations.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from gpu_run import build_shape, load_bench, sync, timed_alternating, tokenizer_folder  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default=None, choices=[None, "pythia-1.4b", "llama-3-8b"],
                        help="a random-init shape on the GPU (default: SmolLM2 on the CPU)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="write the numbers as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    import interp_bayes as ib
    from interp_bayes.model.read import final_position_tail, length_batches

    device = "cuda" if args.shape else "cpu"
    dtype = torch.bfloat16 if args.shape else torch.float32
    if args.shape:
        args.tokenizer, args.tiny = None, False
        args.tokenizer_folder = tokenizer_folder(args)
        folder = build_shape(f"{args.shape}-shape", args, device, dtype, Path(tempfile.mkdtemp()))
    else:
        from interp_bayes.model.loading import resolve

        folder = Path(resolve("smollm2-135m")[0])
    bridge = ib.load_model(str(folder), dtype=dtype, device=device)
    hf = {impl: AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=impl).to(device).eval()
          for impl in ("sdpa", "eager")}
    prompts = load_bench("extract").bench_prompts(bridge.tokenizer)
    groups = list(length_batches(prompts, None))
    batches = [torch.tensor([prompts[i] for i in idx], device=device) for idx in groups]
    tail = final_position_tail(bridge)

    def bridge_tail(b):
        with bridge.hooks(fwd_hooks=tail):
            return bridge(batches[b], logits_to_keep=1, use_cache=False)

    runs = {"hf_sdpa": lambda b: hf["sdpa"](batches[b], logits_to_keep=1, use_cache=False),
            "hf_eager": lambda b: hf["eager"](batches[b], logits_to_keep=1, use_cache=False),
            "bridge": lambda b: bridge(batches[b], logits_to_keep=1, use_cache=False),
            "bridge_tail": bridge_tail,
            "collect": lambda b: ib.collect(bridge, [prompts[i] for i in groups[b]], progress=False)}
    out = dict(shape=args.shape or "smollm2-135m", device=device, dtype=str(dtype), batches=len(batches))
    with torch.no_grad():
        for name in runs:  # warm-up: kernels chosen, caches filled
            runs[name](0)
        times = timed_alternating(runs, len(batches), args.repeats, device)
        med = {k: statistics.median(v) for k, v in times.items()}
        out["many_batches"] = {k: dict(median_s=v, over_hf_sdpa=v / med["hf_sdpa"]) for k, v in med.items()}
        length = min(len(p) for p in prompts)
        full = torch.tensor([p[:length] for p in prompts], device=device)
        one = {"hf_sdpa": lambda b: hf["sdpa"](full, logits_to_keep=1, use_cache=False),
               "hf_eager": lambda b: hf["eager"](full, logits_to_keep=1, use_cache=False),
               "collect": lambda b: ib.collect(bridge, full, progress=False)}
        times = timed_alternating(one, 1, args.repeats * 3, device)
        med1 = {k: statistics.median(v) for k, v in times.items()}
        out["one_batch_of_64"] = {k: dict(median_s=v, over_hf_sdpa=v / med1["hf_sdpa"]) for k, v in med1.items()}
        if device == "cuda":
            from torch.profiler import ProfilerActivity, profile

            sync(device)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for b in range(len(batches)):
                    runs["collect"](b)
                sync(device)
            events = prof.key_averages()
            out["profile_collect"] = {e.key: dict(count=e.count, cpu_ms=round(e.cpu_time_total / 1e3, 2))
                                      for e in sorted(events, key=lambda e: -e.cpu_time_total)[:25]}
            out["syncs"] = {e.key: e.count for e in events
                            if any(s in e.key for s in ("Synchronize", "Memcpy", "_local_scalar_dense", "item"))}
    for section in ("many_batches", "one_batch_of_64"):
        print(f"{section}: " + ", ".join(f"{k} {v['median_s'] * 1e3:.1f} ms ({v['over_hf_sdpa']:.3f}x)"
                                         for k, v in out[section].items()))
    if "syncs" in out:
        print("syncs:", out["syncs"])
        for k, v in out["profile_collect"].items():
            print(f"  {v['cpu_ms']:9.2f} ms  {v['count']:6d}  {k}")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
