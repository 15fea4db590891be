"""What a probe kind is: typed parameters, a computation, and the views of its results.

A kind owns its whole vertical. Its ``Params`` dataclass is the single home of its defaults and refuses unknown
keys; ``run(ctx, params)`` computes and returns tidy rows (plus per-prompt data for its figures, and any files it
saves through the context); ``summary(rows, params)`` turns its rows (and nothing else) into the summary lines the
report shows; ``figures(view)`` draws from what the probe wrote; ``ledger(probes)`` gives its entries of the claims
ledger, each with a verdict from the one set of rules in ``stats.ledger``. The report iterates over the kinds recorded in the
run folder and never knows a probe by its recipe name.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Callable, ClassVar

from .errors import ConfigError
from .results import Row


@dataclass(frozen=True)
class Params:
    """Base of every kind's parameters. Subclasses are frozen dataclasses whose field defaults are the defaults."""

    kind: ClassVar[str] = ""

    @classmethod
    def from_dict(cls, data: dict) -> "Params":
        """Build from a recipe's keys: unknown keys and values of the wrong type are refused with one sentence."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ConfigError(f"Unknown parameter(s) {', '.join(unknown)} for probe kind '{cls.kind}'; valid "
                              f"parameters: {', '.join(sorted(known))}.")
        hints = typing.get_type_hints(cls)
        for name, value in data.items():
            if not _fits(value, hints[name]):
                raise ConfigError(f"Parameter '{name}' of probe kind '{cls.kind}' must be {_describe(hints[name])}, "
                                  f"not {value!r}.")
            least = _least(known[name])
            if least is not None and is_int(value) and value < least:
                raise ConfigError(f"Parameter '{name}' of probe kind '{cls.kind}' counts something and must be at "
                                  f"least {least}, not {value!r}.")
        return cls(**{k: _freeze(v) for k, v in data.items()})

    def to_dict(self) -> dict:
        return json.loads(json.dumps(asdict(self), default=list))

    @classmethod
    def defaults(cls) -> dict:
        """name -> default, for ``interp-bayes probes``."""
        out = {}
        for f in fields(cls):
            value = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
            out[f.name] = value
        return out

    def checkpoints(self) -> dict:
        """The model folders these parameters name (parameter -> folder, e.g. a wind tunnel's ``tunnel:``), each
        checked when the recipe is read (ConfigError naming the fix). Their content, not their path, enters the
        stage's key, so a checkpoint retrained in place is computed again. The default names none."""
        return {}

    def check(self, ctx, probe: str) -> None:
        """Refuse what this recipe cannot run with in this sweep (ConfigError naming ``probe``), before the sweep
        or its dry run writes or computes anything: what needs the context (the model's depth, the task's size),
        e.g. layers it analyses but does not collect, ks beyond its task, more folds than its groups, or values
        its field types cannot say. Reads configs and tokenizers at most, never weights. The default checks
        nothing."""


def _freeze(value):
    """Lists from YAML become tuples, so params stay hashable and immutable."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return {k: _freeze(v) for k, v in value.items()}
    return value


def is_int(value) -> bool:
    """An int that is not a bool (YAML's ``true`` is no count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _least(f) -> int | None:
    """The least value of an integer parameter that counts something: the field's own ``metadata["least"]`` (a count
    that may be 0), else the naming convention every kind follows: ``n_*``, ``per_*``, ``*_n`` and ``*_bins`` count
    draws, prompts, items or bins (at least 1); ``folds`` are cross-fitting folds (at least 2). None: not a count."""
    name = f.name
    if "least" in f.metadata:
        return f.metadata["least"]
    if name == "folds":
        return 2
    return 1 if name.startswith(("n_", "per_")) or name.endswith(("_n", "_bins")) else None


def _fits(value, hint) -> bool:
    """A light type check of a recipe value against a field's annotation (ints accepted for floats; a ``Literal``
    takes only its choices)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint in (tuple, list):
        return isinstance(value, (list, tuple))
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            return False
        inner = args[0] if args else Any
        return all(_fits(v, inner) for v in value) if inner is not Ellipsis else True
    if origin is dict:
        return isinstance(value, dict)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return is_int(value)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _describe(hint) -> str:
    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    return str(hint).replace("typing.", "").replace("<class '", "").replace("'>", "")


@dataclass
class Result:
    """What ``run`` returns: the tidy rows, and per-prompt data its figures need (written to ``data.json``)."""

    rows: list[Row]
    data: dict = field(default_factory=dict)


@dataclass
class Line:
    """One summary line: a label, the value as text, the verdict against its null, and the paper's row it sits
    beside (a key of report.paper.PAPER_ROWS), if any."""

    label: str
    value: str
    verdict: str = ""
    paper: str | None = None


@dataclass
class Figure:
    """A figure (plotly) or an HTML fragment (already escaped) the report shows for a probe, with a caption."""

    id: str
    title: str
    content: Any  # plotly.graph_objects.Figure or str (HTML)
    caption: str = ""
    subject: str = ""  # the model or wind tunnel it is about ("": the run's model); the report's section


@dataclass
class Claim:
    """One entry of the report's claims ledger, contributed by a kind from its rows (``Kind.ledger``).

    ``key`` names the claim across runs (the rows of the compare page's claims x models matrix); ``verdict`` is
    one of ``stats.ledger.VERDICTS``, given by the rules there; ``evidence`` is the decisive number with its null
    or interval; ``paper`` the papers' number where they print one; ``section`` the figure id it links to."""

    key: str
    claim: str
    verdict: str
    evidence: str
    subject: str = ""  # the model or wind tunnel it is about ("": the run's model)
    paper: str = ""
    section: str = ""
    rival: bool = False  # a rival explanation rather than a claim of the papers


@dataclass
class Kind:
    """A registered probe kind."""

    name: str
    params: type[Params]
    run: Callable  # (ctx, params) -> Result
    summary: Callable = lambda rows, params: []  # (rows, params) -> list[Line]
    figures: Callable = lambda view: []  # (ProbeView) -> list[Figure]
    plan: Callable = lambda ctx, params: []  # (ctx, params) -> list[PlanItem], for --dry-run
    version: int = 1  # bump when the computation changes, so cached results of older versions are recomputed
    doc: str = ""
    ledger: Callable = lambda probes: []  # (list[ProbeView]) -> list[Claim], the claims its probes test
    subject: Callable = lambda params: ""  # (Params) -> the wind tunnel a probe runs on ("": the sweep's model)


@dataclass
class PlanItem:
    """One stage of a dry run: what it computes, whether it is cached, and what the rest will cost."""

    probe: str
    what: str
    cached: bool | None  # None: not known before another stage has run
    forwards: int = 0  # prompt forward passes still to run
    disk_bytes: int = 0
    key: str = ""  # an activation set's folder name: two probes asking for one set share it (counted once)
    model: str = ""  # the wind tunnel the forwards run on ("": the sweep's model)
    sample: list = field(default_factory=list, repr=False)  # token ids of a few of its prompts (a calibration)
