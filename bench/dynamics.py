"""Closed-form blocked gradients (``single_head_gradients``) vs autograd on the §2.2 head, side by side.

    python bench/dynamics.py [--T 2000] [--repeats 10] [--threads 1]

Prints seconds per full-batch gradient for both, their ratio, and the largest relative gradient difference.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from interp_bayes.dynamics import init_single_head, relative_error, single_head_gradients
from interp_bayes.tasks.sticky import sample_sticky


def autograd_gradients(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """The authors' dense forward (masked T x T scores) differentiated by autograd."""
    p = {n: t.clone().requires_grad_() for n, t in params.items()}
    T = x.shape[0]
    s = (x @ p["W_Q"]) @ (x @ p["W_K"]).T / p["W_Q"].shape[1] ** 0.5
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    loss = F.cross_entropy(torch.softmax(s, -1) @ (x @ p["W_V"]) @ p["W_O"], y)
    loss.backward()
    return {f"d_{n}": t.grad for n, t in p.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    chain = sample_sticky(args.T, 42)
    params, x, y = init_single_head(42), chain.inputs, chain.targets
    timings = {}
    for name, fn in (("closed_form_blocked", single_head_gradients), ("autograd_dense", autograd_gradients)):
        fn(params, x, y)  # warm-up
        t0 = time.perf_counter()
        for _ in range(args.repeats):
            grads = fn(params, x, y)
        timings[name] = ((time.perf_counter() - t0) / args.repeats, grads)
    (tc, gc), (ta, ga) = timings["closed_form_blocked"], timings["autograd_dense"]
    err = max(relative_error(gc[n], ga[n]) for n in ga)
    print(f"T={args.T}, float32, {args.threads} thread(s), {args.repeats} repeats")
    print(f"closed-form blocked: {tc * 1e3:.1f} ms   autograd dense: {ta * 1e3:.1f} ms   ratio {ta / tc:.2f}x")
    print(f"max relative gradient difference (float32): {err:.1e}")


if __name__ == "__main__":
    main()
