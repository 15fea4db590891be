"""Every hook site the toolkit reads or edits, named in one place.

The sites TransformerLens names are spelled by its own ``get_act_name`` (``v`` -> ``blocks.L.attn.hook_v``,
``resid_post`` -> ``blocks.L.hook_resid_post``, ``scale`` -> ``ln_final.hook_scale``, ...), so a name here is the
name a TransformerLens user types. The bridge also has an input edge on every module (``hook_in``), which
``get_act_name`` does not cover; ``module_input`` spells those.
"""

from __future__ import annotations

from functools import cache

# reading -> TL site; "resid_pre" is the residual stream entering a block: at layer 0 the embedding output (for GPT-2
# the sum of the token and position embeddings), the layer where no attention or recurrence has run yet
READING_SITES = {"v": "v", "k": "k", "z": "z", "resid": "resid_post", "resid_pre": "resid_pre",
                 "attn_entropy": "pattern"}


@cache
def act_name(site: str, layer: int | None = None) -> str:
    """TransformerLens's name of ``site`` at ``layer`` (a non-negative index), e.g. ``act_name("v", 3)``."""
    from transformer_lens.utilities.components_utils import get_act_name  # imported on first use: TL is heavy

    return get_act_name(site, layer)


def reading_hook(reading: str, layer: int) -> str:
    """The hook a reading (``v``, ``k``, ``z``, ``resid``, ``attn_entropy``) is taken from at ``layer``."""
    return act_name(READING_SITES[reading], layer)


def module_input(module: str, layer: int | None = None) -> str:
    """The bridge's input edge of a module: ``blocks.L.<module>.hook_in``, or ``<module>.hook_in`` without a layer
    (e.g. ``ln_final``)."""
    return f"{module}.hook_in" if layer is None else f"blocks.{layer}.{module}.hook_in"
