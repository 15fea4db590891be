"""What survives of a raw correlation once a confound is held fixed: one function, one fixed vocabulary."""

from __future__ import annotations

import numpy as np

from .permutation import holm, significant

DECONFOUNDED = ("partial", "within")
VERDICTS = ("no raw effect", "appears only within strata", "inseparable", "reverses within strata", "vanishes",
            "weakens", "survives")


def claim(raw: float, p_raw_plain: float, values: dict[str, float], p: dict[str, float]) -> str:
    """The verdict of a raw correlation ``raw`` (its p-value against a plain permutation null ``p_raw_plain``)
    given its deconfounded values and their p-values against confound-keeping nulls (keys ``partial``,
    ``within``). One of ``VERDICTS``:

    - "no raw effect": the raw number is within its plain null, and no deconfounded one clears its null;
    - "appears only within strata": no raw effect, but a deconfounded number clears (the confound was hiding it);
    - "inseparable": nothing varies once the confound is held fixed (e.g. the bijection's exact entropy within a
      position): the data cannot tell the two apart;
    - "reverses within strata": a deconfounded number clears its null with the sign opposite to the raw one
      (Simpson's case: the raw association is the confound's, and within strata it runs the other way);
    - "vanishes": no deconfounded number clears: the raw correlation is what the confound gives;
    - "survives": both clear with the raw sign and at least half the raw magnitude;
    - "weakens": otherwise (one clears with the raw sign, or both at under half the raw magnitude).

    "Clears" for the two deconfounded readings is Holm's step-down over the pair (``permutation.holm``): each at its
    own 5% would let a confounded null through about 8% of the time (either of two correlated tests), this at most
    5% (``tests/test_stats.py`` plants it).
    """
    cleared = [k for k, ok in zip(DECONFOUNDED, holm([p[k] for k in DECONFOUNDED])) if ok]
    if not significant(p_raw_plain):
        return "appears only within strata" if cleared else "no raw effect"
    if not any(np.isfinite(values[k]) for k in DECONFOUNDED):
        return "inseparable"
    if any(np.sign(values[k]) == -np.sign(raw) for k in cleared):
        return "reverses within strata"
    if not cleared:
        return "vanishes"
    if len(cleared) == len(DECONFOUNDED) and all(abs(values[k]) >= 0.5 * abs(raw) for k in cleared):
        return "survives"
    return "weakens"
