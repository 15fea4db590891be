"""The on-manifold ablations (``model.edits.AxisSet``: ``resample`` and stratum ``mean``) against hand-computed
replacements, their donors, and their fast path against the naive one; the manifold move (``analyses.manifold_move``)."""

import numpy as np
import pandas as pd
import pytest
import torch

EPS32 = float(torch.finfo(torch.float32).eps)
PROMPT_LENGTHS = (3, 3, 5, 7, 7, 12, 20, 20, 20, 20, 33, 40, 40, 9)
STRATA = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 1])  # mixed lengths within strata: end alignment matters


def _prompts(n_vocab=400, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(2, n_vocab, size=n).tolist() for n in PROMPT_LENGTHS]


def _unit(dim, seed):
    u = np.random.default_rng(seed).standard_normal(dim)
    return torch.tensor(u / np.linalg.norm(u))


def _edited_values(bridge, prompts, layer, edit):
    """Per prompt (each run alone), hook_v at ``layer`` after ``edit`` (bound to that prompt), [len, dim] float32."""
    from interp_bayes.model.edits import bind_edit
    from interp_bayes.model.hooks import reading_hook

    out = []
    for i, p in enumerate(prompts):
        got = {}
        hooks = [(reading_hook("v", layer), lambda v, hook: bind_edit(edit, [i])(v)),
                 (reading_hook("v", layer), lambda v, hook: got.__setitem__("v", v.detach().reshape(1, len(p), -1)))]
        with torch.no_grad(), bridge.hooks(fwd_hooks=hooks):
            bridge(torch.tensor([p]))
        out.append(got["v"][0])
    return out


def _tolerance(values, dim):
    """A dot product of dim float32 terms and one axpy: each element within ~2 dim eps of the largest |v|."""
    return 2 * dim * EPS32 * max(float(v.abs().max()) for v in values)


def _expected(v, u, target):
    """v - (v.u)u + c u in float64, left as it is where c is NaN."""
    v64, u64 = v.double(), u.double()
    c = torch.as_tensor(target, dtype=torch.float64)
    out = v64 - (v64 @ u64)[:, None] * u64 + c[:, None] * u64
    return torch.where(torch.isnan(c)[:, None], v64, out)


def test_donors_stay_in_their_stratum_and_never_give_to_themselves():
    from interp_bayes.core.errors import ConfigError
    from interp_bayes.stats import donors_within

    strata = np.array([3, 1, 3, 3, 1, 2, 2, 1, 3])
    d = donors_within(strata, seed=5)
    assert (d != np.arange(len(strata))).all() and (strata[d] == strata).all()
    assert sorted(d.tolist()) == list(range(len(strata)))  # every prompt donates once
    np.testing.assert_array_equal(d, donors_within(strata, seed=5))
    assert any((donors_within(strata, seed=s) != d).any() for s in range(6, 12))  # the seed chooses
    with pytest.raises(ConfigError, match="Stratum 7 holds one prompt"):
        donors_within(np.array([1, 1, 7]), seed=0)


def test_resample_sets_the_donors_component_exactly(tiny):
    """The edited value's component along u is the donor's (aligned from the end), its orthogonal part is the
    prompt's own, and positions before the donor's first token are untouched, bit for bit."""
    from interp_bayes.model.collect import token_values
    from interp_bayes.model.edits import onmanifold_op, site_dim
    from interp_bayes.stats import donors_within

    bridge, _, _ = tiny
    prompts, layer = _prompts(), 1
    dim = site_dim(bridge, "v")
    u = _unit(dim, 3)
    vals = token_values(bridge, prompts, [layer])[layer]
    donors = donors_within(STRATA, seed=0)
    edited = _edited_values(bridge, prompts, layer, onmanifold_op("resample", u, vals, STRATA, donors))
    tol = _tolerance(vals, dim)
    for i, d in enumerate(donors):
        own, src = vals[i], vals[d]  # unperturbed hook_v of prompt i and of its donor, each from its own forward
        m = min(len(own), len(src))
        target = torch.full((len(own),), float("nan"), dtype=torch.float64)
        target[len(own) - m:] = src[len(src) - m:].double() @ u
        torch.testing.assert_close(edited[i].double(), _expected(own, u, target), rtol=0, atol=tol)
        torch.testing.assert_close(edited[i][len(own) - m:].double() @ u, target[len(own) - m:], rtol=0, atol=tol)
        assert torch.equal(edited[i][:len(own) - m], own[:len(own) - m])
    assert any(len(vals[d]) < len(vals[i]) for i, d in enumerate(donors))  # the untouched-prefix case occurs


def test_stratum_mean_sets_the_strata_mean_component(tiny):
    from interp_bayes.model.collect import token_values
    from interp_bayes.model.edits import onmanifold_op, site_dim

    bridge, _, _ = tiny
    prompts, layer = _prompts(seed=1), 0
    dim = site_dim(bridge, "v")
    u = _unit(dim, 4)
    vals = token_values(bridge, prompts, [layer])[layer]
    edited = _edited_values(bridge, prompts, layer, onmanifold_op("mean", u, vals, STRATA, None))
    tol = _tolerance(vals, dim)
    for i, v in enumerate(vals):
        target = []
        for back in range(len(v), 0, -1):  # position len - back, counted from the end
            comps = [float(vals[j][len(vals[j]) - back].double() @ u) for j in np.flatnonzero(STRATA == STRATA[i])
                     if len(vals[j]) >= back]
            target.append(sum(comps) / len(comps))
        torch.testing.assert_close(edited[i].double(), _expected(v, u, target), rtol=0, atol=tol)


def test_an_unbound_axis_set_is_refused_with_one_sentence(tiny):
    from interp_bayes.core.errors import InterventionError
    from interp_bayes.model.edits import AxisSet, intervene

    bridge, _, _ = tiny
    dim = bridge.cfg.n_key_value_heads * bridge.cfg.d_head if bridge.cfg.n_key_value_heads else \
        bridge.cfg.n_heads * bridge.cfg.d_head
    op = AxisSet(_unit(dim, 0), [torch.zeros(4), torch.zeros(4)])
    with pytest.raises(InterventionError, match="bind it first"), intervene(bridge, {0: op}):
        bridge(torch.tensor([[3, 4, 5, 6]]))
    with pytest.raises(InterventionError, match="bound to 1 prompts of \\[4\\] tokens but the batch has 2 rows"), \
            intervene(bridge, {0: op.bind([0])}):
        bridge(torch.tensor([[3, 4, 5, 6], [3, 4, 5, 6]]))


def _onmanifold_edits(bridge, prompts, layers, strata, seed=0):
    from interp_bayes.model.collect import token_values
    from interp_bayes.model.edits import onmanifold_op, resolve_edits, site_dim
    from interp_bayes.stats import donors_within

    vals = token_values(bridge, prompts, layers)
    donors = donors_within(strata, seed)
    dim = site_dim(bridge, "v")
    return [resolve_edits(bridge, {layer: onmanifold_op(op, _unit(dim, 10 * draw + layer), vals[layer], strata, donors)
                                   for layer in ls})
            for ls in ([0], [1], [0, 1]) for op in ("resample", "mean") for draw in range(2)]


def _close(a_runs, b_runs, *, same_batches: bool):
    """Equal runs. On the same batches (fast against naive path) as ``test_interventions`` asks: 1e-5 relative
    (bit for bit with MKL). Batches of other sizes take other matrix kernels, so rows may round differently: ~100
    float32 ulps of each tensor's own scale through two blocks (for the KL, a sum of p * (log p - log q): the
    log-probabilities' scale)."""
    for a, b in zip(a_runs, b_runs, strict=True):
        lp_scale = float(b.label_logprobs.abs().max())
        for x, y, scale in [(a.entropy, b.entropy, None), (a.label_logprobs, b.label_logprobs, None),
                            (a.kl, b.kl, lp_scale)] + [(a.values[layer], b.values[layer], None) for layer in b.values]:
            if y is None:
                continue
            atol = 0.0 if same_batches else 100 * EPS32 * (scale or float(y.abs().max()))
            torch.testing.assert_close(x, y, rtol=1e-5, atol=atol)


def test_onmanifold_fast_path_equals_naive_path_and_batched_equals_single(tiny):
    """Stacked copies on the replayed prefix against a whole forward per edit, and batches of equal length against
    one prompt at a time (each binds the edit to its own rows)."""
    from interp_bayes.model.prefix import edited_runs

    bridge, _, _ = tiny
    prompts, labels = _prompts(), [5, 9]
    edits = _onmanifold_edits(bridge, prompts, [0, 1], STRATA)
    fast = edited_runs(bridge, prompts, edits, layers=[0, 1], label_tokens=labels, fast=True)
    _close(fast, edited_runs(bridge, prompts, edits, layers=[0, 1], label_tokens=labels, fast=False),
           same_batches=True)
    _close(fast, edited_runs(bridge, prompts, edits, layers=[0, 1], label_tokens=labels, fast=True, batch_size=1),
           same_batches=False)
    assert all(float(r.kl.max()) > 0 for r in fast[1:])  # every edit changed something


def test_protocol_donors_come_from_the_evaluation_half_of_the_same_k(tiny):
    """run_interventions sees the evaluation prompts only; its donors are among them, of the same k, and its rows
    are the same on the fast and the naive path."""
    from interp_bayes.analyses.axis import fit_entropy_axis
    from interp_bayes.analyses.interventions import EditProtocol, run_interventions
    from interp_bayes.kinds.interventions import split_by_k
    from interp_bayes.model.collect import collect

    bridge, _, _ = tiny
    rng = np.random.default_rng(2)
    prompts = [rng.integers(2, 400, size=n).tolist() for n in rng.integers(4, 12, 32)]
    k = np.repeat([0, 1, 2, 4], 8)
    labels = [5, 9]
    fit_idx, eval_idx = split_by_k(k, seed=1)
    acts = collect(bridge, prompts, layers=(0, 1), label_tokens=labels, progress=False)
    axes = {layer: fit_entropy_axis(acts, layer, folds=0, subset=fit_idx) for layer in (0, 1)}
    ev = np.asarray(eval_idx)
    task = dict(k=k[ev].tolist(), latent=rng.integers(0, 2, len(ev)).tolist(), bayes_entropy=rng.random(len(ev)).tolist())
    protocol = EditProtocol([[0], [0, 1]], ("cut", "resample", "mean"), {"isotropic": 1, "matched": 1}, seed=3)
    runs = [run_interventions(bridge, [prompts[i] for i in eval_idx], axes,
                              {layer: acts.values(layer)[fit_idx] for layer in (0, 1)}, task, protocol,
                              label_tokens=labels, fast=fast, progress=False) for fast in (True, False)]
    donors = ev[runs[0].donors]
    assert set(donors.tolist()) <= set(eval_idx) and not set(donors.tolist()) & set(fit_idx)
    assert (k[donors] == k[ev]).all() and (donors != ev).all()
    fast, naive = (pd.DataFrame(r.rows) for r in runs)
    pd.testing.assert_frame_equal(fast, naive, rtol=1e-5, atol=0)
    assert set(fast.op) == {"cut", "resample", "mean"} and set(fast.kind) == {"true", "isotropic", "matched"}


def _planted_states(n_groups=30, steps=4, dim=6, seed=0):
    """States whose first two coordinates are the exact spread and mean (plus noise dimensions), and a readout that
    reads those two coordinates: the model of a belief that is linear and fully used."""
    rng = np.random.default_rng(seed)
    n = n_groups * steps
    spread, mean = rng.standard_normal(n), rng.standard_normal(n)
    x = np.column_stack([spread, mean, rng.standard_normal((n, dim - 2))])
    groups, strata = np.repeat(np.arange(n_groups), steps), np.tile(np.arange(steps), n_groups)
    readout = lambda states, rows: dict(spread=states[:, 0], mean=states[:, 1])  # noqa: E731
    fit = np.flatnonzero(groups < n_groups // 2)
    ev = np.flatnonzero(groups >= n_groups // 2)
    return x, spread, mean, readout, groups, strata, fit, ev


def test_manifold_move_on_a_planted_linear_belief():
    """Where the readout is the first coordinate: the manifold move achieves the donor's exact change (gain 1, no
    error, the donor's exact mean change, on the manifold), the probe-calibrated shift nearly so (ridge shrinkage),
    and random steps orthogonal to the probe move the spread by little; donors are evaluation rows of the same
    stratum and another group."""
    from interp_bayes.analyses.manifold_move import manifold_move

    x, spread, mean, readout, groups, strata, fit, ev = _planted_states()
    out = manifold_move(x, spread, mean, readout, fit_idx=fit, eval_idx=ev, groups=groups, strata=strata,
                        n_random=5, n_boot=200)
    val = {(r["op"], r["measure"]): r["value"] for r in out["rows"]}
    tol = 64 * np.finfo(np.float64).eps
    assert abs(val[("manifold", "spread_gain")] - 1) < tol and val[("manifold", "spread_error")] < tol
    assert val[("manifold", "mean_error")] < tol and val[("manifold", "off_manifold")] == 0
    assert val[("manifold", "spread_change")] > 0.5  # a real move, towards the target
    assert abs(val[("linear-probe", "spread_gain")] - 1) < 0.05 and val[("linear-probe", "mean_change")] < 0.05
    assert abs(val[("random", "spread_gain")]) < 0.1 and val[("linear-norm", "off_manifold")] > 0
    per = out["per_row"]["manifold"]
    donor, row = per["donor"], per["row"]
    assert set(donor.tolist()) <= set(ev.tolist()) and (groups[donor] != groups[row]).all()
    assert (strata[donor] == strata[row]).all()


def test_manifold_move_refuses_a_group_on_both_sides():
    from interp_bayes.analyses.manifold_move import manifold_move
    from interp_bayes.core.errors import ConfigError

    x, spread, mean, readout, groups, strata, fit, ev = _planted_states()
    with pytest.raises(ConfigError, match="A group has rows on both the fit and the evaluation side"):
        manifold_move(x, spread, mean, readout, fit_idx=np.append(fit, ev[0]), eval_idx=ev, groups=groups)


def test_onmanifold_readout_claims_follow_their_own_rows():
    """The ledger states the readout claim once per ablation, each judged on its own excess over its matched
    controls: a resample ablation no worse than its controls holds while a mean ablation 0.3 bits worse does not."""
    from interp_bayes.analyses.interventions import readout_excess
    from interp_bayes.core.results import Row
    from interp_bayes.kinds.interventions import READOUT_DELTA_BITS, readout_claims

    def effect(op, harm):
        scope = dict(layer_set="3+5", op=op, measure="mae_k_ge_1")
        err = 0.1 + 0.005 * np.random.default_rng(1).standard_normal((11, 100))  # prompts enough to exclude delta
        return [Row("effect", harm, "bits", dict(scope, family="true")),
                readout_excess(err[0] + harm, err[1:], delta=READOUT_DELTA_BITS, scope=dict(scope, family="matched"))]

    claims = {c.key: c.verdict for c in readout_claims(effect("cut", 0.002) + effect("resample", 0.0)
                                                       + effect("mean", 0.3))}
    assert claims == {"readout": "holds", "readout-resample": "holds", "readout-mean": "does not hold"}
