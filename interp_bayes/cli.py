"""Command line: parse, call the library, print. ``interp-bayes --help`` lists the commands."""

from __future__ import annotations

import argparse
import sys

from .errors import InterpBayesError


def _sweep(args: argparse.Namespace) -> None:
    from .config import SweepConfig
    from .report.html import build_report
    from .report.tables import markdown_summary
    from .sweep import run_sweep

    base = SweepConfig.from_yaml(args.config) if args.config else SweepConfig()
    config = base.override(model=args.model, revision=args.revision, out=args.out, prompts=args.prompts, probes=args.probes,
                           layers=args.layers, seed=args.seed,
                           dtype=args.dtype, device=args.device, batch_size=args.batch_size, threads=args.threads,
                           quiet=True if args.quiet else None)
    run = run_sweep(config)
    print(markdown_summary(run.metrics, config.model))
    print(f"run folder: {run.folder}")
    print(f"report: {build_report(run.folder)}")


def _models(args: argparse.Namespace) -> None:
    from .models import list_models

    for spec in list_models():
        print(f"{spec.alias:14s} {spec.checkpoint:40s} {spec.family:9s} {spec.params:>6s}  {spec.notes}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="interp-bayes", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("sweep", help="run the analyses on one model and write a run folder")
    p.add_argument("--config", help="YAML file of SweepConfig keys; flags override it")
    p.add_argument("--model", help="registry alias, local HF folder or Hub id (default smollm2-135m)")
    p.add_argument("--revision", help="Hub revision of the model (branch, tag or commit, e.g. step1000)")
    p.add_argument("--out", help="root folder for runs (default reports)")
    p.add_argument("--prompts", help="prompt pool of the manifold probes: built-in set or JSONL file (default pool)")
    p.add_argument("--probes", nargs="+", help="probe names (probes/*.yaml) or YAML paths (default: all)")
    p.add_argument("--layers", type=int, nargs="+", help="layers to collect, negative from the end (default -1)")
    p.add_argument("--seed", type=int)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--threads", type=int, help="torch CPU threads (1 is faster when other jobs share the cores)")
    p.add_argument("--quiet", action="store_true", help="no progress bars or stage messages")
    p.set_defaults(func=_sweep)

    from .dynamics import add_dynamics_arguments, dynamics_main
    from .report.html import add_compare_arguments, add_report_arguments, compare_main, report_main
    from .windtunnel.train import add_train_args, run_train

    for name, help_text, add_arguments, func in (
        ("train", "train a wind-tunnel model (bijection or HMM) or its MLP baseline", add_train_args, run_train),
        ("dynamics", "Paper II: gradient laws, SGD vs EM on the sticky chain, frame vs precision",
         add_dynamics_arguments, dynamics_main),
        ("report", "(re)build report.html of a run folder from the folder alone", add_report_arguments, report_main),
        ("compare", "one page comparing several run folders (Paper III Table 2 layout)", add_compare_arguments,
         compare_main),
    ):
        p = sub.add_parser(name, help=help_text)
        add_arguments(p)
        p.set_defaults(func=func)

    p = sub.add_parser("models", help="list the registry's model aliases")
    p.set_defaults(func=_models)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except InterpBayesError as err:
        print(f"interp-bayes: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
