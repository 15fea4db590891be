"""IEEE float32 against oneDNN's bf16 fpmath mode on SmolLM2: ``python bench/numeric_modes.py [THREADS]``. The
time of ``collect`` on 64 pool prompts in each mode (alternated, 3 repeats, medians; ratio fast / ieee) and how far
the fast mode moves entropies, value vectors and log-probabilities. What the mode computes depends on the CPU
(docs/performance.md, "Numeric modes"): on AMX oneDNN rounds the inputs to bfloat16; on AVX-512 without AMX it keeps
float32; elsewhere the mode reaches no product and both runs are IEEE."""
import statistics
import sys
import time

import torch

import interp_bayes as ib
from interp_bayes.core.prompts import load_source
from interp_bayes.model.numerics import float32_mode, onednn_rounds_to_bf16, resolve_float32


def main(threads: int = 1, repeats: int = 3) -> None:
    torch.set_num_threads(threads)
    print(f"fast resolves to {resolve_float32('fast', 'cpu')}, auto to {resolve_float32('auto', 'cpu')}; oneDNN rounds "
          f"inputs to bfloat16 here: {onednn_rounds_to_bf16()}")
    model = ib.load_model("smollm2-135m")
    texts = list(load_source("pool")["text"][:64])
    acts, times = {}, {"ieee": [], "fast": []}
    for _ in range(repeats):
        for mode in times:
            with float32_mode(mode):
                t = time.perf_counter()
                acts[mode] = ib.collect(model, texts, progress=False, keep_logprobs=True)
                times[mode].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    ieee, fast = acts["ieee"], acts["fast"]
    d_h = (fast.entropy - ieee.entropy).abs()
    d_v = (fast.values() - ieee.values()).abs().max() / ieee.values().abs().max()
    d_lp = (fast.logprobs - ieee.logprobs).abs().max()
    print(f"seconds ieee {med['ieee']:.2f}, fast {med['fast']:.2f}: fast / ieee {med['fast'] / med['ieee']:.3f}")
    print(f"entropy |difference| max {d_h.max():.3g} bits, mean {d_h.mean():.3g}; value vectors, relative to the "
          f"largest entry, max {d_v:.3g}; log-probabilities max {d_lp:.3g}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
