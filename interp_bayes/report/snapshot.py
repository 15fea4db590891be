"""Docs that cannot go stale: a committed snapshot of a run's results, and the markdown it fills.

``write_snapshot(run, folder)`` writes what a doc may quote from a finished run: ``results.csv`` (its tidy rows,
exactly as ``interp-bayes results`` exports them), ``ledger.csv`` (its claims and their verdicts) and
``snapshot.json`` (model, seed, package, commit, and each probe's kind, parameters and seconds). Beside them,
``docs.yaml`` (written by hand, never by this module) defines what docs quote from it: tables (which rows, which
columns, how each cell is formatted) and single values.

A markdown file quotes an entry between markers, ``<!-- snapshot NAME/ENTRY -->`` ... ``<!-- /snapshot -->``, NAME a
snapshot folder under ``snapshots/`` beside the file: a table on lines of its own, a value inline in a sentence.
``render`` refills every marker from the snapshot; ``interp-bayes docs FILE...`` writes the result, ``--check`` only
names the markers whose text differs (tests/test_docs.py runs it on docs/).
"""

from __future__ import annotations

# .ledger (scipy) is imported inside the function that writes: `interp-bayes docs --help` imports this module
import csv
import io
import math
import re
import string
import sys
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import ConfigError
from ..core.store import atomic_write_text, read_yaml, write_json
from ..core.results import to_csv
from .view import RunView

RESULTS, LEDGER, META, SPEC = "results.csv", "ledger.csv", "snapshot.json", "docs.yaml"
LEDGER_COLUMNS = ("subject", "key", "claim", "verdict", "evidence")
# a marker and the text it holds; NAME/ENTRY are plain names, so a stray comment is never taken for one, and a
# marker right after a backquote is one quoted in code (a doc describing the syntax), not one to fill
MARKER = re.compile(r"(?<!`)<!-- snapshot ([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+) -->(.*?)<!-- /snapshot -->", re.DOTALL)
AGGREGATES = ("one", "max", "min", "count")


def write_snapshot(run_folder: str | Path, folder: str | Path) -> list[Path]:
    """Write the snapshot files of a finished run into ``folder`` (``docs.yaml`` there is left as it is)."""
    from .ledger import collect

    run = RunView.load(run_folder)
    rows = run.rows()
    if not rows:
        raise ConfigError(f"{run.folder} has no finished probe; run the sweep to the end before snapshotting it.")
    claims = collect(run)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(LEDGER_COLUMNS)
    writer.writerows([c.subject, c.key, c.claim, c.verdict, c.evidence] for c in claims)
    # provenance from the stages themselves: a run folder's env.json is written by its first sweep, and a later
    # version may have computed some or all of its stages since
    meta = dict(model=run.name, seed=run.config.get("seed"), package=_one_or_all(p.package for p in run.probes()),
                git_commit=_one_or_all(p.git_commit for p in run.probes()), run=run.folder.name,
                probes=[dict(name=p.name, kind=p.kind, params=p.params, seconds=round(p.seconds or 0, 1))
                        for p in run.probes()])
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return [atomic_write_text(folder / RESULTS, to_csv(rows, run.origins())),
            atomic_write_text(folder / LEDGER, buf.getvalue()), write_json(folder / META, meta)]


class _Cells(string.Formatter):
    """Formats a snapshot record, whose fields are CSV text: a field with a format spec is read as a number; an empty
    one shows as "—", a NaN as "NaN"."""

    def format_field(self, value, spec):
        if value in ("", None):
            return "—"
        if spec and isinstance(value, str):
            value = float(value)
        if isinstance(value, float) and math.isnan(value):
            return "NaN"
        return format(value, spec)


_CELLS = _Cells()


@dataclass
class Snapshot:
    """A snapshot folder read back: its records (results and ledger, as CSV text) and its entries."""

    name: str
    folder: Path
    tables: dict[str, list[dict]]
    entries: dict[str, dict]

    @classmethod
    def load(cls, folder: str | Path) -> "Snapshot":
        folder = Path(folder)
        if not (folder / SPEC).is_file():
            raise ConfigError(f"{folder} is no snapshot (no {SPEC}); name a folder under snapshots/ that has one.")
        tables = {}
        for source, file in (("results", RESULTS), ("ledger", LEDGER)):
            path = folder / file
            tables[source] = list(csv.DictReader(io.StringIO(path.read_text()))) if path.is_file() else []
        return cls(folder.name, folder, tables, read_yaml(folder / SPEC, "The snapshot's entries") or {})

    def select(self, spec: dict, what: str) -> list[dict]:
        """The records of ``spec['from']`` (results or ledger) whose columns hold ``spec['rows']``: a value, or a
        list of allowed values, per column (compared as text)."""
        source = spec.get("from", "results")
        if source not in self.tables:
            raise ConfigError(f"{what}: from must be results or ledger, not {source!r}.")
        records = self.tables[source]
        if not records:
            raise ConfigError(f"{what}: the snapshot {self.folder} has no {source} records; write it with "
                              "`interp-bayes results RUN --snapshot DIR`.")
        wanted = {k: [str(x) for x in (v if isinstance(v, list) else [v])] for k, v in (spec.get("rows") or {}).items()}
        unknown = sorted(set(wanted) - set(records[0]))
        if unknown:
            raise ConfigError(f"{what}: no column {', '.join(unknown)} in the snapshot's {source} records.")
        return [r for r in records if all(r[k] in v for k, v in wanted.items())]

    def render(self, entry: str) -> str:
        """The text of one entry: a markdown table or a value."""
        what = f"snapshot {self.name}/{entry}"
        spec = self.entries.get(entry)
        if not isinstance(spec, dict):
            raise ConfigError(f"{what} is not defined; add it to {self.folder / SPEC} or fix the marker.")
        records = self.select(spec, what)
        if "columns" in spec:
            return _table(spec, records, what)
        return _value(spec, records, what)


def _fill(template: str, record: dict, what: str) -> str:
    try:
        return _CELLS.format(template, **record)
    except (KeyError, ValueError) as err:
        raise ConfigError(f"{what}: {template!r} cannot be filled from the record ({err}).") from None


def _table(spec: dict, records: list[dict], what: str) -> str:
    """One line per distinct ``key`` among the records (in their order); each column either ``text``, a template of
    the key's fields, or ``format``, a template filled from the one record of that key that matches ``match``
    ("—" where none does). A pipe in a cell is escaped; a head is written escaped by hand."""
    key = spec.get("key") or []
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault(tuple(r[k] for k in key), []).append(r)
    if not groups:
        raise ConfigError(f"{what}: no record matches its rows.")
    columns = spec["columns"]
    lines = ["| " + " | ".join(c["head"] for c in columns) + " |", "|" + "---|" * len(columns)]
    for group in groups.values():
        cells = []
        for c in columns:
            if "text" in c:
                cells.append(_fill(c["text"], group[0], what))
                continue
            match = {k: str(v) for k, v in (c.get("match") or {}).items()}
            found = [r for r in group if all(r.get(k) == v for k, v in match.items())]
            if len(found) > 1:
                raise ConfigError(f"{what}: column {c['head']!r} matches {len(found)} records of one line; "
                                  "narrow its match.")
            cells.append(_fill(c["format"], found[0], what) if found else "—")
        # a record's text may hold a pipe (a claim's "|cos|"), which would split its cell
        lines.append("| " + " | ".join(re.sub(r"(?<!\\)\|", r"\\|", cell) for cell in cells) + " |")
    return "\n".join(lines)


def _value(spec: dict, records: list[dict], what: str) -> str:
    """A value: ``format`` filled from the one matching record (``agg: one``, the default), the one with the largest
    or smallest ``field`` (``max`` / ``min``; NaN and empty ones left out), or ``{count}`` of them (``count``)."""
    agg, field = spec.get("agg", "one"), spec.get("field", "value")
    if agg not in AGGREGATES:
        raise ConfigError(f"{what}: agg must be one of {', '.join(AGGREGATES)}, not {agg!r}.")
    if agg == "count":
        return _fill(spec["format"], {"count": len(records)}, what)
    if agg == "one":
        if len(records) != 1:
            raise ConfigError(f"{what}: {len(records)} records match where one must; narrow its rows.")
        return _fill(spec["format"], records[0], what)
    try:
        numbers = [r for r in records if r[field] != "" and not math.isnan(float(r[field]))]
    except (KeyError, ValueError):
        raise ConfigError(f"{what}: {field} is not a numeric column of the matching records.") from None
    if not numbers:
        raise ConfigError(f"{what}: no matching record has a number in {field}.")
    pick = (max if agg == "max" else min)(numbers, key=lambda r: float(r[field]))
    return _fill(spec["format"], pick, what)


def render(text: str, root: str | Path) -> tuple[str, list[str]]:
    """``text`` with every marker refilled from the snapshots under ``root``, and the markers whose text changed
    (``NAME/ENTRY``, in order). A table is put on lines of its own, a value inline."""
    snapshots: dict[str, Snapshot] = {}
    changed: list[str] = []

    def fill(m: re.Match) -> str:
        name, entry, old = m.groups()
        if name not in snapshots:
            snapshots[name] = Snapshot.load(Path(root) / name)
        new = snapshots[name].render(entry)
        if "\n" in new or old.startswith("\n"):
            new = f"\n{new}\n"
        if new != old:
            changed.append(f"{name}/{entry}")
        return f"<!-- snapshot {name}/{entry} -->{new}<!-- /snapshot -->"

    return MARKER.sub(fill, text), changed


def quoted(text: str) -> list[tuple[str, str]]:
    """The (NAME, ENTRY) of every marker in ``text``."""
    return [m.groups()[:2] for m in MARKER.finditer(text)]


def docs_main(args) -> int:
    """``interp-bayes docs FILE...``: refill the marked blocks (or, with --check, name those that differ: exit 1)."""
    done = []  # every file rendered before any is written: a bad marker anywhere writes nothing
    for path in map(Path, args.files):
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"{path} cannot be read ({err}); pass markdown files.") from None
        done.append((path, *render(text, Path(args.snapshots) if args.snapshots else path.parent / "snapshots")))
    stale = [f"{path}: {c}" for path, _, changed in done for c in changed]
    if not args.check:
        for path, new, changed in done:
            if changed:
                atomic_write_text(path, new)
                print(f"{path}: refilled {', '.join(changed)}")
    if args.check and stale:
        print("stale (refill with `interp-bayes docs FILE...`):\n  " + "\n  ".join(stale), file=sys.stderr)
        return 1
    return 0


def add_docs_arguments(p) -> None:
    p.add_argument("files", nargs="+", help="markdown files with <!-- snapshot NAME/ENTRY --> markers")
    p.add_argument("--snapshots", help="folder of the snapshots NAME/ (default: snapshots/ beside each file)")
    p.add_argument("--check", action="store_true", help="write nothing; name the markers whose text differs, exit 1")


def _one_or_all(values):
    """The one value the probes share, else the sorted list of what they hold (a mixed run shows as mixed)."""
    found = sorted({v for v in values if v is not None})
    return found[0] if len(found) == 1 else (found or None)
