"""A manifold move against a linear shift of the same size (issue 28, after Sarfati et al. 2026): does moving a
belief state along the data's own manifold change the model's predicted spread with fewer side effects than
steering it along a linear spread direction?

Given belief states (e.g. the residual stream at a layer, at the position whose belief the exact posterior
describes), each row's exact posterior spread and mean, and a ``readout`` that runs the rest of the model from an
edited state, ``manifold_move`` moves every evaluation row i to a target spread s_i +- delta * sd (sd: the spread's
standard deviation in the row's stratum) by

- ``manifold``: replacing its state by the state x_j of another row (another group: a sequence or prompt; the same
  stratum where given; evaluation rows only) whose exact spread is nearest the target and, as far as possible, whose
  exact mean is the row's own (the squared standardised distance in spread plus that in mean is minimised);
- ``linear-norm``: x_i + sign(s_j - s_i) |x_j - x_i| u, the same step size along u, the decoded spread direction (a
  ridge probe of the spread fitted on the fit rows only, in raw units);
- ``linear-probe``: x_i + (s_j - s_i) / |w| u, the step the probe says changes the decoded spread by s_j - s_i;

with controls ``manifold-null`` (the donor chosen the same way for the row's own spread: what swapping in another
sequence's state of the same belief does) and ``random`` (steps of size |x_j - x_i| along isotropic directions
orthogonal to u). Measured from the readout against the unedited readout: the intended change (``spread_change``:
the predicted spread's change towards the target; ``spread_gain``: its regression on the exact change s_j - s_i,
through 0; ``spread_error``: |achieved - intended|) and the side effects (``mean_change``: |predicted mean change|;
``mean_error``: its distance from the exact mean change the move asks for, m_j - m_i for the manifold move and 0 for
the shifts; ``donor_mean_mismatch``: |m_j - m_i|; ``kl_bits`` on other tokens where the readout gives it); and how far each edited state lies from the nearest
real state of its stratum, in units of the real states' median nearest-neighbour distance (0 for the manifold move).

``kalman_move`` runs it on the Kalman tunnel and returns its rows (the kind ``manifold_move``); ``token_readout``
gives the readout for a token model (the Gaussian in-context task), with the predicted mean and spread computed by
the caller from the next-token log-probabilities.
"""

from __future__ import annotations

# windtunnel.kalman is imported inside kalman_move, its one user: it opens tunnels, whose configs import transformers
# (~1.5 s), and manifold_move on other states needs none of it
from typing import Callable

import numpy as np
import torch

from ..core.errors import ConfigError
from ..core.results import Row
from ..model.hooks import reading_hook
from ..model.read import Sequences, read, tokenize
from ..stats import as_float64, bootstrap_means, fit_ridge, info, interval

# a readout: (edited states [n, d], their rows [n] into the state table) -> dict with "spread" [n] and "mean" [n]
# or [n, m], optionally "kl" [n] (bits: the side effect on the other tokens)
Readout = Callable[[np.ndarray, np.ndarray], dict]
OPS = ("manifold", "linear-norm", "linear-probe", "manifold-null", "random")


def spread_direction(states, spread, fit_idx) -> tuple[np.ndarray, float]:
    """(u, |w|): the unit direction in raw state units of a ridge probe of ``spread`` fitted on the ``fit_idx`` rows,
    and the probe's gain along it (decoded spread per unit step along u)."""
    x, y = as_float64(states)[fit_idx], as_float64(spread)[fit_idx]
    fit = fit_ridge(x, y)
    w = fit.coef[:, 0] / fit.sd  # d(decoded spread) / dx in raw units
    norm = float(np.linalg.norm(w))
    return w / norm, norm


def choose_donor(i: int, target: float, spread: np.ndarray, mean: np.ndarray, pool: np.ndarray, sd_spread: float,
                 sd_mean: np.ndarray) -> int:
    """The row of ``pool`` nearest (spread ``target``, row i's mean) in standardised units."""
    d = ((spread[pool] - target) / sd_spread) ** 2 + (((mean[pool] - mean[i]) / sd_mean) ** 2).sum(-1)
    return int(pool[np.argmin(d)])


def _nn_ratio(edited: np.ndarray, real: np.ndarray, scale: float) -> np.ndarray:
    """Distance of each edited state to its nearest real state, over ``scale``."""
    d = ((edited[:, None, :] - real[None, :, :]) ** 2).sum(-1)
    return np.sqrt(d.min(1)) / scale


def manifold_move(states, spread, mean, readout: Readout, *, fit_idx, eval_idx, groups, strata=None,
                  delta: float = 1.0, n_random: int = 10, n_boot: int = 1000, seed: int = 0) -> dict:
    """The manifold move, the linear shifts and their controls on every ``eval_idx`` row, both signs of ``delta``.

    states [N, d]; spread [N] (exact, e.g. ln sd); mean [N] or [N, m] (exact); groups [N] (donors come from other
    groups); strata [N] or None (donors from the same stratum). Returns ``rows`` (one dict per op and measure:
    value, bootstrap 95% interval over the moved rows' groups and, for ``random``, the 95% range over its draws),
    the probe's held-out R^2 on the evaluation rows, and ``per_row`` (every edit's rows, intended and achieved
    changes)."""
    x = as_float64(states)
    s = as_float64(spread)
    m = as_float64(mean).reshape(len(x), -1)
    groups = np.asarray(groups)
    strata = np.zeros(len(x), dtype=int) if strata is None else np.asarray(strata)
    fit_idx, eval_idx = np.asarray(fit_idx), np.asarray(eval_idx)
    if set(groups[fit_idx].tolist()) & set(groups[eval_idx].tolist()):
        raise ConfigError("A group has rows on both the fit and the evaluation side; split by whole groups "
                          "(kinds.interventions.split_by_group).")
    u, gain = spread_direction(x, s, fit_idx)
    fit = fit_ridge(x[fit_idx], s[fit_idx])
    decoded = fit.predict(x[eval_idx])[:, 0]
    r2_eval = 1 - ((decoded - s[eval_idx]) ** 2).sum() / ((s[eval_idx] - s[eval_idx].mean()) ** 2).sum()
    rng = np.random.default_rng(seed)

    edits = {op: [] for op in OPS}  # op -> [(row, edited state, intended spread change, exact mean change, draw,
    #                                         donor row or -1)]
    real = {k: eval_idx[strata[eval_idx] == k] for k in np.unique(strata[eval_idx])}
    scale = {}
    for k, rows in real.items():
        d = np.sqrt(((x[rows][:, None] - x[rows][None]) ** 2).sum(-1))
        np.fill_diagonal(d, np.inf)
        nearest = d.min(1)
        nearest = nearest[np.isfinite(nearest) & (nearest > 0)]  # identical prompts (e.g. one shown number) share a state
        scale[k] = float(np.median(nearest)) if len(nearest) else float("nan")
    for i in eval_idx:
        pool = real[strata[i]]
        pool = pool[groups[pool] != groups[i]]
        sd_s = float(s[real[strata[i]]].std())
        sd_m = m[real[strata[i]]].std(0)
        sd_m = np.where(sd_m > 0, sd_m, 1.0)
        null = choose_donor(i, s[i], s, m, pool, sd_s, sd_m)
        edits["manifold-null"].append((i, x[null], s[null] - s[i], m[null] - m[i], 0, null))
        for sign in (1.0, -1.0):
            j = choose_donor(i, s[i] + sign * delta * sd_s, s, m, pool, sd_s, sd_m)
            step, want = float(np.linalg.norm(x[j] - x[i])), s[j] - s[i]
            edits["manifold"].append((i, x[j], want, m[j] - m[i], 0, j))
            edits["linear-norm"].append((i, x[i] + np.sign(want) * step * u, want, 0 * m[i], 0, -1))
            edits["linear-probe"].append((i, x[i] + want / gain * u, want, 0 * m[i], 0, -1))
            for r in range(n_random):
                g = rng.standard_normal(len(u))
                g -= (g @ u) * u
                edits["random"].append((i, x[i] + step * g / np.linalg.norm(g), want, 0 * m[i], r, -1))

    base = readout(x[eval_idx], eval_idx)
    base_at = {int(i): k for k, i in enumerate(eval_idx)}
    per_row, rows = {}, []
    for op, items in edits.items():
        idx = np.array([it[0] for it in items])
        out = readout(np.stack([it[1] for it in items]), idx)
        b = np.array([base_at[int(i)] for i in idx])
        achieved = as_float64(out["spread"]) - as_float64(base["spread"])[b]
        dmean = as_float64(out["mean"]).reshape(len(idx), -1) - as_float64(base["mean"]).reshape(len(eval_idx), -1)[b]
        intended = np.array([it[2] for it in items])
        exact_dmean = np.stack([it[3] for it in items])
        draw = np.array([it[4] for it in items])
        k = strata[idx]
        off = np.concatenate([_nn_ratio(np.stack([items[t][1] for t in np.flatnonzero(k == kk)]), x[real[kk]],
                                        scale[kk]) for kk in np.unique(k)])
        off_order = np.concatenate([np.flatnonzero(k == kk) for kk in np.unique(k)])
        off_rows = np.empty(len(idx))
        off_rows[off_order] = off
        towards = np.sign(intended) if op != "manifold-null" else np.ones(len(idx))
        cols = dict(spread_change=achieved * towards, spread_error=np.abs(achieved - intended),
                    mean_change=np.linalg.norm(dmean, axis=1), mean_error=np.linalg.norm(dmean - exact_dmean, axis=1),
                    donor_mean_mismatch=np.linalg.norm(exact_dmean, axis=1), off_manifold=off_rows)
        if "kl" in out:
            cols["kl_bits"] = as_float64(out["kl"])
        per_row[op] = dict(row=idx, donor=np.array([it[5] for it in items]), intended=intended, draw=draw, **cols)
        moving = np.abs(intended) > 0 if op != "manifold-null" else np.ones(len(idx), bool)
        gain_value = float((achieved * intended).sum() / (intended ** 2).sum()) if op != "manifold-null" else np.nan
        for name, col in cols.items():
            if op == "random":  # one value per draw; the range over draws is the control's spread
                per_draw = np.array([col[draw == r].mean() for r in range(n_random)])
                lo, hi = interval(per_draw)
                rows.append(dict(op=op, measure=name, value=float(per_draw.mean()), low=lo, high=hi,
                                 interval="random draws 95%", n=n_random))
                continue
            mean_, lo, hi = bootstrap_means(col[moving], groups[idx][moving], n_boot=n_boot, seed=seed)
            rows.append(dict(op=op, measure=name, value=float(mean_), low=float(lo), high=float(hi),
                             interval="bootstrap 95%", n=int(moving.sum())))
        if op != "manifold-null":
            if op == "random":
                gains = [float((achieved[draw == r] * intended[draw == r]).sum() / (intended[draw == r] ** 2).sum())
                         for r in range(n_random)]
                lo, hi = interval(gains)
                rows.append(dict(op=op, measure="spread_gain", value=float(np.mean(gains)), low=lo, high=hi,
                                 interval="random draws 95%", n=n_random))
            else:
                rows.append(dict(op=op, measure="spread_gain", value=gain_value, low=None, high=None, interval=None,
                                 n=int(moving.sum())))
        rows.append(dict(op=op, measure="intended_abs_change", value=float(np.abs(intended).mean()), low=None,
                         high=None, interval=None, n=len(idx)))
    return dict(rows=rows, probe_r2_eval=float(r2_eval), probe_gain=gain, per_row=per_row,
                n_eval=len(eval_idx), n_fit=len(fit_idx), delta=delta)


def spread_of(cov: torch.Tensor) -> torch.Tensor:
    """The spread of a Gaussian belief: ln of the geometric mean standard deviation, 0.5 ln det P / d (ln sd for a
    one-dimensional state)."""
    return 0.5 * torch.linalg.slogdet(cov).logabsdet / cov.shape[-1]


UNITS = dict(spread_change="ln sd", spread_error="ln sd", spread_gain="ratio", intended_abs_change="ln sd",
             mean_change="state", mean_error="state", donor_mean_mismatch="state", off_manifold="nn distances",
             kl_bits="bits")


def move_rows(out: dict, scope: dict) -> list[Row]:
    """Rows of ``manifold_move``'s output: one per (op, measure) with its interval (a bootstrap over the moved rows'
    groups, or the random draws' range), then the spread probe's held-out R² and gain; ``scope`` is in every row."""
    rows = [Row(r["measure"], r["value"], UNITS[r["measure"]], dict(scope, op=r["op"]), r["low"], r["high"],
                r["interval"], n=r["n"]) for r in out["rows"]]
    return rows + [Row("probe_r2_eval", float(out["probe_r2_eval"]), "R²", dict(scope), n=out["n_eval"],
                       note="the spread probe (fitted on the fit rows) on the evaluation rows"),
                   Row("probe_gain", float(out["probe_gain"]), "ln sd per unit", dict(scope), n=out["n_fit"],
                       note="decoded spread per unit step along the probe's direction")]


def kalman_move(bridge, task, *, layer: int, n_sequences: int = 200, seed: int = 2024, delta: float = 1.0,
                n_random: int = 10, split_seed: int = 0) -> list[Row]:
    """``manifold_move`` on a Kalman tunnel, as ``move_rows`` scoped by ``layer``: the states are the residual stream
    after block ``layer`` at every observation step, the stratum is the step, the exact spread and mean are the
    filter's (``kalman_readings``), and the readout reruns each sequence with the state written at its step and reads
    the Gaussian head there. Fit and evaluation halves hold whole sequences."""
    from ..windtunnel.kalman import gaussian_head, kalman_readings

    acts, cols = kalman_readings(bridge, task, n_sequences, seed=seed, layers=[layer], readings=("resid",))
    states = acts.readings["resid"][layer].double().numpy()
    batch = task.sample(n_sequences, seed=seed)  # the same draws as kalman_readings
    exact_spread = as_float64(spread_of(batch.cov)).reshape(-1)
    exact_mean = as_float64(batch.mean).reshape(len(states), -1)
    qpos = batch.query_pos
    seq, step = cols["sequence"].astype(int), cols["k"].astype(int) - 1
    ids = np.random.default_rng(split_seed).permutation(n_sequences)
    fit_seq = set(ids[: n_sequences // 2].tolist())
    fit_idx = np.flatnonzero([s in fit_seq for s in seq])
    eval_idx = np.flatnonzero([s not in fit_seq for s in seq])
    hook = reading_hook("resid", layer)

    @torch.no_grad()
    def readout(edited: np.ndarray, rows: np.ndarray) -> dict:
        spread, mean = np.empty(len(rows)), np.empty((len(rows), task.state_dim))
        for t in np.unique(step[rows]):
            at = np.flatnonzero(step[rows] == t)
            pos = int(qpos[t])
            new = torch.tensor(edited[at], dtype=torch.float32)

            def write(act, hook, new=new, pos=pos):
                act = act.clone()
                act[:, pos] = new.to(act.dtype)
                return act

            feats = batch.features[seq[rows[at]]]
            with bridge.hooks(fwd_hooks=[(hook, write)]):  # an edit (the state written), read by ``read``
                got = read(bridge, Sequences(qpos[t:t + 1], features=feats), (), "queries",
                           logit_ids=task.readout_ids, batch_size=len(feats))
            mu, chol = gaussian_head(got.logits.double(), task.state_dim)
            spread[at] = as_float64(spread_of(chol @ chol.mT))
            mean[at] = as_float64(mu)
        return dict(spread=spread, mean=mean)

    out = manifold_move(states, exact_spread, exact_mean, readout, fit_idx=fit_idx, eval_idx=eval_idx, groups=seq,
                        strata=step, delta=delta, n_random=n_random, seed=seed)
    return move_rows(out, dict(layer=layer))


def token_readout(model, prompts: list, layer: int, summarize: Callable[[torch.Tensor], tuple], *,
                  number_tokens: list[int]) -> Readout:
    """The readout of ``manifold_move`` for a token model: each row's prompt rerun with the residual stream after
    block ``layer`` set to the edited state at the final position; ``summarize(logprobs [n, vocab])`` gives the
    predicted (mean, spread) per row (e.g. of the next-number distribution over ``number_tokens``); ``kl`` is the
    side effect on the other tokens: KL(edited || unedited) in bits over the other tokens and one bucket holding the
    number tokens' total mass."""
    token_ids = tokenize(model, prompts)
    numbers = torch.tensor(number_tokens)
    base_cache: dict[int, torch.Tensor] = {}

    @torch.no_grad()
    def run(i: int, state: torch.Tensor | None) -> torch.Tensor:
        def write(act, hook):
            act = act.clone()
            act[:, -1] = state.to(act.dtype).to(act.device)
            return act

        hooks = [] if state is None else [(reading_hook("resid", layer), write)]
        with model.hooks(fwd_hooks=hooks):  # an edit (the state written), read by ``read``
            return read(model, [token_ids[i]], (), "final", keep_logprobs=True).logprobs[0]

    def bucketed(lp: torch.Tensor) -> torch.Tensor:
        keep = torch.ones(len(lp), dtype=torch.bool)
        keep[numbers] = False
        return torch.cat([lp[keep], torch.logsumexp(lp[numbers], 0)[None]]).double()

    def readout(edited: np.ndarray, rows: np.ndarray) -> dict:
        lps, kls = [], []
        for state, i in zip(edited, rows):
            i = int(i)
            if i not in base_cache:
                base_cache[i] = run(i, None)
            lp = run(i, torch.tensor(state, dtype=torch.float32))
            a, b = bucketed(lp), bucketed(base_cache[i])
            kls.append(float(info.kl(a, b)))
            lps.append(lp)
        mean, spread = summarize(torch.stack(lps))
        return dict(mean=as_float64(mean), spread=as_float64(spread), kl=np.array(kls))

    return readout
