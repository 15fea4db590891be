"""A Gaussian in-context task for LLMs (after Sarfati et al. 2026), with its exact Normal-Inverse-Gamma posterior.

Each sequence has its own (mu, sigma^2) from the conjugate prior NIG(mu0, kappa0, alpha0, beta0):

    sigma^2 ~ InvGamma(alpha0, beta0),   mu | sigma^2 ~ N(mu0, sigma^2 / kappa0),   x_i ~ N(mu, sigma^2) iid,

and shows the draws rounded to integers, comma-delimited with no spaces and a trailing comma, as in the authors'
code: ``"4,6,5,3,"``. The model's next token after the comma is its belief about the next number.

**The number tokens.** SmolLM2's tokenizer splits numbers into digits (" 37" is three tokens: " ", "3", "7"), so
the only integers that are one token each are 0..9; the shown range is ``LOW..HIGH`` = 0..9 and
``number_token_ids`` checks, for any tokenizer, that every integer of the range is one token in this format.

**What the exact posterior conditions on.** The shown integers x_1..x_n, taken as the observations of the continuous
model above: ``posterior`` is the conjugate NIG update on them, and ``predictive`` the Student-t
t_{2 alpha_n}(mu_n, beta_n (kappa_n + 1) / (alpha_n kappa_n)) of the next draw. That predictive is then put through
the same rendering as the data: the mass of the t on [j - 1/2, j + 1/2] for each shown integer j, renormalised over
the range (``discrete_predictive``). The rendering's rounding (a width-1 bin) and the sampler's rejection of
sequences with a draw outside the range are not in the likelihood: the "exact" Bayes predictor is the one of the
stated continuous model given the numbers on the page, not of the sampler's censored process. The sampler records
how many sequences it rejected (``rejected``), so the size of that selection is visible.

Prompts: one sequence of ``max(ns)`` draws per group, and one prompt per prefix length n in ``ns`` (the prefixes
of a sequence share its draws, so the sequence is the unit of independence: column ``sequence``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special, stats

from ..core.errors import ConfigError, PromptError
from .base import as_rng

LOW, HIGH = 0, 9  # the shown integers: SmolLM2's one-token numbers
DELIMITER = ","
MAX_REJECTIONS = 10_000  # a prior that almost never keeps every draw in range is a configuration error


@dataclass(frozen=True)
class NIG:
    """Normal-Inverse-Gamma parameters (arrays broadcast): mu | sigma^2 ~ N(mu, sigma^2/kappa) and
    sigma^2 ~ InvGamma(alpha, beta)."""

    mu: np.ndarray | float
    kappa: np.ndarray | float
    alpha: np.ndarray | float
    beta: np.ndarray | float


def posterior(prior: NIG, data: Sequence[Sequence[float]]) -> NIG:
    """The conjugate update of ``prior`` on each observation list in ``data`` (lists may differ in length):
    kappa_n = kappa0 + n, mu_n = (kappa0 mu0 + n xbar) / kappa_n, alpha_n = alpha0 + n/2,
    beta_n = beta0 + S/2 + kappa0 n (xbar - mu0)^2 / (2 kappa_n), S the sum of squares around xbar."""
    n = np.array([len(x) for x in data], dtype=np.float64)
    total = np.array([np.sum(x, dtype=np.float64) for x in data])
    xbar = np.divide(total, n, out=np.zeros_like(total), where=n > 0)
    ss = np.array([np.sum((np.asarray(x, np.float64) - m) ** 2) for x, m in zip(data, xbar)])
    kappa = prior.kappa + n
    return NIG(mu=(prior.kappa * prior.mu + n * xbar) / kappa, kappa=kappa, alpha=prior.alpha + n / 2,
               beta=prior.beta + ss / 2 + prior.kappa * n * (xbar - prior.mu) ** 2 / (2 * kappa))


def predictive(post: NIG):
    """The predictive of the next draw, a frozen ``scipy.stats.t`` (df 2 alpha, loc mu, scale^2 beta (kappa + 1) /
    (alpha kappa))."""
    scale = np.sqrt(post.beta * (post.kappa + 1) / (post.alpha * post.kappa))
    return stats.t(df=2 * np.asarray(post.alpha), loc=post.mu, scale=scale)


def discrete_predictive(post: NIG, low: int = LOW, high: int = HIGH) -> np.ndarray:
    """[n_prompts, high - low + 1]: the predictive's mass on [j - 1/2, j + 1/2] for j = low..high, renormalised over
    the range (the rendering of the data applied to the next draw)."""
    column = [np.asarray(getattr(post, f), np.float64)[..., None] for f in ("mu", "kappa", "alpha", "beta")]
    t = predictive(NIG(*column))  # [n, 1] parameters against [J + 1] edges
    edges = np.arange(low, high + 2) - 0.5  # [J + 1]
    cdf = t.cdf(edges)  # [n, J + 1]
    mass = np.diff(cdf, axis=-1)
    return mass / mass.sum(-1, keepdims=True)


def posterior_sigma_mean(post: NIG) -> np.ndarray:
    """E[sigma | data] = sqrt(beta) Gamma(alpha - 1/2) / Gamma(alpha) (sigma^2 ~ IG(alpha, beta))."""
    return np.sqrt(post.beta) * np.exp(special.gammaln(np.asarray(post.alpha) - 0.5) - special.gammaln(post.alpha))


def posterior_mu_sd(post: NIG) -> np.ndarray:
    """sd[mu | data]: mu's marginal is t_{2 alpha}(mu_n, beta / (alpha kappa)), variance beta / ((alpha - 1) kappa)."""
    return np.sqrt(post.beta / ((post.alpha - 1) * post.kappa))


def moments(p: np.ndarray, low: int = LOW) -> tuple[np.ndarray, np.ndarray]:
    """(mean, sd) of distributions ``p`` [..., J] over the integers low..low + J - 1."""
    x = np.arange(low, low + p.shape[-1], dtype=np.float64)
    mean = (p * x).sum(-1)
    return mean, np.sqrt(np.clip((p * x**2).sum(-1) - mean**2, 0.0, None))


def render(numbers: Sequence[int]) -> str:
    """The prompt of shown integers: ``"4,6,5,"`` (trailing delimiter: the next token is the next number). The one
    place the format is written."""
    return "".join(f"{int(x)}{DELIMITER}" for x in numbers)


def parse(text: str) -> list[int]:
    """The shown integers of a prompt ``render`` wrote (refused, in one sentence, when it is not one)."""
    if not re.fullmatch(rf"(\d+{re.escape(DELIMITER)})*", text):
        raise PromptError(f"{text[:40]!r} is not a Gaussian-task prompt (integers each followed by "
                          f"'{DELIMITER}'); build prompts with interp_bayes.tasks.gaussian.render.")
    return [int(s) for s in text.split(DELIMITER)[:-1]]


def number_token_ids(tokenizer, low: int = LOW, high: int = HIGH) -> list[int]:
    """Token ids of the integers low..high as they follow a delimiter in a prompt, checked to be one token each
    (the prompt "x,j," must tokenise as the tokens of "x," followed by j's single token and the delimiter's)."""
    ids = []
    for j in range(low, high + 1):
        head = tokenizer(render([low]), add_special_tokens=False)["input_ids"]
        whole = tokenizer(render([low, j]), add_special_tokens=False)["input_ids"]
        tail = whole[len(head):]
        if whole[:len(head)] != head or len(tail) != 2:
            raise PromptError(f"The integer {j} is not one token after '{DELIMITER}' in this tokenizer (got "
                              f"{len(tail) - 1} tokens); use a range whose integers are single tokens "
                              "(GaussianTask(low=..., high=...)).")
        ids.append(tail[0])
    return ids


@dataclass(frozen=True)
class GaussianTask:
    """Generator of Gaussian-task prompt sets with exact posteriors (see the module docstring).

    The default prior puts mu near the middle of 0..9 (sd sigma / sqrt(kappa0)) and sigma^2 around 1.5
    (E = beta0 / (alpha0 - 1)), so most sequences stay in range and the posterior spread varies with n and sigma."""

    mu0: float = 4.5
    kappa0: float = 1.0
    alpha0: float = 3.0
    beta0: float = 3.0
    ns: tuple[int, ...] = (1, 2, 3, 5, 8, 12, 16, 24)
    low: int = LOW
    high: int = HIGH

    def __post_init__(self) -> None:
        if self.kappa0 <= 0 or self.alpha0 <= 1 or self.beta0 <= 0:
            raise ConfigError(f"The NIG prior needs kappa0 > 0, alpha0 > 1 (a finite E[sigma^2]) and beta0 > 0; got "
                              f"kappa0={self.kappa0}, alpha0={self.alpha0}, beta0={self.beta0}.")
        if not self.ns or min(self.ns) < 1 or list(self.ns) != sorted(set(self.ns)):
            raise ConfigError(f"ns={self.ns} must be increasing prefix lengths of at least 1.")
        if self.high <= self.low:
            raise ConfigError(f"The range low={self.low}..high={self.high} must hold at least two integers.")

    @property
    def prior(self) -> NIG:
        return NIG(self.mu0, self.kappa0, self.alpha0, self.beta0)

    def draw_sequences(self, n_sequences: int, seed: int | np.random.Generator | None = 0
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """(mu [S], sigma [S], shown integers [S, max(ns)], sequences rejected): (mu, sigma^2) from the prior,
        draws rounded, a sequence redrawn whole when a rounded draw falls outside low..high."""
        rng, length = as_rng(seed), max(self.ns)
        mus, sigmas, seqs, rejected = [], [], [], 0
        while len(seqs) < n_sequences:
            var = self.beta0 / rng.gamma(self.alpha0)  # InvGamma(alpha0, beta0)
            mu = rng.normal(self.mu0, np.sqrt(var / self.kappa0))
            x = np.rint(rng.normal(mu, np.sqrt(var), size=length)).astype(int)
            if x.min() < self.low or x.max() > self.high:
                rejected += 1
                if rejected > MAX_REJECTIONS * max(1, len(seqs)):
                    raise ConfigError(f"The prior keeps almost no sequence of {length} draws inside "
                                      f"{self.low}..{self.high}; narrow it (smaller beta0, larger kappa0).")
                continue
            mus.append(mu)
            sigmas.append(np.sqrt(var))
            seqs.append(x)
        return np.array(mus), np.array(sigmas), np.stack(seqs), rejected

    def generate(self, n_sequences: int = 60, seed: int = 0) -> dict[str, list]:
        """Columns of one prompt set, sequence-major (one prompt per sequence and n in ``ns``): text, numbers,
        sequence (the group), n, prompt_id, true_mu, true_sigma, and the exact posterior's summaries
        (``posterior_summary``); ``rejected`` (a list of one number) is the sampler's count of redrawn sequences."""
        mu, sigma, seqs, rejected = self.draw_sequences(n_sequences, seed)
        cols: dict[str, list] = {c: [] for c in ("text", "numbers", "sequence", "n", "prompt_id", "true_mu",
                                                 "true_sigma")}
        for s, seq in enumerate(seqs):
            for n in self.ns:
                shown = [int(v) for v in seq[:n]]
                for key, val in (("text", render(shown)), ("numbers", shown), ("sequence", s), ("n", n),
                                 ("prompt_id", f"g{seed}-s{s}-n{n}"), ("true_mu", float(mu[s])),
                                 ("true_sigma", float(sigma[s]))):
                    cols[key].append(val)
        for key, val in self.posterior_summary(cols["numbers"]).items():
            cols[key] = val.tolist()
        cols["rejected"] = [rejected]
        return cols

    def posterior_summary(self, prompts: Sequence[str] | Sequence[Sequence[int]]) -> dict[str, np.ndarray]:
        """Per prompt (texts ``render`` wrote, or lists of shown integers), the exact posterior's summaries, float64:

        - ``posterior_mean``: E[mu | x] = mu_n (also the mean of the continuous predictive);
        - ``posterior_sigma``: E[sigma | x], the inferred spread of the Gaussian;
        - ``posterior_log_sigma``: its log (the target the decoders fit: spreads vary over a factor of several);
        - ``posterior_mu_sd``: sd[mu | x], the uncertainty about the mean;
        - ``predictive_mean``, ``predictive_sd``: moments of the discretised predictive over low..high;
        - ``kappa_n``, ``alpha_n``, ``beta_n``: the NIG parameters (mu_n is ``posterior_mean``)."""
        data = [parse(p) if isinstance(p, str) else [int(v) for v in p] for p in prompts]
        post = posterior(self.prior, data)
        pm, psd = moments(discrete_predictive(post, self.low, self.high), self.low)
        sig = posterior_sigma_mean(post)
        return dict(posterior_mean=np.asarray(post.mu, np.float64), posterior_sigma=sig,
                    posterior_log_sigma=np.log(sig), posterior_mu_sd=posterior_mu_sd(post), predictive_mean=pm,
                    predictive_sd=psd, kappa_n=np.asarray(post.kappa, np.float64),
                    alpha_n=np.asarray(post.alpha, np.float64), beta_n=np.asarray(post.beta, np.float64))

    def exact_predictive(self, prompts: Sequence[str] | Sequence[Sequence[int]]) -> np.ndarray:
        """[n_prompts, high - low + 1]: the discretised exact predictive of each prompt's next number."""
        data = [parse(p) if isinstance(p, str) else [int(v) for v in p] for p in prompts]
        return discrete_predictive(posterior(self.prior, data), self.low, self.high)


def gaussian_posterior_summary(prompts: Sequence[str] | Sequence[Sequence[int]],
                               task: GaussianTask | None = None) -> dict[str, np.ndarray]:
    """The exact posterior mean and spread (and the other summaries of ``GaussianTask.posterior_summary``) of each
    Gaussian-task prompt, under ``task``'s prior (default ``GaussianTask()``): what a caller needs to pick a donor
    prompt whose posterior has a target spread."""
    return (task or GaussianTask()).posterior_summary(prompts)
