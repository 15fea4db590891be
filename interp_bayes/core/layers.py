"""Layer resolution, in one place: every layer a recipe, a config or a caller names becomes a non-negative block
index here (negative indices count from the end; a layer outside the model is refused with one sentence)."""

from __future__ import annotations

# numpy is imported inside the functions that need it: core is the light bottom layer that every command imports
import operator
from typing import Sequence

from .errors import ConfigError

SPECS = ("spread5", "middle", "last", "all")  # the named layer specs, beside an int and a list of ints


def layer_index(layer, n: int, *, error: type[Exception] = ConfigError) -> int:
    """The non-negative index of ``layer`` (an int; negative counts from the end) in a model with ``n`` layers;
    ``error`` (one sentence naming the layer, the depth and the fix) when it is not an int or lies outside."""
    try:
        if isinstance(layer, bool):
            raise TypeError
        idx = operator.index(layer)
    except TypeError:
        raise error(f"Layer {layer!r} is not an integer; name a layer by its index (0..{n - 1}, or -{n}..-1 from "
                    "the end).") from None
    if not -n <= idx < n:
        raise error(f"Layer {layer} is out of range for a model with {n} layers; use 0..{n - 1}, or -{n}..-1 from "
                    "the end.")
    return idx + n if idx < 0 else idx


def resolve_layers(spec, n: int, default: Sequence[int] | str, *, error: type[Exception] = ConfigError) -> list[int]:
    """Sorted non-negative layer indices of a model with ``n`` layers from a layer spec: a list of ints (negative
    from the end), one int, ``"spread5"`` (five evenly spaced from a third of the depth to the last layer, fewer on a
    shallow model), ``"middle"`` (the spread5 layer nearest half the depth), ``"last"``, ``"all"``, or None
    (``default``, itself a spec)."""
    import numpy as np

    if spec is None:
        spec = default
    if isinstance(spec, str):
        if spec in ("spread5", "middle"):
            spread = sorted({int(round(x)) for x in np.linspace(n / 3, n - 1, 5)})
            return spread if spec == "spread5" else [min(spread, key=lambda x: abs(x - n / 2))]
        if spec == "last":
            return [n - 1]
        if spec == "all":
            return list(range(n))
        raise error(f"Unknown layer spec '{spec}'; use a list of layers, one layer, or one of {', '.join(SPECS)}.")
    if not isinstance(spec, Sequence) and not hasattr(spec, "__iter__"):
        return [layer_index(spec, n, error=error)]
    return sorted({layer_index(layer, n, error=error) for layer in spec})


def check_recipe_layers(ctx, probe: str, collected, analysed: dict | None = None) -> None:
    """Refuse, before a sweep's first write, a recipe whose collected layers (``layers:``, a layer spec resolved by
    ``ctx.layers``) lie outside the sweep's model, or whose analysed layers (``analysed``: recipe key -> layer spec)
    are not among them; one sentence naming the probe, the layers and the fix."""
    def shown(spec):  # as the recipe wrote it (its lists are frozen into tuples)
        return spec if isinstance(spec, (str, int)) else list(spec)

    have = ctx.layers(collected)
    for key, spec in (analysed or {}).items():
        missing = sorted(set(ctx.layers(spec)) - set(have))
        if missing:
            raise ConfigError(f"Probe '{probe}' analyses layer(s) {missing} ({key}: {shown(spec)!r}) but collects "
                              f"only layers {have} (layers: {shown(collected)!r}); add them to its layers, or analyse "
                              "a collected one.")
