"""The benchmarks in bench/ keep up with the package: each imports, and the interventions benchmark builds its
protocol through the same kinds the sweep uses (a refactor once broke it silently)."""

import importlib.util
from pathlib import Path

import pytest

from interp_bayes.model.loading import load_model

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", sorted(p.stem for p in BENCH.glob("*.py")))
def test_benchmark_imports(name):
    assert callable(load_bench(name).main)


def test_interventions_benchmark_builds_the_sweeps_protocol(tiny_dirs):
    bench = load_bench("interventions")
    model = load_model(tiny_dirs["llama3"])
    proto = bench.protocol(model, "tiny-llama3")
    n_layers = model.cfg.n_layers
    assert set(proto["layer_sets"]) == {"middle", "spread5"} and proto["layer_sets"]["spread5"][-1] == n_layers - 1
    assert len(proto["prompts"]) == len(proto["task"]["k"]) == 125  # half of 50 per k, the evaluation half
    assert set(proto["axes"]) == set(proto["fit_values"]) and len(proto["label_tokens"]) == 2
