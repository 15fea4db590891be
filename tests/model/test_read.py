"""The one activation reader, ``model.read.read`` (and ``patterns``): the functions that became calls of it give what
their own hooks gave (the former hook code is kept here as the reference, and the same arithmetic runs, so outputs
are equal bit for bit), its rows at positions, its refusals, and ``Context.activations`` caching a wind tunnel's
readings by identity."""

import math

import numpy as np
import pytest
import torch

from interp_bayes.analyses.manifold_move import token_readout
from interp_bayes.analyses.subspaces import every_position
from interp_bayes.model.collect import collect, query_readings, token_values
from interp_bayes.model.hooks import reading_hook
from interp_bayes.model.loading import load_model
from interp_bayes.model.read import (Activations, Sequences, continuous_inputs, final_logits, length_batches, read,
                                     sites_of, tokenize)
from interp_bayes.model.testing import float32_lambda, float32_spread
from interp_bayes.tasks.base import TaskBatch
from interp_bayes.windtunnel.kalman import gaussian_head, kalman_readings
from interp_bayes.windtunnel.tunnels import open_tunnel

torch.set_num_threads(1)
PROMPTS = ["the cat sat on the mat", "hello world 0 1 2 3", "in context learning with induction heads",
           "the cat sat", "hello world", "a b c d e f g", "def f(x): return x + 1", "the mat"]


# --- the former readers, as they were before they became calls of ``read`` -----------------------------------------

@torch.no_grad()
def former_token_values(model, prompts, layers, site="v", batch_size=None):
    token_ids = tokenize(model, prompts)
    out = {layer: [None] * len(token_ids) for layer in layers}
    got = {}

    def keep(layer):
        def hook(act, hook):
            got[layer] = act.detach().to("cpu", torch.float32).reshape(*act.shape[:2], -1)
        return hook

    blocks = {layer: layer % model.cfg.n_layers for layer in layers}
    with model.hooks(fwd_hooks=[(reading_hook(site, blocks[layer]), keep(layer)) for layer in layers]):
        for idx in length_batches(token_ids, batch_size):
            final_logits(model, torch.tensor([token_ids[i] for i in idx]))
            for layer in layers:
                for r, i in enumerate(idx):
                    out[layer][i] = got[layer][r].clone()
    return out


@torch.no_grad()
def former_query_readings(model, batch, layers, readings, batch_size=250):
    pos = batch.query_pos
    got = {(r, layer): [] for r in readings for layer in layers}

    def keep(reading, layer):
        def hook(act, hook):
            picked = act[:, pos].detach().to("cpu", torch.float32)
            got[(reading, layer)].append(picked.reshape(picked.shape[0] * picked.shape[1], -1))
        return hook

    with model.hooks(fwd_hooks=[(reading_hook(r, layer), keep(r, layer)) for r in readings for layer in layers]):
        for start in range(0, batch.input_ids.shape[0], batch_size):
            model(batch.input_ids[start: start + batch_size])
    return {r: {layer: torch.cat(got[(r, layer)]) for layer in layers} for r in readings}


@torch.no_grad()
def former_kalman_readings(bridge, batch, readout_ids, state_dim, layers, readings, batch_size):
    names = {(r, layer): reading_hook(r, layer) for r in readings for layer in layers}
    qpos, K = batch.query_pos, len(batch.query_pos)
    parts = {key: [] for key in names}
    cov = []
    for start in range(0, batch.features.shape[0], batch_size):
        with continuous_inputs(bridge, batch.features[start:start + batch_size]) as ids:
            logits, cache = bridge.run_with_cache(ids, names_filter=list(names.values()))
        for (r, layer), name in names.items():
            act = cache[name].float().cpu()
            if r == "attn_entropy":
                p = act[:, :, qpos]
                act = (-torch.special.xlogy(p, p).sum(-1) / math.log(2)).transpose(1, 2)
            else:
                act = act[:, qpos].reshape(act.shape[0], K, -1)
            parts[(r, layer)].append(act.reshape(-1, act.shape[-1]))
        _, chol = gaussian_head(logits[:, qpos][..., readout_ids].double().cpu(), state_dim)
        cov.append(chol @ chol.mT)
    return {key: torch.cat(chunks) for key, chunks in parts.items()}, torch.cat(cov)


@torch.no_grad()
def former_take_snapshot(model, batch, hypothesis_ids):
    """``dynamics.frames.take_snapshot``'s two ``run_with_cache`` passes, as they were."""
    n_layers = model.cfg.n_layers
    hyp = torch.as_tensor(list(hypothesis_ids))
    keep = lambda name: name.endswith(("hook_pattern", "hook_v", "hook_k"))  # noqa: E731
    logits, cache = model.run_with_cache(batch.input_ids, names_filter=keep)
    _, key_cache = model.run_with_cache(hyp[:, None], names_filter=keep)
    log_p = torch.log_softmax(logits[:, batch.query_pos][..., hyp].double(), -1)
    values = cache[f"blocks.{n_layers - 1}.attn.hook_v"][:, batch.query_pos]
    return dict(patterns=[cache[f"blocks.{layer}.attn.hook_pattern"].double() for layer in range(n_layers)],
                layer0_keys=key_cache["blocks.0.attn.hook_k"][:, 0].double(),
                values=values.flatten(2).flatten(0, 1).double(), log_p=log_p,
                groups=np.repeat(np.arange(values.shape[0]), values.shape[1]))


def former_model_site(model, prompts, layer: int, reading: str, label_tokens, *, batch_size=None):
    """``analyses.causal.model_site`` with its own value-vector hook and its residual site read off the capture, as it
    was."""
    from interp_bayes.analyses.causal import Site
    from interp_bayes.model.prefix import capture_residuals, replay_prefix
    from interp_bayes.model.read import final_position_tail

    token_ids = tokenize(model, prompts)
    device = next(model.parameters()).device
    labels = torch.tensor(list(label_tokens), device=device)
    start = layer + 1 if reading == "resid" else layer  # the first block an edit at the site changes
    batches = [np.asarray(b) for b in length_batches(token_ids, batch_size)]
    where = {}  # row -> (batch, position in it)
    captured, h = [], torch.empty(len(token_ids), 0)
    v_hook = reading_hook("v", layer)
    for j, rows in enumerate(batches):
        ids = torch.tensor([token_ids[i] for i in rows], device=device)
        kept = {}

        def keep(act, hook):
            kept["v"] = act[:, -1].reshape(act.shape[0], -1).detach()

        with torch.no_grad(), capture_residuals(model, [start]) as store, \
                model.hooks(fwd_hooks=[(v_hook, keep)] if reading == "v" else []):
            final_logits(model, ids)
        res = store.get(start)
        captured.append(res)
        vec = kept["v"] if reading == "v" else (res[0] if isinstance(res, tuple) else res)[:, -1]
        if h.shape[1] == 0:
            h = torch.empty(len(token_ids), vec.shape[1])
        h[torch.as_tensor(rows)] = vec.float().cpu()
        for p, i in enumerate(rows.tolist()):
            where[i] = (j, p)

    def run(base: np.ndarray, new: torch.Tensor) -> torch.Tensor:
        j = where[int(base[0])][0]
        pos = torch.tensor([where[int(i)][1] for i in base])
        copies = new.shape[0] // len(base)
        ids = torch.tensor([token_ids[i] for i in base], device=device).repeat(copies, 1)
        res = captured[j]
        hidden = res[0] if isinstance(res, tuple) else res
        if res is not None:
            hidden = hidden[pos.to(hidden.device)].repeat(copies, *([1] * (hidden.dim() - 1)))
        new = new.to(device)
        hooks = final_position_tail(model)
        if reading == "resid":
            hidden = torch.cat([hidden[:, :-1], new[:, None].to(hidden.dtype)], 1)
        else:
            def swap(act, hook):
                return torch.cat([act[:, :-1], new.reshape(act.shape[0], 1, *act.shape[2:]).to(act.dtype)], 1)
            hooks = [(v_hook, swap)] + hooks
        replay = None if res is None else ((hidden, *res[1:]) if isinstance(res, tuple) else hidden)
        with replay_prefix(model, start, replay), model.hooks(fwd_hooks=hooks):
            logits = final_logits(model, ids)
        return torch.log_softmax(logits.float()[:, labels], dim=-1).cpu()

    return Site(h, run, batches)


# --- each move: equal outputs ---------------------------------------------------------------------------------------

def test_token_values_equal_the_former_hooks(tiny):
    bridge, _, _ = tiny
    for site, layers, batch_size in (("v", [0, -1], 2), ("z", [1], None), ("resid", [-1], 3)):
        new, old = (f(bridge, PROMPTS, layers, site=site, batch_size=batch_size)
                    for f in (token_values, former_token_values))
        assert set(new) == set(old) == set(layers)
        for layer in layers:
            assert all(torch.equal(a, b) for a, b in zip(new[layer], old[layer], strict=True)), (site, layer)


@pytest.mark.parametrize("name", ["bijection-cpu", "hmm-cpu", "bijection-cpu-lstm"])
def test_query_readings_and_every_position_equal_the_former_hooks(name):
    tunnel = open_tunnel(name)
    model = tunnel.model
    batch = tunnel.task.sample(12, seed=3)
    layers = list(range(model.cfg.n_layers))
    readings = ("resid", "resid_pre") if "lstm" in name else ("resid", "v", "z", "resid_pre")
    new = query_readings(model, batch, layers=layers, readings=readings, batch_size=5)
    old = former_query_readings(model, batch, layers, readings, batch_size=5)
    assert all(torch.equal(new[r][layer], old[r][layer]) for r in readings for layer in layers)
    if "lstm" not in name:  # every position: the former route read a batch whose query positions are all of them
        T = batch.input_ids.shape[1]
        x, tokens = every_position(model, batch, 1, "v")
        ref = former_query_readings(model, TaskBatch(batch.input_ids, torch.arange(T), batch.posterior, batch.labels),
                                    [1], ("v",))["v"][1]
        assert np.array_equal(x, ref.double().numpy()) and np.array_equal(tokens, batch.input_ids.reshape(-1).numpy())


def test_kalman_readings_equal_the_former_run_with_cache():
    tunnel = open_tunnel("kalman-cpu")
    task, bridge = tunnel.task, tunnel.model
    readings, layers = ("v", "resid", "attn_entropy"), list(range(bridge.cfg.n_layers))
    acts, cols = kalman_readings(bridge, task, 7, seed=5, readings=readings, batch_size=3)
    old, cov = former_kalman_readings(bridge, task.sample(7, seed=5), task.readout_ids, task.state_dim, layers,
                                      readings, batch_size=3)
    assert all(torch.equal(acts.reading(r, layer), old[(r, layer)]) for r in readings for layer in layers)
    assert np.array_equal(cols["model_logdet"], torch.linalg.slogdet(cov).logabsdet.reshape(-1).numpy())
    assert np.array_equal(acts.groups, np.repeat(np.arange(7), len(task.sample(1, seed=0).query_pos)))


def test_token_readout_is_the_former_forward_within_float32_rounding(tiny_dirs):
    """The readout now reads its logits through ``read`` at the final token, which computes the last block's output
    projection and MLP at the final position only (``final_position_tail``): another matrix shape than the former
    full forward, so the two agree to the float32 rounding of the forward (``float32_spread``), not bit for bit."""
    folder = tiny_dirs["llama3"]
    bridge, b64 = load_model(folder), load_model(folder, dtype=torch.float64)
    prompts, layer = PROMPTS[:3], 1
    token_ids = tokenize(bridge, prompts)

    @torch.no_grad()
    def former(model, i, state):
        def write(act, hook):
            act = act.clone()
            act[:, -1] = state.to(act.dtype)
            return act

        with model.hooks(fwd_hooks=[(reading_hook("resid", layer), write)]):
            return torch.log_softmax(final_logits(model, torch.tensor([token_ids[i]])).to(torch.float64), -1)[0]

    states = collect(bridge, prompts, layers=(layer,), readings=("resid",), progress=False).reading("resid", layer)
    edited = states[[1, 2, 0]] * 1.1
    # the readout's "mean" is what ``summarize`` makes of the log-probabilities: here all of them, [rows, vocab]
    readout = token_readout(bridge, prompts, layer, lambda lp: (lp, lp[:, 0]), number_tokens=[10, 11, 12])
    got = readout(edited.numpy(), np.arange(3))["mean"]
    spread = float32_spread(lambda: [former(b64, i, edited[i].double()) for i in range(3)])
    lam = float32_lambda(3)
    for i in range(3):
        diff = torch.from_numpy(got[i]) - former(bridge, i, edited[i])
        bound = lam * math.sqrt(2) * spread[i].sum().sqrt().item()
        assert diff.norm().item() <= bound, (i, diff.norm().item(), bound)


# --- the reader itself ----------------------------------------------------------------------------------------------

def test_rows_at_every_position_are_prefixes_read_at_their_final_token(tiny):
    bridge, _, _ = tiny
    acts = read(bridge, PROMPTS[:4], sites_of([0, -1], ("v", "attn_entropy")), "all", batch_size=1)
    lengths = [len(ids) for ids in tokenize(bridge, PROMPTS[:4])]
    assert len(acts) == sum(lengths) and np.array_equal(acts.groups, np.repeat(np.arange(4), lengths))
    assert acts.meta["at"] == "all" and acts.token_ids[lengths[0] - 1] == tokenize(bridge, PROMPTS[:1])[0]
    # a prefix read alone at its final token: the same hooked values; the entropy at the prefix's last position
    # comes from the full forward there and from the final-position tail here, so it agrees to rounding
    row = 3
    alone = read(bridge, [acts.token_ids[row]], sites_of([0], ("v", "attn_entropy")), "final")
    assert torch.equal(alone.reading("v", 0)[0], acts.reading("v", 0)[row])
    torch.testing.assert_close(alone.reading("attn_entropy", 0)[0], acts.reading("attn_entropy", 0)[row])
    torch.testing.assert_close(alone.entropy[0], acts.entropy[row])


def test_readings_alone_are_those_of_a_whole_forward(tiny):
    """``read(distribution=False)`` computes no next-token distribution and stops after the deepest site's block,
    which runs whole: its readings equal, bit for bit, those beside the distribution at every position, and at the
    final token the whole forward's rows at each prompt's last position; blocks past the deepest site never run."""
    bridge, _, _ = tiny
    last = bridge.cfg.n_layers - 1
    for sites in ([(0, "v"), (0, "resid")], sites_of([0, last], ("v", "z", "resid", "attn_entropy"))):
        whole = read(bridge, PROMPTS, sites, "all", batch_size=3)
        alone = read(bridge, PROMPTS, sites, "all", batch_size=3, distribution=False)
        final = read(bridge, PROMPTS, sites, "final", batch_size=3, distribution=False)
        ends = np.cumsum(np.bincount(whole.groups)) - 1  # each prompt's last row
        for layer, name in sites:
            assert torch.equal(alone.reading(name, layer), whole.reading(name, layer)), (name, layer)
            assert torch.equal(final.reading(name, layer), whole.reading(name, layer)[ends]), (name, layer)
        assert alone.entropy is None and alone.next_token is None and final.meta["entropy_over"] is None
    fired = []
    with bridge.hooks(fwd_hooks=[(reading_hook("resid", last), lambda act, hook: fired.append(hook.name))]):
        read(bridge, PROMPTS, [(0, "v")], distribution=False)
        assert not fired
        read(bridge, PROMPTS, [(0, "v")])
    assert fired  # the hook is live: only the stop kept it from firing


def test_bad_input_is_refused_with_one_sentence(tiny):
    bridge, _, _ = tiny
    with pytest.raises(ValueError, match="Unknown read position 'last'"):
        read(bridge, PROMPTS, at="last")
    with pytest.raises(ValueError, match="Prompts have no query positions"):
        read(bridge, PROMPTS, at="queries")
    with pytest.raises(ValueError, match=r"Unknown reading\(s\) \['q'\]"):
        read(bridge, PROMPTS, [(0, "q")])
    for kw in (dict(label_tokens=[1, 2]), dict(logit_ids=[1]), dict(keep_logprobs=True)):
        with pytest.raises(ValueError, match=r"read\(distribution=False\) keeps readings alone"):
            read(bridge, PROMPTS, [(0, "v")], distribution=False, **kw)
    with pytest.raises(ValueError, match="give it sites"):
        read(bridge, PROMPTS, (), distribution=False)


def test_logits_and_groups_survive_save_and_load(tmp_path):
    tunnel = open_tunnel("kalman-cpu")
    batch = tunnel.task.sample(3, seed=1)
    acts = read(tunnel.model, batch, [(0, "resid")], "queries", logit_ids=tunnel.task.readout_ids)
    back = Activations.load(acts.save(tmp_path / "set"))
    assert torch.equal(back.logits, acts.logits) and np.array_equal(back.groups, acts.groups)
    assert back.token_ids == [[]] * len(acts) and back.meta["positions"] == batch.query_pos.tolist()


# --- Context.activations: a wind tunnel's readings cached by identity -------------------------------------------------

def test_context_caches_a_tunnels_readings_by_identity(tmp_path, monkeypatch):
    import interp_bayes.run.sweep as reader  # the module whose `read` Context.activations calls
    from interp_bayes.core.store import content_key
    from interp_bayes import __version__
    from interp_bayes.run.config import SweepConfig
    from interp_bayes.run.sweep import Context

    said = []
    ctx = Context(tmp_path / "run", SweepConfig(out=str(tmp_path)), said.append)
    tunnel = open_tunnel("bijection-cpu")
    batch = tunnel.task.sample(6, seed=0)
    ask = dict(layers=[0, 1], readings=("v",), at="queries", subject=tunnel)
    first = ctx.activations("queries", batch, **ask)
    assert torch.equal(first.reading("v", 1), query_readings(tunnel.model, batch, layers=[1], readings=("v",))["v"][1])
    kalman = open_tunnel("kalman-cpu")
    kb = kalman.task.sample(4, seed=0)
    gauss = ctx.activations("kalman", kb, layers=[0], readings=("resid",), at="queries", subject=kalman,
                            logit_ids=kalman.task.readout_ids)
    prompts = [[int(t) for t in row[:5]] for row in batch.input_ids]
    final = ctx.activations("final", prompts, layers=[1], readings=("v",), subject=tunnel)
    assert said == ["collecting queries", "collecting kalman", "collecting final (6 prompts)"]

    def no_forward(*args, **kwargs):
        raise AssertionError("a cached set was read again")

    monkeypatch.setattr(reader, "read", no_forward)  # a second ask is served from the run folder
    again = ctx.activations("queries", batch, **ask)
    assert torch.equal(again.reading("v", 0), first.reading("v", 0)) and np.array_equal(again.groups, first.groups)
    assert torch.equal(ctx.activations("kalman", kb, layers=[0], readings=("resid",), at="queries", subject=kalman,
                                       logit_ids=kalman.task.readout_ids).logits, gauss.logits)
    assert torch.equal(ctx.activations("final", prompts, layers=[1], readings=("v",), subject=tunnel).values(1),
                       final.values(1))
    assert len(said) == 3
    # another position, another subject: another key; a final-token set keeps the key it had before ``at`` existed
    paths = {ctx.acts_path("x", batch, layers=[0], at=at, subject=t) for at in ("queries", "all")
             for t in (tunnel, open_tunnel("hmm-cpu"))}
    assert len(paths) == 4
    from interp_bayes.model.read import prompt_digest

    key = content_key(tunnel.identity, None, prompt_digest(prompts), [1], ["v"], None, __version__)
    assert ctx.acts_path("final", prompts, layers=[1], readings=("v",), subject=tunnel).name == f"final-{key}"


@pytest.mark.parametrize("name", ["bijection-cpu", "hmm-sticky-cpu"])
def test_frame_snapshot_equals_the_former_run_with_cache(name):
    """``dynamics.frames.take_snapshot`` reads through ``read`` and ``patterns``: every field as before, bit for bit."""
    from interp_bayes.dynamics.frames import take_snapshot
    from interp_bayes.stats.info import entropy_of_log_probs

    tunnel = open_tunnel(name)
    batch = tunnel.task.sample(6, seed=3)
    new = take_snapshot(tunnel.model, batch, tunnel.task.hypothesis_ids)
    old = former_take_snapshot(tunnel.model, batch, tunnel.task.hypothesis_ids)
    assert len(new.patterns) == len(old["patterns"]) == tunnel.model.cfg.n_layers
    assert all(torch.equal(a, b) for a, b in zip(new.patterns, old["patterns"], strict=True))
    assert torch.equal(new.layer0_keys, old["layer0_keys"]) and torch.equal(new.values, old["values"])
    assert torch.equal(new.model_entropy, entropy_of_log_probs(old["log_p"]).flatten())
    assert np.array_equal(new.groups, old["groups"])


@pytest.mark.parametrize("reading", ["v", "resid"])
def test_causal_site_equals_the_former_hooks(tiny, reading):
    """``analyses.causal.model_site``'s clean pass reads its site, values or residual stream, through ``read``
    (readings alone): the site's vectors, its clean log-probabilities and an interchange at every layer equal the
    former value hook's and residual capture's, bit for bit."""
    from interp_bayes.analyses.causal import model_site

    bridge, _, _ = tiny
    labels = [5, 6, 7]
    for layer in range(bridge.cfg.n_layers):
        new, old = (f(bridge, PROMPTS, layer, reading, labels, batch_size=3) for f in (model_site, former_model_site))
        assert torch.equal(new.h, old.h) and [b.tolist() for b in new.batches] == [b.tolist() for b in old.batches]
        assert torch.equal(new.clean_logp(), old.clean_logp())
        base = new.batches[0]
        swapped = old.h[base].flip(0)  # each base prompt given another's vector
        with torch.no_grad():
            assert torch.equal(new.run(base, swapped), old.run(base, swapped))
