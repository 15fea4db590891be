"""interp_bayes: mechanistic interpretability of Bayesian inference in transformers.

The public API, re-exported: what a notebook needs (``__all__``); everything else is reached by its module path
(``interp_bayes.model.loading.model_ref``). See README.md for a walk-through and docs/ for definitions. Names are
imported on first use (PEP 562), so ``import interp_bayes`` stays light: plotly, pandas and datasets load only when
a report, a table or a prompt set needs them.
"""

from importlib import import_module

_EXPORTS = {  # what a notebook needs (README.md, docs/ and examples/ use these), by step; the rest by module path
    # load a model or a wind tunnel, and read it
    "windtunnel.tunnels": ["Tunnel", "load_model", "open_tunnel"],  # load_model: an LLM or a tunnel of any arch
    "model.loading": ["checkpoint_tokenizer", "list_models", "model_info"],
    "model.read": ["Activations", "read"],
    "model.collect": ["collect"],
    "model.numerics": ["float32_mode"],
    "model.native": ["run_native_when_unobserved"],
    # edit it
    "model.edits": ["AxisCut", "AxisOnly", "AxisSet", "AxisShift", "SubspaceCut", "SubspaceOnly", "intervene"],
    "analyses.interventions": ["EditProtocol", "run_interventions", "summarize"],
    "analyses.neurons": ["AblationProtocol", "entropy_neurons"],
    # ask it a question
    "analyses.axis": ["fit_entropy_axis"],
    "analyses.decoding": ["decoding_curve"],
    "analyses.focusing": ["attention_focusing"],
    "analyses.gaussian": ["manifold_curvature"],
    "analyses.keys": ["key_orthogonality"],
    "analyses.manifold": ["manifold_report"],
    "analyses.martingale": ["martingale_test"],
    "analyses.unembedding": ["unembedding_null_space"],
    # statistics on the readings
    "stats.calibration": ["compare_to_bayes"],
    "stats.deconfound": ["deconfounded_correlation"],
    "stats.pca": ["participation_ratio", "pca"],
    "stats.probe": ["belief_probe"],
    # tasks with exact posteriors, and the wind tunnels trained on them
    "tasks.bijection": ["BijectionTask"],
    "tasks.gaussian": ["GaussianTask", "gaussian_posterior_summary"],
    "tasks.hmm": ["HMMTask"],
    "tasks.icl": ["SULATask"],
    "tasks.kalman": ["KalmanTask"],
    "windtunnel.train": ["train_windtunnel"],
    "windtunnel.evaluate": ["evaluate_windtunnel"],
    "windtunnel.kalman": ["evaluate_kalman", "kalman_readings"],
    # prompts, sweeps, grids and the report
    "core.prompts": ["builtin_prompt_sets", "load_hf_prompts", "load_prompts", "stratified_sample"],
    "core.errors": ["InterpBayesError"],
    "run.config": ["SweepConfig"],
    "run.sweep": ["plan_sweep", "run_sweep"],
    "run.grid": ["Grid", "run_grid"],
    "report.html": ["build_report"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)
__version__ = "0.9.0"


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'interp_bayes' has no attribute '{name}'")
    value = getattr(import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value  # cache: the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
