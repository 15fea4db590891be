"""interp_bayes: mechanistic interpretability of Bayesian inference in transformers.

The public API, re-exported; see README.md for a walk-through and docs/ for definitions. Names are imported on
first use (PEP 562), so ``import interp_bayes`` stays light: plotly, pandas and datasets load only when a report,
a table or a prompt set needs them.
"""

from importlib import import_module

_EXPORTS = {
    "analyses.axis": ["EntropyAxis", "fit_entropy_axis"],
    "analyses.belief": ["windtunnel_belief_probes"],
    "analyses.controls": ["control_directions", "isotropic_subspaces", "matched_subspaces"],
    "analyses.decoding": ["DecodingCurve", "decoding_curve"],
    "analyses.focusing": ["attention_focusing"],
    "analyses.gaussian": ["manifold_curvature", "predictive_calibration"],
    "analyses.interventions": ["EditProtocol", "run_interventions", "summarize"],
    "analyses.keys": ["key_orthogonality"],
    "analyses.manifold": ["manifold_report", "manifold_summary"],
    "analyses.martingale": ["MartingaleReport", "bijection_contexts", "bijection_setup", "martingale_test",
                            "sula_contexts", "sula_setup"],
    "analyses.manifold_move": ["kalman_move", "manifold_move", "token_readout"],
    "analyses.mechanisms": ["MechanismComparison", "axis_null_overlap", "compare_mechanisms", "scale_entropy",
                            "value_axis_in_residual"],
    "analyses.neurons": ["AblationProtocol", "EntropyNeuronReport", "entropy_neurons"],
    "analyses.recall_circuit": ["recall_circuit", "recall_circuit_scores"],
    "analyses.unembedding": ["frequency_neurons", "neuron_scores", "unembedding_null_space", "unigram_counts"],
    "core.errors": ["AxisError", "ConfigError", "GridError", "InterpBayesError", "InterventionError",
                    "ModelLoadError", "ModelNotFoundError", "NonFiniteActivationError", "PromptError",
                    "UnsupportedModelError"],
    "core.plugin": ["Figure", "Kind", "Line", "Params", "Result"],
    "core.prompts": ["builtin_prompt_sets", "load_hf_prompts", "load_prompts", "load_source", "stratified_sample"],
    "core.registry": ["get_kind", "register"],
    "core.results": ["Row"],
    "model.collect": ["Activations", "collect", "logit_entropy_bits", "query_readings"],
    "model.edits": ["AxisCut", "AxisOnly", "AxisSet", "AxisShift", "SubspaceCut", "SubspaceOnly", "intervene",
                    "onmanifold_op"],
    "model.loading": ["ModelInfo", "ModelSpec", "checkpoint_tokenizer", "list_models", "model_identity",
                      "model_info"],
    "model.native": ["run_native_when_unobserved"],
    "report.grid": ["build_grid_page"],
    "report.html": ["Report", "build_compare", "build_report"],
    "run.config": ["SweepConfig"],
    "run.grid": ["Grid", "GridRun", "run_grid"],
    "run.sweep": ["Run", "load_probe", "plan_sweep", "run_sweep"],
    "stats.calibration": ["compare_to_bayes"],
    "stats.confounds": ["covariate_matrix", "nuisance_columns"],
    "stats.deconfound": ["Deconfounded", "deconfounded_correlation"],
    "stats.pca": ["participation_ratio", "pca"],
    "stats.probe": ["belief_probe"],
    "stats.regression": ["residualize"],
    "tasks.bijection": ["BijectionTask"],
    "tasks.gaussian": ["GaussianTask", "gaussian_posterior_summary"],
    "tasks.hmm": ["HMMTask"],
    "tasks.icl": ["SULATask"],
    "tasks.kalman": ["KalmanTask"],
    "windtunnel.evaluate": ["evaluate_windtunnel"],
    "windtunnel.kalman": ["continuous_inputs", "evaluate_kalman", "kalman_readings"],
    "windtunnel.train": ["train_windtunnel"],
    "windtunnel.tunnels": ["Tunnel", "load_model", "open_tunnel"],  # load_model: an LLM or a tunnel of any arch
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)
__version__ = "0.7.0"


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'interp_bayes' has no attribute '{name}'")
    value = getattr(import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value  # cache: the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
