"""Tidy results: one row per number.

Every probe writes its numbers as rows (``probes/<name>/rows.json``): the metric, its scope (layer, k, condition,
layer set, operator, control family, ...), the value, an interval (and what kind of interval), a null range (and
which null), the count it rests on and its unit. The summary, the report, the compare page and ``interp-bayes
results RUN`` are views of these rows; nothing else is read to show a number.
"""

from __future__ import annotations

# .store (yaml) is imported inside the function that writes: reading rows does not need it
import csv
import io
import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable

# a scope key orders the rows of a metric; these come first, in this order, in tables and CSV columns
SCOPE_ORDER = ("condition", "target", "reading", "layer", "layer_set", "op", "family", "k", "stratum", "null")


def _number(x) -> float | None:
    """A plain float (numpy scalars and tensors included); None stays None."""
    return None if x is None else float(x)


@dataclass
class Row:
    """One number with everything needed to read it."""

    metric: str
    value: float | None
    unit: str = ""
    scope: dict[str, Any] = field(default_factory=dict)
    low: float | None = None  # interval around the value ...
    high: float | None = None
    interval: str | None = None  # ... and what it is: "resampled 95%", "bootstrap 95%", "controls 95%", ...
    null_low: float | None = None  # range of the same statistic under a null ...
    null_high: float | None = None
    null: str | None = None  # ... and which null: "permuted", "gaussian", "within-k permutation", ...
    n: int | None = None  # prompts (or draws) the number rests on
    note: str | None = None  # e.g. why a value is NaN
    probe: str = ""  # filled in by the runner: the recipe's name ...
    kind: str = ""  # ... and its kind
    # a sequential Monte-Carlo test of the value against its null (``stats.sequential.Decision.as_dict``): decision,
    # p, its interval (low, high), draws used, alpha, epsilon
    test: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in ("value", "low", "high", "null_low", "null_high"):
            setattr(self, name, _number(getattr(self, name)))
        self.n = None if self.n is None else int(self.n)

    def verdict(self) -> str:
        """Does the number clear its null? "above null", "below null", "within null", or "" without a null."""
        if self.null_low is None or self.null_high is None or self.value is None or math.isnan(self.value):
            return ""
        if self.value > self.null_high:
            return "above null"
        if self.value < self.null_low:
            return "below null"
        return "within null"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Row":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def find(rows: Iterable[Row], metric: str, **scope) -> Row | None:
    """The first row of ``metric`` whose scope holds every given key with the given value (None: key absent)."""
    for row in rows:
        if row.metric == metric and all(row.scope.get(k) == v for k, v in scope.items()):
            return row
    return None


def select(rows: Iterable[Row], metric: str | None = None, **scope) -> list[Row]:
    """Every row of ``metric`` (any metric when None) matching ``scope`` as in ``find``."""
    return [r for r in rows if (metric is None or r.metric == metric)
            and all(r.scope.get(k) == v for k, v in scope.items())]


def write_rows(path: str | Path, rows: list[Row]) -> Path:
    from .store import write_json

    return write_json(path, [r.to_dict() for r in rows])


def read_rows(path: str | Path) -> list[Row]:
    return [Row.from_dict(d) for d in json.loads(Path(path).read_text())]


def scope_columns(rows: Iterable[Row]) -> list[str]:
    """The union of the rows' scope keys, the usual ones first."""
    keys = {k for r in rows for k in r.scope}
    return [k for k in SCOPE_ORDER if k in keys] + sorted(keys - set(SCOPE_ORDER))


COLUMNS = ("probe", "kind", "metric", "value", "low", "high", "interval", "null_low", "null_high", "null", "n",
           "unit", "verdict", "p", "draws", "note")
# which run and model a row of a run folder came from (``report.view.RunView.origins``), so that tables of several
# runs concatenated still say it: the run key (the folder's name), the model as named, a hash of its identity
ORIGIN_COLUMNS = ("run", "model", "model_key")


def records(rows: list[Row], origins: list[dict] | None = None) -> list[dict]:
    """Flat records, one per row: the scope spread into columns, plus the verdict; ``origins`` (one per row) puts
    ``ORIGIN_COLUMNS`` first."""
    scope = scope_columns(rows)
    out = []
    for i, r in enumerate(rows):
        test = r.test or {}
        d = {c: r.verdict() if c == "verdict" else test.get(c) if c in ("p", "draws") else getattr(r, c)
             for c in COLUMNS}
        out.append({**({c: origins[i][c] for c in ORIGIN_COLUMNS} if origins is not None else {}),
                    **{c: d[c] for c in COLUMNS[:3]}, **{k: r.scope.get(k) for k in scope},
                    **{c: d[c] for c in COLUMNS[3:]}})
    return out


def to_csv(rows: list[Row], origins: list[dict] | None = None) -> str:
    recs = records(rows, origins)
    empty = [*(ORIGIN_COLUMNS if origins is not None else ()), *COLUMNS]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(recs[0]) if recs else empty, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: "" if v is None else v for k, v in rec.items()} for rec in recs)
    return buf.getvalue()


def to_json(rows: list[Row], origins: list[dict] | None = None) -> str:
    return json.dumps(records(rows, origins), indent=1)
