"""The mixed-pool manifold claim ("PC1 tracks next-token entropy beyond prompt length"): its permutation p-values
measured precisely, and its verdict at many seeds of the draws (issue 36).

Reads a finished run's manifold probe (its ``data.json``: the last layer's PC1 score, the entropy and the token
length of each prompt the recipe drew) and rebuilds the kind's deconfounded correlation from them (the recipe's
covariates and length strata, ``stats.deconfounded_correlation``: the toolkit's own null construction). Then:

1. ``--draws`` within-length permutations with no early stop (the resampling risk set to 1e-300, so that no test
   near α settles): each test's Monte-Carlo p-value, its exact binomial 95% interval and the sequential rule's
   confidence-sequence interval (raw against the plain null, partial, within, and "either", their larger magnitude,
   which clears the two by closed testing);
2. the claim's verdict at ``--seeds`` seeds with the recipe's cap (``--cap``, default the recipe's ``n_perm``), and
   how many seeds each test settled at.

    python bench/manifold_p.py RUN_FOLDER [--probe manifold_mixed] [--draws 200000] [--seeds 100] [--cap N]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from functools import partial
from pathlib import Path
from unittest import mock

import numpy as np
from scipy import stats as sps

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TESTS = ("plain", "partial", "within", "either")


def claim_data(run: str, probe: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, object]:
    """(PC1 score, entropy, covariate design, strata, params) of the probe's prompts at its last layer, as the kind
    passed them to ``deconfounded_correlation``."""
    from interp_bayes.kinds.common import last_layer
    from interp_bayes.report.view import RunView
    from interp_bayes.stats import fine_strata
    from interp_bayes.stats.confounds import nuisance_columns, select_covariates

    view = next(p for p in RunView.load(run).probes() if p.name == probe)
    params, data = view.params_object(), view.data
    lengths = np.asarray(data["lengths"])
    x = np.asarray(data["layers"][str(last_layer(view.rows))]["pc1"])
    cov = select_covariates(nuisance_columns(lengths), params.covariates)
    return x, np.asarray(data["entropy"]), cov, fine_strata(lengths, params.stratum_size), params


def main() -> None:
    from interp_bayes.stats import deconfound, deconfounded_correlation
    from interp_bayes.stats import ledger as L

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run")
    ap.add_argument("--probe", default="manifold_mixed")
    ap.add_argument("--draws", type=int, default=200_000)
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--cap", type=int, default=None)
    ap.add_argument("--stat", default="spearman")
    args = ap.parse_args()
    x, y, cov, strata, params = claim_data(args.run, args.probe)
    print(f"{args.probe}: n {len(x)}, {len(np.unique(strata))} strata, covariates {params.covariates}")

    exact = partial(deconfound.sequential_tests, epsilon=1e-300)
    with mock.patch.object(deconfound, "sequential_tests", exact):
        dec = deconfounded_correlation(x, y, cov, strata, n_perm=args.draws, seed=12345)
    print(f"the p-values from {args.draws} permutations ({args.stat}; observed, p, exact 95% interval, the "
          "sequential rule's 95% confidence-sequence interval):")
    for name in TESTS:
        t = dec.tests.get(name, {}).get(args.stat)
        n = t["draws"]
        s = round(t["p"] * (1 + n) / 2 - 1)  # two-sided: p = 2 (1 + s) / (1 + n), s the smaller tail's count
        lo, hi = (2 * sps.beta.ppf(q, s + a, n - s + b) for q, a, b in ((0.025, 0, 1), (0.975, 1, 0)))
        v = {k: dec.values[k][args.stat] for k in ("raw", "partial", "within")}
        value = dict(v, plain=v["raw"], either=max(abs(v["partial"]), abs(v["within"])))[name]
        print(f"  {name:8s} {value:+.4f}  p = {t['p']:.5f} [{lo:.5f}, {hi:.5f}] (CS [{t['low']:.5f}, "
              f"{t['high']:.5f}]) after {n} draws; decision {t['decision']}")

    cap = args.cap or params.n_perm
    if not args.seeds:
        return
    verdicts, decided, draws = Counter(), Counter(), {name: [] for name in TESTS}
    for seed in range(args.seeds):
        d = deconfounded_correlation(x, y, cov, strata, n_perm=cap, seed=seed)
        verdict = L.from_deconfounded(d.verdict(args.stat))
        verdicts[verdict] += 1
        for name in TESTS:
            t = d.tests[name][args.stat]
            decided[(name, t["decision"])] += 1
            draws[name].append(t["draws"])
        if seed < 5:
            print(f"  seed {seed}: {verdict} (" + ", ".join(
                f"{n} {d.tests[n][args.stat]['decision']} p {d.tests[n][args.stat]['p']:.4f} "
                f"after {d.tests[n][args.stat]['draws']}" for n in TESTS) + ")")
    print(f"cap {cap}, seeds 0-{args.seeds - 1}: verdicts {dict(verdicts)}")
    for name in TESTS:
        print(f"  {name}: " + ", ".join(f"{w} {decided[(name, w)]}" for w in ("reject", "accept", "undecided"))
              + f"; mean draws {np.mean(draws[name]):.0f}")


if __name__ == "__main__":
    main()
