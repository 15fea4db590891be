"""One result row: a number with its scope, interval, null and unit, the shape every summary table is built from."""

from __future__ import annotations

import math


def row(metric: str, value: float, *, scope: str = "", low: float = math.nan, high: float = math.nan,
        null_low: float = math.nan, null_high: float = math.nan, n: int | None = None, unit: str = "") -> dict:
    """A tidy row; NaN marks an interval or null the number does not have."""
    return dict(metric=metric, scope=scope, value=float(value), low=float(low), high=float(high),
                null_low=float(null_low), null_high=float(null_high), n=n, unit=unit)
