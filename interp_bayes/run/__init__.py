"""Running recipes: the sweep and its context, configs, grids (local or Ray)."""
