"""Probe kinds, registered by name: one module per kind.

Built-in kinds load on first use. Your own kind is one module that calls ``register(Kind(...))`` (see
docs/adding-a-probe.md); a recipe names it as ``kind: NAME`` once the module is imported, or as
``kind: path/to/module.py:NAME`` / ``kind: package.module:NAME``, which imports it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from ..errors import ConfigError
from .base import Figure, Kind, Line, Params, Result

BUILTIN = ("manifold", "keys", "focusing", "icl", "axis", "interventions", "windtunnel", "entropy_neurons",
           "martingale", "decoding")
_MODULES = {"entropy_neurons": "neurons"}  # kinds whose module is named otherwise
_REGISTRY: dict[str, Kind] = {}

__all__ = ["BUILTIN", "Figure", "Kind", "Line", "Params", "Result", "get_kind", "known_kinds", "register"]


def register(kind: Kind) -> Kind:
    """Add (or replace) a probe kind; its parameter class learns its name for error messages."""
    kind.params.kind = kind.name
    _REGISTRY[kind.name] = kind
    return kind


def _import_plugin(module: str) -> None:
    """Import a plugin module by dotted name or by .py file path (which registers its kinds)."""
    path = Path(module)
    if path.suffix == ".py":
        if not path.is_file():
            raise ConfigError(f"No probe-kind module at '{module}'; give an existing .py file or a dotted module name.")
        name = f"interp_bayes_plugin_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    else:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ConfigError(f"Cannot import probe-kind module '{module}' ({err}); check the name or give a .py "
                              "path.") from err


def get_kind(name: str) -> Kind:
    """The kind called ``name``; ``module:NAME`` imports the module first."""
    if ":" in name:
        module, name = name.rsplit(":", 1)
        _import_plugin(module)
    if name not in _REGISTRY and name in BUILTIN:
        importlib.import_module(f".{_MODULES.get(name, name)}", __name__)
    if name not in _REGISTRY:
        raise ConfigError(f"Unknown probe kind '{name}'; known kinds: {', '.join(known_kinds())} (or "
                          "'path/to/module.py:NAME' for your own).")
    return _REGISTRY[name]


def known_kinds() -> list[str]:
    return sorted(set(BUILTIN) | set(_REGISTRY))
