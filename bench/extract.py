"""Benchmark: ib.collect against a bare Hugging Face forward over the same batches, on SmolLM2-135M by default
(``--model``: any alias or local HF folder, e.g. a random-init model of another family's shape).

64 prompts of 24-48 tokens; all are timed alternately, batch by batch, in one process (several repeats) and the
median ratio printed, in wall-clock time and in this process's CPU time (the steadier of the two on a shared
machine). Beside collect and the bare HF forwards (sdpa, the default, and eager, the kernels of the bridge's own
attention when a hook observes its pattern; neither builds a KV cache, as collect builds none) the bridge's own
forward with no hook attached is timed, so the overhead splits into what TransformerLens's bridge costs and what
collect adds (hooks, copies to the CPU, entropy). Peak RSS is measured in a fresh subprocess that only loads the
model and runs ib.collect, so the baseline model's memory does not count against it, beside a second one that
imports the same libraries and runs the bare HF forwards instead (most of the peak is imports and weights).
Targets (issues 2 and 16): ratio <= 1.05; peak RSS <= 1.5 x weight bytes + 300 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

N_PROMPTS, MIN_LEN, MAX_LEN = 64, 24, 48


def bench_prompts(tokenizer) -> list[list[int]]:
    """64 token-id prompts of 24-48 tokens cut from the built-in prompt set (deterministic)."""
    from interp_bayes.core.prompts import PROMPTS_DIR

    texts = [json.loads(line)["text"] for line in (PROMPTS_DIR / "basic.jsonl").read_text().splitlines() if line]
    stream = [t for text in texts for t in tokenizer(text)["input_ids"]]
    out, pos = [], 0
    for i in range(N_PROMPTS):
        n = MIN_LEN + (i * 7) % (MAX_LEN - MIN_LEN + 1)
        out.append(stream[pos:pos + n])
        pos = (pos + 37) % (len(stream) - MAX_LEN)
    return out


def interleaved(runs: dict, n_batches: int, repeats: int) -> dict[str, dict[str, list[float]]]:
    """Per clock ("wall", "cpu") and run, the time of each repeat: ``runs[name](b)`` for every batch b, the runs
    alternating batch by batch, so that the machine's load, which drifts within seconds on a shared host, hits every
    run alike."""
    times: dict[str, dict[str, list[float]]] = {"wall": {k: [] for k in runs}, "cpu": {k: [] for k in runs}}
    for _ in range(repeats):
        total = {clock: dict.fromkeys(runs, 0.0) for clock in times}
        for b in range(n_batches):
            for name, fn in runs.items():
                wall, cpu = time.perf_counter(), time.process_time()
                fn(b)
                total["wall"][name] += time.perf_counter() - wall
                total["cpu"][name] += time.process_time() - cpu
        for clock in times:
            for name in runs:
                times[clock][name].append(total[clock][name])
    return times


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM). Not ru_maxrss: that one survives exec, so a child started from a large
    parent reports the parent's size."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # non-Linux fallback


def measure_rss(name: str, threads: int, bare_hf: bool) -> dict:
    """Run in a subprocess: load + collect only (or, with ``bare_hf``, the same imports, then HF's model and bare
    forwards over the same batches); report peak RSS and the weights' bytes."""
    torch.set_num_threads(threads)
    import transformer_lens  # noqa: F401  (load_model imports it: the baseline carries the same libraries)
    from transformers import AutoModelForCausalLM

    import interp_bayes as ib
    from interp_bayes.model.read import length_batches
    from interp_bayes.model.loading import load_tokenizer, resolve

    if bare_hf:
        model = AutoModelForCausalLM.from_pretrained(resolve(name)[0]).eval()
        prompts = bench_prompts(load_tokenizer(name))
        with torch.no_grad():
            for idx in length_batches(prompts, None):
                model(torch.tensor([prompts[i] for i in idx]), logits_to_keep=1, use_cache=False)
    else:
        model = ib.load_model(name)
        ib.collect(model, bench_prompts(model.tokenizer), progress=False)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return dict(peak_rss_mb=peak_rss_mb(), weight_mb=weight_bytes / 2**20)


def rss_in_subprocess(name: str, threads: int, bare_hf: bool) -> dict:
    command = [sys.executable, __file__, "--rss-only", "--model", name, "--threads", str(threads)] + \
        (["--bare-hf"] if bare_hf else [])
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m", help="alias or local HF folder (default smollm2-135m)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rss-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bare-hf", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_only:
        print(json.dumps(measure_rss(args.model, args.threads, args.bare_hf)))
        return

    rss, rss_hf = (rss_in_subprocess(args.model, args.threads, bare_hf) for bare_hf in (False, True))
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    import interp_bayes as ib
    from interp_bayes.model.read import final_logits, length_batches

    model = ib.load_model(args.model)
    folder = ib.model_info(model).source
    baselines = {impl: AutoModelForCausalLM.from_pretrained(folder, attn_implementation=impl).eval()
                 for impl in ("sdpa", "eager")}
    prompts = bench_prompts(model.tokenizer)
    groups = list(length_batches(prompts, None))
    batches = [torch.tensor([prompts[i] for i in idx]) for idx in groups]
    runs = {"collect": lambda b: ib.collect(model, [prompts[i] for i in groups[b]], progress=False),
            "bridge": lambda b: final_logits(model, batches[b]),  # what collect's forward costs before collect adds
            **{impl: lambda b, hf=hf: hf(batches[b], logits_to_keep=1, use_cache=False)  # collect keeps no cache
               for impl, hf in baselines.items()}}
    with torch.no_grad():
        for b in range(len(batches)):  # warm-up
            for fn in runs.values():
                fn(b)
        times = interleaved(runs, len(batches), args.repeats)  # collect too runs one batch per call
    print(f"prompts {len(prompts)} ({MIN_LEN}-{MAX_LEN} tokens) in {len(batches)} equal-length batches, "
          f"{args.threads} threads, {args.repeats} repeats, load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores")
    for clock, by_run in times.items():
        med = {k: statistics.median(v) for k, v in by_run.items()}
        spread = [c / s for c, s in zip(by_run["collect"], by_run["sdpa"])]
        print(f"{clock}: median seconds: ib.collect {med['collect']:.3f} | bridge forward alone {med['bridge']:.3f} | "
              f"bare HF sdpa {med['sdpa']:.3f} | bare HF eager {med['eager']:.3f}")
        print(f"  collect / bare HF sdpa (the default) {med['collect'] / med['sdpa']:.3f} (target <= 1.05; per repeat "
              f"{min(spread):.3f}-{max(spread):.3f}, median of the per-repeat ratios "
              f"{statistics.median(spread):.3f}) | "
              f"collect / bare HF eager {med['collect'] / med['eager']:.3f} | "
              f"bridge alone / eager {med['bridge'] / med['eager']:.3f} | collect / bridge alone "
              f"{med['collect'] / med['bridge']:.3f}")
    target_rss = 1.5 * rss["weight_mb"] + 300
    print(f"peak RSS (load + collect, fresh process): {rss['peak_rss_mb']:.0f} MB; weights {rss['weight_mb']:.0f} MB; "
          f"target <= {target_rss:.0f} MB | bare HF forwards over the same batches after the same imports: "
          f"{rss_hf['peak_rss_mb']:.0f} MB (ratio {rss['peak_rss_mb'] / rss_hf['peak_rss_mb']:.3f})")


if __name__ == "__main__":
    main()
