"""Grids: many sweeps at once (models x revisions x seeds, one probe list), each cell an ordinary run folder.

A grid (YAML or a dict) lists models (aliases, folders or Hub ids, each with optional ``revisions``), probes, seeds
and ``config`` (SweepConfig keys shared by every cell, ``out`` included). A cell is the sweep of one model, revision
and seed: its run folder and cache keys are those ``interp-bayes sweep`` gives the same settings, so a cell finished
anywhere (in this process, on a cluster, by a colleague on the shared store) is never recomputed.

Executors: ``local`` (the default) runs the cells one after another in this process and never imports Ray (a cell
starts with the activation sets of the earlier cells of its model linked in, so a grid over seeds runs each forward
once: ``share_activations``); ``ray``
submits one Ray task per cell to a local Ray cluster it starts, or to an existing one (``address``), with the CPUs,
memory and GPUs the cell's model needs, retried when its worker dies (the retry reuses the stages already
finished). Either way the driver shows one bar of cells, every cell appends its output to its own log
(``<out>/grids/<name>/logs/``), and the grid page (``grid.html``, scaling figures) is built from the run folders.
"""

from __future__ import annotations

# the sweep, its config and the loader (all three import torch, ~2 s), pandas, Ray and the report's views are imported
# inside the functions that read a grid, run cells or build a page or a table: ``interp-bayes grid --help`` loads none
# of them
import argparse
import contextlib
import html
import math
import os
import shutil
import socket
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..core.errors import ConfigError, GridError, InterpBayesError
from ..core.model_ref import ModelRef
from ..core.progress import progress_bar
from ..core.results import records
from ..core.stop import check_stop
from ..core.store import MANIFEST, building, checked_name, inside, read_yaml, write_json

EXECUTORS = ("local", "ray")
GRID_KEYS = ("name", "models", "probes", "seeds", "config", "retries")
MAX_CELLS_PER_GPU = 4  # small models share a GPU, at most this many cells at once


@dataclass(frozen=True)
class GridModel:
    """A model of a grid and the revisions to run (None: the default branch)."""

    name: str
    revisions: tuple[str | None, ...] = (None,)


@dataclass(frozen=True)
class Cell:
    """One sweep of a grid: a model at a revision with a seed, and the config it runs with."""

    model: str
    revision: str | None
    seed: int
    config: dict  # SweepConfig fields

    @property
    def label(self) -> str:
        name = Path(self.model).name if Path(self.model).is_absolute() else self.model
        return f"{name}{'@' + self.revision if self.revision else ''} seed {self.seed}"

    def sweep_config(self):
        from .config import SweepConfig

        return SweepConfig.from_dict(self.config)


@dataclass
class Grid:
    """Models x revisions x seeds, one probe list and shared config overrides."""

    models: list[GridModel]
    probes: list[str] | None = None  # probe names or YAML paths; None: every built-in probe
    seeds: list[int] = field(default_factory=lambda: [0])
    config: dict = field(default_factory=dict)  # SweepConfig keys of every cell (out, prompts, layers, threads ...)
    name: str = "grid"
    retries: int = 3  # Ray: reruns of a cell whose worker died

    @classmethod
    def from_dict(cls, data: dict, base: Path | None = None) -> "Grid":
        """A grid from its YAML keys; relative model folders and probe recipes are found beside ``base`` (the grid
        file's folder) first; ``out`` is relative to the working folder, as for a sweep."""
        from .config import SweepConfig

        if not isinstance(data, dict):
            raise ConfigError("A grid must be a mapping with keys models, probes, seeds, config (and name, retries).")
        unknown = sorted(set(data) - set(GRID_KEYS))
        if unknown:
            raise ConfigError(f"Unknown grid key(s) {', '.join(unknown)}; grid keys: {', '.join(GRID_KEYS)}.")
        entries = data.get("models") or []
        if not isinstance(entries, list) or not entries:
            raise ConfigError("A grid needs 'models:', a list of aliases, folders or Hub ids (each optionally "
                              "{name: ..., revisions: [...]}).")
        models = [_grid_model(e, base) for e in entries]
        seeds = data.get("seeds", [0])
        if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool)
                                                               for s in seeds):
            raise ConfigError(f"'seeds:' must be a list of integers, not {seeds!r}.")
        config = dict(data.get("config") or {})
        clash = sorted(set(config) & {"model", "revision", "seed", "probes"})
        if clash:
            raise ConfigError(f"'config:' may not set {', '.join(clash)}; a grid sets them per cell (models, "
                              "revisions, seeds, probes).")
        SweepConfig.from_dict(config)  # unknown keys are refused here, before any cell runs
        probes = data.get("probes")
        if probes is not None:
            if not isinstance(probes, list) or not all(isinstance(p, str) for p in probes):
                raise ConfigError(f"'probes:' must be a list of probe names or YAML paths, not {probes!r}.")
            probes = [_local_path(p, base) if Path(p).suffix else p for p in probes]
        retries = data.get("retries", 3)
        if not isinstance(retries, int) or retries < 0:
            raise ConfigError(f"'retries:' must be a non-negative integer, not {retries!r}.")
        return cls(models, probes, list(seeds), config, checked_name(str(data.get("name", "grid")), "The grid name"),
                   retries)

    @classmethod
    def from_yaml(cls, path: str | Path) -> "Grid":
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"No grid file at '{path}'; pass a YAML file with models, probes, seeds and config.")
        data = read_yaml(path, "Grid file") or {}
        if isinstance(data, dict):
            data.setdefault("name", path.stem)
        return cls.from_dict(data, base=path.parent)

    def cells(self) -> list[Cell]:
        """Every (model, revision, seed), in that order."""
        from .config import SweepConfig

        base = asdict(SweepConfig.from_dict(self.config))
        base["out"] = str(Path(base["out"]).resolve())  # as given here, wherever a cell runs
        return [Cell(m.name, rev, seed, dict(base, model=m.name, revision=rev, seed=seed, probes=self.probes))
                for m in self.models for rev in m.revisions for seed in self.seeds]

    def folder(self) -> Path:
        """Where the grid's page, record and logs go: ``<out>/grids/<name>``."""
        from .config import SweepConfig

        root = Path(SweepConfig.from_dict(self.config).out).resolve()
        return inside(root, root / "grids" / checked_name(self.name, "The grid name"))


def _local_path(value: str, base: Path | None) -> str:
    """``value`` as an absolute path when it names an existing one (beside the grid file first, then here), so that
    cells running in another folder find it; aliases, Hub ids and probe names stay as given."""
    path = Path(value).expanduser()
    for candidate in ([base / path] if base is not None and not path.is_absolute() else []) + [path]:
        if candidate.exists():
            return str(candidate.resolve())
    return value


def _grid_model(entry, base: Path | None) -> GridModel:
    if isinstance(entry, str):
        entry = {"name": entry}
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise ConfigError(f"A grid model is an alias, folder or Hub id, or {{name: ..., revisions: [...]}}; got "
                          f"{entry!r}.")
    unknown = sorted(set(entry) - {"name", "revisions"})
    if unknown:
        raise ConfigError(f"Unknown key(s) {', '.join(unknown)} for grid model '{entry['name']}'; keys: name, "
                          "revisions.")
    revisions = entry.get("revisions") or [None]
    if not isinstance(revisions, list) or not all(r is None or isinstance(r, str) for r in revisions):
        raise ConfigError(f"'revisions:' of '{entry['name']}' must be a list of revision names (e.g. [step1000]).")
    return GridModel(_local_path(entry["name"], base), tuple(revisions))


@dataclass
class CellResult:
    """What became of a cell: its run folder, what it computed (empty when everything was cached), where it ran,
    and the error when it failed."""

    cell: Cell
    folder: Path
    log: Path
    computed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    host: str = ""
    error: str | None = None


@dataclass
class GridRun:
    """A finished grid: its folder (page, record, logs) and its cells."""

    folder: Path
    cells: list[CellResult]
    executor: str = "local"
    seconds: float = 0.0

    @property
    def page(self) -> Path:
        return self.folder / "grid.html"

    @property
    def computed(self) -> int:
        """Stages computed by this call (0 on a rerun)."""
        return sum(len(c.computed) for c in self.cells)

    def table(self):
        """Every number of every cell, one row each, with the cell's model, revision and seed (pandas)."""
        import pandas as pd

        from ..report.view import RunView

        frames = [pd.DataFrame(records(RunView.load(c.folder).rows())).assign(
            model=c.cell.model, revision=c.cell.revision, seed=c.cell.seed) for c in self.cells if c.error is None]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def _repr_html_(self) -> str:
        return (f"<b>Grid</b> of {len(self.cells)} cells ({self.executor}, {self.seconds:.0f} s, {self.computed} "
                f"stages computed): <code>{html.escape(str(self.page))}</code>")


def cell_log_name(folder: Path) -> str:
    """A cell's log file name from its run folder (``<model slug>-<run key>.log``)."""
    return f"{folder.parent.name}-{folder.name}.log"


def run_cell(config: dict, log: str, split: bool = False, ref: ModelRef | None = None) -> dict:
    """Run one cell (an ordinary sweep) with its output appended to ``log``: the body of a Ray task and of the local
    loop. ``split`` loads the model with ``device_map="auto"`` over the devices the cell was given. ``ref``: the
    cell's model resolved (``SweepConfig.model_ref``) when the caller has it, else resolved here, once for the run's
    id, its cache keys and its load."""
    from .config import SweepConfig
    from .sweep import run_sweep

    cfg = SweepConfig.from_dict(config)
    ref = ref or cfg.model_ref()
    start = time.perf_counter()
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", buffering=1) as out, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        print(f"=== start {cfg.model} revision {cfg.revision} seed {cfg.seed} on {socket.gethostname()} pid "
              f"{os.getpid()} at {time.strftime('%Y-%m-%d %H:%M:%S')}")
        try:
            run = run_sweep(cfg, model=_split_model(cfg, ref) if split else None, ref=ref)
        except Exception:
            traceback.print_exc()
            raise
        seconds = time.perf_counter() - start
        print(f"=== end: computed {', '.join(run.computed) or 'nothing (all cached)'} in {seconds:.1f} s")
    return dict(folder=str(run.folder), computed=run.computed, seconds=seconds, host=socket.gethostname(),
                pid=os.getpid())


def _split_model(cfg, ref: ModelRef):
    """The cell's model (``ref``: its resolved reference) spread over its GPUs, loaded only when some stage still
    needs it."""
    from ..model.loading import load_model
    from .sweep import plan_sweep

    if all(item.cached for item in plan_sweep(cfg, ref=ref)):
        return None
    return load_model(ref, device_map="auto", allow_pickle=cfg.allow_pickle)


def cell_resources(n_params: int | None, dtype, threads: int, gpu_bytes: int | None, held: int | None = None) -> dict:
    """Ray resources of a cell from its model's size (``n_params``; ``held``: the parameters a loaded bridge holds,
    by default the same): ``threads`` CPUs; on a cluster without GPUs, the RAM a load needs (``model.loading.memory_needed``);
    with GPUs of ``gpu_bytes`` each, the GPUs its weights need: a share of one when several fit (at most
    ``MAX_CELLS_PER_GPU`` per GPU) or as many whole GPUs as they fill."""
    import torch

    from ..model.loading import default_dtype, device_bytes_needed, memory_needed

    out: dict = dict(num_cpus=threads)
    if n_params is None:
        return out
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else (dtype or default_dtype(n_params))
    held = held or n_params
    if not gpu_bytes:
        out["memory"] = memory_needed(held, dtype)
        return out
    gpus = device_bytes_needed("cuda:0", held * torch.finfo(dtype).bits // 8) / gpu_bytes
    out["num_gpus"] = math.ceil(gpus) if gpus > 1 else 1 / min(MAX_CELLS_PER_GPU, max(1, math.floor(1 / gpus)))
    return out


def _model_size(ref: ModelRef) -> tuple[int, int] | tuple[None, None]:
    """(parameters, parameters a loaded bridge holds) of a cell's model (``ref``: resolved) from its config alone
    (None, None when the config cannot be read here)."""
    from ..model.loading import count_parameters, load_config

    try:
        return count_parameters(load_config(ref.source, local=ref.local, revision=ref.load_revision))
    except InterpBayesError:
        return None, None


def _bar(total: int, quiet: bool):
    return progress_bar(total=total, desc="grid", unit="cell", disable=quiet, file=sys.stderr)


def share_activations(sources: list[Path], target: Path) -> int:
    """Link into ``target``'s ``acts/`` every sealed activation set of the run folders ``sources`` that it lacks;
    returns how many. A set's name carries the content key of what determines it (model identity, dtype, token ids,
    sites, version), never the seed of the draws, so cells of one model at several seeds collect each set once.
    A sealed set is never written again, so hard links are safe (a copy where the folders are on two file systems);
    the sweep still checks every file's digest when it loads one."""
    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    linked = 0
    for source in sources:
        for found in sorted((source / "acts").glob(f"*/{MANIFEST}")):
            final = target / "acts" / found.parent.name
            if not final.exists():
                with building(final) as tmp:
                    shutil.copytree(found.parent, tmp, copy_function=link, dirs_exist_ok=True)
                linked += 1
    return linked


def _run_local(cells: list[Cell], refs: list[ModelRef], folders: list[Path], logs: list[Path],
               quiet: bool) -> list[CellResult]:
    results = []
    with _bar(len(cells), quiet) as bar:
        for i, (cell, ref, folder, log) in enumerate(zip(cells, refs, folders, logs)):
            bar.set_postfix_str(cell.label)
            same_model = [f for c, f in zip(cells[:i], folders) if (c.model, c.revision) == (cell.model, cell.revision)]
            share_activations(same_model, folder)
            try:
                out = run_cell(cell.config, str(log), ref=ref)
                results.append(CellResult(cell, folder, log, out["computed"], out["seconds"], out["host"]))
            except Exception as err:  # the cell's log holds the traceback; the other cells still run
                results.append(CellResult(cell, folder, log, error=f"{type(err).__name__}: {err}"))
            bar.update(1)
    return results


def _start_ray(address: str | None, num_cpus: int | None) -> bool:
    """Connect to ``address`` or start a local Ray cluster, unless this process already has a session; True when
    this call started one (and so shuts it down)."""
    try:
        import ray
    except ImportError as err:
        raise ConfigError("The ray executor needs Ray: pip install 'interp_bayes[grid]' (or ray), or use "
                          "--executor local.") from err
    if ray.is_initialized():
        return False
    kw = dict(include_dashboard=False, log_to_driver=False)  # each cell writes its own log
    if address:
        ray.init(address=address, **kw)
    else:
        ray.init(num_cpus=num_cpus, object_store_memory=128 * 2**20, **kw)  # cells return a few numbers
    return True


def _gpu_bytes() -> int | None:
    """Memory of one GPU of the Ray cluster (read by a one-GPU task), or None without GPUs."""
    import ray

    if not ray.cluster_resources().get("GPU"):
        return None

    def total() -> int:
        import torch

        return torch.cuda.get_device_properties(0).total_memory

    return ray.get(ray.remote(num_gpus=1)(total).remote())


def _check_fits(cell: Cell, resources: dict) -> None:
    """Refuse a cell that no node of the cluster can take (Ray would wait for it forever)."""
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    for key, ray_key, unit in (("memory", "memory", 2**30), ("num_gpus", "GPU", 1), ("num_cpus", "CPU", 1)):
        need, most = resources.get(key, 0), max((n.get(ray_key, 0) for n in nodes), default=0)
        if need > most:
            what = f"{need / unit:.1f} GiB of RAM" if key == "memory" else f"{need:g} {ray_key}s"
            have = f"{most / unit:.1f} GiB" if key == "memory" else f"{most:g}"
            raise GridError(f"Cell {cell.label} needs {what} but the largest Ray node offers {have}; use a bigger "
                            "node, a smaller dtype (config: {dtype: bfloat16}), or fewer threads.")


def _run_ray(cells: list[Cell], refs: list[ModelRef], folders: list[Path], logs: list[Path], grid: Grid,
             quiet: bool) -> list[CellResult]:
    """One Ray task per cell. A task resolves its model again (once) in its worker: an alias resolves to a folder
    converted on that worker's machine, which may not be this one."""
    import ray

    gpu_bytes = _gpu_bytes()
    sizes: dict[tuple, tuple] = {}
    pending = {}
    cell_task = ray.remote(run_cell)
    for cell, ref, folder, log in zip(cells, refs, folders, logs):
        key = (cell.model, cell.revision)
        if key not in sizes:
            sizes[key] = _model_size(ref)
        cfg = cell.sweep_config()
        threads = cfg.threads or 1
        n_params, held = sizes[key]
        resources = cell_resources(n_params, cfg.dtype, threads, gpu_bytes, held)
        _check_fits(cell, resources)
        config = dict(cell.config, threads=threads)  # the cell uses the CPUs it declared
        task = cell_task.options(max_retries=grid.retries, retry_exceptions=False, name=f"cell {cell.label}",
                                 **resources)
        pending[task.remote(config, str(log), resources.get("num_gpus", 0) > 1)] = (cell, folder, log)
    results = {}
    try:
        with _bar(len(cells), quiet) as bar:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                check_stop()  # a SIGTERM cancels the cells as Ctrl-C does (below)
                if not ready:
                    continue
                (done,) = ready
                cell, folder, log = pending.pop(done)
                try:
                    out = ray.get(done)
                    results[id(cell)] = CellResult(cell, folder, log, out["computed"], out["seconds"], out["host"])
                except ray.exceptions.RayError as err:
                    cause = getattr(err, "cause", None) or err
                    results[id(cell)] = CellResult(cell, folder, log, error=f"{type(cause).__name__}: "
                                                                             f"{str(cause).splitlines()[0]}")
                bar.set_postfix_str(cell.label)
                bar.update(1)
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    return [results[id(c)] for c in cells]


def run_grid(grid: Grid | dict | str | Path, *, executor: str = "local", address: str | None = None,
             num_cpus: int | None = None, quiet: bool = False) -> GridRun:
    """Run (or resume) every cell of ``grid`` and build its page; returns the finished grid.

    executor: "local" (one cell after another in this process; no Ray) or "ray" (one task per cell). address: an
    existing Ray cluster ("auto" or "HOST:PORT"); without it a local cluster of ``num_cpus`` CPUs (default: all)
    is started for this call. A process that already called ``ray.init`` keeps its session. Raises GridError
    naming the cells that failed (after building the page of the others).
    """
    from ..report.grid import build_grid_page
    from .config import SweepConfig
    from .sweep import load_probes, run_folder

    if executor not in EXECUTORS:
        raise ConfigError(f"Unknown executor '{executor}'; choose one of {', '.join(EXECUTORS)}.")
    if not isinstance(grid, Grid):
        grid = Grid.from_yaml(grid) if isinstance(grid, (str, Path)) else Grid.from_dict(grid)
    cells = grid.cells()
    load_probes(SweepConfig.from_dict(cells[0].config))  # unknown or clashing probes are refused before any cell runs
    resolved: dict[tuple, ModelRef] = {}  # each model resolved once for all its cells: bad names fail here
    for c in cells:
        if (c.model, c.revision) not in resolved:
            resolved[c.model, c.revision] = c.sweep_config().model_ref()
    refs = [resolved[c.model, c.revision] for c in cells]
    folders = [run_folder(c.sweep_config(), ref) for c, ref in zip(cells, refs)]
    gfolder = grid.folder()
    logs = [gfolder / "logs" / cell_log_name(f) for f in folders]
    start = time.perf_counter()
    if executor == "local":
        results = _run_local(cells, refs, folders, logs, quiet)
    else:
        started = _start_ray(address, num_cpus)
        try:
            results = _run_ray(cells, refs, folders, logs, grid, quiet)
        finally:
            if started:
                import ray

                ray.shutdown()
    run = GridRun(gfolder, results, executor, time.perf_counter() - start)
    write_json(gfolder / "grid.json", dict(
        name=grid.name, executor=executor, seconds=run.seconds,
        cells=[dict(model=r.cell.model, revision=r.cell.revision, seed=r.cell.seed,
                    run=os.path.relpath(r.folder, gfolder), log=os.path.relpath(r.log, gfolder), computed=r.computed,
                    seconds=r.seconds, host=r.host, error=r.error) for r in results]))
    build_grid_page([r.folder for r in results if r.folder.exists()], run.page, title=grid.name)
    failed = [r for r in results if r.error]
    if failed:
        raise GridError(f"{len(failed)} of {len(results)} cells failed: " + "; ".join(
            f"{r.cell.label} ({r.error}; log {r.log})" for r in failed) + f". The page of the others: {run.page}.")
    return run


def add_grid_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``interp-bayes grid GRID.yaml``."""
    p.add_argument("grid", type=Path, help="grid YAML: models (with optional revisions), probes, seeds, config")
    p.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="local: one cell after another here (default); ray: one Ray task per cell")
    p.add_argument("--address", help="an existing Ray cluster ('auto' or HOST:PORT); default: start a local one")
    p.add_argument("--num-cpus", type=int, help="CPUs of the local Ray cluster (default: all)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--verbose", action="store_true", help="debug logging (ours and the libraries')")


def grid_main(args: argparse.Namespace) -> int:
    """Entry point for ``interp-bayes grid``: run the grid, print where each cell went and the page."""
    if args.address and args.executor != "ray":
        raise ConfigError("--address needs --executor ray.")
    run = run_grid(args.grid, executor=args.executor, address=args.address, num_cpus=args.num_cpus, quiet=args.quiet)
    for r in run.cells:
        state = f"computed {', '.join(r.computed)}" if r.computed else "all cached"
        print(f"{r.cell.label}: {state} ({r.seconds:.1f} s) -> {r.folder}")
    print(f"{len(run.cells)} cells, {run.computed} stages computed, {run.seconds:.1f} s ({run.executor})")
    print(f"grid page: {run.page}")
    return 0
