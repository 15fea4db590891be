"""The laws of one causal attention head in closed form, and their check against autograd (methods.md §2).

Row convention: ``s = q k^T / sqrt(d_k)`` (future masked), ``alpha = softmax_j(s)``, ``o = alpha v``, upstream
signal ``u_i = dL/do_i``, ``b_ij = u_i . v_j``. Then ``dL/ds_ij = alpha_ij (b_ij - E_alpha_i[b])`` (advantage
routing), ``dL/dv_j = sum_i alpha_ij u_i`` (responsibility-weighted values), ``dL/dq_i = sum_j dL/ds_ij k_j /
sqrt(d_k)``, ``dL/dk_j = sum_i dL/ds_ij q_i / sqrt(d_k)``. With readout ``z = o W_O`` (``W_O`` [d_v, K]) and mean
cross-entropy over N rows, ``u_i = (p_i - e_{y_i}) W_O^T / N``. ``law_errors`` checks all of it against autograd.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F


def _mm(wide: torch.Tensor, thin: torch.Tensor) -> torch.Tensor:
    """``wide @ thin`` computed as ``(thin^T wide^T)^T``: same numbers, ~2x faster on CPU for [T, T] @ [T, d]."""
    return (thin.transpose(-1, -2) @ wide.transpose(-1, -2)).transpose(-1, -2)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal softmax attention of one head: ``alpha`` [..., Tq, Tk] and output ``alpha @ v`` [..., Tq, d_v].

    Query row i sits at position ``offset + i`` and sees keys ``0..offset + i`` (``offset`` > 0 for a block of
    queries against all keys up to its end).
    """
    s = (q / math.sqrt(q.shape[-1])) @ k.transpose(-1, -2)
    future = torch.ones(q.shape[-2], k.shape[-2] - offset, dtype=torch.bool, device=q.device).triu(1)
    s[..., offset:].masked_fill_(future, float("-inf"))
    alpha = torch.softmax(s, dim=-1)
    return alpha, _mm(alpha, v)


def routing_gradients(alpha: torch.Tensor, out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      u: torch.Tensor) -> dict[str, torch.Tensor]:
    """Paper II's laws given the forward pass (``alpha``, ``out``) and the upstream signal ``u = dL/dout``.

    Returns ``d_scores`` (zero where masked, since alpha is), ``d_q``, and ``d_v``, ``d_k`` summed over the given
    queries; the laws are sums over queries, so blocks of queries add up. ``E_alpha_i[b] = u_i . o_i``.
    """
    b_mean = (u * out).sum(-1, keepdim=True)  # E_alpha_i[b] = sum_j alpha_ij u_i.v_j = u_i.o_i
    d_scores = (u @ v.transpose(-1, -2)).sub_(b_mean).mul_(alpha)  # alpha_ij (b_ij - E[b]): advantage routing
    scale = 1.0 / math.sqrt(q.shape[-1])
    return {
        "d_scores": d_scores,
        "d_v": _mm(alpha.transpose(-1, -2), u),  # responsibility-weighted value update
        "d_q": _mm(d_scores, k) * scale,
        "d_k": _mm(d_scores.transpose(-1, -2), q) * scale,
    }


def attention_gradients(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, u: torch.Tensor,
                        offset: int = 0) -> dict[str, torch.Tensor]:
    """Forward pass and closed-form gradients of a loss with ``dL/dout = u`` through one causal head."""
    alpha, out = causal_attention(q, k, v, offset)
    return {"alpha": alpha, "out": out, **routing_gradients(alpha, out, q, k, v, u)}


def readout_signal(out: torch.Tensor, w_o: torch.Tensor, targets: torch.Tensor,
                   n: int | None = None) -> dict[str, torch.Tensor]:
    """Cross-entropy of ``out @ w_o`` summed over rows / ``n`` (default: mean) and its gradients.

    Returns ``loss``, ``log_probs``, ``residual`` = p - e_y, ``u`` = dL/dout = residual W_O^T / n, ``d_w_o``.
    """
    n = out.shape[0] if n is None else n
    log_p = torch.log_softmax(out @ w_o, -1)  # [N, K]
    residual = log_p.exp() - F.one_hot(targets, w_o.shape[-1]).to(out.dtype)
    return {
        "loss": -log_p.gather(-1, targets[:, None]).sum() / n,
        "log_probs": log_p,
        "residual": residual,
        "u": residual @ w_o.T / n,
        "d_w_o": out.T @ residual / n,
    }


def single_head_gradients(params: dict[str, torch.Tensor], x: torch.Tensor, targets: torch.Tensor,
                          block: int = 128, mixed_inputs: bool = False) -> dict[str, torch.Tensor]:
    """Loss and closed-form gradients of the §2.2 head ``causal-attn(x) @ W_O`` under mean cross-entropy.

    Computed in query blocks of ``block`` rows (each against the keys up to its end): half the T x T work of a dense
    pass, cache-sized, and identical up to rounding. Also returns ``values`` (x W_V), ``out``, ``u``, ``log_probs``,
    ``residual`` and, if asked, ``mixed_inputs`` (alpha x, for ``closed_form_value_step``).
    """
    q, k, v = x @ params["W_Q"], x @ params["W_K"], x @ params["W_V"]
    T = x.shape[0]
    grads = {n: torch.zeros_like(t) for n, t in (("d_q", q), ("d_k", k), ("d_v", v))}
    names = ("out", "u", "log_probs", "residual") + (("mixed_inputs",) if mixed_inputs else ())
    parts: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    loss = x.new_zeros(())
    for r0 in range(0, T, block):
        r1 = min(r0 + block, T)
        alpha, out = causal_attention(q[r0:r1], k[:r1], v[:r1], offset=r0)
        ro = readout_signal(out, params["W_O"], targets[r0:r1], n=T)
        g = routing_gradients(alpha, out, q[r0:r1], k[:r1], v[:r1], ro["u"])
        grads["d_q"][r0:r1] = g["d_q"]
        grads["d_k"][:r1] += g["d_k"]
        grads["d_v"][:r1] += g["d_v"]
        loss = loss + ro["loss"]
        ro["out"] = out
        if mixed_inputs:
            ro["mixed_inputs"] = _mm(alpha, x[:r1])
        for name in names:
            parts[name].append(ro[name])
    res = {n: torch.cat(t) for n, t in parts.items()}
    return {
        **res, **grads, "loss": loss, "values": v,
        "d_W_Q": x.T @ grads["d_q"], "d_W_K": x.T @ grads["d_k"], "d_W_V": x.T @ grads["d_v"],
        "d_W_O": res["out"].T @ res["residual"] / T,
    }


def relative_error(closed: torch.Tensor, auto: torch.Tensor) -> float:
    """``||closed - auto|| / ||auto||`` (absolute error when autograd's gradient is exactly zero)."""
    diff = float(torch.linalg.vector_norm(closed - auto))
    ref = float(torch.linalg.vector_norm(auto))
    return diff / ref if ref > 0 else diff


def law_errors(T: int, d_k: int, d_v: int, seed: int, *, readout: bool = False, d_x: int = 6,
               n_classes: int = 5) -> dict[str, float]:
    """Relative error of every closed-form gradient vs autograd, in float64, for one random head.

    Without readout the loss is ``sum_i u_i . o_i`` for a random ``u``; with readout it is the mean cross-entropy of
    ``(attn(x W_Q, x W_K, x W_V)) W_O`` on random targets, and the weight gradients are checked too. Entries are
    N(0, 1) (weights N(0, 1/fan_in)), so scores are O(1): in a saturated softmax (weights ~1e-16) both sides
    compute a difference of nearly equal numbers and agree only to rounding of the larger terms.
    """
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    if readout:
        x = randn(T, d_x)
        params = {n: (randn(*s) / math.sqrt(s[0])).requires_grad_() for n, s in
                  [("W_Q", (d_x, d_k)), ("W_K", (d_x, d_k)), ("W_V", (d_x, d_v)), ("W_O", (d_v, n_classes))]}
        targets = torch.randint(n_classes, (T,), generator=gen)
        q, k, v = x @ params["W_Q"], x @ params["W_K"], x @ params["W_V"]
    else:
        q, k, v = randn(T, d_k).requires_grad_(), randn(T, d_k).requires_grad_(), randn(T, d_v).requires_grad_()
        u = randn(T, d_v)
    for t in (q, k, v):
        t.retain_grad()
    s = q @ k.T / math.sqrt(d_k)
    s.retain_grad()
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    out = torch.softmax(s.masked_fill(future, float("-inf")), -1) @ v
    out.retain_grad()
    if readout:
        F.cross_entropy(out @ params["W_O"], targets).backward()
        model = single_head_gradients({n: p.detach() for n, p in params.items()}, x, targets, block=max(1, T // 3))
        pairs = {f"d_{n}": (model[f"d_{n}"], p.grad) for n, p in params.items()}
        u = readout_signal(out.detach(), params["W_O"].detach(), targets)["u"]
        pairs["u"] = (u, out.grad)
    else:
        (out * u).sum().backward()
        pairs = {}
    closed = attention_gradients(q.detach(), k.detach(), v.detach(), u)
    pairs.update({"d_scores": (closed["d_scores"], s.grad), "d_q": (closed["d_q"], q.grad),
                  "d_k": (closed["d_k"], k.grad), "d_v": (closed["d_v"], v.grad)})
    return {name: relative_error(c, a) for name, (c, a) in pairs.items()}


def law_check(n_cases: int = 200, seed: int = 0, max_T: int = 64, max_dim: int = 16) -> dict[str, dict[str, float]]:
    """Worst relative error of each gradient over ``n_cases`` random shapes, without and with readout + CE."""
    rng = np.random.default_rng(seed)
    worst: dict[str, dict[str, float]] = {"attention": {}, "readout_ce": {}}
    for case in range(n_cases):
        T, d_k, d_v, d_x, n_cls = (int(rng.integers(1, m + 1)) for m in (max_T, max_dim, max_dim, max_dim, max_dim))
        for kind, readout in (("attention", False), ("readout_ce", True)):
            errs = law_errors(T, d_k, d_v, seed * 100_003 + case, readout=readout, d_x=d_x, n_classes=max(n_cls, 2))
            for name, e in errs.items():
                worst[kind][name] = max(worst[kind].get(name, 0.0), e)
    return worst
