"""interp_bayes: mechanistic interpretability of Bayesian inference in transformers.

The public API, re-exported; see README.md for a walk-through and docs/ for definitions. Names are imported on
first use (PEP 562), so ``import interp_bayes`` stays light: plotly, pandas and datasets load only when a report,
a table or a prompt set needs them.
"""

from importlib import import_module

_EXPORTS = {
    "axis": ["EntropyAxis", "fit_entropy_axis"],
    "config": ["SweepConfig"],
    "errors": ["InterpBayesError", "ModelLoadError", "ModelNotFoundError", "NonFiniteActivationError",
               "PromptError"],
    "extract": ["Activations", "collect", "entropy_bits"],
    "geometry": ["attention_focusing", "key_orthogonality", "manifold_report", "manifold_summary", "pca",
                 "participation_ratio"],
    "interventions": ["AxisCut", "AxisOnly", "AxisShift", "SubspaceCut", "SubspaceOnly", "control_directions",
                      "intervene", "isotropic_subspaces", "matched_subspaces", "run_interventions", "summarize"],
    "models": ["ModelInfo", "ModelSpec", "list_models", "load_model", "model_info"],
    "prompts": ["builtin_prompt_sets", "load_hf_prompts", "load_prompts", "stratified_sample"],
    "report.html": ["Report", "build_compare", "build_report"],
    "sweep": ["Run", "run_sweep"],
    "tasks.bijection": ["BijectionTask"],
    "tasks.hmm": ["HMMTask"],
    "tasks.icl": ["SULATask"],
    "windtunnel.evaluate": ["evaluate_windtunnel"],
    "windtunnel.train": ["train_windtunnel"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'interp_bayes' has no attribute '{name}'")
    value = getattr(import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value  # cache: the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
