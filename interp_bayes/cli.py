"""Command line: parse, call the library, print. ``interp-bayes --help`` lists the commands.

Only the chosen command's module is imported (and its arguments built), so ``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from importlib import import_module

from .core.errors import InterpBayesError

log = logging.getLogger("interp_bayes")


def _configure_output(quiet: bool, verbose: bool) -> None:
    """Messages through ``logging``: stage lines by default, none with --quiet (also no progress bars, ours or
    Hugging Face's), library debug logs with --verbose. Into a log or a pipe, Hugging Face's bars are off and ours
    write plain lines (``core.progress``)."""
    logging.basicConfig(format="%(message)s" if not verbose else "%(asctime)s %(name)s: %(message)s",
                        level=logging.DEBUG if verbose else logging.WARNING, stream=sys.stdout)
    log.setLevel(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)
    logged = not sys.stderr.isatty()  # a log or a pipe: our bars write plain lines there, Hugging Face's none
    if quiet or logged:
        for var in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS") + (("TQDM_DISABLE",)
                                                                                               if quiet else ()):
            os.environ[var] = "1"
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    if quiet:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _add_sweep_arguments(p: argparse.ArgumentParser) -> None:
    from .core.checks import device_arg

    p.add_argument("--config", help="YAML file of SweepConfig keys; flags override it")
    p.add_argument("--model", help="registry alias, local HF folder, .gguf file or Hub id (default smollm2-135m)")
    p.add_argument("--revision", help="Hub revision of the model (branch, tag or commit, e.g. step1000)")
    p.add_argument("--out", help="root folder for runs (default reports)")
    p.add_argument("--prompts", help="prompt pool of the manifold and focusing probes: built-in set or JSONL file")
    p.add_argument("--probes", nargs="+", help="probe names (probes/*.yaml) or YAML paths (default: all)")
    p.add_argument("--layers", type=int, nargs="+", help="layers to collect, negative from the end (default -1)")
    p.add_argument("--seed", type=int, help="seed of every random draw of the analyses: nulls, bootstraps, folds, "
                                             "control axes (0 to 2**32-1; default 0)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="weights and activations (default: float32 up to ~3B parameters, bfloat16 above)")
    p.add_argument("--float32", choices=["auto", "ieee", "fast"],
                   help="float32 matrix products on the CPU: ieee (strict), fast (oneDNN's path), or auto (default: "
                        "fast where oneDNN keeps float32 arithmetic; docs/performance.md, Numeric modes)")
    p.add_argument("--device", type=device_arg, help="torch device of the model: cpu, cuda, cuda:1, mps (default: cuda when available, "
                                    "else cpu)")
    p.add_argument("--batch-size", type=int, help="prompts per forward pass (default: about 2048 tokens per batch)")
    p.add_argument("--threads", type=int, help="torch CPU threads of each worker (1 is faster when other jobs share "
                                               "the cores)")
    p.add_argument("--workers", type=int, help="processes that compute the probes side by side (default: 2 on a CPU "
                                               "with 2+ cores where RAM holds the model twice, else 1)")
    p.add_argument("--allow-pickle", action="store_true",
                   help="load pickle weights (pytorch_model.bin, *.pt) of a checkpoint without safetensors: only "
                        "for files you trust, since unpickling runs any code they hold")
    # extend: a repeated --set / --redo adds to the earlier ones (argparse's default kept only the last)
    p.add_argument("--set", nargs="+", action="extend", default=[], metavar="PROBE.PARAM=VALUE", dest="assignments",
                   help="override recipe parameters, e.g. interventions.controls.isotropic=3 (values are YAML); "
                        "repeatable")
    p.add_argument("--redo", nargs="+", action="extend", default=[], metavar="PROBE",
                   help="recompute these probes even if cached; repeatable")
    p.add_argument("--dry-run", action="store_true", help="print what is cached and what the rest will cost; run nothing")
    p.add_argument("--quiet", action="store_true", help="no progress bars or stage messages")
    p.add_argument("--verbose", action="store_true", help="debug logging (ours and the libraries')")


def _sweep(args: argparse.Namespace) -> int:
    from .report.ledger import collect, ledger_lines
    from .report.view import RunView
    from .run.config import SweepConfig, parse_set
    from .run.sweep import plan_sweep, run_sweep

    base = SweepConfig.from_yaml(args.config) if args.config else SweepConfig()
    config = base.override(model=args.model, revision=args.revision, out=args.out, prompts=args.prompts,
                           probes=args.probes, layers=args.layers, seed=args.seed, dtype=args.dtype,
                           float32=args.float32, device=args.device, batch_size=args.batch_size, threads=args.threads,
                           workers=args.workers,
                           quiet=True if args.quiet else None, overrides=parse_set(list(args.assignments)),
                           allow_pickle=True if args.allow_pickle else None)
    if args.dry_run:
        ref = config.model_ref()  # resolved once: the plan, the estimate and the calibration use it
        return _print_plan(plan_sweep(config, redo=args.redo, ref=ref), config, ref)
    run = run_sweep(config, redo=args.redo)
    view = RunView.load(run.folder)
    print("\n".join(ledger_lines(collect(view), view.name)))  # the answer; every number is in the report
    print(f"every number: {run.folder / 'results.csv'} (or `interp-bayes results {run.folder}`)")
    print(f"run folder: {run.folder}")
    print(f"report: {run.folder / 'report.html'}")
    return 0


def _print_plan(items, config, ref) -> int:
    """The plan, each probe with its cost, and the time it should take (recorded by earlier runs under --out, else
    from a calibration forward of the sweep's model on this machine); probes with nothing to time stay untimed."""
    from .run.sweep import REFERENCE_MODEL, calibrate, estimate

    forwards = sum(i.forwards for i in items)
    disk = sum(i.disk_bytes for i in items)
    est = estimate(config, items, ref=ref)
    to_run = [i.probe for i in items if i.what.startswith("probe of kind") and not i.cached]
    if any(est.source.get(p) != "recorded" for p in to_run):  # no earlier run to read their time from: time here
        measured = calibrate(config, items, ref)
        if measured is not None:
            est = estimate(config, items, *measured, ref=ref)
    for i in items:
        state = "cached" if i.cached else "unknown until earlier stages run" if i.cached is None else "to compute"
        extra = f", {i.forwards} prompt forwards" + (f" on {i.model}" if i.model else "") if i.forwards else ""
        print(f"{i.probe:20s} {i.what} [{state}{extra}]")
        if i.probe in est.seconds and i.what.startswith("probe of kind"):
            print(f"{'':20s} about {est.seconds[i.probe]:.0f} s ({est.source[i.probe]})")
    tunnels = sum(i.forwards for i in items if i.model)
    print(f"total still to run: {forwards} prompt forwards ({forwards - tunnels} of the sweep's model, {tunnels} of "
          f"wind tunnels), about {disk / 2**20:.1f} MiB of activations")
    untimed = [p for p in to_run if p not in est.seconds]
    left = (f"not timed: {', '.join(untimed)} (no earlier run under --out and no activation set of the sweep's "
            "model to time)") if untimed else ""
    if not est.seconds:
        print("estimated time: none" + (f"; {left}" if left else " (everything is cached)"))
        return 0
    sources = list(est.source.values())
    if not est.pace:
        paced = " (pace not measured)"
    elif config.model == REFERENCE_MODEL:
        paced = f" x {est.pace:.2f} (this machine's pace)"
    else:  # the pace holds the model's cost beside the machine's: a wind tunnel's stage does not follow it
        paced = f", the model's stages x {est.pace:.2f} (its pace on the reference sample), the wind tunnels' as is"
    how = "; ".join(filter(None, [f"{sources.count('recorded')} probe(s) as long as an earlier run under --out took"
                                  if "recorded" in sources else "",
                                  f"{sources.count('reference')} shipped recipe(s) at their reference seconds{paced}"
                                  if "reference" in sources else "",
                                  f"the rest at {est.calibration}" if "throughput" in sources else "", left]))
    on = f" on {est.workers} worker processes" if est.workers > 1 else ""
    print(f"estimated time: about {est.total / 60:.1f} min{on}" + (f" ({how})" if how else ""))
    return 0


def _models(args: argparse.Namespace) -> int:
    from .model.loading import list_models

    for spec in list_models():
        print(f"{spec.alias:14s} {spec.checkpoint:40s} {spec.family:9s} {spec.params:>6s}  {spec.notes}")
    return 0


def _probes(args: argparse.Namespace) -> int:
    """Probe kinds (built-in, registered and installed entry points, each with where it comes from) with their
    parameters and defaults, then the built-in recipes. An entry point that fails to load is listed with why."""
    from .core.registry import catalog
    from .run.sweep import builtin_probes, load_probe

    for entry in catalog():
        if entry.kind is None:
            print(f"kind {entry.name}: not loadable [{entry.source}]: {entry.error}")
            continue
        print(f"kind {entry.name}: {entry.about} [{entry.source}]")
        for key, value in entry.kind.params.defaults().items():
            print(f"    {key} = {value!r}")
    print("\nrecipes (probes/*.yaml):")
    for name in builtin_probes():
        probe = load_probe(name)
        changed = {k: v for k, v in probe.params.to_dict().items() if probe.kind.params.defaults().get(k) != v and
                   not (isinstance(v, list) and list(probe.kind.params.defaults().get(k) or ()) == v)}
        print(f"  {name:24s} kind {probe.kind.name}{'' if probe.default else ' (opt-in: name it with --probes)'}; "
              + (", ".join(f"{k}={v}" for k, v in changed.items()) or "defaults"))
    return 0


def _results(args: argparse.Namespace) -> int:
    from .report.view import RunView
    from .core.results import to_csv, to_json

    if args.snapshot:
        from .report.snapshot import write_snapshot

        for path in write_snapshot(args.run, args.snapshot):
            print(path)
        return 0
    view = RunView.load(args.run)
    if args.format == "markdown":
        from .report.tables import markdown_results

        text = markdown_results(view)
    else:
        text = (to_csv if args.format == "csv" else to_json)(view.rows(), view.origins())
    if args.out:
        from .core.store import atomic_write_text

        print(atomic_write_text(args.out, text))
    else:
        sys.stdout.write(text)
    return 0


def _add_results_arguments(p: argparse.ArgumentParser) -> None:
    from .core.checks import out_file_arg, out_folder_arg

    p.add_argument("run", help="run folder written by `interp-bayes sweep`")
    p.add_argument("--format", choices=["csv", "json", "markdown"], default="csv",
                   help="csv: one row per number, scope keys as columns; json: the rows as objects; markdown: per "
                        "probe its summary lines and a table per metric (default csv)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", type=out_file_arg, help="write to this file instead of standard output")
    where.add_argument("--snapshot", metavar="DIR", type=out_folder_arg,
                       help="write the snapshot that docs quote into DIR: results.csv, ledger.csv (the claims' "
                            "verdicts), snapshot.json (model, seed, probes); DIR's docs.yaml is kept")


def _run_module(module: str, func: str):
    return lambda args: getattr(import_module(module, __package__), func)(args)


# command -> (help, (module, argument adder) or a local adder, the function to call)
COMMANDS = {
    "sweep": ("run the probes on one model and write a run folder with its report", _add_sweep_arguments, _sweep),
    "probes": ("list the probe kinds with their parameters and defaults, and the built-in recipes", None, _probes),
    "results": ("export a run's tidy results table (one row per number) as CSV, JSON or markdown",
                _add_results_arguments,
                _results),
    "report": ("(re)build report.html of a run folder from the folder alone",
               (".report.html", "add_report_arguments"), _run_module(".report.html", "report_main")),
    "compare": ("one page comparing several run folders (Paper III Table 2 layout)",
                (".report.html", "add_compare_arguments"), _run_module(".report.html", "compare_main")),
    "train": ("train a wind-tunnel model: a transformer, or one of its parameter-matched rivals (mlp, mlp-context, "
              "lstm, mamba)", (".windtunnel.train", "add_train_args"),
              _run_module(".windtunnel.train", "run_train")),
    "dynamics": ("Paper II: gradient laws, SGD vs EM on the sticky chain, frame vs precision",
                 (".dynamics.cli", "add_dynamics_arguments"), _run_module(".dynamics.cli", "dynamics_main")),
    "docs": ("refill the <!-- snapshot NAME/ENTRY --> blocks of markdown files from committed run snapshots "
             "(--check: name the stale ones)", (".report.snapshot", "add_docs_arguments"),
             _run_module(".report.snapshot", "docs_main")),
    "models": ("list the registry's model aliases", None, _models),
    "grid": ("run many sweeps (models x revisions x seeds) locally or on Ray, and build the grid page",
             (".run.grid", "add_grid_arguments"), _run_module(".run.grid", "grid_main")),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s arguments are built (importing its module), so --help stays fast."""
    from . import __version__

    parser = argparse.ArgumentParser(prog="interp-bayes", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"interp-bayes {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, adder, func) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name != command:
            continue
        if isinstance(adder, tuple):
            getattr(import_module(adder[0], __package__), adder[1])(p)
        elif adder is not None:
            adder(p)
        p.set_defaults(func=func)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command if command in COMMANDS else None).parse_args(argv)
    _configure_output(getattr(args, "quiet", False), getattr(args, "verbose", False))
    import signal

    from .core.stop import check_stop, stop_on_signal, stop_requested

    # a scheduler's stop or `kill` takes Ctrl-C's path (views rebuilt, one line), raised at the next safe point
    with stop_on_signal(signal.SIGTERM):
        try:
            code = args.func(args) or 0
            check_stop()  # a SIGTERM after the last safe point still ends the process as terminated
            return code
        except InterpBayesError as err:
            print(f"interp-bayes: error: {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as err:
            said = str(err) or "interrupted"
            if stop_requested():  # 128 + the signal's number, as a shell reports a process that SIGTERM ended
                print(f"interp-bayes: terminated (SIGTERM): {said}", file=sys.stderr)
                return 128 + signal.SIGTERM
            print(f"\ninterp-bayes: {said}", file=sys.stderr)
            return 130


if __name__ == "__main__":
    sys.exit(main())
