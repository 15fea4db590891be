"""The recall circuit along a training run (issue 40, item 2; ``interp_bayes.analyses.recall_circuit``): for each
checkpoint of a recall transformer's folder (``checkpoints/step_*`` and the final model), every head's key
look-back, prefix-matching score, attention to the queried key's value and that value's share of the head's
attention on the stored values, on held-out sequences, beside the held-out recall at that step.

    python examples/recall_circuit.py RUN_FOLDER [--n 500] [--json OUT.json]

RUN_FOLDER is a name under interp_bayes/windtunnel/checkpoints/ or a folder written by ``interp-bayes train``.
"""

from __future__ import annotations

import argparse
import json

import torch

from interp_bayes.analyses.recall_circuit import METRICS, recall_circuit
from interp_bayes.core.checks import count_arg
from interp_bayes.windtunnel.recall import evaluate_recall
from interp_bayes.windtunnel.tunnels import checkpoint_folder, open_tunnel


def along_run(folder, n: int) -> list[dict]:
    """[{step, recall, scores: {metric: [[per head] per layer]}}] for each checkpoint, the final model last."""
    root = checkpoint_folder(folder)
    folders = sorted((root / "checkpoints").glob("step_*")) + [root]
    out = []
    for f in folders:
        tunnel = open_tunnel(f)
        rows = recall_circuit(tunnel.model, tunnel.task, n=n, n_boot=200)
        layers = 1 + max(r.scope["layer"] for r in rows)
        scores = {m: [[r.value for r in rows if r.metric == m and r.scope["layer"] == layer] for layer in range(layers)]
                  for m in METRICS}
        recall = evaluate_recall(tunnel.model, tunnel.task, n=n, lengths=[tunnel.task.n_pairs], baselines=False)
        out.append({"step": tunnel.step, "recall": next(iter(recall.values()))["recall_accuracy"], "scores": scores})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder")
    parser.add_argument("--n", type=count_arg(), default=500, help="held-out sequences per checkpoint")
    parser.add_argument("--json", default=None, help="write the scores here too")
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = along_run(args.folder, args.n)
    for r in result:
        best = {m: max((v, layer, h) for layer, heads in enumerate(r["scores"][m]) for h, v in enumerate(heads))
                for m in METRICS}
        print(f"step {r['step']:>6}  recall {r['recall']:.3f}  " + "  ".join(
            f"{m.removeprefix('recall_')} max {v:.3f} (L{layer}H{h})" for m, (v, layer, h) in best.items()))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
