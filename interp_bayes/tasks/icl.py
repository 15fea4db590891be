"""SULA, the in-context task of Paper III (methods.md §3.7), with its exact posterior and controls.

A prompt lists k examples ``"w1: L, w2: L, ..., wk: L. q:"`` where each w is a decorative sentiment word and each
L one of two nonsense label words. A latent label y is uniform over the pair; every example's label equals y with
probability ``alpha`` (0.9), independently. The Bayes posterior after n1 labels L1 and n2 labels L2 is

    P(y = L1 | D) = alpha^n1 (1-alpha)^n2 / (alpha^n1 (1-alpha)^n2 + alpha^n2 (1-alpha)^n1)

and the model's prediction is its next-token distribution renormalised over the two label tokens.

Conditions (Paper III §5.2, with the evidence ablation done right):
- ``main``: as above;
- ``remap``: another label pair, same posteriors (lexical control);
- ``shuffled``: each example's label an independent fair coin, so the labels carry no evidence: H_Bayes = 1 bit;
- ``label_masked``: the labels, which carry all the evidence, replaced by a mask word: H_Bayes = 1 bit;
- ``carrier_masked``: the paper's ablation, masking the carrier words, which carry no evidence: posterior unchanged;
- ``fixed_k``: k = 8 examples in every prompt, with label splits 8:0, 7:1, 6:2, 5:3 and 4:4 (either label in the
  majority), carriers drawn from words that are one token each for the model: the Bayes entropy then varies while
  k and the prompt's length in tokens stay fixed, so an entropy axis cannot be a k or length axis here.

Two targets (docs/analyses.md): ``bayes_entropy`` is the entropy of the latent posterior p(y | D), today's target;
``predictive_entropy`` is the entropy of the predictive distribution of the query's label, p(label = L1 | D) =
alpha P(y = L1 | D) + (1 - alpha) P(y = L2 | D), the quantity Paper I's Theorem 1 says a loss-minimising model's
prediction equals.
"""

from __future__ import annotations

# datasets is imported inside the one function that builds a Dataset: it takes about a second to load
import math
from dataclasses import dataclass

import numpy as np

from ..core.errors import ConfigError, PromptError
from .base import as_rng

# nonsense words first (the authors' eight, then more that are single tokens in smaller vocabularies, e.g.
# SmolLM2's): semantically unrelated to the sentiment carriers, as the task requires
LABEL_CANDIDATES = ("dax", "lug", "mip", "zorb", "wug", "kep", "tuv", "gax", "pim", "dop", "tob", "sut", "mim",
                    "pom", "zig", "tok")
POSITIVE = ("happy", "joyful", "bright", "kind", "gentle", "brave", "calm", "cheerful", "warm", "lovely", "proud",
            "hopeful", "eager", "grateful", "honest", "lucky", "merry", "noble", "polite", "lively", "sunny", "sweet",
            "tender", "witty", "charming", "clever", "delightful", "fresh", "generous", "glad", "graceful", "jolly",
            "loyal", "peaceful", "radiant")
NEGATIVE = ("sad", "angry", "gloomy", "cruel", "harsh", "cowardly", "tense", "bitter", "cold", "ugly", "ashamed",
            "hopeless", "lazy", "rude", "dishonest", "unlucky", "miserable", "mean", "nasty", "grumpy", "stormy", "sour",
            "rough", "dull", "awkward", "foolish", "dreadful", "stale", "greedy", "upset", "clumsy", "grim", "fickle",
            "anxious", "dark")
CARRIERS = POSITIVE + NEGATIVE  # 70 distinct words
MASK = "[MASK]"
CONDITIONS = ("main", "remap", "shuffled", "label_masked", "carrier_masked", "fixed_k")
FIXED_K = 8
FIXED_K_SPLITS = (8, 7, 6, 5, 4)  # examples carrying the majority label out of FIXED_K


def posterior_label1(n1: np.ndarray | int, n2: np.ndarray | int, alpha: float = 0.9) -> np.ndarray:
    """P(y = L1 | n1 labels L1, n2 labels L2), computed in log-odds form (stable for any counts)."""
    log_odds = (np.asarray(n1) - np.asarray(n2)) * (math.log(alpha) - math.log1p(-alpha))
    return 1.0 / (1.0 + np.exp(-log_odds))


def binary_entropy_bits(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -(p * np.log2(p) + (1 - p) * np.log2(1 - p))
    return np.nan_to_num(h, nan=0.0)


def single_token_words(tokenizer, candidates=LABEL_CANDIDATES, n: int = 4) -> list[str]:
    """The first ``n`` candidate words that are one token with a leading space, then consonant-vowel-consonant
    fallbacks other than the carrier words; the leading space is part of the token because labels follow ': '."""
    found = [w for w in candidates if len(tokenizer(" " + w, add_special_tokens=False)["input_ids"]) == 1]
    if len(found) < n:
        cons, vows = "bcdfghjklmnprstvwxz", "aeiou"
        for word in (a + b + c for a in cons for b in vows for c in cons):
            if word not in found and word not in CARRIERS and \
                    len(tokenizer(" " + word, add_special_tokens=False)["input_ids"]) == 1:
                found.append(word)
            if len(found) >= n:
                break
    if len(found) < n:
        raise PromptError(f"Found only {len(found)} single-token label words in this tokenizer; pass labels= explicitly.")
    return found[:n]


@dataclass(frozen=True)
class SULATask:
    """Generator of SULA prompt sets; 50 prompts for each k in (0, 1, 2, 4, 8) by default, as the authors' code."""

    labels: tuple[str, str] = ("dax", "lug")
    remap_labels: tuple[str, str] = ("mip", "zorb")
    alpha: float = 0.9
    ks: tuple[int, ...] = (0, 1, 2, 4, 8)
    per_k: int = 50
    fixed_carriers: tuple[str, ...] = CARRIERS  # carriers of the fixed_k condition (single tokens for the model)

    @classmethod
    def for_tokenizer(cls, tokenizer, **kw) -> "SULATask":
        """Pick two label pairs that are single tokens in ``tokenizer``, and the carriers that are single tokens at
        the start of a prompt and after a space, so the fixed_k prompts all have the same length in tokens (all the
        carriers when fewer than nine are)."""
        words = single_token_words(tokenizer)
        carriers = tuple(w for w in CARRIERS if all(len(tokenizer(text, add_special_tokens=False)["input_ids"]) == 1
                                                    for text in (w, " " + w)))  # first word, and after a space
        if len(carriers) < FIXED_K + 1:  # too few one-token words: all carriers; lengths then vary a little, and
            carriers = CARRIERS  # the length covariate of the deconfounded statistics takes that out
        return cls(labels=(words[0], words[1]), remap_labels=(words[2], words[3]), fixed_carriers=carriers, **kw)

    def label_token_ids(self, tokenizer, condition: str = "main") -> list[int]:
        """Token ids of the two labels (with their leading space) the model's entropy is renormalised over."""
        pair = self.remap_labels if condition == "remap" else self.labels
        ids = [tokenizer(" " + w, add_special_tokens=False)["input_ids"] for w in pair]
        if any(len(i) != 1 for i in ids):
            raise PromptError(f"Labels {pair} are not single tokens in this tokenizer; use SULATask.for_tokenizer().")
        return [i[0] for i in ids]

    def render(self, carriers, labels, query: str, condition: str = "main") -> str:
        """The prompt text for ``carriers[i]`` labelled ``labels[i]`` (0 or 1: which word of the pair), then
        ``query``; masking follows ``condition``. The one place the SULA format is written."""
        pair = self.remap_labels if condition == "remap" else self.labels
        shown = [MASK if condition == "label_masked" else pair[i] for i in labels]
        words = [MASK if condition == "carrier_masked" else w for w in carriers]
        examples = ", ".join(f"{c}: {lab}" for c, lab in zip(words, shown))
        return f"{examples}. {query}:" if len(carriers) else f"{query}:"

    def generate(self, condition: str = "main", seed: int = 42) -> dict[str, list]:
        """Columns (text, k, n1, n2, latent, p_label1, bayes_entropy, predictive_entropy, condition, carriers,
        example_labels, query) of one prompt set; ``carriers``, ``example_labels`` (0 or 1 per example) and
        ``query`` are the draws the text is rendered from (``render``), unmasked.

        The draws (latent, carriers, example labels) depend only on ``seed``, not on the condition, so the
        conditions (fixed_k aside) are paired prompt by prompt.
        """
        if condition not in CONDITIONS:
            raise ConfigError(f"Unknown SULA condition '{condition}'; choose from {', '.join(CONDITIONS)}.")
        rng = as_rng(seed)
        if condition == "fixed_k":
            return self._fixed_k(rng)
        cols = self._columns()
        for k in self.ks:
            for _ in range(self.per_k):
                latent = int(rng.integers(2))
                words = rng.choice(len(CARRIERS), size=k + 1, replace=False)
                agree = rng.random(k) < self.alpha
                coin = rng.integers(2, size=k)  # used by the shuffled condition only, drawn always (pairing)
                idx = coin if condition == "shuffled" else np.where(agree, latent, 1 - latent)
                n1 = int((idx == 0).sum())
                if condition in ("shuffled", "label_masked"):
                    p1 = 0.5  # labels independent of y, or hidden: the prior
                else:
                    p1 = float(posterior_label1(n1, k - n1, self.alpha))
                carriers, query = [CARRIERS[w] for w in words[:k]], CARRIERS[words[k]]
                self._add(cols, carriers, idx, query, n1, latent, p1, condition)
        return cols

    @staticmethod
    def _columns() -> dict[str, list]:
        return {c: [] for c in ("text", "k", "n1", "n2", "latent", "p_label1", "bayes_entropy", "predictive_entropy",
                                "condition", "carriers", "example_labels", "query")}

    def _add(self, cols: dict, carriers: list[str], labels, query: str, n1: int, latent: int, p1: float,
             condition: str) -> None:
        k = len(carriers)
        predictive = self.alpha * p1 + (1 - self.alpha) * (1 - p1)  # p(query label = L1 | D)
        for key, val in (("text", self.render(carriers, labels, query, condition)), ("k", k), ("n1", n1),
                         ("n2", k - n1), ("latent", latent), ("p_label1", p1),
                         ("bayes_entropy", float(binary_entropy_bits(p1))),
                         ("predictive_entropy", float(binary_entropy_bits(predictive))), ("condition", condition),
                         ("carriers", list(carriers)), ("example_labels", [int(i) for i in labels]),
                         ("query", query)):
            cols[key].append(val)

    def _fixed_k(self, rng: np.random.Generator) -> dict[str, list]:
        """per_k prompts per split (8:0 ... 4:4), the majority label at random, the labels in random order, and the
        latent drawn from its exact posterior given the labels."""
        cols = self._columns()
        for majority in FIXED_K_SPLITS:
            for _ in range(self.per_k):
                n1 = majority if rng.random() < 0.5 else FIXED_K - majority
                idx = rng.permutation(np.r_[np.zeros(n1, int), np.ones(FIXED_K - n1, int)])
                p1 = float(posterior_label1(n1, FIXED_K - n1, self.alpha))
                latent = int(rng.random() >= p1)  # 0 (label 1) with probability p1
                words = rng.choice(len(self.fixed_carriers), size=FIXED_K + 1, replace=False)
                carriers = [self.fixed_carriers[w] for w in words]
                self._add(cols, carriers[:-1], idx, carriers[-1], n1, latent, p1, "fixed_k")
        return cols

    def dataset(self, condition: str = "main", seed: int = 42):
        """The prompt set as a ``datasets.Dataset``."""
        from datasets import Dataset

        return Dataset.from_dict(self.generate(condition, seed))
