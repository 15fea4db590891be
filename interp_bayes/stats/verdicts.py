"""What survives of a raw correlation once a confound is held fixed: one function, one fixed vocabulary."""

from __future__ import annotations

import itertools

import numpy as np

from .permutation import significant

DECONFOUNDED = ("partial", "within")
VERDICTS = ("no raw effect", "appears only within strata", "inseparable", "reverses within strata", "vanishes",
            "weakens", "survives", "borderline")


def claim(raw: float, p_raw_plain: float, values: dict[str, float], p: dict[str, float]) -> str:
    """The verdict of a raw correlation ``raw`` (its p-value against a plain permutation null ``p_raw_plain``)
    given its deconfounded values and their p-values against confound-keeping nulls (keys ``partial``, ``within``,
    and ``either``: the larger of the two magnitudes against the same permutations). One of ``VERDICTS``
    (``claim_from``); a reading clears by closed testing (``closed_pair``)."""
    return claim_from(raw, significant(p_raw_plain), values,
                      closed_pair({k: significant(p[k]) for k in DECONFOUNDED}, significant(p["either"])))


def closed_pair(each: dict[str, bool | None], either: bool | None) -> dict[str, bool | None]:
    """Which deconfounded readings clear, by closed testing: a reading clears when its own test rejects and so does
    the global test of both (max(|partial|, |within|) against the same permutations). Each at its own 5% would let a
    confounded null through about 8% of the time (either of two correlated tests); this at most 5%
    (``tests/stats/test_family.py`` plants it), with every test at the full level (so as few draws as one test needs).
    Three-valued: True rejected, False not, None undecided at the cap."""
    def both(a, b):
        return False if a is False or b is False else None if a is None or b is None else True

    return {k: both(v, either) for k, v in each.items()}


def claim_from(raw: float, raw_significant: bool | None, values: dict[str, float],
               cleared: dict[str, bool | None]) -> str:
    """The verdict given whether the raw correlation clears its plain null and which deconfounded readings clear
    theirs (True, False, or None: a sequential test undecided at its cap). One of ``VERDICTS``:

    - "no raw effect": the raw number is within its plain null, and no deconfounded one clears its null;
    - "appears only within strata": no raw effect, but a deconfounded number clears (the confound was hiding it);
    - "inseparable": nothing varies once the confound is held fixed (e.g. the bijection's exact entropy within a
      position): the data cannot tell the two apart;
    - "reverses within strata": a deconfounded number clears its null with the sign opposite to the raw one
      (Simpson's case: the raw association is the confound's, and within strata it runs the other way);
    - "vanishes": no deconfounded number clears: the raw correlation is what the confound gives;
    - "survives": both clear with the raw sign and at least half the raw magnitude;
    - "weakens": otherwise (one clears with the raw sign, or both at under half the raw magnitude);
    - "borderline": an undecided test could change the verdict (it is the same for every outcome otherwise).
    """
    open_ = [k for k, v in [("raw", raw_significant), *cleared.items()] if v is None]
    verdicts = set()
    for outcome in itertools.product((False, True), repeat=len(open_)):
        fill = dict(zip(open_, outcome))
        verdicts.add(_claim(raw, fill.get("raw", raw_significant), values,
                            [k for k in DECONFOUNDED if fill.get(k, cleared[k])]))
    return verdicts.pop() if len(verdicts) == 1 else "borderline"


def _claim(raw: float, raw_significant: bool, values: dict[str, float], cleared: list[str]) -> str:
    if not raw_significant:
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
