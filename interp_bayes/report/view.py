"""A run folder read back for the report: its config, environment, model facts and each finished probe's rows,
data and files. Everything the report shows comes from here; nothing is recomputed or regenerated."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from ..core.errors import CacheError, ConfigError, InterpBayesError
from ..core.results import Row, read_rows
from ..core.store import content_key, read_json, read_yaml, unseal, warn
from ..core.plugin import Line
from ..core.registry import load_kind


class ReportError(InterpBayesError, ValueError):
    """A folder that is not a run folder."""


def _read_optional(path: Path) -> dict:
    """A JSON record of the run folder, or {} when it is absent or damaged (with one warning)."""
    try:
        return read_json(path) if path.exists() else {}
    except CacheError as err:
        warn(str(err))
        return {}


def enclosing_run(path: str | Path) -> Path | None:
    """The run folder (one holding ``run.json``) that ``path`` is or lies in, or None."""
    path = Path(path).resolve()
    return next((p for p in [path, *path.parents] if (p / "run.json").is_file()), None)


@dataclass
class ProbeView:
    """One finished probe of a run folder."""

    name: str
    kind: str
    params: dict
    folder: Path
    seconds: float | None = None
    rows: list[Row] = field(default_factory=list)
    kind_ref: str = ""  # how the recipe named the kind (``module.py:NAME`` imports a plugin)
    kind_module: str = ""  # what to import to get the kind back (``kinds.provenance``): file, module or entry point
    kind_from: str = ""  # which of those it is
    load_error: str = ""  # why the kind could not be loaded here (set by ``kind_object``)
    package: str | None = None  # the interp_bayes version that computed it (stage.json)
    git_commit: str | None = None  # and its commit (stage.json; None before 0.7.0 or outside a checkout)

    @cached_property
    def data(self) -> dict:
        """The per-prompt data the probe wrote for its figures (``data.json``)."""
        return _read_optional(self.folder / "data.json")

    def params_object(self):
        """The parameters as the kind's dataclass (defaults filled in), or None for a kind that cannot be loaded."""
        kind = self.kind_object()
        return kind.params.from_dict(self.params) if kind is not None else None

    def kind_object(self):
        """The probe's kind, importing the module its stage recorded (a plugin's file, module or entry point), or
        None when it cannot be loaded here (``load_error`` says which module it needs)."""
        try:
            return load_kind(self.kind, self.kind_module, self.kind_from, self.kind_ref)
        except InterpBayesError as err:
            self.load_error = str(err)
            return None


def subject_of(probe: ProbeView) -> str:
    """The wind tunnel a finished probe ran on ("" for the sweep's model, or a kind that cannot be loaded)."""
    kind = probe.kind_object()
    return "" if kind is None else str(kind.subject(probe.params_object()) or "")


@dataclass
class RunView:
    """A run folder read back."""

    folder: Path
    config: dict
    env: dict
    model: dict
    order: list[str]

    @classmethod
    def load(cls, folder: str | Path) -> "RunView":
        folder = Path(folder)
        if not (folder / "run.json").exists() and not (folder / "config.yaml").exists():
            raise ReportError(f"{folder} is not a run folder (no run.json); pass a folder written by "
                              "`interp-bayes sweep` (reports/<model>/<run key>).")
        try:
            config = read_yaml(folder / "config.yaml", "The run's config") if (folder / "config.yaml").exists() else {}
        except ConfigError as err:
            warn(str(err))
            config = {}
        order = [p["name"] for p in _read_optional(folder / "run.json").get("probes", [])]
        return cls(folder, config or {}, _read_optional(folder / "env.json"), _read_optional(folder / "model.json"),
                   order)

    @property
    def name(self) -> str:
        """The model as the user named it (alias, Hub id or folder name)."""
        name = str(self.config.get("model") or self.model.get("name") or self.folder.parent.name).rstrip("/")
        return Path(name).name if Path(name).is_absolute() or Path(name).exists() else name

    @cached_property
    def _probes(self) -> list[ProbeView]:
        found = {}
        for stage in sorted((self.folder / "probes").glob("*/stage.json")):
            try:  # a damaged stage is left out with one warning (the next sweep recomputes it)
                s = unseal(stage.parent, "stage.json")
            except CacheError as err:
                warn(f"{str(err).rstrip('.')}; probe {stage.parent.name} is left out until a sweep recomputes it.")
                continue
            rows_path = stage.parent / "rows.json"
            if rows_path.exists():
                found[stage.parent.name] = ProbeView(stage.parent.name, s["kind"], s.get("params", {}), stage.parent,
                                                     s.get("seconds"), read_rows(rows_path), s.get("kind_ref", ""),
                                                     s.get("kind_module", ""), s.get("kind_from", ""),
                                                     package=s.get("package"), git_commit=s.get("git_commit"))
        ordered = [found.pop(n) for n in self.order if n in found]
        return ordered + [found[n] for n in sorted(found)]

    def probes(self, kind: str | None = None) -> list[ProbeView]:
        """Finished probes in the order of the latest sweep (then any others), optionally of one kind."""
        return [p for p in self._probes if kind is None or p.kind == kind]

    def rows(self) -> list[Row]:
        return [r for p in self._probes for r in p.rows]

    def origins(self) -> list[dict]:
        """Per row of ``rows()``, the run and model it came from (``core.results.ORIGIN_COLUMNS``): the run key, the
        model as named (a probe on a wind tunnel: the tunnel) and a hash of the model's identity (``model.json``;
        "" for a tunnel, or before the model was loaded)."""
        identity = self.model.get("identity")
        key = content_key(identity) if identity else ""
        out = []
        for p in self._probes:
            tunnel = subject_of(p)
            origin = dict(run=self.folder.name, model=tunnel or self.name, model_key="" if tunnel else key)
            out += [origin] * len(p.rows)
        return out

    def summary(self) -> list:
        """Summary lines of every finished probe, each computed by its kind from its rows alone."""
        return [line for _, line in self.summary_by_subject()]

    def summary_by_subject(self) -> list[tuple[str, object]]:
        """(subject, summary line) of every finished probe: the subject is the wind tunnel the probe ran on, as
        its kind says (``Kind.subject``), or "" for the sweep's model."""
        out = []
        for p in self._probes:
            kind = p.kind_object()
            if kind is None:  # a plugin kind that is not importable here: say what it needs, show its rows as they are
                out.append(("", Line(f"{p.name}: kind {p.kind} not loaded", p.load_error)))
                out += [("", Line(f"{p.name}: {r.metric} {r.scope}", "n/a" if r.value is None else f"{r.value:.4g}",
                                  r.verdict())) for r in p.rows]
                continue
            where = subject_of(p)
            out += [(where, line) for line in kind.summary(p.rows, p.params_object())]
        return out

    def figures(self) -> list:
        """Figures of every kind that ran, each kind drawing its probes (in run order) once per subject (the
        model, each wind tunnel), so that every figure knows which model or tunnel it shows."""
        out, seen = [], []
        for p in self._probes:
            if p.kind not in seen:
                seen.append(p.kind)
        for name in seen:
            kind = self.probes(name)[0].kind_object()
            if kind is None:
                continue
            groups: dict[str, list[ProbeView]] = {}
            for p in self.probes(name):
                groups.setdefault(subject_of(p), []).append(p)
            for where, probes in groups.items():
                for fig in kind.figures(probes):
                    fig.subject = fig.subject or where
                    out.append(fig)
        return out
