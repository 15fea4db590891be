"""Geometry per architecture (issue 27, item 6; ``interp_bayes.analyses.p4b.tunnel_geometry``): for each wind-tunnel
checkpoint, the exact entropy's held-out R² at the embedding layer and after every block (raw and within position),
the final layer's PC1 share and cluster count against their nulls, and on the HMM how the final layer's clusters
line up with the MAP hidden state and with the last observation.

    python examples/geometry_table.py --out runs/geometry --checkpoints hmm-sticky-cpu hmm-sticky-cpu-lstm ...
    python examples/geometry_table.py --out runs/geometry --render     # the table again from OUT/*/geometry.json

Folders are names under interp_bayes/windtunnel/checkpoints/ or paths to trained folders.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from interp_bayes.analyses.p4b import tunnel_geometry
from interp_bayes.core.checks import count_arg, out_folder_arg, seed_arg
from interp_bayes.core.store import atomic_write_text
from interp_bayes.windtunnel.tunnels import PACKAGED, checkpoint_folder

# Paper I v3's geometry (issue 27): PC1 share of the final layer, entropy R², clusters
PAPER = {"mamba": "PC1 21.9%, 5 clusters (one per HMM state), entropy R² 0.40 at layer 9",
         "lstm": "PC1 92.3%, entropy R² 0.004"}


def r2_cell(g: dict, test: str) -> str:
    rows = [d for d in g["decoding"] if d["test"] == test]
    return ", ".join(f"{d['layer']} {d['r2']:.3f}" + ("" if d["verdict"] == "holds" else f" ({d['verdict']})")
                     for d in rows)


def table(results: list[dict]) -> str:
    header = ("| checkpoint | architecture | entropy R² per layer, raw | within position | PC1 share, standardised "
              "(null) / raw | clusters (best k, silhouette vs null) | ARI with MAP state / last observation "
              "| paper (its HMM family) |")
    lines = [header, "|---" * 8 + "|"]
    for g in results:
        geo, c = g["geometry"], g["geometry"]["clusters"]
        lo, hi = geo["pc1_null"]["pc1_range"]
        align = geo.get("alignment")
        ari = f"{align['map_state']:.3f} / {align['last_observation']:.3f} (k {align['k']})" if align else "—"
        lines.append(f"| {g['checkpoint']} | {g['arch']} | {r2_cell(g, 'decodable')} | {r2_cell(g, 'within position')} "
                     f"| {geo['pc1_share']:.3f} ([{lo:.3f}, {hi:.3f}]) / {geo['pc1_share_raw']:.3f} | "
                     f"{c['n_clusters']} (k {c['best_k']}, {c['silhouette']:.3f} vs [{c['null_range'][0]:.3f}, "
                     f"{c['null_range'][1]:.3f}]) | {ari} | {PAPER.get(g['arch'], '') if g['task'] == 'hmm' else ''} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=out_folder_arg, required=True, help="folder of the <checkpoint>/geometry.json files")
    ap.add_argument("--checkpoints", nargs="+", default=["hmm-sticky-cpu", "hmm-sticky-cpu-mlp"])
    ap.add_argument("--n", type=count_arg(), default=300, help="sequences (every query position of each is a row)")
    ap.add_argument("--n-null", type=count_arg(), default=1000,
                    help="shuffled-target decoders of the null, at most (drawn until settled)")
    ap.add_argument("--threads", type=count_arg(), default=1)
    ap.add_argument("--seed", type=seed_arg, default=2024)
    ap.add_argument("--render", action="store_true", help="print the table of OUT/*/geometry.json and exit")
    args = ap.parse_args(argv)
    if not args.render:
        missing = [name for name in args.checkpoints if not (checkpoint_folder(name) / "windtunnel.json").is_file()]
        if missing:
            ap.error(f"{', '.join(missing)}: not a trained wind-tunnel folder (no windtunnel.json); pass a checkpoint "
                     f"name under {PACKAGED} or a folder path.")
        torch.set_num_threads(args.threads)
        for name in args.checkpoints:
            t0 = time.perf_counter()
            g = tunnel_geometry(checkpoint_folder(name), n=args.n, n_null=args.n_null, seed=args.seed)
            g["seconds"] = time.perf_counter() - t0
            (args.out / g["checkpoint"]).mkdir(parents=True, exist_ok=True)
            atomic_write_text(args.out / g["checkpoint"] / "geometry.json", json.dumps(g, indent=2))
            print(f"{g['checkpoint']}: {g['seconds']:.0f} s", flush=True)
    results = [json.loads(p.read_text()) for p in sorted(args.out.glob("*/geometry.json"))]
    text = table(results)
    atomic_write_text(args.out / "geometry.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
