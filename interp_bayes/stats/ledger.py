"""The claims ledger's rules: how a kind's rows become a verdict on a claim, in one fixed vocabulary
(``VERDICTS``). The kinds choose which rule and which rows decide each of their claims (``Kind.ledger``);
deconfounded correlations keep the verdict of ``stats.verdicts.claim`` (``from_deconfounded`` only translates it
into this vocabulary), so there is no second verdict function for them. The ledger's views (symbols, colours,
tables) are ``report.ledger``."""

from __future__ import annotations

import math
from typing import Iterable

from scipy.stats import norm

from ..core.results import Row
from .permutation import holm
from .resample import CI_LEVEL
from .sequential import REJECT, UNDECIDED

HOLDS, WEAK, FAILS, INSEPARABLE, UNTESTABLE = "holds", "holds weakly", "does not hold", "inseparable", \
    "not testable here"
BORDERLINE = "borderline"  # the Monte-Carlo draws reached their cap without settling the decision


VERDICTS = (HOLDS, WEAK, FAILS, INSEPARABLE, BORDERLINE, UNTESTABLE)
POWER = 0.8  # the power at which a non-rejection's detectable effect is stated


# stats.claim's vocabulary in the ledger's: a claim that a quantity tracks another
_DECONFOUNDED = {"survives": HOLDS, "weakens": WEAK, "appears only within strata": WEAK, "inseparable": INSEPARABLE,
                 "vanishes": FAILS, "no raw effect": FAILS, "reverses within strata": FAILS, "borderline": BORDERLINE}


def _finite(x) -> bool:
    return x is not None and math.isfinite(x)


def _flat_null(row: Row) -> bool:
    """A null with no width at the value itself: the null keeps all there is (e.g. a target that is a function
    of the confound the null preserves), so the data cannot tell the claim from the confound."""
    scale = max(abs(row.value), 1e-12)
    return abs(row.null_high - row.null_low) <= 1e-6 * scale and abs(row.value - row.null_high) <= 1e-6 * scale


def beyond_null(row: Row | None, side: str = "above") -> str:
    """A claim that a number clears its null: ``holds`` when the value lies beyond the null's range on ``side``
    ("above" or "below"), ``does not hold`` when within it or beyond the other side, ``inseparable`` when the null
    is a single point at the value (nothing varies once the confound is kept), ``not testable here`` without a
    finite value or a null. A row with a sequential test (``Row.test``) is decided by it: ``holds`` when it rejected
    with the value on ``side`` of the null's centre, ``borderline`` when its draws reached their cap undecided."""
    if row is None or not _finite(row.value):
        return INSEPARABLE if row is not None and (row.note or "").startswith("the target is a function") \
            else UNTESTABLE
    if not (_finite(row.null_low) and _finite(row.null_high)):
        return UNTESTABLE
    if _flat_null(row):
        return INSEPARABLE
    beyond = row.value > row.null_high if side == "above" else row.value < row.null_low
    if row.test:  # a sequential test decided it: its decision, on the claimed side of the null
        centre = (row.null_low + row.null_high) / 2
        on_side = row.value > centre if side == "above" else row.value < centre
        if row.test["decision"] == UNDECIDED:
            return BORDERLINE if on_side or beyond else FAILS
        return HOLDS if row.test["decision"] == REJECT and on_side else FAILS
    return HOLDS if beyond else FAILS


def detectable(row: Row | None, side: str = "above", power: float = POWER) -> float:
    """The smallest effect (a shift of the statistic from its null's centre, toward ``side``) the test would find
    with probability ``power`` at the toolkit's level: the null's half-range on that side times (z_{1-a/2} +
    z_power) / z_{1-a/2}, the null taken as normal and the effect as a shift of it (half-range 0.171 bits: 0.244
    bits at 80% power). NaN without a finite null."""
    if row is None or not (_finite(row.null_low) and _finite(row.null_high)):
        return float("nan")
    z = norm.isf((1 - CI_LEVEL) / 2)
    half = (row.null_high - row.null_low) / 2
    return float(half * (z + norm.ppf(power)) / z)


def not_beyond_null(row: Row | None, side: str = "above", delta: float | None = None) -> str:
    """A claim that a number stays inside its null on ``side`` (e.g. cutting the axis harms behaviour no more than
    cutting matched random axes: the axis is a readout, not a bottleneck): the negation of ``beyond_null``. With
    the claim's ``delta`` (the effect it says is absent), a non-rejection holds only where the test could have seen
    it (``detectable`` <= delta); otherwise it is "not testable here"."""
    verdict = {HOLDS: FAILS, FAILS: HOLDS}.get(beyond_null(row, side), beyond_null(row, side))
    if verdict == HOLDS and delta is not None and not detectable(row, side) <= delta:
        return UNTESTABLE
    return verdict


def below_margin(row: Row | None, delta: float) -> str:
    """A claim that an excess is smaller than the claim's ``delta`` (e.g. ablating the axis costs less than
    ``delta`` more than ablating matched axes: a readout, not a bottleneck), from a row whose interval was drawn
    until settled against ``delta`` (``Row.test``, two-sided): ``holds`` when the interval lies below ``delta``,
    ``does not hold`` when it lies above, ``borderline`` when it straddles ``delta`` or its draws reached their cap
    undecided; ``not testable here`` without a finite value or a test."""
    if row is None or not _finite(row.value) or not row.test:
        return UNTESTABLE
    if row.test["decision"] != REJECT:
        return BORDERLINE
    return HOLDS if (row.low + row.high) / 2 < delta else FAILS


def decodable(row: Row | None) -> str:
    """A claim that a held-out R² shows something decodable: ``holds`` when it clears its null and its whole
    interval lies above 0 (a negative null alone let an R² of 0.005 read "holds weakly"), ``does not hold``
    otherwise; ``beyond_null``'s other outcomes as they are."""
    verdict = beyond_null(row, "above")
    if verdict == HOLDS and not (_finite(row.low) and row.low > 0):
        return FAILS
    return verdict


def family(rows: Iterable[Row], side: str = "above") -> tuple[list[Row], list[Row]]:
    """One decision over a claim's cells (k, layers): (the cells that survive Holm's step-down over their p-values
    (``Row.test``) on ``side``, the cells whose test reached its cap undecided). A location is named only when it
    survives; the family's chance of naming a null cell is at most the level."""
    rows = [r for r in rows if r.test and _finite(r.test.get("p"))]
    on_side = [(r.value > (r.null_low + r.null_high) / 2) == (side == "above") for r in rows]
    survive = holm([r.test["p"] if ok else float("nan") for r, ok in zip(rows, on_side)])
    return ([r for r, ok in zip(rows, survive) if ok],
            [r for r, ok in zip(rows, survive) if not ok and r.test["decision"] == UNDECIDED])


def from_deconfounded(claim: str | None) -> str:
    """The verdict of a deconfounded correlation (``stats.claim``'s word, as its rows' notes carry it) on a claim
    that the two quantities track each other beyond the confound."""
    return _DECONFOUNDED.get((claim or "").strip(), UNTESTABLE)


def deconfounded_claim(row: Row | None) -> str:
    """``stats.claim``'s word from a deconfounded row's note ("...; claim survives"), "" without one."""
    note = (row.note or "") if row is not None else ""
    return note.rsplit("claim ", 1)[-1].strip() if "claim " in note else ""


def interval_side(row: Row | None, side: str = "above", at: float = 0.0) -> str:
    """A claim that a number lies on ``side`` of ``at`` (e.g. attention entropy falls with depth): ``holds`` when
    its whole interval does, ``holds weakly`` when only the value does, ``does not hold`` otherwise. A row whose
    interval was drawn until settled against ``at`` (``Row.test`` from ``sequential.beyond``) is decided by that
    test: ``holds`` when it rejected, ``borderline`` when its draws reached their cap undecided."""
    if row is None or not _finite(row.value):
        return UNTESTABLE
    sign = 1 if side == "above" else -1
    if sign * (row.value - at) <= 0:
        return FAILS
    if row.test:
        return {REJECT: HOLDS, UNDECIDED: BORDERLINE}.get(row.test["decision"], WEAK)
    edge = row.low if side == "above" else row.high
    return HOLDS if _finite(edge) and sign * (edge - at) > 0 else WEAK


def at_least(verdict: str, row: Row | None, threshold: float) -> str:
    """``verdict`` kept when ``row``'s interval reaches ``threshold`` (its low end does), else a ``holds`` demoted to
    ``holds weakly``: a claim of size (a *dominant* axis, a decodable R², a subspace that controls) on a number that
    clears its null but may be small. The low end, not the point: a point near the threshold lands on either side of
    it with the seed of the draws. A row without a finite low end (no interval) cannot show its size: "holds
    weakly"."""
    if verdict == HOLDS and not (row is not None and _finite(row.low) and row.low >= threshold):
        return WEAK
    return verdict


def below_reference(value: float | None, reference: float | None, strong: float = 0.5) -> str:
    """A claim that an error is small against a reference error of the same run (e.g. the in-context entropy error
    against the shuffled-label control's): ``holds`` at or under ``strong`` times the reference, ``holds weakly``
    under the reference, ``does not hold`` otherwise."""
    if not (_finite(value) and _finite(reference)) or reference <= 0:
        return UNTESTABLE
    return HOLDS if value <= strong * reference else WEAK if value < reference else FAILS


def count_beyond(rows: Iterable[Row], side: str = "above") -> tuple[int, int]:
    """(rows whose value clears its null on ``side``, rows that can be judged), for claims tested at several k."""
    judged = [beyond_null(r, side) for r in rows]
    judged = [v for v in judged if v in (HOLDS, FAILS)]
    return sum(v == HOLDS for v in judged), len(judged)


def none_beyond(rows: Iterable[Row], side: str = "above", delta: float | None = None) -> str:
    """A claim of *no* effect tested at several k (e.g. predictions do not depend on the order of the examples):
    ``holds`` when no k clears its null, ``holds weakly`` when fewer than half do, ``does not hold`` when half or
    more do. With the claim's ``delta``, "holds" needs every k's test to have been able to see it (``detectable``
    <= delta at each k); otherwise "not testable here"."""
    rows = list(rows)
    hit, total = count_beyond(rows, side)
    if total == 0:
        return UNTESTABLE
    verdict = HOLDS if hit == 0 else WEAK if 2 * hit < total else FAILS
    if verdict == HOLDS and delta is not None and not all(detectable(r, side) <= delta for r in rows):
        return UNTESTABLE
    return verdict


def worst(verdicts: Iterable[str]) -> str:
    """The weakest of several verdicts on one claim (a claim stated at several layers holds only as far as its
    weakest test)."""
    order = {FAILS: 0, INSEPARABLE: 1, BORDERLINE: 2, WEAK: 3, HOLDS: 4, UNTESTABLE: 5}
    verdicts = list(verdicts)
    return min(verdicts, key=order.__getitem__) if verdicts else UNTESTABLE


def fmt(row: Row | None, digits: int = 3, pct: bool = False) -> str:
    """'value (interval) vs null [range]', the decisive number as the ledger shows it."""
    if row is None or row.value is None:
        return "—"

    def num(x):
        if not _finite(x):
            return "NaN"
        return f"{100 * x:.1f}%" if pct else f"{x:.{digits}g}"
    text = num(row.value)
    if _finite(row.low) and _finite(row.high):
        text += f" ({(row.interval or 'interval').replace(' 95%', '')} {num(row.low)}, {num(row.high)})"
    if _finite(row.null_low) and _finite(row.null_high):
        text += f" vs {(row.null or 'null').split(' (')[0]} null [{num(row.null_low)}, {num(row.null_high)}]"
    if row.test:
        t = row.test
        text += f", p = {t['p']:.3g} [{t['low']:.3g}, {t['high']:.3g}] after {t['draws']} draws"
    return text


def exceeds(a: Row | None, b: Row | None) -> str:
    """A claim that ``a`` is larger than ``b`` (two numbers of one run): ``holds`` when ``a``'s interval lies
    wholly above ``b``'s, ``holds weakly`` when only the value does, ``does not hold`` otherwise."""
    if a is None or b is None or not (_finite(a.value) and _finite(b.value)):
        return UNTESTABLE
    if a.value <= b.value:
        return FAILS
    return HOLDS if _finite(a.low) and _finite(b.high) and a.low > b.high else WEAK


def small_beside_null(row: Row | None, ceiling: float) -> str:
    """A claim that a number is small (e.g. keys are near-orthogonal, mean |cos| low): ``holds`` when it is within
    or below its null (as small as chance), ``holds weakly`` when above its null but at most ``ceiling``, ``does
    not hold`` above ``ceiling``."""
    verdict = not_beyond_null(row, "above")
    if verdict == FAILS and row.value <= ceiling:
        return WEAK
    return verdict


def magnitude(value: float | None, strong: float, weak: float, larger: bool = True) -> str:
    """A claim of size without a null of its own: ``holds`` at ``strong`` or beyond, ``holds weakly`` at ``weak``
    or beyond, ``does not hold`` otherwise (``larger=False``: small is the claim, e.g. an error in bits)."""
    if not _finite(value):
        return UNTESTABLE
    sign = 1 if larger else -1
    return HOLDS if sign * (value - strong) >= 0 else WEAK if sign * (value - weak) >= 0 else FAILS
