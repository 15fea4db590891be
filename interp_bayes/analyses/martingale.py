"""Is the in-context learning Bayesian? Order sensitivity and the martingale gap (Falck, Wang and Holmes, ICML 2024,
arXiv 2406.00793).

On exchangeable data a Bayesian predictor (i) does not depend on the order of the examples and (ii) is a
martingale: if the next example is drawn from its own predictive distribution and appended, the expected new
prediction equals today's. Both are measured on the model and, with the same draws and the same estimator, on the
task's exact Bayesian predictor (a reference).

A context is k examples ``(input, outcome)`` and a query input; a predictor maps contexts to distributions over the
outcomes. Per context:

- order sensitivity: the predictions for up to ``n_perms`` distinct orders of the same examples; their spread is the
  generalised Jensen-Shannon divergence H(mean) - mean H, in bits (0 iff every order predicts the same), and the
  standard deviation of the probability of the mean's top outcome;
- martingale gap: the next example is (x', o) with x' from the task's input distribution and o from the predictor's
  own predictive at x' (sampled with a shared uniform, or enumerated with its probabilities as weights), followed by
  a fresh query; m is the average prediction at the fresh queries over ``n_draws`` draws and m0 the average
  prediction at the same fresh queries without the new example. The gap is KL(m || m0) in bits (finite: m never
  puts mass where an exact predictor has none): for any predictor whose predictions are the conditionals of one
  joint distribution it is 0 (total probability), however much it cares about the query. Beside it the total
  variation, the drift of the top outcome m[top] - m0[top] (> 0: the predictor grows more confident in its own guess
  than its predictive justifies), the gap against today's prediction KL(m || p) and its floor KL(m0 || p), what
  changing the query alone does;
- the test: with a few sampled draws the plug-in KL(m || m0) is biased up by their Monte-Carlo noise, and that
  noise is the predictor's own (a flatter predictor has less), so the exact predictor's range is no null for another
  predictor. The gap is also estimated without that bias (``debiased_gap_bits``: a U-statistic over pairs of
  draws, mean exactly 0 for any martingale) and tested against its own bootstrap over contexts, recentred at 0.

SULA (``tasks/icl.py``): the examples are (carrier word, label) pairs and the query is a word. What the model
outputs at the query is its predictive for the *next label*, and under the task's model that label equals the
latent y with probability alpha, so the Bayesian next-label predictive is

    p(l_{k+1} = L1 | D_k) = alpha pi_k + (1 - alpha)(1 - pi_k),   pi_k = P(y = L1 | D_k) (``posterior_label1``),

which is the martingale: drawing l_{k+1} from it and updating gives E[p(l_{k+2} | D_{k+1})] = p(l_{k+1} | D_k). The
latent posterior pi_k is a martingale too, but only under draws from this predictive, not under draws from pi_k
itself; the exact null therefore uses the next-label predictive (its entropy is larger than the Bayes entropy
H(pi_k) the calibration metrics compare with: 0.68 vs 0.47 bits at k = 1). The label outcome is enumerated (two
outcomes, so no label sampling noise); the fresh query word is drawn at random, the only Monte-Carlo part.

Bayes in expectation (Chlon et al. 2025, arXiv 2507.11768): positional encodings break exchangeability, so a
model may fail these per-order tests while the average of its predictive over orderings of the same examples is
Bayesian. ``order_averaged`` is that exchangeable predictor (the mean over m orders of the examples, all of them when
k! <= m); ``martingale_test(n_orders=m)`` runs the same statistics on it beside the per-order ones, each against its
own null (the averaged predictor's own draws: averaging also smooths the draws' noise, and the null keeps that), and
the per-order minus averaged gap with a paired bootstrap.

Bijection wind tunnel (``tasks/bijection.py``): the examples are revealed (key, value) pairs and the query a key
not yet revealed; the next example is an unrevealed key other than the query, with a value sampled from the
predictor's own predictive at that key; the query stays. The exact predictive (uniform over unrevealed values) is
a martingale. With 20 outcomes the value is sampled, so every predictor's plug-in gap has Monte-Carlo error; the
exact predictor's 95% range over ``n_null`` independent sets of draws is kept as a reference.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

import numpy as np

from ..core.results import Row
from ..model.collect import collect
from ..stats import bootstrap_mean_draws, info, interval, sequential_test
from ..tasks.icl import CARRIERS, posterior_label1


@dataclass(frozen=True)
class Context:
    """k examples ``(input, outcome index)`` and the query input whose outcome is predicted."""

    examples: tuple[tuple[Hashable, int], ...]
    query: Hashable

    @property
    def k(self) -> int:
        return len(self.examples)


Predictor = Callable[[Sequence[Context]], np.ndarray]  # contexts -> [n, n_outcomes] probabilities


@dataclass(frozen=True)
class ExchangeableTask:
    """What the tests need to know about a task: how to write a context for the model, which tokens are its outcomes,
    its exact predictive, and how the next example's input and the next query are drawn."""

    name: str
    render: Callable[[Context], Any]  # -> prompt text or token ids
    outcome_tokens: list[int]
    exact: Predictor
    next_inputs: Callable[[Context, np.random.Generator], tuple[Hashable, Hashable]]  # -> (x', next query)
    enumerate_outcomes: bool  # weight every outcome by its probability instead of sampling one


def sula_setup(task, label_tokens: Sequence[int]) -> ExchangeableTask:
    """The SULA task (``SULATask``, main condition) with the model's label token ids (``task.label_token_ids``)."""
    def render(ctx: Context) -> str:
        return task.render([w for w, _ in ctx.examples], [o for _, o in ctx.examples], ctx.query)

    def exact(contexts: Sequence[Context]) -> np.ndarray:
        n1 = np.array([sum(o == 0 for _, o in c.examples) for c in contexts])
        k = np.array([c.k for c in contexts])
        pi = posterior_label1(n1, k - n1, task.alpha)
        p1 = task.alpha * pi + (1 - task.alpha) * (1 - pi)  # the next label's predictive, not pi itself
        return np.column_stack([p1, 1 - p1])

    def next_inputs(ctx: Context, rng: np.random.Generator) -> tuple[str, str]:
        used = {w for w, _ in ctx.examples} | {ctx.query}
        free = [w for w in CARRIERS if w not in used]
        return ctx.query, free[int(rng.integers(len(free)))]

    return ExchangeableTask("sula", render, list(label_tokens), exact, next_inputs, enumerate_outcomes=True)


def sula_contexts(task, *, condition: str = "main", seed: int = 42, ks: Sequence[int] | None = None) -> list[Context]:
    """The prompts of ``task.generate(condition, seed)`` as contexts (optionally only those with k in ``ks``)."""
    cols = task.generate(condition, seed)
    return [Context(tuple(zip(words, labels)), query)
            for words, labels, query, k in zip(cols["carriers"], cols["example_labels"], cols["query"], cols["k"])
            if ks is None or k in ks]


def bijection_setup(task) -> ExchangeableTask:
    """The bijection wind-tunnel task (``BijectionTask`` without replacement): keys are token ids 0..V-1, the value
    v is token V + v, and a prompt is ``[k1, V + v1, ..., kj, V + vj, query]`` (as ``kinds.windtunnel.windtunnel_prompts``)."""
    V = task.n_symbols

    def render(ctx: Context) -> list[int]:
        return [t for key, value in ctx.examples for t in (key, V + value)] + [ctx.query]

    def exact(contexts: Sequence[Context]) -> np.ndarray:
        return np.stack([task.predictive(c.examples, c.query) for c in contexts])

    def next_inputs(ctx: Context, rng: np.random.Generator) -> tuple[int, int]:
        used = {key for key, _ in ctx.examples} | {ctx.query}
        free = [key for key in range(V) if key not in used]
        return free[int(rng.integers(len(free)))], ctx.query

    return ExchangeableTask("bijection", render, list(task.hypothesis_ids), exact, next_inputs,
                            enumerate_outcomes=False)


def bijection_contexts(task, ks: Sequence[int], per_k: int, *, seed: int = 0) -> list[Context]:
    """``per_k`` contexts for each k: the first k revealed pairs of a fresh sequence and its (k+1)-th key as query."""
    batch = task.sample(per_k * len(ks), seed=seed)
    keys, values = batch.input_ids[:, 0::2].tolist(), batch.labels.tolist()
    out = []
    for i, k in enumerate(np.repeat(ks, per_k).tolist()):
        out.append(Context(tuple(zip(keys[i][:k], values[i][:k])), keys[i][k]))
    return out


def model_predictor(model, setup: ExchangeableTask, *, batch_size: int | None = None) -> Predictor:
    """The model's next-token distribution at the end of each rendered context, renormalised over the outcome
    tokens (``model.collect.collect`` with ``label_tokens``). Predictions are memoised by prompt: the same prompt in two
    calls (today's context and its identity order, say) runs once."""
    cache: dict[Any, np.ndarray] = {}

    def key(ctx: Context):
        prompt = setup.render(ctx)
        return prompt if isinstance(prompt, str) else tuple(prompt)

    def predict(contexts: Sequence[Context]) -> np.ndarray:
        keys = [key(c) for c in contexts]
        todo = list(dict.fromkeys(k for k in keys if k not in cache))
        if todo:
            acts = collect(model, [k if isinstance(k, str) else list(k) for k in todo], readings=(),
                           label_tokens=setup.outcome_tokens, batch_size=batch_size, progress=False)
            for k, lp in zip(todo, acts.label_logprobs.double().exp().numpy()):
                cache[k] = lp
        return np.stack([cache[k] for k in keys])

    return predict


def _orders(k: int, n_perms: int, rng: np.random.Generator) -> list[tuple[int, ...]]:
    """The identity and up to ``n_perms - 1`` other distinct orders of k items (all of them when there are few)."""
    if math.factorial(k) <= n_perms:
        return list(itertools.permutations(range(k)))
    orders = {tuple(range(k))}
    while len(orders) < n_perms:
        orders.add(tuple(rng.permutation(k).tolist()))
    return [tuple(range(k))] + sorted(orders - {tuple(range(k))})


def order_sensitivity(predict: Predictor, contexts: Sequence[Context], *, n_perms: int = 6,
                      seed: int = 0) -> dict[str, np.ndarray]:
    """Per context: the Jensen-Shannon spread (bits) and the standard deviation of the top outcome's probability
    across distinct orders of its examples, and the number of orders compared (1 for k < 2: no spread)."""
    rng = np.random.default_rng(seed)
    orders = [_orders(c.k, n_perms, rng) for c in contexts]
    flat = [Context(tuple(c.examples[i] for i in order), c.query) for c, os in zip(contexts, orders) for order in os]
    preds = predict(flat)
    js, sd, start = np.empty(len(contexts)), np.empty(len(contexts)), 0
    for i, os in enumerate(orders):
        p = preds[start:start + len(os)]
        start += len(os)
        mean = p.mean(0)
        js[i] = max(0.0, info.entropy(mean) - info.entropy(p).mean())  # >= 0; a negative value is rounding
        sd[i] = p[:, mean.argmax()].std()
    return dict(js_bits=js, top_sd=sd, n_orders=np.array([len(os) for os in orders]))


def _multiset_rng(examples: tuple, seed: int) -> tuple[tuple, np.random.Generator]:
    """The examples in a canonical order (sorted by their text) and a generator seeded by ``seed`` and that order:
    the same for every order of the same examples, and stable across processes (not Python's salted ``hash``)."""
    canonical = tuple(sorted(examples, key=repr))
    digest = hashlib.blake2b(repr(canonical).encode(), digest_size=8).digest()
    return canonical, np.random.default_rng([seed, int.from_bytes(digest, "little")])


def order_averaged(predict: Predictor, n_orders: int, *, seed: int = 0) -> Predictor:
    """The exchangeable predictor of ``predict``: per context, the mean of its predictions over ``n_orders`` orders
    of the examples (``_orders``: all k! of them when k! <= n_orders, else the canonical order and n_orders - 1
    others drawn at random), the query kept last.

    The orders are drawn from the examples' canonical order with a generator seeded by ``seed`` and the examples
    themselves, so every order of the same examples gets the same m orders: the average is a function of the
    multiset (exchangeable by construction, as the exact predictor; the order test on it is 0 up to rounding), and
    a deterministic predictor, so the martingale test's null (its own draws) holds for it as for any predictor.
    With k! <= n_orders it is the exact symmetrisation of ``predict``."""
    if n_orders < 1:
        raise ValueError(f"order_averaged needs n_orders >= 1 (got {n_orders}); set the number of orderings to "
                         "average over to 1 or more.")

    def predict_averaged(contexts: Sequence[Context]) -> np.ndarray:
        flat, sizes = [], []
        for c in contexts:
            canonical, rng = _multiset_rng(c.examples, seed)
            orders = _orders(c.k, n_orders, rng)
            flat += [Context(tuple(canonical[i] for i in order), c.query) for order in orders]
            sizes.append(len(orders))
        preds = predict(flat)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        return np.stack([preds[a:a + n].mean(0) for a, n in zip(starts, sizes)])

    return predict_averaged


def _kl_bits(m: np.ndarray, p: np.ndarray) -> np.ndarray:
    """KL(m || p) per row in bits, >= 0 (a negative value is rounding)."""
    with np.errstate(divide="ignore"):  # p = 0 where m > 0: an infinite KL, as it should be
        return np.maximum(info.kl_from_probs(m, np.log(p)), 0.0)


def _gap_stats(m: np.ndarray, m0: np.ndarray, p: np.ndarray) -> dict[str, np.ndarray]:
    """The plug-in gap statistics of ``martingale_gap`` from m, m0 and p ([n, n_outcomes] each)."""
    top, rows = m0.argmax(-1), np.arange(len(p))
    return dict(kl_bits=_kl_bits(m, m0), tv=0.5 * np.abs(m - m0).sum(-1), drift_top=m[rows, top] - m0[rows, top],
                kl_today_bits=_kl_bits(m, p), kl_floor_bits=_kl_bits(m0, p))


def debiased_gap_bits(next_draws: np.ndarray, same_draws: np.ndarray, today: np.ndarray) -> np.ndarray:
    """Per context, an unbiased estimate of the true gap chi2(mu || m0) / (2 ln 2) in bits (~ KL(mu || m0) for small
    gaps), mu the predictor's expected next prediction: the U-statistic mean over pairs of distinct draws j != l of
    <d_j, d_l>_W, d = next - same, weights W = 1 / today (fixed given the context; 0 where today is 0).

    Under the martingale hypothesis every d_j has mean 0 and the draws are independent, so its expectation is exactly
    0 for any predictor, however noisy its draws: the plug-in KL(m || m0) instead carries the draws' own noise
    (its mean is > 0 under the hypothesis, and larger for a sharper predictor), which is why a band from another
    predictor (the exact one) is not a null for this one. NaN with fewer than 2 draws."""
    d = next_draws - same_draws  # [n, D, O]
    D = d.shape[1]
    if D < 2:
        return np.full(len(d), np.nan)
    w = np.where(today > 0, 1.0 / np.where(today > 0, today, 1.0), 0.0)[:, None, :]
    pairs = (d.sum(1, keepdims=True) ** 2 * w).sum((1, 2)) - (d**2 * w).sum((1, 2))  # sum over j != l of <d_j, d_l>
    return pairs / (D * (D - 1)) / (2 * info.LN2)


def martingale_gap(predict: Predictor, contexts: Sequence[Context], setup: ExchangeableTask, *, n_draws: int = 4,
                   seed: int = 0) -> dict[str, np.ndarray]:
    """Per context, with m the mean prediction at the fresh queries after one more example drawn from the
    predictor's own predictive, m0 the mean prediction at the same fresh queries without it, and p today's:

    - ``kl_bits`` = KL(m || m0), the martingale gap (bits): the same queries, with and without the new example, so a
      model's sensitivity to the query itself cancels (the law of total probability any coherent predictor obeys);
    - ``tv`` = |m - m0|_1 / 2 and ``drift_top`` = m[top] - m0[top] (top = argmax m0: > 0 when the predictor grows
      more confident in its own guess than its predictive justifies);
    - ``kl_today_bits`` = KL(m || p), the gap against today's prediction, and ``kl_floor_bits`` = KL(m0 || p), what
      changing the query alone does (both equal 0 and ``kl_bits`` where the query stays, as in the bijection);
    - ``next_draws`` and ``same_draws`` ([n, n_draws, n_outcomes]): each draw's prediction with the new example
      (its outcomes' average where they are enumerated) and without it; m and m0 are their means over the draws.
      ``debiased_bits`` is the gap estimated from them without the draws' noise (``debiased_gap_bits``).

    The random draws depend only on ``seed`` and the contexts, never on the predictor, so two predictors see the
    same draws (common random numbers)."""
    rng = np.random.default_rng(seed)
    draws = [(i, *setup.next_inputs(c, rng), rng.random()) for i, c in enumerate(contexts) for _ in range(n_draws)]
    p = predict(contexts)  # [n, n_outcomes]
    at_x = predict([Context(contexts[i].examples, x) for i, x, _, _ in draws])  # predictive for the new example
    nexts, weights, owner = [], [], []
    for d, ((i, x, query, u), q) in enumerate(zip(draws, at_x)):
        outcomes = range(len(q)) if setup.enumerate_outcomes else \
            [min(int(np.searchsorted(np.cumsum(q), u * q.sum(), side="right")), len(q) - 1)]
        for o in outcomes:
            nexts.append(Context(contexts[i].examples + ((x, o),), query))
            weights.append(q[o] if setup.enumerate_outcomes else 1.0)
            owner.append(d)  # draws are laid out context by context, n_draws each
    shape = (len(contexts), n_draws, p.shape[1])
    next_draws = np.zeros((len(draws), p.shape[1]))
    np.add.at(next_draws, np.array(owner), predict(nexts) * np.array(weights)[:, None])
    same_draws = predict([Context(contexts[i].examples, query) for i, _, query, _ in draws])
    next_draws, same_draws = next_draws.reshape(shape), same_draws.reshape(shape)
    return dict(**_gap_stats(next_draws.mean(1), same_draws.mean(1), p),
                debiased_bits=debiased_gap_bits(next_draws, same_draws, p), next_draws=next_draws,
                same_draws=same_draws, today=p)


ORDER_STATS = ("js_bits", "top_sd")
GAP_STATS = ("debiased_bits", "kl_bits", "drift_top", "tv", "kl_today_bits", "kl_floor_bits")
FLOAT_FLOOR = 1e-4  # bits: a model computed in float32 differs from itself by about this across batch layouts
UNITS = dict(js_bits="bits", top_sd="probability", debiased_bits="bits", kl_bits="bits", tv="probability",
             drift_top="probability", kl_today_bits="bits", kl_floor_bits="bits")
OWN_NULL = "the predictor's own draws under the martingale hypothesis, 95%"
NULLS = dict(js_bits="exact predictor", top_sd="exact predictor", debiased_bits=OWN_NULL, kl_bits=OWN_NULL,
             drift_top=OWN_NULL, kl_floor_bits="exact predictor, Monte-Carlo 95%")  # tv, kl_today: descriptive


AVERAGED = "averaged_"  # metric prefix of the order-averaged predictor's rows
EXPECTATION_GAP = "expectation_gap_debiased_bits"  # per-order minus order-averaged debiased gap, per k
GAP_ROW = "martingale_gap_debiased_bits"  # the test's statistic (its exact predictor's row: exact_ + this)
GAP_OVER_K = "martingale_gap_debiased_bits_over_k"  # the same pooled over every k: the claim's one decision


def _stat_rows(per_k: list[dict], task: str, prefix: str, extra: dict) -> list[Row]:
    """``MartingaleReport.rows`` for one predictor's per-k entries (metric names prefixed, scope extended)."""
    out = []
    for entry in per_k:
        for stat in ORDER_STATS + GAP_STATS:
            if stat not in entry:
                continue
            model, null = entry[stat], entry.get(f"null_{stat}")
            kind = "order_sensitivity" if stat in ORDER_STATS else "martingale_gap"
            note = []
            if f"exact_{stat}" in entry:
                ex = entry[f"exact_{stat}"]
                note.append(f"exact predictor {ex['value']:.4g} (Monte-Carlo {ex['range'][0]:.4g}, "
                            f"{ex['range'][1]:.4g})")
            if f"p_{stat}" in entry:
                note.append(f"p = {entry[f'p_{stat}']:.3g} against the null as drawn")
            low = high = None
            if null is not None:
                floor = FLOAT_FLOOR if UNITS[stat] == "bits" else 0.0
                low, high = null["range"][0], max(null["range"][1], floor)
                if floor > null["range"][1]:
                    note.insert(0, f"null widened to the float32 floor of {FLOAT_FLOOR:g} bits")
            out.append(Row(f"{prefix}{kind}_{stat}", model["mean"], UNITS[stat], dict(task=task, k=entry["k"], **extra),
                           model["ci"][0], model["ci"][1], "bootstrap 95%", low, high,
                           NULLS[stat] if null is not None else None, entry["n"], note="; ".join(note) or None,
                           test=entry.get(f"test_{stat}")))
    return out


def _overall_row(overall: dict, task: str, prefix: str, extra: dict) -> list[Row]:
    """The debiased gap pooled over k (``GAP_OVER_K``) with its null and sequential test; [] when not computed."""
    if not overall:
        return []
    stat, null = overall["debiased_bits"], overall["null_debiased_bits"]["range"]
    return [Row(f"{prefix}{GAP_OVER_K}", stat["mean"], "bits", dict(task=task, **extra), stat["ci"][0], stat["ci"][1],
                "bootstrap 95%", null[0], max(null[1], FLOAT_FLOOR), NULLS["debiased_bits"], overall["n"],
                test=overall["test_debiased_bits"])]


@dataclass
class MartingaleReport:
    """Per k: the predictor's order sensitivity and martingale gap (mean over contexts, bootstrap 95% interval),
    each beside a null valid for the predictor under test (``martingale_test``) where one exists, and the exact
    predictor's gap under the same draws with its Monte-Carlo range (``exact_*``) as a reference. With
    ``n_orders`` > 0 the same per k for the order-averaged predictor (``averaged``) and the per-order minus averaged
    debiased gap (``expectation``)."""

    task: str
    per_k: list[dict]
    params: dict
    per_context: dict = field(default_factory=dict, repr=False)  # statistic -> [n_contexts] for the model
    averaged: list[dict] = field(default_factory=list)  # per k, the order-averaged predictor ([]: not run)
    expectation: list[dict] = field(default_factory=list)  # per k, per order minus averaged
    overall: dict = field(default_factory=dict)  # the debiased gap pooled over k, with its test (one decision)
    overall_averaged: dict = field(default_factory=dict)  # the same for the order-averaged predictor

    def rows(self) -> list[Row]:
        """Tidy rows per k and statistic: the predictor's mean with its bootstrap interval, beside its null's 95%
        range (``NULLS``), the upper end widened to the float32 floor for statistics in bits: a gap below
        ``FLOAT_FLOOR`` cannot be told from arithmetic noise (part of the power floor). ``tv`` and
        ``kl_today_bits`` have no null (biased up by the draws' noise; descriptive). The order-averaged predictor's
        rows are the same statistics prefixed ``averaged_`` with ``orders`` (m) in their scope; ``EXPECTATION_GAP``
        is the per-order minus averaged debiased gap, against its paired bootstrap recentred at 0."""
        out = _stat_rows(self.per_k, self.task, "", {}) + _overall_row(self.overall, self.task, "", {})
        if self.averaged:
            out += _stat_rows(self.averaged, self.task, AVERAGED, dict(orders=self.params["n_orders"]))
            out += _overall_row(self.overall_averaged, self.task, AVERAGED, dict(orders=self.params["n_orders"]))
            for entry in self.per_k:  # the exact predictor beside both (exchangeable: one value for both)
                ex = entry["exact_debiased_bits"]
                out.append(Row(f"exact_{GAP_ROW}", ex["value"], "bits", dict(task=self.task, k=entry["k"]),
                               ex["range"][0], ex["range"][1], "exact predictor, Monte-Carlo 95%", n=entry["n"]))
        for e in self.expectation:
            out.append(Row(EXPECTATION_GAP, e["mean"], "bits", dict(task=self.task, k=e["k"],
                                                                     orders=self.params["n_orders"]),
                           e["ci"][0], e["ci"][1], "bootstrap 95%", e["null"][0], e["null"][1],
                           "paired bootstrap over contexts, recentred at 0, 95%", e["n"],
                           note=f"p = {e['p']:.3g} against the null as drawn", test=e["test"]))
        return out


def _boot(x: np.ndarray, n_boot: int, rng: np.random.Generator) -> tuple[dict, dict, dict]:
    """The mean of ``x`` with its bootstrap interval, that bootstrap recentred at 0 (the null of a statistic whose
    mean is 0 under the hypothesis, the contexts independent), and the sequential test of the mean against further
    recentred draws (``stats.sequential_test``: drawn until the decision is settled, at most 10 x ``n_boot``; a
    bootstrap of a mean is one matrix product, so the cap can be generous)."""
    mean, boots = float(x.mean()), bootstrap_mean_draws(x, n_boot=n_boot, seed=rng)
    low, high = interval(boots)
    test = sequential_test(lambda b: bootstrap_mean_draws(x, n_boot=b, seed=rng) - mean, mean, cap=10 * n_boot)
    return dict(mean=mean, ci=[low, high]), dict(value=0.0, range=[low - mean, high - mean]), test.as_dict()


def _per_k(predict: Predictor, setup: ExchangeableTask, contexts: Sequence[Context], *, n_perms: int, n_draws: int,
           n_boot: int, seed: int, exact: dict) -> tuple[list[dict], dict]:
    """Per-k entries (``MartingaleReport.per_k``) and per-context statistics of one predictor; ``exact`` holds the
    exact predictor's order and gap statistics under the same draws and its Monte-Carlo replicates."""
    order = order_sensitivity(predict, contexts, n_perms=n_perms, seed=seed)
    gap = martingale_gap(predict, contexts, setup, n_draws=n_draws, seed=seed)
    ks = np.array([c.k for c in contexts])
    rng = np.random.default_rng(seed)
    per_k = []
    for k in sorted(set(ks.tolist())):
        sel = ks == k
        entry: dict = dict(k=int(k), n=int(sel.sum()))
        if k >= 2:
            for stat in ORDER_STATS:
                entry[stat], _, _ = _boot(order[stat][sel], n_boot, rng)
                null = float(exact["order"][stat][sel].mean())
                # exact: no Monte-Carlo part; from 0, as a statistic >= 0 and the exact value is rounding
                entry[f"null_{stat}"] = dict(value=null, range=[min(0.0, null), null])
            entry["n_orders"] = float(order["n_orders"][sel].mean())
        for stat in GAP_STATS:
            entry[stat], recentred, test = _boot(gap[stat][sel], n_boot, rng)
            reps = np.array([r[stat][sel].mean() for r in exact["replicates"]]) if exact["replicates"] \
                else np.array([np.nan])
            entry[f"exact_{stat}"] = dict(value=float(exact["gap"][stat][sel].mean()), range=interval(reps))
            if stat in ("debiased_bits", "drift_top"):  # mean 0 under the hypothesis: the bootstrap, recentred
                entry[f"null_{stat}"], entry[f"p_{stat}"], entry[f"test_{stat}"] = recentred, test["p"], test
        shift = entry["kl_bits"]["mean"] - entry["debiased_bits"]["mean"]  # the plug-in's noise part
        entry["null_kl_bits"] = dict(value=shift, range=[shift + x for x in entry["null_debiased_bits"]["range"]])
        entry["null_kl_floor_bits"] = entry["exact_kl_floor_bits"]  # the query alone: the exact predictor's is 0
        per_k.append(entry)
    per_context = dict(k=ks.tolist(), **{s: order[s].tolist() for s in ORDER_STATS},
                       **{s: gap[s].tolist() for s in GAP_STATS})
    # one decision over k: the debiased gap pooled over every context (mean 0 under the hypothesis at every k, so
    # at their mean), against its own recentred bootstrap: a small violation at every k adds up here
    stat, null, test = _boot(gap["debiased_bits"], n_boot, rng)
    overall = dict(n=len(ks), debiased_bits=stat, null_debiased_bits=null, test_debiased_bits=test)
    return per_k, per_context, overall


def martingale_test(model, setup: ExchangeableTask, contexts: Sequence[Context], *, n_perms: int = 6,
                    n_draws: int = 4, n_null: int = 100, n_boot: int = 1000, seed: int = 0,
                    batch_size: int | None = None, predictor: Predictor | None = None, n_orders: int = 0,
                    order_seed: int = 0) -> MartingaleReport:
    """Order sensitivity and martingale gap of ``model`` on ``contexts``, per k, each against a null valid for it.

    ``predictor`` replaces the model (any function of contexts, e.g. a toy predictor in a test); ``model`` may then
    be None. Order sensitivity is reported for k >= 2 (one example has one order), against the exact predictor's
    (computed, not assumed; 0).

    The martingale test is the predictor's own: ``debiased_bits`` (``debiased_gap_bits``) has mean exactly 0 under
    the hypothesis whatever the predictor's noise, so its null is its own bootstrap distribution over contexts
    recentred at 0 ([low - mean, high - mean]: the contexts are independent, their draws are the noise), with the
    p-value of the mean against those draws (``p_debiased_bits``). The plug-in ``kl_bits`` is placed against the
    same band moved to its noise level (kl - debiased: where the plug-in sits for a martingale with this
    predictor's draws), so both give one verdict; ``drift_top`` (mean 0 under the hypothesis) against its own
    recentred bootstrap. The exact predictor's statistics under the same draws and their Monte-Carlo range over
    ``n_null`` further sets of draws are kept (``exact_*``), as a reference only: that band is the exact
    predictor's noise, and a flatter martingale scores below it.

    ``n_orders`` = m > 0 also runs every statistic on the order-averaged predictor (``order_averaged`` over m
    orders, seeded by ``order_seed``) with the same contexts, draws and nulls built the same way (its own draws, so
    the smoothing the averaging brings is in its null too), and the per-order minus averaged debiased gap per k
    with a paired bootstrap over contexts (``expectation``). It costs about m times the gap's forwards.

    Power floor: the band's half-width, set by the draws' noise over ``n_draws`` x contexts per k (it shrinks as
    1 / sqrt of their product), and never below ``FLOAT_FLOOR`` for the statistics in bits (docs/rivals.md measures
    both on planted predictors).
    """
    if n_draws < 2:
        raise ValueError("The martingale test needs n_draws >= 2 (its null is built from the spread of the "
                         "predictor's own draws); set n_draws to 2 or more.")
    if n_orders < 0:
        raise ValueError(f"n_orders must be >= 0 (got {n_orders}); use 0 for the per-order test alone or m > 0 to "
                         "add the predictor averaged over m orderings.")
    predict = predictor or model_predictor(model, setup, batch_size=batch_size)
    exact = dict(order=order_sensitivity(setup.exact, contexts, n_perms=n_perms, seed=seed),
                 gap=martingale_gap(setup.exact, contexts, setup, n_draws=n_draws, seed=seed),
                 replicates=[martingale_gap(setup.exact, contexts, setup, n_draws=n_draws, seed=seed + 1 + r)
                             for r in range(n_null)])
    kw = dict(n_perms=n_perms, n_draws=n_draws, n_boot=n_boot, seed=seed, exact=exact)
    per_k, per_context, overall = _per_k(predict, setup, contexts, **kw)
    averaged, expectation, overall_avg = [], [], {}
    if n_orders:
        averaged, per_context_avg, overall_avg = _per_k(order_averaged(predict, n_orders, seed=order_seed), setup,
                                                        contexts, **kw)
        ks = np.array(per_context["k"])
        diff = np.array(per_context["debiased_bits"]) - np.array(per_context_avg["debiased_bits"])
        rng = np.random.default_rng([seed, n_orders])
        for k in sorted(set(ks.tolist())):
            stat, null, test = _boot(diff[ks == k], n_boot, rng)  # paired: the same contexts and draws
            expectation.append(dict(k=int(k), n=int((ks == k).sum()), **stat, null=null["range"], p=test["p"],
                                    test=test))
        per_context |= {f"{AVERAGED}{s}": v for s, v in per_context_avg.items() if s != "k"}
    params = dict(n_perms=n_perms, n_draws=n_draws, n_null=n_null, n_boot=n_boot, seed=seed, n_orders=n_orders,
                  order_seed=order_seed, outcomes="enumerated" if setup.enumerate_outcomes else "sampled",
                  n_contexts=len(contexts))
    return MartingaleReport(setup.name, per_k, params, per_context, averaged, expectation, overall, overall_avg)
