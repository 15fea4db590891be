"""Entropy axis against hypothesis frame (``analyses.subspaces``): the cost, in bits against the exact posterior, of
cutting (or keeping only) the entropy axis and each hypothesis frame at one site of each layer of a wind-tunnel
transformer, beside isotropic and variance-matched random subspaces of the same dimension (docs/windtunnels.md's
ablation tables). The bijection and HMM tunnels; no verdict is stated (the tables show costs beside controls)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from ..analyses.subspaces import OPS, subspace_rows
from ..core.errors import ConfigError
from ..core.figures import COLOURS, axis_titles, error_bars
from ..core.plugin import Kind, Line, Result
from ..core.registry import register
from ..core.results import Row, find, select
from ..windtunnel.tunnels import open_tunnel
from .common import figure_per_probe
from .windtunnel import TunnelParams, check_layers, tunnel_plan, tunnel_subject

MEASURES = ("kl_bits", "mae_bits")


@dataclass(frozen=True)
class SubspacesParams(TunnelParams):
    tunnel_tasks: ClassVar[tuple[str, ...]] = ("bijection", "hmm")
    tunnel_archs: ClassVar[tuple[str, ...] | None] = ("transformer",)  # hook_v / hook_z edits
    tunnel: str = "bijection-cpu"  # a packaged checkpoint's name or a trained folder
    site: Literal["v", "z", "resid"] = "v"  # hook_v, hook_z or the residual stream after the block
    layers: tuple[int, ...] = ()  # (): every layer; negative counts from the end
    ops: tuple[str, ...] = ("cut", "only")
    n_fit: int = field(default=400, metadata={"least": 2})  # sequences the subspaces are fitted on
    n_eval: int = field(default=300, metadata={"least": 2})  # other sequences the edits are scored on
    n_isotropic: int = field(default=10, metadata={"least": 1})
    n_matched: int = field(default=10, metadata={"least": 1})
    seed: int = 2024  # the sequence draws, the controls and the bootstrap

    def check(self, ctx, probe: str) -> None:
        check_layers(ctx, probe, self.tunnel, dict(layers=self.layers or None))
        unknown = sorted(set(self.ops) - set(OPS))
        if unknown:
            raise ConfigError(f"Probe '{probe}': unknown subspace edit(s) {unknown} in 'ops'; choose from "
                              f"{', '.join(OPS)}.")


def run(ctx, p: SubspacesParams) -> Result:
    tunnel = open_tunnel(p.tunnel)
    rows, draws = subspace_rows(tunnel.model, tunnel.task, site=p.site, layers=list(p.layers) or None, ops=p.ops,
                                n_fit=p.n_fit, n_eval=p.n_eval, n_isotropic=p.n_isotropic, n_matched=p.n_matched,
                                seed=p.seed)
    return Result(rows, dict(draws=draws, task=tunnel.config.task, arch=tunnel.config.arch))


def edit_rows(rows: list[Row]) -> list[Row]:
    """The edits' cost rows (``<op>_<measure>``), in the order they came."""
    return [r for r in rows if r.metric in {f"{op}_{m}" for op in OPS for m in MEASURES}]


def summary(rows: list[Row], p: SubspacesParams) -> list[Line]:
    where = tunnel_subject(p)
    base_kl, base_mae = find(rows, "unedited_kl_bits"), find(rows, "unedited_mae_bits")
    out = [Line(f"{where}: the unedited model at hook {p.site}", f"KL {base_kl.value:.4f} bits, |H error| "
                f"{base_mae.value:.4f} bits (n {base_kl.n} sequences)")]
    for r in edit_rows(rows):
        at = r.scope
        iso = find(rows, f"{r.metric}_controls", layer=at["layer"], subspace=at["subspace"], family="isotropic")
        out.append(Line(f"{where}: {r.metric.split('_', 1)[0]} {at['subspace']} (k = {at['k']}) at layer "
                        f"{at['layer']}: {r.metric.split('_', 1)[1].replace('_', ' ')} cost",
                        f"{r.value:+.4f} [{r.low:+.4f}, {r.high:+.4f}]; matched {r.null_low:+.4f} to "
                        f"{r.null_high:+.4f}; isotropic {iso.low:+.4f} to {iso.high:+.4f}"))
    return out


@figure_per_probe("subspaces", tunnel_subject)
def figures(fig, pr, where):
    """Per probe: each edit's KL cost with its interval beside the matched controls' range."""
    for op in OPS:
        rs = select(pr.rows, f"{op}_kl_bits")
        if not rs:
            continue
        x = [f"L{r.scope['layer']} {r.scope['subspace']}" for r in rs]
        fig.add_scatter(x=x, y=[r.value for r in rs], mode="markers", name=op, error_y=error_bars(rs))
        fig.add_scatter(x=x, y=[r.null_high for r in rs], mode="markers", name=f"{op}: matched top",
                        marker=dict(symbol="line-ew-open", size=14, color=COLOURS["permuted"]))
    axis_titles(fig, "layer and subspace", "KL cost over the unedited model (bits)", xaxis=dict(type="category"))
    return (f"Subspace edits in {where}", "The cost of cutting / keeping only each subspace",
            "Paired bootstrap 95% intervals over sequences; dashes: the top of the variance-matched controls' range.")


def plan(ctx, p: SubspacesParams) -> list:
    return tunnel_plan(p, f"subspaces fitted on {p.n_fit} sequences, each edit and {p.n_isotropic + p.n_matched} "
                       f"controls scored on {p.n_eval} (a small model: minutes)")


KIND = register(Kind("subspaces", SubspacesParams, run, summary, figures, plan, doc=__doc__, subject=tunnel_subject))
