"""Prefix reuse: replaying the residual entering block L equals the whole forward pass, bit for bit, in every
family (rotary, partial rotary, parallel residual, learned positions, a sliding window shorter than the prompt)."""

import pytest
import torch

from interp_bayes.model.edits import AxisCut
from interp_bayes.model.read import final_position_tail
from interp_bayes.model.prefix import capture_residuals, per_copy, replay_prefix


def _inputs(bridge, batch=3, length=24):
    """Token ids longer than Mistral's sliding window (16), and a unit direction in value space."""
    ids = torch.randint(2, 400, (batch, length), generator=torch.Generator().manual_seed(0))
    dim = (bridge.cfg.n_key_value_heads or bridge.cfg.n_heads) * bridge.cfg.d_head
    u = torch.randn(dim, generator=torch.Generator().manual_seed(1))
    return ids, u


@torch.no_grad()
def test_replayed_prefix_equals_the_whole_forward_bit_for_bit(tiny):
    bridge, _, _ = tiny
    ids, u = _inputs(bridge)
    with capture_residuals(bridge, [1]) as residual:
        base = bridge(ids)
    edit = [("blocks.1.attn.hook_v", lambda v, hook: AxisCut(u)(v))]
    with bridge.hooks(fwd_hooks=edit):
        whole = bridge(ids)
        with replay_prefix(bridge, 1, residual[1]):
            replayed = bridge(ids)
        with replay_prefix(bridge, 1, residual[1], copies=2):
            stacked = bridge(ids.repeat(2, 1))
    assert (whole - base).abs().max() > 1e-3  # the edit does something
    assert torch.equal(replayed, whole)
    assert torch.equal(stacked[:3], whole) and torch.equal(stacked[3:], whole)
    with replay_prefix(bridge, 1, torch.zeros_like(residual[1])):  # block 0 really is skipped
        assert not torch.equal(bridge(ids), base)
    assert torch.equal(bridge(ids), base) and "forward" not in vars(bridge.blocks[0])  # restored on exit


@torch.no_grad()
def test_final_position_tail_and_per_copy_modules(tiny):
    """The last block cut to the final position gives the final position's logits; with that block's output
    projection, MLP and the unembedding run per copy, two stacked copies give each copy exactly its own logits."""
    bridge, _, _ = tiny
    ids, _ = _inputs(bridge, batch=2, length=8)
    whole = bridge(ids)[:, -1]
    tail_hooks = final_position_tail(bridge)
    with bridge.hooks(fwd_hooks=tail_hooks):
        tail = bridge(ids)[:, -1]
        last = bridge.blocks[-1]
        with per_copy([last.attn.o, last.mlp, bridge.unembed], 2):
            pair = bridge(torch.cat([ids, ids.flip(0)]))[:, -1]
    torch.testing.assert_close(tail, whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pair, torch.cat([tail, tail.flip(0)]), rtol=1e-6, atol=1e-6)
    with pytest.raises(RuntimeError, match="inside"), per_copy([bridge.unembed], 2):
        raise RuntimeError("inside")
    assert "forward" not in vars(bridge.unembed)
