"""The continuous-state (Kalman) wind tunnel: models, its entry of the task table (``KALMAN``: loss, held-out
metrics, evaluation against the exact and window filters), and hooked readings for the geometry diagnostics.

**Model.** The same plain ``GPT2LMHeadModel`` as the other tunnels, over ``KalmanTask.vocab`` (feature tokens, then
read-out tokens). Continuous inputs enter as soft tokens: a position's feature weights times the token-embedding
matrix, ``features @ W_E[:F]`` (a linear embedding that already lives in the checkpoint, so the folder is an
ordinary HF folder and ``ib.load_model`` boots it). The Gaussian head is the tied LM head at the read-out tokens:
mean, then the Cholesky factor's lower triangle with log diagonal. No extra tensors, no custom module.

**The bridge route.** A ``TransformerBridge`` takes token ids; ``continuous_inputs(bridge, features)`` is a context
manager that hooks ``hook_embed`` (the token embedding, before positions are added) to return the soft-token
embedding and yields placeholder ids of the right shape. Every TransformerLens hook downstream fires as usual
(``run_with_cache``, ``hooks()``, interventions on ``hook_v``); the Gaussian head is read from the logits
(``unembed.hook_out``) at the read-out ids. Tests check it against the training-time HF module.

**Metrics** per observation step, against the exact posterior N(m_t, P_t): the 2-Wasserstein distance (state
units), KL(exact || model) in bits, and the entropy error H(model) - H(exact) in bits (0.5 log2 det ratio). The
same metrics for the window filters (the exact posterior given only the last w observations) give the baseline:
the target is the transformer below the best (largest) window at every step past that window.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..core.errors import ConfigError
from ..core.layers import resolve_layers
from ..stats.sequential import ACCEPT, BATCH, REJECT
from ..stats import as_float64, beyond_each, bootstrap_mean_draws
from ..stats.info import LN2, gaussian_kl
from ..tasks.kalman import (KalmanBatch, KalmanTask, gaussian_entropy_bits, gaussian_kl_bits, gaussian_w2,
                            window_filter)
from ..model.read import continuous_inputs, input_embedding, read, sites_of, soft_token_embeddings
from .tunnels import open_tunnel
from .entry import TaskEntry

WINDOWS = (1, 2, 4, 8)  # window filters scored beside every model
LOG_DIAG_CLAMP = 12.0  # |log L_ii| cap: a guard against exp overflow early in training, never reached by a fit


def is_bridge(model: nn.Module) -> bool:
    return hasattr(model, "hook_dict") and hasattr(model, "run_with_cache")


def head_outputs(model: nn.Module, features: torch.Tensor) -> torch.Tensor:
    """Logits [batch, pos, vocab] of a bridge, an HF causal LM or the MLP baseline on continuous inputs."""
    if is_bridge(model):
        with continuous_inputs(model, features) as ids:
            return model(ids)
    out = model(inputs_embeds=soft_token_embeddings(model, features))
    return out if isinstance(out, torch.Tensor) else out.logits


def gaussian_head(raw: torch.Tensor, state_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Read-out values [..., d + d(d+1)/2] -> mean [..., d] and lower Cholesky factor [..., d, d] (diagonal = exp
    of its entry)."""
    d = state_dim
    rows, cols = torch.tril_indices(d, d, device=raw.device)
    chol = raw.new_zeros(*raw.shape[:-1], d, d)
    chol[..., rows, cols] = raw[..., d:]
    diag = torch.diagonal(chol, dim1=-2, dim2=-1)
    chol = chol - torch.diag_embed(diag) + torch.diag_embed(diag.clamp(-LOG_DIAG_CLAMP, LOG_DIAG_CLAMP).exp())
    return raw[..., :d], chol


def predict_gaussian(model: nn.Module, task: KalmanTask, batch: KalmanBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's Gaussian belief at every observation: mean [n, K, d], Cholesky factor [n, K, d, d] (model dtype,
    model device)."""
    rows = input_embedding(model).shape[0]
    if rows != len(task.vocab) + 1:
        raise ConfigError(f"The model has {rows} token rows but KalmanTask(state_dim={task.state_dim}, obs_dim="
                          f"{task.obs_dim}) needs {len(task.vocab) + 1}; pass the task it was trained on (the "
                          "task_kwargs in its windtunnel.json).")
    logits = head_outputs(model, batch.features)
    raw = logits[:, batch.query_pos.to(logits.device)][..., task.readout_ids]
    return gaussian_head(raw, task.state_dim)


def kalman_loss(mean: torch.Tensor, chol: torch.Tensor, batch: KalmanBatch, kind: str) -> torch.Tensor:
    """Gaussian NLL in nats, mean over sequences and steps. ``soft``: its expectation under the exact posterior,
    KL(exact || model) + H(exact) (the same minimiser as ``hard`` with far less gradient noise); ``hard``: the NLL
    of the realised state."""
    dtype, device = mean.dtype, mean.device
    d = mean.shape[-1]
    if kind == "soft":
        exact_chol = torch.linalg.cholesky(batch.cov).to(device, dtype)
        h_exact = gaussian_entropy_bits(batch.cov).to(device, dtype) * LN2  # nats
        return (gaussian_kl(batch.mean.to(device, dtype), exact_chol, mean, chol, "nats") + h_exact).mean()
    if kind == "hard":
        z = torch.linalg.solve_triangular(chol, (batch.states.to(device, dtype) - mean)[..., None], upper=False)
        logdet = 2 * torch.diagonal(chol, dim1=-2, dim2=-1).log().sum(-1)
        return 0.5 * (d * np.log(2 * np.pi) + logdet + z.pow(2).sum((-1, -2))).mean()
    raise ConfigError(f"Unknown loss {kind!r} for the kalman task; use 'soft' or 'hard'.")


def step_metrics(exact_mean: torch.Tensor, exact_cov: torch.Tensor, mean: torch.Tensor, cov: torch.Tensor
                 ) -> dict[str, torch.Tensor]:
    """Per sequence and step [n, K], float64: W2, KL(exact || other) in bits, entropy error H(other) - H(exact)."""
    mean, cov = mean.double().cpu(), cov.double().cpu()
    return dict(w2=gaussian_w2(exact_mean, exact_cov, mean, cov),
                kl_bits=gaussian_kl_bits(exact_mean, exact_cov, mean, cov),
                entropy_error_bits=gaussian_entropy_bits(cov) - gaussian_entropy_bits(exact_cov))


def summarise(m: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Averages and per-step curves of ``step_metrics`` (entropy MAE in both definitions, as evaluate.py)."""
    err = m["entropy_error_bits"]
    return {
        "w2": m["w2"].mean().item(),
        "kl_bits": m["kl_bits"].mean().item(),
        "per_sample_entropy_mae_bits": err.abs().mean().item(),
        "mean_curve_entropy_mae_bits": err.mean(0).abs().mean().item(),
        "per_position": {"w2": m["w2"].mean(0).tolist(), "kl_bits": m["kl_bits"].mean(0).tolist(),
                         "entropy_error_bits": err.mean(0).tolist(),
                         "per_sample_entropy_mae_bits": err.abs().mean(0).tolist()},
    }


def paired_difference(a: torch.Tensor, b: torch.Tensor, *, n_boot: int = 1000, seed: int = 0) -> dict[str, list]:
    """Per step, mean of a - b over sequences ([n, K] each) with a percentile bootstrap interval over sequences,
    drawn in batches until every step's interval is settled on one side of 0 (``stats.beyond_each``, side "below";
    ``n_boot`` the cap): ``decision`` per step ("reject": the interval lies below 0) and ``draws`` used."""
    diff = as_float64(a - b)
    rng = np.random.default_rng(seed)
    tests = beyond_each(lambda m: bootstrap_mean_draws(diff, n_boot=m, seed=rng), np.zeros(diff.shape[1]), "below",
                        cap=n_boot, batch=min(BATCH, n_boot))
    return dict(mean=diff.mean(0).tolist(), low=[t.null[0] for t in tests], high=[t.null[1] for t in tests],
                decision=[t.decision for t in tests], draws=[t.draws for t in tests])


def target_verdict(model: dict[str, torch.Tensor], windows: dict[int, dict[str, torch.Tensor]], *,
                   n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Is the model below the best (largest) window filter in W2 and KL at every step past that window?

    ``met`` judges the per-step means; ``met_with_interval`` asks that every paired 95% interval of
    model - window lie below 0 (``paired_difference``'s sequential decisions: True when every step's is settled
    below, False when one is settled not to be, None when some step stayed undecided at the cap and none
    failed). Steps are 1-based observation indices."""
    w = max(windows)
    past = slice(w, None)  # steps w+1 .. K
    out: dict[str, Any] = dict(best_window=w, steps=list(range(w + 1, model["w2"].shape[1] + 1)))
    for key in ("w2", "kl_bits"):
        diff = paired_difference(model[key][:, past], windows[w][key][:, past], n_boot=n_boot, seed=seed)
        decided = set(diff["decision"])
        out[key] = dict(difference=diff, met=bool(np.all(np.array(diff["mean"]) < 0)),
                        met_with_interval=False if ACCEPT in decided else True if decided <= {REJECT} else None,
                        worst_step=int(w + 1 + np.argmax(diff["mean"])), worst_difference=float(max(diff["mean"])))
    out["met"] = out["w2"]["met"] and out["kl_bits"]["met"]
    return out


@torch.no_grad()
def evaluate_kalman(
    model: nn.Module | str | Path,
    task: KalmanTask | None = None,
    n: int = 2000,
    *,
    lengths: list[int] | None = None,
    seed: int = 2024,
    batch_size: int = 500,
    baselines: bool = True,
    windows: tuple[int, ...] = WINDOWS,
) -> dict[int, dict[str, Any]]:
    """Score ``model`` (a folder, bridge, HF model or MLP) on ``n`` held-out sequences per length against the exact
    posterior, beside (with ``baselines``) the window filters of sizes ``windows`` on the same sequences.

    Returns {length: {n, length, w2, kl_bits, per_sample_entropy_mae_bits, mean_curve_entropy_mae_bits,
    per_position, windows: {w: same metrics}, target: ``target_verdict``}} (windows shorter than the sequence
    only; none, and no target, without ``baselines``); lengths default to the training length."""
    if isinstance(model, (str, Path)):
        tunnel = open_tunnel(model)
        model, cfg = tunnel.model, tunnel.config
        task = task or KalmanTask(**cfg.task_kwargs)
    if task is None:
        raise ConfigError("evaluate_kalman needs a KalmanTask when given a model rather than a trained folder.")
    model.eval()
    results = {}
    for length in lengths or [task.n_steps]:
        # a window of the whole sequence is the exact filter
        shorter = [w for w in windows if w < length] if baselines else []
        parts: dict[str, list] = {"model": [], **{w: [] for w in shorter}}
        for i, start in enumerate(range(0, n, batch_size)):
            batch = task.sample(min(batch_size, n - start), seed=[seed, length, i], length=length)
            mean, chol = predict_gaussian(model, task, batch)
            parts["model"].append(step_metrics(batch.mean, batch.cov, mean, chol @ chol.mT))
            for w in shorter:
                parts[w].append(step_metrics(batch.mean, batch.cov, *window_filter(batch.system, batch.obs, w)))
        cat = {k: {m: torch.cat([p[m] for p in v]) for m in v[0]} for k, v in parts.items()}
        res = {"length": length, "n": n, **summarise(cat["model"]),
               "windows": {str(w): summarise(cat[w]) for w in shorter}}
        if shorter:
            res["target"] = target_verdict(cat["model"], {w: cat[w] for w in shorter}, seed=seed)
        results[length] = res
    return results


def gaussian_loss(model: nn.Module, task: KalmanTask, batch: KalmanBatch, kind: str) -> torch.Tensor:
    """The training loss: ``kalman_loss`` of the model's Gaussian belief on ``batch``."""
    return kalman_loss(*predict_gaussian(model, task, batch), batch, kind)


def held_out_metrics(model: nn.Module, task: KalmanTask, batch: KalmanBatch) -> dict[str, Any]:
    """W2, KL and entropy error of the model on ``batch`` (``summarise`` of ``step_metrics``), logged in training."""
    mean, chol = predict_gaussian(model, task, batch)
    return summarise(step_metrics(batch.mean, batch.cov, mean, chol @ chol.mT))


def final_summary(final: dict[int, dict[str, Any]], task: KalmanTask) -> str:
    """The averaged metrics at the training length and whether the target is met there."""
    summary = {k: v for k, v in final[task.n_steps].items() if k not in ("per_position", "windows", "target")}
    return f"eval: {json.dumps(summary)}; target met: {final[task.n_steps]['target']['met']}"


# the Kalman tunnel's entry of the task table: Gaussian outputs, held-out W2 / KL, the window filters beside
KALMAN = TaskEntry(loss=gaussian_loss, held_out=held_out_metrics, evaluate=evaluate_kalman,
                   lengths=lambda task: [task.n_steps], summary=final_summary,
                   batch_length=lambda batch: batch.obs.shape[1], progress=("kl", "kl_bits"))


@torch.no_grad()
def kalman_readings(
    bridge: nn.Module,
    task: KalmanTask,
    n_sequences: int = 40,
    *,
    seed: int = 2024,
    layers: list[int] | None = None,
    readings: tuple[str, ...] = ("v", "resid", "attn_entropy"),
    batch_size: int = 100,
):
    """Hooked readings of a Kalman wind-tunnel bridge at every observation step, with the exact posterior.

    One row per (sequence, step), sequence-major, as the other tunnels' one prompt per query position: reading
    ``name`` at ``layer`` is the hook of ``model.hooks.reading_hook`` at that step's position (values per KV head
    concatenated, residual stream after the block, attention entropy in bits per head). Returns ``(acts,
    columns)``: a ``model.read.Activations`` whose ``entropy`` is the model's Gaussian entropy in bits (so
    ``manifold_report``, ``fit_entropy_axis`` and ``attention_focusing`` take it as they are), and float64 columns
    ``sequence``, ``k`` (step, 1-based), ``bayes_entropy`` (bits), ``bayes_logdet`` (ln det P_t), ``bayes_mean``
    [N, d] (m_t), ``model_mean`` [N, d] and ``model_logdet`` for ``stats.probe.scalar_probes`` and calibration.
    """
    layer_idx = resolve_layers(layers, bridge.cfg.n_layers, "all")
    batch = task.sample(n_sequences, seed=seed)
    K = len(batch.query_pos)
    acts = read(bridge, batch, sites_of(layer_idx, readings), "queries", logit_ids=task.readout_ids,
                batch_size=batch_size)  # groups: the sequences, whose steps are not independent
    mean, chol = gaussian_head(acts.logits.double().reshape(n_sequences, K, -1), task.state_dim)
    model_mean, model_cov = mean, chol @ chol.mT  # [n, K, d], [n, K, d, d]
    acts.entropy = gaussian_entropy_bits(model_cov).reshape(-1).float()
    acts.meta.update(entropy_over="the Gaussian head (differential entropy)", task=task.name,
                     inputs="continuous features (no token ids)", seed=seed, n_sequences=n_sequences, steps=K)
    d = task.state_dim
    columns = dict(
        sequence=np.repeat(np.arange(n_sequences), K), k=np.tile(np.arange(1, K + 1), n_sequences),
        bayes_entropy=as_float64(gaussian_entropy_bits(batch.cov)).reshape(-1),
        bayes_logdet=as_float64(torch.linalg.slogdet(batch.cov).logabsdet).reshape(-1),
        bayes_mean=as_float64(batch.mean).reshape(-1, d), model_mean=as_float64(model_mean).reshape(-1, d),
        model_logdet=as_float64(torch.linalg.slogdet(model_cov).logabsdet).reshape(-1))
    return acts, columns
