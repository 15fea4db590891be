"""Tasks with closed-form Bayesian posteriors (wind tunnels): pure numpy/torch generators, no model code."""
