"""The float32 numeric mode (``model.numerics``): how ``auto`` resolves on each kind of CPU, the context that sets
and restores torch's oneDNN precision, the mode in the run's id and the activation sets' keys, the command line's
check, and the error model of the mode (``model.testing.float32_mode_bound``)."""

import json

import pytest
import torch

from interp_bayes import __version__
from interp_bayes.cli import main
from interp_bayes.core.errors import ConfigError
from interp_bayes.core.store import content_key
from interp_bayes.model import numerics
from interp_bayes.model.numerics import ENV, IEEE, ONEDNN, float32_mode, resolve_float32
from interp_bayes.model.testing import float32_lambda, float32_mode_bound
from interp_bayes.run.config import SweepConfig
from interp_bayes.run.sweep import Context

AVX2 = frozenset({"avx2", "fma"})  # this machine's kind: torch never sends a float32 product to oneDNN
ZEN5 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}  # oneDNN's float32 kernel
SAPPHIRE = ZEN5 | {"amx_tile", "amx_int8", "amx_bf16"}  # oneDNN would round the inputs to bfloat16


@pytest.fixture
def cpu(monkeypatch):
    """Set the CPU's flags as detection reads them, on a CPU build with oneDNN, with no machine-wide answer."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def set_flags(flags):
        monkeypatch.setattr(numerics, "cpu_flags", lambda: flags)

    return set_flags


@pytest.mark.parametrize("flags, auto, fast", [(AVX2, IEEE, IEEE), (ZEN5, ONEDNN, ONEDNN),
                                                (SAPPHIRE, IEEE, ONEDNN), (AVX2 | {"avx_ne_convert"}, ONEDNN, ONEDNN)])
def test_auto_takes_onednn_only_where_it_keeps_float32(cpu, flags, auto, fast):
    cpu(flags)
    assert resolve_float32("auto") == auto
    assert resolve_float32("fast") == fast
    assert resolve_float32("ieee") == IEEE
    assert resolve_float32("fast", device="cuda") == IEEE  # the setting reaches no GPU product


def test_the_machine_wide_answer_and_unknown_modes(cpu, monkeypatch):
    cpu(ZEN5)
    monkeypatch.setenv(ENV, "ieee")
    assert resolve_float32("auto") == IEEE and resolve_float32("fast") == ONEDNN  # asked for by name: honoured
    cpu(SAPPHIRE)
    monkeypatch.setenv(ENV, "fast")
    assert resolve_float32("auto") == ONEDNN
    monkeypatch.setenv(ENV, "bf16")
    with pytest.raises(ConfigError, match=ENV):
        resolve_float32("auto")
    with pytest.raises(ConfigError, match="one of auto, ieee, fast"):
        resolve_float32("fastest")
    with pytest.raises(ConfigError, match="'float32'"):
        SweepConfig(float32="bf16")


def test_the_context_sets_and_restores_even_on_error():
    mkldnn = torch.backends.mkldnn
    before = mkldnn.matmul.fp32_precision, mkldnn.conv.fp32_precision
    with float32_mode(ONEDNN) as mode:
        assert mode == ONEDNN and mkldnn.matmul.fp32_precision == mkldnn.conv.fp32_precision == "bf16"
    assert (mkldnn.matmul.fp32_precision, mkldnn.conv.fp32_precision) == before
    with pytest.raises(RuntimeError, match="inside"):
        with float32_mode(ONEDNN):
            raise RuntimeError("inside")
    assert (mkldnn.matmul.fp32_precision, mkldnn.conv.fp32_precision) == before
    mkldnn.matmul.fp32_precision = "bf16"  # a caller's own setting comes back after an IEEE block
    try:
        with float32_mode("ieee") as mode:
            assert mode == IEEE and mkldnn.matmul.fp32_precision == "ieee"
        assert mkldnn.matmul.fp32_precision == "bf16"
    finally:
        mkldnn.matmul.fp32_precision = before[0]


def _keys(tmp_path, **kw):
    """The run's id and an activation set's key under a config of a folder that stands for a model (nothing loads)."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    config = SweepConfig(model=str(model), out=str(tmp_path), **kw)
    ref = config.model_ref()
    ctx = Context(tmp_path / "run", config, print, ref=ref)
    return config.digest(ref), ctx._acts_key("d" * 16, [1], ["v"], None, ctx.identity, "final", None, None), ctx


def test_the_mode_that_ran_enters_every_key(cpu, tmp_path):
    """auto and ieee share their run folder and activation sets where auto resolves to IEEE (the keys of runs before
    the switch among them), and share nothing where auto takes oneDNN's path."""
    cpu(AVX2)
    ieee, auto = _keys(tmp_path, float32="ieee")[:2], _keys(tmp_path, float32="auto")[:2]
    assert ieee == auto == _keys(tmp_path, float32="fast")[:2]
    ctx = _keys(tmp_path)[2]  # a set's key as it was before the mode existed
    assert ieee[1] == content_key(ctx.identity, None, "d" * 16, [1], ["v"], None, __version__)
    cpu(ZEN5)
    fast = _keys(tmp_path, float32="auto")[:2]
    assert _keys(tmp_path, float32="ieee")[:2] == ieee
    assert fast[0] != ieee[0] and fast[1] != ieee[1] and fast == _keys(tmp_path, float32="fast")[:2]


def test_the_command_line_refuses_an_unknown_mode_before_writing(tmp_path, capsys):
    out = tmp_path / "runs"
    with pytest.raises(SystemExit) as exit_:
        main(["sweep", "--float32", "bf16", "--out", str(out), "--dry-run"])
    assert exit_.value.code == 2 and "--float32: invalid choice: 'bf16'" in capsys.readouterr().err
    assert not out.exists()


def test_the_bound_of_bfloat16_inputs_holds_and_the_float32_one_would_not():
    """Inputs rounded to bfloat16 as AMX rounds them (to nearest even), the products summed in float64: within the
    mode's bound with bfloat16 inputs, and far outside IEEE float32's, so that the two bounds are not the same test."""
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 896, generator=gen, dtype=torch.float64), torch.randn(896, 128, generator=gen,
                                                                                 dtype=torch.float64)
    exact = a @ b
    rounded = a.bfloat16().double() @ b.bfloat16().double()
    abs_sum = a.abs() @ b.abs()
    lam = float32_lambda(exact.numel())
    err = (rounded - exact).abs()
    assert (err <= float32_mode_bound(896, abs_sum, lam=lam, mode=ONEDNN, bf16_inputs=True)).all()
    assert (err / float32_mode_bound(896, abs_sum, lam=lam, mode=ONEDNN, bf16_inputs=False)).max() > 10
    assert torch.equal(float32_mode_bound(896, abs_sum, lam=lam, mode=ONEDNN, bf16_inputs=False),
                       float32_mode_bound(896, abs_sum, lam=lam))


@pytest.mark.skipif(resolve_float32("fast", "cpu") == IEEE,
                    reason="this CPU has neither AVX-512 nor AVX-NE-CONVERT: torch sends no float32 product to "
                           "oneDNN, so the fast path does not exist here")
def test_a_linear_layer_under_the_fast_path_is_within_its_bound():
    """F.linear of the issue's shape on the oneDNN path against float64: within the mode's bound for this CPU."""
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(512, 896, generator=gen), torch.randn(1216, 896, generator=gen)
    with float32_mode("fast"):
        got = torch.nn.functional.linear(x, w).double()
    exact = x.double() @ w.double().T
    abs_sum = x.double().abs() @ w.double().abs().T
    bound = float32_mode_bound(896, abs_sum, lam=float32_lambda(exact.numel()), mode=ONEDNN)
    assert ((got - exact).abs() <= bound).all()


def test_a_sweep_computes_in_the_mode_it_records(cpu, tiny_dirs, tmp_path, monkeypatch):
    """Where auto takes oneDNN's path (detection set to an AVX-512 CPU without AMX), every stage runs with torch's
    oneDNN precision at bf16, env.json says so, the setting is restored after the sweep, and the run folder is not
    the IEEE run's."""
    import yaml

    from interp_bayes.run import sweep

    cpu(ZEN5)
    recipe = tmp_path / "keys.yaml"
    recipe.write_text(yaml.safe_dump(dict(kind="keys", n_null=10)))
    seen = []
    run_probe = sweep._run_probe
    monkeypatch.setattr(sweep, "_run_probe", lambda *a, **kw: (
        seen.append(torch.backends.mkldnn.matmul.fp32_precision), run_probe(*a, **kw)))
    config = SweepConfig(model=str(tiny_dirs["llama3"]), out=str(tmp_path / "runs"), prompts="basic", quiet=True,
                         probes=[str(recipe)])
    before = torch.backends.mkldnn.matmul.fp32_precision
    run = sweep.run_sweep(config)
    assert seen == ["bf16"] and torch.backends.mkldnn.matmul.fp32_precision == before
    assert json.loads((run.folder / "env.json").read_text())["float32"] == ONEDNN
    assert run.folder != sweep.run_folder(config.override(float32="ieee"))
