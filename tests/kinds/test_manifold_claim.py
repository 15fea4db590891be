"""The mixed-pool claim "PC1 tracks next-token entropy beyond prompt length" on SmolLM2's own rows (issue 36).

Its verdict is decided by the closed test's global test (max(|partial|, |within|) against the within-length
permutations): partial and within sit at α (p 0.0497 and 0.0468 from 200,000 permutations, `bench/manifold_p.py`),
so neither clears unless the global test rejects, and its p is 0.0927 [0.0900, 0.0954]: the claim does not hold.
At the recipe's former cap of 1,000 permutations the global test settled at one seed in five (seed 3, after 400
draws) and stopped undecided at the others, so the ledger read "does not hold" at seed 3 and "borderline" at 0, 1, 2
and 4 on the same data.
"""

import json
from pathlib import Path

import numpy as np

from interp_bayes.kinds.common import deconfounded, deconfounded_text
from interp_bayes.run.sweep import load_probe
from interp_bayes.stats import fine_strata
from interp_bayes.stats import ledger as L
from interp_bayes.stats.confounds import nuisance_columns

ROWS = Path(__file__).resolve().parents[1] / "data" / "manifold_mixed_rows.json"


def test_the_mixed_pool_claim_reads_one_verdict_at_every_seed_of_its_draws():
    """The recipe's cap settles the decisive test at every seed: one verdict, "does not hold", at seeds 0-9."""
    data = json.loads(ROWS.read_text())
    p = load_probe("manifold_mixed").params
    lengths = np.asarray(data["lengths"])
    verdicts = []
    for seed in range(10):
        rows = deconfounded(data["pc1"], data["entropy"], nuisance_columns(lengths), p.covariates,
                            fine_strata(lengths, p.stratum_size), "length", n_perm=p.n_perm, seed=seed,
                            metric="corr_pc1", scope=dict(layer=data["layer"], target="entropy"))
        verdicts.append(L.from_deconfounded(deconfounded_text(rows, "corr_pc1", target="entropy")[1]))
    assert verdicts == ["does not hold"] * 10, verdicts
