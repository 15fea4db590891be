"""interp_bayes: mechanistic interpretability of Bayesian inference in transformers.

The public API, re-exported; see README.md for a walk-through and docs/ for definitions. Names are imported on
first use (PEP 562), so ``import interp_bayes`` stays light: plotly, pandas and datasets load only when a report,
a table or a prompt set needs them.
"""

from importlib import import_module

_EXPORTS = {
    "axis": ["EntropyAxis", "fit_entropy_axis"],
    "belief": ["belief_probe", "query_readings", "windtunnel_belief_probes"],
    "calibration": ["compare_to_bayes"],
    "config": ["SweepConfig"],
    "confounds": ["Deconfounded", "covariate_matrix", "deconfounded_correlation", "nuisance_columns", "residualize"],
    "decoding": ["DecodingCurve", "decoding_curve"],
    "errors": ["AxisError", "ConfigError", "GridError", "InterpBayesError", "InterventionError", "ModelLoadError",
               "ModelNotFoundError", "NonFiniteActivationError", "PromptError", "UnsupportedModelError"],
    "extract": ["Activations", "collect", "logit_entropy_bits"],
    "grid": ["Grid", "GridRun", "run_grid"],
    "geometry": ["attention_focusing", "key_orthogonality", "manifold_report", "manifold_summary", "pca",
                 "participation_ratio"],
    "interventions": ["AxisCut", "AxisOnly", "AxisShift", "SubspaceCut", "SubspaceOnly", "control_directions",
                      "intervene", "isotropic_subspaces", "matched_subspaces", "run_interventions", "summarize"],
    "kinds": ["Figure", "Kind", "Line", "Params", "Result", "get_kind", "register"],
    "models": ["ModelInfo", "ModelSpec", "checkpoint_tokenizer", "list_models", "load_model", "model_identity",
               "model_info"],
    "prompts": ["builtin_prompt_sets", "load_hf_prompts", "load_prompts", "load_source", "stratified_sample"],
    "report.grid": ["build_grid_page"],
    "martingale": ["MartingaleReport", "bijection_contexts", "bijection_setup", "martingale_test", "sula_contexts",
                   "sula_setup"],
    "mechanisms": ["MechanismComparison", "axis_null_overlap", "compare_mechanisms", "scale_entropy",
                   "value_axis_in_residual"],
    "native": ["run_native_when_unobserved"],
    "neurons": ["EntropyNeuronReport", "entropy_neurons", "frequency_neurons", "neuron_scores",
                "unembedding_null_space", "unigram_counts"],
    "report.html": ["Report", "build_compare", "build_report"],
    "results": ["Row"],
    "sweep": ["Run", "load_probe", "plan_sweep", "run_sweep"],
    "tasks.bijection": ["BijectionTask"],
    "tasks.hmm": ["HMMTask"],
    "tasks.icl": ["SULATask"],
    "tasks.kalman": ["KalmanTask"],
    "windtunnel.evaluate": ["evaluate_windtunnel"],
    "windtunnel.kalman": ["continuous_inputs", "evaluate_kalman", "kalman_readings"],
    "windtunnel.train": ["train_windtunnel"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)
__version__ = "0.3.0"


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'interp_bayes' has no attribute '{name}'")
    value = getattr(import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value  # cache: the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
