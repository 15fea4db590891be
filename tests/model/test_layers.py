"""One layer resolver (core.layers): every caller that takes a layer resolves it there, so a negative index counts
from the end everywhere and a layer outside the model is refused everywhere with the same sentence; and a recipe
names the layers it analyses apart from those it collects, checked before a sweep's first write."""

import numpy as np
import pytest
import torch
import yaml

from interp_bayes.core.errors import ConfigError, InterventionError
from interp_bayes.core.layers import layer_index, resolve_layers

REFUSED = r"Layer {} is out of range for a model with {} layers; use 0\.\.{}, or -{}\.\.-1 from the end\."


@pytest.mark.parametrize("spec, n, want", [
    ([-1], 30, [29]), ([0, -30], 30, [0]), ([5, 2, 5, -1], 30, [2, 5, 29]), (-2, 30, [28]), (np.int64(3), 30, [3]),
    ("spread5", 30, [10, 15, 20, 24, 29]), ("spread5", 2, [1]), ("spread5", 24, [8, 12, 16, 19, 23]),
    ("middle", 30, [15]), ("middle", 24, [12]), ("last", 30, [29]), ("all", 3, [0, 1, 2]), (None, 30, [29]),
])
def test_specs_resolve_to_sorted_block_indices(spec, n, want):
    assert resolve_layers(spec, n, [-1]) == want


def test_spread5_is_five_evenly_spaced_layers_from_a_third_to_the_last():
    # independent reference: the integers nearest n/3 + i (n - 1 - n/3) / 4, i = 0..4
    for n in (6, 12, 30, 32, 80):
        want = sorted({int(round(n / 3 + i * (n - 1 - n / 3) / 4)) for i in range(5)})
        assert resolve_layers("spread5", n, ()) == want and want[-1] == n - 1


def test_a_spec_of_none_is_the_default_itself_a_spec():
    assert resolve_layers(None, 4, "all") == [0, 1, 2, 3] and resolve_layers(None, 4, range(2)) == [0, 1]


@pytest.mark.parametrize("layer, n", [(30, 30), (-31, 30), (2, 2), (-3, 2)])
def test_a_layer_outside_the_model_is_refused_naming_it_the_depth_and_the_fix(layer, n):
    with pytest.raises(ConfigError, match=REFUSED.format(layer, n, n - 1, n)):
        resolve_layers([0, layer], n, ())
    with pytest.raises(InterventionError, match=REFUSED.format(layer, n, n - 1, n)):
        layer_index(layer, n, error=InterventionError)


@pytest.mark.parametrize("spec", [[1.5], [True], ["3"]])
def test_a_layer_that_is_not_an_integer_is_refused(spec):
    with pytest.raises(ConfigError, match="is not an integer; name a layer by its index"):
        resolve_layers(spec, 4, ())


def test_an_unknown_spec_is_refused_listing_the_known_ones():
    with pytest.raises(ConfigError, match="Unknown layer spec 'deepest'.*spread5, middle, last, all"):
        resolve_layers("deepest", 4, ())


def test_every_model_entry_point_refuses_an_out_of_range_layer_in_the_same_sentence(tiny_dirs):
    """collect, intervene, query_readings and edited_runs (which wrapped layer 5 round to block 1) all resolve
    through core.layers."""
    from interp_bayes.model.collect import collect, query_readings
    from interp_bayes.model.edits import AxisCut, intervene
    from interp_bayes.model.loading import load_model
    from interp_bayes.model.prefix import edited_runs
    from interp_bayes.tasks.base import TaskBatch

    model = load_model(tiny_dirs["llama3"])  # 2 layers
    texts = ["the cat sat on the mat", "hello world 0 1 2 3"]
    refused = REFUSED.format(5, 2, 1, 2)
    with pytest.raises(ConfigError, match=refused):
        collect(model, texts, layers=[5], progress=False)
    u = torch.ones(model.cfg.n_key_value_heads * model.cfg.d_head)
    with pytest.raises(InterventionError, match=refused), intervene(model, {5: AxisCut(u)}):
        pass
    batch = TaskBatch(torch.tensor([[1, 2, 3]]), torch.tensor([2]), torch.zeros(1, 1, 2), torch.zeros(1, 1))
    with pytest.raises(ConfigError, match=refused):
        query_readings(model, batch, layers=[5])
    with pytest.raises(ConfigError, match=refused):
        edited_runs(model, texts, [{1: AxisCut(u)}], layers=[5], label_tokens=[5, 6])
    acts = collect(model, texts, layers=[-1], progress=False)
    assert acts.layers == [1] and torch.equal(acts.values(-1), acts.values(1))
    with pytest.raises(KeyError, match="Layer 0 was not collected; collected layers: \\[1\\]"):
        acts.values(0)
    with pytest.raises(KeyError, match=REFUSED.format(-3, 2, 1, 2)):
        acts.values(-3)


def _sweep(tiny_dirs, tmp_path, recipes: dict, **config):
    from interp_bayes.run.config import SweepConfig

    folder = tmp_path / "recipes"
    folder.mkdir(exist_ok=True)
    for name, body in recipes.items():
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(body))
    return SweepConfig(model=str(tiny_dirs["llama3"]), out=str(tmp_path / "runs"), prompts="basic", quiet=True,
                       probes=[str(folder / f"{name}.yaml") for name in recipes], **config)


@pytest.mark.parametrize("recipe, refused", [
    (dict(kind="icl", per_k=2, layers=[0], at=-1),
     r"Probe 'probe' analyses layer\(s\) \[1\] \(at: -1\) but collects only layers \[0\] \(layers: \[0\]\); add "
     "them to its layers, or analyse a collected one."),
    (dict(kind="icl", per_k=2, layers="all", at="all"), "Parameter 'at' of probe 'probe' names one layer"),
    (dict(kind="icl", per_k=2, layers=[0, 9]), REFUSED.format(9, 2, 1, 2)),
    (dict(kind="interventions", per_k=2, layers=[1], layer_sets=[[1], [0, 1]]),
     r"analyses layer\(s\) \[0\] \(layer_sets\[1\]: \[0, 1\]\) but collects only layers \[1\]"),
    # a wind tunnel's layers against its own depth (they were refused only as its stage ran, after the first write)
    (dict(kind="windtunnel", tunnel="bijection-cpu", layer_sets=[[-1], [7]]),
     r"Probe 'probe', layer_sets\[1\]: \[7\] on wind tunnel bijection-cpu: " + REFUSED.format(7, 2, 1, 2)),
    (dict(kind="decoding", tunnel="hmm-cpu", layers=[0, 3]),
     r"Probe 'probe', layers: \[0, 3\] on wind tunnel hmm-cpu: " + REFUSED.format(3, 3, 2, 3)),
    (dict(kind="belief", tunnel="hmm-cpu", layers=[-4]), "on wind tunnel hmm-cpu: " + REFUSED.format(-4, 3, 2, 3)),
    (dict(kind="subspaces", tunnel="bijection-cpu", layers=[2]), "layers: \\[2\\] on wind tunnel bijection-cpu"),
    (dict(kind="causal_subspace", tunnel="bijection-cpu", layers=["last", 5]),
     r"Probe 'probe', layers\[1\]: 5 on wind tunnel bijection-cpu: " + REFUSED.format(5, 2, 1, 2)),
    (dict(kind="gaussian", tunnel="kalman-cpu", layers=[3]),
     "on wind tunnel kalman-cpu: " + REFUSED.format(3, 3, 2, 3)),
    (dict(kind="entropy_neurons", tunnel="bijection-cpu", layer=2), "layer: 2 on wind tunnel bijection-cpu"),
    # and the sweep's model's, named the same way
    (dict(kind="entropy_neurons", layer=5),
     r"Probe 'probe', layer: 5 on the sweep's model: " + REFUSED.format(5, 2, 1, 2)),
    (dict(kind="decoding", per_k=2, layers=[9]), "layers: \\[9\\] on the sweep's model: " + REFUSED.format(9, 2, 1, 2)),
])
def test_an_analysed_layer_the_recipe_does_not_collect_is_refused_before_the_first_write(tiny_dirs, tmp_path,
                                                                                         recipe, refused):
    from interp_bayes.run.sweep import plan_sweep, run_sweep

    config = _sweep(tiny_dirs, tmp_path, {"probe": recipe})
    with pytest.raises(ConfigError, match=refused):
        plan_sweep(config)
    with pytest.raises(ConfigError, match=refused):
        run_sweep(config)
    assert not (tmp_path / "runs").exists()


def test_a_recipe_collects_its_own_layers_not_the_sweeps_and_analyses_at(tiny_dirs, tmp_path):
    """The sweep's --layers no longer joins a recipe's collected layers; icl's value geometry is at ``at``."""
    from interp_bayes.core.results import select
    from interp_bayes.run.sweep import plan_sweep, run_sweep

    config = _sweep(tiny_dirs, tmp_path, {"icl": dict(kind="icl", conditions=["main"], per_k=3, layers=[0, 1], at=0,
                                                      n_boot=10, n_null=5, n_perm=10)}, layers=[1])
    assert "sula-main: 15 prompts, layers [0, 1], v" in [i.what.split("activations ")[-1] for i in plan_sweep(config)]
    config = _sweep(tiny_dirs, tmp_path, {"icl": dict(kind="icl", conditions=["main"], per_k=3, layers=[1], n_boot=10,
                                                      n_null=5, n_perm=10)}, layers=[0])
    assert "sula-main: 15 prompts, layers [1], v" in [i.what.split("activations ")[-1] for i in plan_sweep(config)]
    rows = run_sweep(config).rows
    assert {r.scope["layer"] for r in select(rows, "pc1_share")} == {1}  # at: -1, the default
