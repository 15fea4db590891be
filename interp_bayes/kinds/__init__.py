"""The built-in probe kinds, one module each (see interp_bayes.core.plugin for the contract)."""
