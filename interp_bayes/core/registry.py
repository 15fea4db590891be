"""Probe kinds, registered by name: one module per kind.

Built-in kinds load on first use. Your own kind is one module that calls ``register(Kind(...))`` (see
docs/adding-a-probe.md); a recipe names it as ``kind: NAME`` once the module is imported, or as
``kind: path/to/module.py:NAME`` / ``kind: package.module:NAME``, which imports it. An installed package may
declare its kinds in the entry-point group ``interp_bayes.kinds`` (``NAME = "package.module:ATTR"``, ATTR a
``Kind`` called NAME); those are found without an import and loaded when a kind is asked for or listed.

A name belongs to one module: registering a kind under a name that another module registered is refused (the
same module registering again, e.g. a plugin file loaded twice, replaces it quietly), and built-in names are
reserved. Where each kind came from is kept (``provenance``) and written into its probe's ``stage.json``, so that a
report built in a fresh process imports the module again (``load_kind``).
"""

from __future__ import annotations

import hashlib
import importlib
import re
import importlib.util
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

from .errors import ConfigError
from .plugin import Kind

BUILTIN = ("manifold", "keys", "focusing", "icl", "axis", "interventions", "windtunnel", "entropy_neurons",
           "martingale", "decoding", "gaussian", "causal_subspace", "p4b", "tunnel_geometry",
           "belief",
           "architectures", "recall_circuit", "subspaces", "manifold_move")
_MODULES = {"entropy_neurons": "neurons"}  # kinds whose module is named otherwise
GROUP = "interp_bayes.kinds"  # the entry-point group of installed plugin kinds
_PLUGIN_PREFIX = "interp_bayes_plugin_"  # module names of .py files imported by path
_REGISTRY: dict[str, Kind] = {}
_SOURCE: dict[str, "Source"] = {}  # name -> where its kind came from

@dataclass(frozen=True)
class Source:
    """Where a kind came from. ``module`` is what a fresh process imports to get it back: a .py file's absolute
    path (``origin`` "file"), a dotted module name ("module"), the entry point's name ("entry point"); "built-in"
    kinds need nothing, and a kind registered in an interactive session or a script ("session", "script") cannot be
    imported again. ``identity`` decides whether two registrations are the same module (its file, else its name)."""

    origin: str
    module: str
    identity: str
    distribution: str = ""  # for an entry point

    def describe(self) -> str:
        if self.origin == "entry point":
            return f"entry point '{self.module}' of distribution '{self.distribution}'"
        return "built-in" if self.origin == "built-in" else f"{self.origin} {self.module}"


def _source_of_globals(g: dict) -> Source:
    """The Source of the module whose top-level namespace is ``g`` (the one that called ``register``)."""
    name, file = g.get("__name__", "?"), g.get("__file__")
    identity = str(Path(file).resolve()) if file else name
    if name.startswith("interp_bayes.kinds."):
        return Source("built-in", name, identity)
    if name == "__main__":
        return Source("script", identity, identity) if file else Source("session", name, identity)
    if name.startswith(_PLUGIN_PREFIX) and file:
        return Source("file", identity, identity)
    return Source("module", name, identity)


def _builtin_module(name: str) -> str:
    return f"interp_bayes.kinds.{_MODULES.get(name, name)}"


def _add(kind: Kind, source: Source) -> Kind:
    if kind.name in BUILTIN and source.module != _builtin_module(kind.name):
        raise ConfigError(f"'{kind.name}' is the name of a built-in probe kind; give the kind of {source.describe()} "
                          "another name.")
    old = _SOURCE.get(kind.name)
    if old is not None and _REGISTRY.get(kind.name) is kind:  # the very Kind object again: harmless
        source = source if source.origin == "entry point" else old  # (an entry point of it names it best)
    elif old is not None and old.identity != source.identity:
        raise ConfigError(f"Two modules register a probe kind named '{kind.name}': {old.describe()} and "
                          f"{source.describe()}; rename one of them.")
    if old is not None and old.origin == "entry point" and source.origin != "entry point":
        source = old  # the entry point's own module registering it on import: keep the entry point as its source
    kind.params.kind = kind.name  # its parameter class learns its name for error messages
    _REGISTRY[kind.name], _SOURCE[kind.name] = kind, source
    return kind


def register(kind: Kind) -> Kind:
    """Add a probe kind under its name, for the module that calls this (its source is recorded for reports).
    A name another module holds is refused; the same module registering it again (or the very same Kind object
    registered again) replaces it quietly."""
    return _add(kind, _source_of_globals(sys._getframe(1).f_globals))


def _reason(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def _import_plugin(module: str) -> None:
    """Import a plugin module by dotted name or by .py file path (which registers its kinds). A file is executed
    again on every call, so that an edited plugin is picked up; registering again from the same file is quiet."""
    path = Path(module)
    if path.suffix == ".py":
        if not path.is_file():
            raise ConfigError(f"No probe-kind module at '{module}'; give an existing .py file or a dotted module name.")
        path = path.resolve()
        # the path's digest keeps two plugin files of the same name apart in sys.modules
        name = f"{_PLUGIN_PREFIX}{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except ConfigError:
            raise
        except Exception as err:
            del sys.modules[name]
            raise ConfigError(f"Probe-kind module {path} fails on import ({_reason(err)}); fix it and rerun.") from err
    else:
        try:
            importlib.import_module(module)
        except ConfigError:
            raise
        except ImportError as err:
            raise ConfigError(f"Cannot import probe-kind module '{module}' ({_reason(err)}); check the name (is its "
                              "folder on PYTHONPATH?) or give a .py path.") from err
        except Exception as err:
            raise ConfigError(f"Probe-kind module '{module}' fails on import ({_reason(err)}); fix it and "
                              "rerun.") from err


def _entry_points() -> dict[str, list]:
    """Entry points of the group by name, read from the installed distributions' metadata (nothing imported)."""
    out: dict[str, list] = {}
    for ep in entry_points(group=GROUP):
        out.setdefault(ep.name, []).append(ep)
    return out


def _dist_name(ep) -> str:
    dist = getattr(ep, "dist", None)
    return dist.name if dist is not None else "?"


def _load_entry_point(name: str, eps: list) -> Kind:
    """Load the entry point(s) called ``name``: one sentence naming the distribution and entry point if it fails."""
    dists = sorted({_dist_name(ep) for ep in eps})
    if len(dists) > 1:
        raise ConfigError(f"Distributions {' and '.join(repr(d) for d in dists)} both declare the probe kind entry "
                          f"point '{name}' (group {GROUP}); uninstall one of them.")
    ep, dist = eps[0], dists[0]
    what = f"Entry point '{name} = {ep.value}' of distribution '{dist}' (group {GROUP})"
    if name in BUILTIN:
        raise ConfigError(f"{what} takes the name of a built-in probe kind; rename it in {dist}'s "
                          f"[project.entry-points.\"{GROUP}\"] table.")
    try:
        obj = ep.load()
    except ConfigError as err:  # e.g. its module registers a name another module holds
        raise ConfigError(f"{what} cannot be loaded: {err}") from err
    except Exception as err:
        raise ConfigError(f"{what} cannot be loaded ({_reason(err)}); fix or reinstall {dist}.") from err
    if not isinstance(obj, Kind):
        raise ConfigError(f"{what} points at a {type(obj).__name__}, not an interp_bayes.core.plugin.Kind; point it at "
                          "the Kind object (module:ATTR).")
    if obj.name != name:
        raise ConfigError(f"{what} loads the kind '{obj.name}'; name the entry point after its kind.")
    module = sys.modules.get(ep.module)
    identity = _source_of_globals(vars(module)).identity if module is not None else ep.module
    return _add(obj, Source("entry point", name, identity, dist))


def get_kind(name: str) -> Kind:
    """The kind called ``name``: built-in, registered, or an installed entry point (loaded now); ``module:NAME``
    imports the module first."""
    module = None
    if ":" in name:
        module, name = name.rsplit(":", 1)
        _import_plugin(module)
    if name not in _REGISTRY and name in BUILTIN:
        importlib.import_module(_builtin_module(name))
    if name not in _REGISTRY and module is None:
        eps = _entry_points().get(name)
        if eps:
            _load_entry_point(name, eps)
    if name not in _REGISTRY:
        if module is not None:
            raise ConfigError(f"Module {module} registers no probe kind '{name}'; it registers: "
                              f"{', '.join(n for n in sorted(_REGISTRY) if n not in BUILTIN) or 'none'}.")
        raise ConfigError(f"Unknown probe kind '{name}'; known kinds: {', '.join(known_kinds())} (or "
                          "'path/to/module.py:NAME' for your own).")
    return _REGISTRY[name]


def known_kinds() -> list[str]:
    """Names of the built-in, registered and installed (entry-point) kinds; loads nothing."""
    return sorted(set(BUILTIN) | set(_REGISTRY) | set(_entry_points()))


def provenance(kind: Kind) -> dict:
    """What a run folder records of a kind so a fresh process can import it again: ``kind_module`` (a .py file's
    absolute path, a dotted module name or the entry point's name) and ``kind_from`` (which of those it is)."""
    source = _SOURCE.get(kind.name) if _REGISTRY.get(kind.name) is kind else None
    if source is None:  # a Kind used without register(): the module that defines its computation
        module = sys.modules.get(getattr(kind.run, "__module__", ""), None)
        source = _source_of_globals(vars(module)) if module is not None else Source("session", "?", "?")
    return dict(kind_module=source.module, kind_from=source.origin)


def load_kind(name: str, module: str = "", origin: str = "", ref: str = "") -> Kind:
    """The kind of a finished probe, from what its ``stage.json`` recorded (``provenance``), importing its module
    if it is not registered here. Refuses with one sentence naming the module it needs."""
    if name in _REGISTRY or name in BUILTIN:
        return get_kind(name)
    if not module:  # a run folder from before kind_module was recorded: the recipe's reference
        return get_kind(ref or name)
    if origin in ("session", "script"):
        where = "an interactive session" if origin == "session" else f"the script {module}"
        raise ConfigError(f"Kind '{name}' was registered in {where}, which cannot be imported again; move it into a "
                          "module (a .py file or an installed package) to see its summary and figures.")
    if origin == "entry point":
        try:
            return get_kind(name)
        except ConfigError as err:
            if name in _entry_points():
                raise
            raise ConfigError(f"Kind '{name}' needs the package that declares the entry point '{module}' (group "
                              f"{GROUP}), which is not installed here; install it to see its summary and "
                              "figures.") from err
    try:
        _import_plugin(module)
    except ConfigError as err:
        why = _reason(err.__cause__) if err.__cause__ is not None else str(err).rstrip(".")
        raise ConfigError(f"Kind '{name}' needs the module {module}, which cannot be imported here ({why}); make it "
                          "importable (restore the file, or put its folder on PYTHONPATH) to see its summary and "
                          "figures.") from err
    if name not in _REGISTRY:
        raise ConfigError(f"Kind '{name}' needs the module {module}, which no longer registers it.")
    return _REGISTRY[name]


@dataclass
class Entry:
    """One line of ``interp-bayes probes``: a kind known here, where it comes from, and why it cannot load."""

    name: str
    source: str
    kind: Kind | None = None
    error: str = ""

    @property
    def about(self) -> str:
        """The first sentence of the kind's doc (else of its module's), whole however many lines it spans."""
        doc = self.kind.doc if self.kind is not None else ""
        if not doc and self.kind is not None:
            doc = getattr(sys.modules.get(getattr(self.kind.run, "__module__", "")), "__doc__", "") or ""
        paragraph = " ".join((doc or "").strip().split("\n\n")[0].split())
        # a sentence ends at . ? or ! before a capital or an opening bracket ("et al. 2024" and "e.g. x" go on)
        sentence = re.match(r"(.+?[.?!])(?=\s+[A-Z(`]|$)", paragraph)
        return sentence.group(1) if sentence else paragraph or "(no description)"


def catalog() -> list[Entry]:
    """Every kind known here: built-ins first, then registered and entry-point kinds by name. Each entry point is
    loaded; one that fails is listed with its error instead of stopping the list."""
    for name in BUILTIN:
        get_kind(name)
    eps = _entry_points()
    out = [Entry(name, "built-in", _REGISTRY[name]) for name in BUILTIN]
    for name in sorted((set(_REGISTRY) | set(eps)) - set(BUILTIN)):
        if name not in _REGISTRY:
            try:
                _load_entry_point(name, eps[name])
            except ConfigError as err:
                dists = ", ".join(sorted({_dist_name(ep) for ep in eps[name]}))
                out.append(Entry(name, f"entry point '{name}' of distribution '{dists}'", None, str(err)))
                continue
        out.append(Entry(name, _SOURCE[name].describe(), _REGISTRY[name]))
    for name in sorted(set(eps) & set(BUILTIN)):  # an entry point that would shadow a built-in is refused
        try:
            _load_entry_point(name, eps[name])
        except ConfigError as err:
            out.append(Entry(name, f"entry point '{name}'", None, str(err)))
    return out
