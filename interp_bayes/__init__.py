"""interp_bayes: mechanistic interpretability of Bayesian inference in transformers.

The public API, re-exported; see README.md for a walk-through and docs/ for definitions.
"""

from .axis import EntropyAxis, fit_entropy_axis
from .config import SweepConfig
from .errors import (InterpBayesError, ModelLoadError, ModelNotFoundError, NonFiniteActivationError,
                     PromptError)
from .extract import Activations, collect, entropy_bits
from .geometry import (attention_focusing, key_orthogonality, manifold_report, manifold_summary, pca,
                       participation_ratio)
from .interventions import (AxisCut, AxisOnly, AxisShift, control_axes, intervene, run_interventions,
                            summarize)
from .models import ModelInfo, ModelSpec, list_models, load_model, model_info
from .prompts import builtin_prompt_sets, load_hf_prompts, load_prompts, stratified_sample
from .report.html import Report, build_compare, build_report
from .sweep import Run, run_sweep
from .tasks.bijection import BijectionTask
from .tasks.hmm import HMMTask
from .tasks.icl import SULATask
from .windtunnel.evaluate import evaluate_windtunnel
from .windtunnel.train import train_windtunnel

__version__ = "0.1.0"
