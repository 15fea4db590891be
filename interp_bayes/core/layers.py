""""""

from __future__ import annotations

from typing import Sequence
from .errors import ConfigError


def resolve_layers(spec, n: int, default: Sequence[int]) -> list[int]:
    """Non-negative layer indices of a model with ``n`` layers from a parameter: explicit ints (negative from the
    end), ``"spread5"`` (five evenly spaced from a third of the depth to the last layer), ``"middle"`` (the spread5
    layer nearest half the depth), ``"all"``, or None (``default``)."""
    import numpy as np

    if spec in ("spread5", "middle"):
        spread = sorted({int(round(x)) for x in np.linspace(n / 3, n - 1, 5)})
        return spread if spec == "spread5" else [min(spread, key=lambda x: abs(x - n / 2))]
    if spec == "all":
        return list(range(n))
    if isinstance(spec, str):
        raise ConfigError(f"Unknown layer spec '{spec}'; use a list of layers, 'spread5', 'middle' or 'all'.")
    out = []
    for layer in (default if spec is None else spec):
        idx = int(layer) + n if int(layer) < 0 else int(layer)
        if not 0 <= idx < n:
            raise ConfigError(f"Layer {layer} is out of range for a model with {n} layers; use 0..{n - 1} or "
                              f"-{n}..-1.")
        out.append(idx)
    return sorted(set(out))
