"""P4b, "decodable but inert", per model and tunnel (``interp_bayes.analyses.p4b``): the tables of docs/windtunnels.md.

    python examples/p4b.py --out runs/p4b [--checkpoints bijection-cpu bijection-repl-cpu] [--threads 1]
        [--n-fit 400] [--n-eval 300] [--controls 20]
    python examples/p4b.py --out runs/p4b --render      # the tables again from OUT/*/p4b.json, nothing rerun

Folders are names under interp_bayes/windtunnel/checkpoints/ or paths to trained folders (any architecture the
collector reads at the residual stream). Each writes OUT/<name>/p4b.json and prints markdown tables: decodability
per layer with its nulls and verdicts, ablation costs against matched controls, geometry, and the one-line answer.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from interp_bayes.analyses.p4b import P4bResult, ablation_verdicts, answer, cost_tolerance, decoding_verdict, p4b
from interp_bayes.core.checks import count_arg, out_folder_arg, seed_arg
from interp_bayes.core.errors import ConfigError
from interp_bayes.windtunnel.tunnels import PACKAGED, checkpoint_folder
from interp_bayes.tasks.bijection import BijectionTask



def num(x, digits: int = 4) -> str:
    return "n/a" if x is None or x != x else f"{x:.{digits}f}"


def rng(r, digits: int = 4) -> str:
    return "n/a" if r is None or r[0] is None or r[0] != r[0] else f"[{r[0]:.{digits}f}, {r[1]:.{digits}f}]"


def tables(res) -> str:
    m = res.meta
    out = [f"\n### {Path(m['folder']).name} ({m['task_kwargs'] or 'without replacement'}, {m['arch']}, "
           f"{m['positions']} positions; unedited KL {m['base']['kl_bits']:.4f} bits, entropy MAE "
           f"{m['base']['mae_bits']:.4f})\n",
           "| layer | test | R² held out [95% CI] | null | null range | verdict |", "|---|---|---|---|---|---|"]
    for d in res.decoding:
        out.append(f"| {d['layer']} | {d['test']} | {num(d['r2'])} {rng(d['r2_ci'])} | {d['null'] or ''} | "
                   f"{rng(d['null_range'])} | {d['verdict']}{' (' + d['note'] + ')' if d['note'] else ''} |")
    out += ["", "| layer | subspace | k | cut: KL cost, bits [95% CI] | matched controls mean [95% range] | p | "
            "isotropic mean | entropy-MAE cost | inert | load-bearing |", "|---|---|---|---|---|---|---|---|---|---|"]
    mae = {(a["layer"], a["subspace"]): a for a in res.ablations if a["metric"] == "mae_bits"}
    for a in (a for a in res.ablations if a["metric"] == "kl_bits"):
        b = mae[(a["layer"], a["subspace"])]
        out.append(f"| {a['layer']} | {a['subspace']} | {a['k']} | {a['cost']:+.4f} {rng(a['cost_ci'])} | "
                   f"{num(a['matched_mean'])} {rng(a['matched_range'])} | {num(a['matched_p'], 3)} | "
                   f"{num(a['isotropic_mean'])} | {b['cost']:+.4f} | {a['inert']} | {a['load_bearing']} |")
    g = res.geometry
    if g:
        c = g["clusters"]
        out += ["", f"Geometry, layer {g['layer']}: PC1 share {g['pc1_share']:.3f} standardised (permuted null "
                f"{rng(g['pc1_null']['pc1_range'], 3)}), {g['pc1_share_raw']:.3f} raw; clusters {c['n_clusters']} "
                f"(best k {c['best_k']}, silhouette {c['silhouette']:.3f} vs Gaussian null {rng(c['null_range'], 3)}, "
                f"p {c['p']:.3f})"]
    out += ["", f"Answer: {res.summary['line']}"]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=out_folder_arg, required=True, help="folder of the <checkpoint>/p4b.json files")
    ap.add_argument("--checkpoints", nargs="+", default=["bijection-cpu", "bijection-repl-cpu"])
    ap.add_argument("--n-fit", type=count_arg(), default=400, help="sequences the subspaces are fitted on")
    ap.add_argument("--n-eval", type=count_arg(), default=300, help="sequences the ablations are scored on")
    ap.add_argument("--controls", type=count_arg(), default=20, help="isotropic and matched draws per subspace, each")
    ap.add_argument("--n-null", type=count_arg(), default=1000,
                    help="shuffled-target decoders of the null, at most (drawn until settled)")
    ap.add_argument("--threads", type=count_arg(), default=1)
    ap.add_argument("--seed", type=seed_arg, default=2024)
    ap.add_argument("--render", action="store_true", help="print the tables of OUT/*/p4b.json and exit")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.render:
        saved = sorted(args.out.glob("*/p4b.json"))
        if not saved:
            print(f"No */p4b.json under {args.out}; run without --render first.", file=sys.stderr)
            return 2
        for path in saved:
            d = json.loads(path.read_text())
            name = path.parent.name
            for row in d["decoding"]:  # the verdicts of the current rules
                row["verdict"] = decoding_verdict(row)
            tol = cost_tolerance(BijectionTask(**d["meta"]["task_kwargs"]).n_symbols)
            for row in d["ablations"]:
                row["inert"], row["load_bearing"] = ablation_verdicts(row["cost"], row["matched_range"], tol)
            print(tables(P4bResult(d["decoding"], d["ablations"], d["geometry"],
                                   answer(d["decoding"], d["ablations"], name), d["meta"])))
        return 0
    for name in args.checkpoints:
        folder = checkpoint_folder(name)
        if not (folder / "windtunnel.json").is_file():
            print(f"{name} is not a trained wind-tunnel folder (no windtunnel.json); pass a checkpoint name under "
                  f"{PACKAGED} or a folder path.", file=sys.stderr)
            return 2
        start = time.time()
        try:
            res = p4b(folder, n_fit=args.n_fit, n_eval=args.n_eval, n_controls=args.controls, n_null=args.n_null,
                      seed=args.seed)
        except ConfigError as err:
            print(f"{name}: {err}", file=sys.stderr)
            return 2
        res.meta["wall_s"] = round(time.time() - start, 1)
        dest = args.out / folder.name
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "p4b.json").write_text(json.dumps(dict(decoding=res.decoding, ablations=res.ablations,
                                                       geometry=res.geometry, summary=res.summary, meta=res.meta),
                                                  indent=1, default=str))
        print(tables(res), flush=True)
        print(f"\n({folder.name}: {res.meta['wall_s']} s wall)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
