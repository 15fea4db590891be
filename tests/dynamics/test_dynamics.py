"""Paper II's gradient laws, the SGD / EM comparison on the sticky chain, and the frame-precision metrics."""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from interp_bayes import dynamics as dy
from interp_bayes.dynamics.cli import markdown_tables
from interp_bayes.tasks.sticky import sample_sticky

torch.set_num_threads(1)

# ---------------------------------------------------------------- laws


@settings(max_examples=100, deadline=None)
@given(T=st.integers(1, 24), d_k=st.integers(1, 8), d_v=st.integers(1, 8), seed=st.integers(0, 2**31 - 1),
       readout=st.booleans(), d_x=st.integers(1, 8), n_classes=st.integers(2, 6))
def test_laws_match_autograd(T, d_k, d_v, seed, readout, d_x, n_classes):
    errors = dy.law_errors(T, d_k, d_v, seed, readout=readout, d_x=d_x, n_classes=n_classes)
    expected = {"d_scores", "d_q", "d_k", "d_v"} | ({"d_W_Q", "d_W_K", "d_W_V", "d_W_O", "u"} if readout else set())
    assert set(errors) == expected
    assert max(errors.values()) < 1e-10, errors


def test_the_check_detects_a_wrong_law():
    """Dropping the baseline E_alpha[b] (plain alpha * b) must be caught by the same error measure."""
    gen = torch.Generator().manual_seed(0)
    q, k, v, u = (torch.randn(9, d, generator=gen, dtype=torch.float64) for d in (4, 4, 5, 5))
    s = (q @ k.T / 2).requires_grad_()
    alpha = torch.softmax(s.masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf")), -1)
    ((alpha @ v) * u).sum().backward()
    wrong = alpha.detach() * (u @ v.T)
    right = dy.attention_gradients(q, k, v, u)["d_scores"]
    assert dy.relative_error(wrong, s.grad) > 1e-2
    assert dy.relative_error(right, s.grad) < 1e-12


def test_score_gradients_sum_to_zero_per_query():
    """Softmax is shift-invariant, so the advantages of each query sum to zero (and vanish on masked keys)."""
    gen = torch.Generator().manual_seed(1)
    q, k, v, u = (torch.randn(12, d, generator=gen, dtype=torch.float64) for d in (3, 3, 4, 4))
    d_s = dy.attention_gradients(q, k, v, u)["d_scores"]
    torch.testing.assert_close(d_s.sum(-1), torch.zeros(12, dtype=torch.float64), atol=1e-14, rtol=0)
    assert torch.all(d_s.triu(1) == 0)


@pytest.mark.parametrize("block", [1, 5, 64])
def test_blocked_model_gradients_equal_the_dense_ones(block):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(23, 6, generator=gen, dtype=torch.float64)
    y = torch.randint(4, (23,), generator=gen)
    params = {n: torch.randn(*s, generator=gen, dtype=torch.float64)
              for n, s in [("W_Q", (6, 3)), ("W_K", (6, 3)), ("W_V", (6, 5)), ("W_O", (5, 4))]}
    dense = dy.single_head_gradients(params, x, y, block=23, mixed_inputs=True)
    blocked = dy.single_head_gradients(params, x, y, block=block, mixed_inputs=True)
    for name in ("loss", "d_W_Q", "d_W_K", "d_W_V", "d_W_O", "mixed_inputs", "log_probs"):
        torch.testing.assert_close(blocked[name], dense[name], atol=1e-13, rtol=1e-12)
    alpha, _ = dy.causal_attention(x @ params["W_Q"], x @ params["W_K"], x @ params["W_V"])
    torch.testing.assert_close(dense["mixed_inputs"], alpha @ x, atol=1e-13, rtol=0)


# ---------------------------------------------------------------- closed-form EM


def _random_head(seed: int, T: int = 40, d_x: int = 6, d_v: int = 5, K: int = 4):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(T, d_x, generator=gen, dtype=torch.float64)
    y = torch.randint(K, (T,), generator=gen)
    params = {n: torch.randn(*s, generator=gen, dtype=torch.float64)
              for n, s in [("W_Q", (d_x, 3)), ("W_K", (d_x, 3)), ("W_V", (d_x, d_v)), ("W_O", (d_v, K))]}
    return x, y, params


@pytest.mark.parametrize("seed", range(8))
def test_closed_form_value_step_never_increases_the_loss(seed):
    x, y, params = _random_head(seed)
    g = dy.single_head_gradients(params, x, y, mixed_inputs=True)
    step = dy.closed_form_value_step(g["mixed_inputs"], params["W_O"], g["residual"])
    after = dy.single_head_gradients({**params, "W_V": params["W_V"] + step}, x, y)["loss"]
    assert float(after) < float(g["loss"])


def test_closed_form_values_are_responsibility_weighted_prototypes():
    """One-hot inputs (free values) and hard routing: each new value is the mean target of the queries it serves."""
    T, K, d_v = 10, 3, 4
    gen = torch.Generator().manual_seed(3)
    w_o = torch.randn(d_v, K, generator=gen, dtype=torch.float64)
    w_v = torch.randn(T, d_v, generator=gen, dtype=torch.float64)  # x = I: row j of W_V is value j
    route = torch.tensor([0, 0, 2, 2, 2, 5, 5, 5, 5, 9])  # query i attends only to key route[i] <= i
    alpha = F.one_hot(route, T).double()
    out = alpha @ w_v
    residual = torch.softmax(out @ w_o, -1) - F.one_hot(torch.randint(K, (T,), generator=gen), K).double()
    centre = torch.eye(K, dtype=torch.float64) - 1 / K
    targets = out - 2 * residual @ w_o.T @ torch.linalg.pinv(w_o @ centre @ w_o.T)
    new_v = w_v + dy.closed_form_value_step(alpha, w_o, residual)
    for j in route.unique():
        torch.testing.assert_close(new_v[j], targets[route == j].mean(0), atol=1e-10, rtol=0)
    unused = [j for j in range(T) if j not in route.tolist()]
    torch.testing.assert_close(new_v[unused], w_v[unused], atol=1e-10, rtol=0)  # no query, no change


# ---------------------------------------------------------------- sticky training


@pytest.fixture(scope="module")
def tiny_chain():
    return sample_sticky(160, 7)


def test_em_like_with_equal_rates_is_sgd(tiny_chain):
    init = dy.init_single_head(7)
    sgd = dy.train_single_head(tiny_chain, "sgd", init, n_steps=15, record_every=5)
    same = dy.train_single_head(tiny_chain, "em_like", init, n_steps=15, lr_value=0.01, record_every=5)
    fast = dy.train_single_head(tiny_chain, "em_like", init, n_steps=15, record_every=5)
    assert len(sgd["losses"]) == 16 and sgd["manifold"]["step"] == [0, 5, 10, 15]
    assert same["losses"] == sgd["losses"]
    assert fast["losses"][0] == sgd["losses"][0] and fast["final_loss"] < sgd["final_loss"]
    assert init["W_V"].abs().max() < 1.0  # the initial weights are not modified in place
    assert torch.equal(init["W_V"], dy.init_single_head(7)["W_V"])


def test_closed_form_em_descends_fast(tiny_chain):
    init = dy.init_single_head(8)
    em = dy.train_single_head(tiny_chain, "em_closed", init, n_steps=10, record_every=10)
    sgd = dy.train_single_head(tiny_chain, "sgd", init, n_steps=10, record_every=10)
    assert em["losses"][1] < em["losses"][0] - 0.05
    assert em["final_loss"] < sgd["final_loss"]


def test_unknown_method_is_rejected(tiny_chain):
    with pytest.raises(ValueError, match="em_closed"):
        dy.train_single_head(tiny_chain, "adam", dy.init_single_head(0), n_steps=1)


def test_steps_to_reach_counts_like_the_authors():
    assert dy.steps_to_reach([3.0, 2.5, 2.0, 1.0], 2.0) == 3  # strictly below
    assert dy.steps_to_reach([3.0, 2.5], 1.0) is None


def test_sticky_comparison_summary():
    s = dy.sticky_comparison([3, 4, 5], T=120, n_steps=20, record_every=10)
    assert s["seeds"] == [3, 4, 5] and set(s["methods"]) == set(dy.METHODS)
    assert s["entropy_floor"] == pytest.approx(1.829, abs=1e-3)
    for m in ("em_like", "em_closed"):
        row = s["methods"][m]
        lo, hi = row["speedup_ci95"]
        assert lo <= row["speedup_geomean"] <= hi
        assert len(row["steps_to_sgd_final"]) == 3 and math.isfinite(row["paired_p"])
        assert all(sp >= 1 for sp in row["speedup_per_seed"])
    assert len(s["loss_curves"]["sgd"]) == 21
    assert s["methods"]["sgd"]["manifold"]["step"] == [0, 10, 20]
    text = markdown_tables({"laws": dy.law_check(3), "law_cases": 3, "sticky": s, "deep": [], "threads": 1,
                               "seconds": {"laws": 0.1, "sticky": 1.0, "deep": 0.0}})
    assert "| em_closed |" in text and "d_scores" in text
    json.dumps(s)  # tidy: plain JSON


def test_sticky_comparison_in_processes_gives_the_same_numbers():
    kw = dict(T=80, n_steps=6, record_every=3)
    one, two = dy.sticky_comparison([1, 2], **kw), dy.sticky_comparison([1, 2], jobs=2, **kw)
    assert [r["seed"] for r in two["per_seed"]] == [1, 2]
    for a, b in zip(one["per_seed"], two["per_seed"]):
        assert {k: v for k, v in a.items() if k != "seconds"} == {k: v for k, v in b.items() if k != "seconds"}


def test_geometric_mean_interval_brackets_the_geometric_mean():
    centre, lo, hi = dy.geometric_mean_interval([2.0, 2.5, 3.0, 2.2, 2.8])
    assert lo < centre < hi and centre == pytest.approx(math.exp(sum(map(math.log, [2.0, 2.5, 3.0, 2.2, 2.8])) / 5))


def test_deep_variant_runs_and_is_reproducible():
    kw = dict(T=40, n_steps=3, d_model=16, n_layers=1, n_heads=2, d_ff=32)
    state = torch.get_rng_state()
    a, b = dy.train_deep(11, **kw), dy.train_deep(11, **kw)
    assert torch.equal(state, torch.get_rng_state())
    assert a["train_losses"] == b["train_losses"] and len(a["train_losses"]) == 3
    assert math.isfinite(a["test_loss"]) and 0 < a["test_entropy"] <= math.log(8) + 1e-6


# ---------------------------------------------------------------- frame vs precision


def test_settle_step_rising_falling_flat_and_relapsing():
    steps = [0, 100, 200, 300, 400]
    assert dy.settle_step(steps, [0.0, 0.5, 0.95, 0.97, 1.0]) == 200
    assert dy.settle_step(steps, [1.0, 0.5, 0.05, 0.02, 0.0]) == 200  # falling metric
    assert dy.settle_step(steps, [0.3, 0.3, 0.3, 0.3, 0.3]) == 0
    assert dy.settle_step(steps, [0.0, 0.95, 0.5, 0.96, 1.0]) == 300  # must stay above the line
    assert dy.settle_step(steps, [1.0, 0.1, 0.01, 0.001, 0.0001]) == 100
    assert dy.settle_step(steps, [1.0, 0.1, 0.01, 0.001, 0.0001], log=True) == 400  # decades of progress


def test_frame_metrics_on_known_inputs():
    eye = torch.eye(4, dtype=torch.float64)[:, None, :].expand(4, 2, 4)  # 4 orthonormal keys, 2 heads
    assert torch.allclose(dy.key_orthogonality(eye), torch.zeros(2, dtype=torch.float64))
    same = torch.ones(5, 1, 3, dtype=torch.float64)
    assert torch.allclose(dy.key_orthogonality(same), torch.ones(1, dtype=torch.float64))
    p = torch.softmax(torch.randn(2, 3, 6, 6, dtype=torch.float64), -1)
    assert dy.attention_similarity(p, p) == pytest.approx(1.0)
    a, b = torch.eye(6, dtype=torch.float64), torch.eye(6, dtype=torch.float64).roll(1, 1)
    assert dy.attention_similarity(a, b) == pytest.approx(0.0, abs=1e-12)


def test_low_entropy_separation():
    gen = torch.Generator().manual_seed(4)
    h = torch.arange(400, dtype=torch.float64) % 20 / 4
    ordered = torch.stack([h, 0.01 * torch.randn(400, generator=gen, dtype=torch.float64)], 1)
    collapsed = torch.stack([h.clamp_min(1.25), torch.randn(400, generator=gen, dtype=torch.float64)], 1)
    assert dy.low_entropy_separation(ordered, h) > 0.95  # < 1 only through ties in h
    assert dy.low_entropy_separation(collapsed, h) < 0.2


SHARPNESS = torch.arange(8.0)[:, None] * torch.arange(5.0) / 2  # [T, 5] logits of a posterior sharpening with position


class FakeHooked(torch.nn.Module):
    """A stand-in for a hooked model whose frame is fixed by step 100 and whose values align slowly (step 800): its
    forward runs the hooks ``model.read`` registers (``hooks``) on the activations below."""

    def __init__(self, step: int, n_layers: int = 2, heads: int = 2, T: int = 8, n_hyp: int = 5) -> None:
        super().__init__()
        self.cfg = SimpleNamespace(n_layers=n_layers, n_heads=heads, n_key_value_heads=heads, d_head=8, n_ctx=T)
        self.hook_dict, self.fwd_hooks = {}, []
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # the device and dtype ``read`` asks the parameters for
        self.frame, self.precision = min(step / 100, 1.0), min(step / 800, 1.0)
        self.heads, self.T, self.n_hyp = heads, T, n_hyp
        gen = torch.Generator().manual_seed(0)
        self.final_scores = torch.randn(n_layers, heads, T, T, generator=gen)
        self.key_base = torch.randn(n_hyp, heads, 8, generator=gen)
        self.noise = torch.randn(64, T, 1, 6, generator=gen)

    def activations(self, ids):
        n, T = ids.shape
        cache = {}
        if T == 1:  # hypothesis tokens alone: keys become orthogonal in head 1 as the frame forms
            keys = self.key_base.clone()
            keys[:, 1] = (1 - self.frame) * keys[:, 1] + self.frame * 5 * torch.eye(self.n_hyp, 8)
            cache["blocks.0.attn.hook_k"] = keys[:, None]
            return torch.zeros(n, 1, 10), cache
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        for layer in range(self.cfg.n_layers):
            s = self.frame * self.final_scores[layer].expand(n, -1, -1, -1)
            cache[f"blocks.{layer}.attn.hook_pattern"] = torch.softmax(s.masked_fill(mask, float("-inf")), -1)
        entropy = torch.arange(T, dtype=torch.float32).expand(n, T) / T  # stands in for the Bayes entropy
        signal = (self.precision * entropy)[..., None, None]
        values = torch.cat([signal * 10, signal.expand(-1, -1, 1, 5)], -1) + (1.05 - self.precision) * self.noise[:n]
        cache[f"blocks.{self.cfg.n_layers - 1}.attn.hook_v"] = values
        logits = torch.zeros(n, T, 10)
        logits[..., 5:] = self.precision * SHARPNESS[:T]  # reaches the posterior of the test at step 800
        return logits, cache

    @contextmanager
    def hooks(self, fwd_hooks=()):
        self.fwd_hooks = list(fwd_hooks)
        try:
            yield self
        finally:
            self.fwd_hooks = []

    def forward(self, ids, logits_to_keep: int = 0, use_cache: bool = False):
        logits, cache = self.activations(ids)
        for name, hook in self.fwd_hooks:
            hook(cache[name], hook=None)
        return logits[:, -logits_to_keep:] if logits_to_keep else logits


def test_frame_precision_from_checkpoints_finds_the_dissociation(tmp_path):
    n, T, hyp = 64, 8, list(range(5, 10))
    # a posterior that sharpens with position, as the fake's values encode (a random one would leave nothing for
    # entropy_r2 to find: its curve would be noise around 0 whose "settle step" means nothing)
    post = torch.softmax(SHARPNESS + 0.01 * torch.randn(n, T, 5, generator=torch.Generator().manual_seed(5)), -1)
    batch = SimpleNamespace(input_ids=torch.zeros(n, T, dtype=torch.long), query_pos=torch.arange(T), posterior=post)
    checkpoints = []
    for step in [0, 50, 100, 200, 400, 600, 800, 1000]:
        (tmp_path / f"step-{step}").mkdir()
        (tmp_path / f"step-{step}" / "step.json").write_text(json.dumps(step))
        checkpoints.append((step, tmp_path / f"step-{step}"))
    loader = lambda path: FakeHooked(json.loads((path / "step.json").read_text()))  # noqa: E731
    res = dy.frame_precision_from_checkpoints(checkpoints[::-1], batch, hyp, loader=loader)
    assert res["steps"] == [0, 50, 100, 200, 400, 600, 800, 1000]
    assert res["curves"]["attention_similarity"][-1] == pytest.approx(1.0)
    assert res["curves"]["frame_head_match"][-1] == 1.0
    assert all(res["settle"][m] <= 100 for m in dy.FRAME_METRICS)
    assert all(res["settle"][m] >= 600 for m in ("pc1_share", "entropy_r2", "entropy_mae"))
    assert res["ratio"] >= 6
    with pytest.raises(ValueError, match="two checkpoints"):
        dy.frame_precision_from_checkpoints(checkpoints[:1], batch, hyp, loader=loader)


def test_dissociation_and_ratio_interval():
    steps = [0, 100, 200, 400, 800]
    curves = {m: [0, 1, 1, 1, 1] for m in dy.FRAME_METRICS} | {m: [0, 0.1, 0.2, 0.5, 1] for m in dy.PRECISION_METRICS}
    d = dy.dissociation(steps, curves)
    assert d["frame_step"] == 100 and d["precision_step"] == 800 and d["ratio"] == 8
    iv = dy.ratio_interval([8.0, 6.0, 10.0])
    assert iv["lo"] < iv["geomean"] < iv["hi"] and iv["n"] == 3


def test_checkpoint_series_reads_a_windtunnel_run(tmp_path):
    for step in (50, 100):
        (tmp_path / "checkpoints" / f"step_{step:06d}").mkdir(parents=True)
    (tmp_path / "windtunnel.json").write_text(json.dumps({"config": {"task": "bijection", "steps": 400}}))
    assert dy.checkpoint_series(tmp_path) == [(50, tmp_path / "checkpoints" / "step_000050"),
                                              (100, tmp_path / "checkpoints" / "step_000100"), (400, tmp_path)]
    with pytest.raises(ValueError, match="fewer than two"):
        dy.checkpoint_series(tmp_path / "checkpoints")
