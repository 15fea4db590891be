"""interp_bayes: mechanistic interpretability of Bayesian inference in transformers."""
