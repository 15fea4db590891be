"""A manifold move on the Kalman tunnel against linear shifts of the same size (issue 28, ``analyses.manifold_move``):
a belief state (the residual stream after a block, at an observation step) replaced by another sequence's state of
the target exact spread, beside steps along the decoded spread direction and random steps; per layer, the predicted
spread's change towards the target, its gain on the exact change, the side effects on the predicted mean and the
distance from the real states (docs/windtunnels.md's table). No verdict is stated: the table shows the numbers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ..analyses.manifold_move import OPS, kalman_move
from ..core.figures import axis_titles, error_bars
from ..core.plugin import Kind, Line, Result
from ..core.registry import register
from ..core.results import Row, find, select
from ..windtunnel.tunnels import open_tunnel
from .common import figure_per_probe
from .windtunnel import TunnelParams, tunnel_plan, tunnel_subject


@dataclass(frozen=True)
class ManifoldMoveParams(TunnelParams):
    tunnel_tasks: ClassVar[tuple[str, ...]] = ("kalman",)
    tunnel_archs: ClassVar[tuple[str, ...] | None] = ("transformer",)  # the residual stream is written per position
    tunnel: str = "kalman-cpu"  # a packaged checkpoint's name or a trained folder
    layers: tuple[int, ...] = (0, 1, 2)  # blocks whose output is moved, one at a time
    n_sequences: int = field(default=120, metadata={"least": 4})  # half fit the spread probe, half are moved
    delta: float = 1.0  # the target spread: the row's own +- delta sd of the spread at its step
    n_random: int = field(default=10, metadata={"least": 1})
    seed: int = 2024  # the sequence draws, the random steps and the bootstrap


def run(ctx, p: ManifoldMoveParams) -> Result:
    tunnel = open_tunnel(p.tunnel)
    return Result([r for layer in p.layers for r in kalman_move(
        tunnel.model, tunnel.task, layer=layer, n_sequences=p.n_sequences, seed=p.seed, delta=p.delta,
        n_random=p.n_random)])


def layers_of(rows: list[Row]) -> list[int]:
    return sorted({r.scope["layer"] for r in rows})


def summary(rows: list[Row], p: ManifoldMoveParams) -> list[Line]:
    where, out = tunnel_subject(p), []
    for layer in layers_of(rows):
        for op in OPS:
            change = find(rows, "spread_change", layer=layer, op=op)
            gain = find(rows, "spread_gain", layer=layer, op=op)
            err, off = find(rows, "mean_error", layer=layer, op=op), find(rows, "off_manifold", layer=layer, op=op)
            out.append(Line(f"{where}: {op} after block {layer}: spread change [95%], gain, mean error, off-manifold",
                            f"{change.value:+.3f} [{change.low:+.3f}, {change.high:+.3f}], "
                            f"{'–' if gain is None else f'{gain.value:.2f}'}, {err.value:.3f}, {off.value:.2f}"))
    return out


@figure_per_probe("manifold-move", tunnel_subject)
def figures(fig, pr, where):
    """Per probe: each op's spread change towards the target against the layer, with its interval."""
    for op in OPS:
        rs = sorted(select(pr.rows, "spread_change", op=op), key=lambda r: r.scope["layer"])
        fig.add_scatter(x=[r.scope["layer"] for r in rs], y=[r.value for r in rs], mode="lines+markers", name=op,
                        error_y=error_bars(rs))
    axis_titles(fig, "block whose output is moved", "predicted ln sd change towards the target",
                xaxis=dict(type="category"))
    return (f"Manifold move in {where}", "A move to another sequence's state against linear and random steps",
            "Bootstrap 95% intervals over sequences; random: the 95% range over its draws.")


def plan(ctx, p: ManifoldMoveParams) -> list:
    return tunnel_plan(p, f"{p.n_sequences} sequences, states moved after {len(p.layers)} block(s) (a small model: "
                       "minutes per block)")


KIND = register(Kind("manifold_move", ManifoldMoveParams, run, summary, figures, plan, doc=__doc__,
                     subject=tunnel_subject))
