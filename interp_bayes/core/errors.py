"""Exceptions with one-sentence messages that name the problem and the fix."""


class InterpBayesError(Exception):
    """Base class: every error the toolkit raises on bad input derives from it."""


class ModelNotFoundError(InterpBayesError, ValueError):
    """An alias, path or Hub id that cannot be resolved to a checkpoint."""


class ModelLoadError(InterpBayesError, RuntimeError):
    """A checkpoint that exists but cannot be loaded as a causal LM here (wrong kind, too big)."""


class PromptError(InterpBayesError, ValueError):
    """A prompt set the model cannot take as given (empty, too long)."""


class NonFiniteActivationError(InterpBayesError, FloatingPointError):
    """NaN or inf in a captured activation; the message names the layer."""


class AxisError(InterpBayesError, ValueError):
    """An entropy axis that cannot be fitted as asked (too few prompts for the folds, constant values)."""


class InterventionError(InterpBayesError, ValueError):
    """An edit that does not fit the layer it is applied to (wrong layer, wrong dimension)."""


class ConfigError(InterpBayesError, ValueError):
    """A configuration file, flag or parameter the toolkit does not understand."""


class GridError(InterpBayesError, RuntimeError):
    """Cells of a grid that failed (or that no node of the cluster can take); the message names them and their logs."""


class UnsupportedModelError(InterpBayesError, ValueError):
    """A model that lacks a part an analysis needs (e.g. a final norm with a scale hook, an MLP)."""


class CacheError(InterpBayesError, RuntimeError):
    """A cached file that is missing, truncated or does not match its recorded digest; the stage is recomputed."""
