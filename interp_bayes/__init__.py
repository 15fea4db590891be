"""interp_bayes: mechanistic interpretability of Bayesian inference in transformers.

The public API, re-exported; see README.md for a walk-through.
"""

from .config import SweepConfig
from .errors import (InterpBayesError, ModelLoadError, ModelNotFoundError, NonFiniteActivationError,
                     PromptError)
from .extract import Activations, collect, entropy_bits
from .geometry import manifold_summary, pca
from .models import ModelInfo, ModelSpec, list_models, load_model, model_info
from .prompts import builtin_prompt_sets, load_hf_prompts, load_prompts
from .sweep import Run, run_sweep

__version__ = "0.1.0"
