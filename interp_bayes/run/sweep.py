"""The sweep runner: one model, a list of probe recipes, each a cached stage in a run folder.

A run folder is ``<out>/<model slug>/<run key>``; the key hashes the model's resolved identity and the global
config (not the probe list), so adding a probe reuses everything already there. A probe's stage is keyed by its
kind, the kind's version, its resolved parameters and the package version: a rerun skips every probe whose key
matches, and recomputes one whose parameters changed. Activation sets are content-addressed (``Context.activations``)
and shared between probes. After every finished probe the tidy table (``results.csv``) and ``report.html`` are
rebuilt, so an interrupted run has a report of what finished.

A recipe is YAML (``probes/*.yaml`` or a path): ``kind`` picks the probe kind (``interp_bayes.kinds``), the other
keys are its parameters, checked against the kind's parameter dataclass. A recipe's ``layers:`` are the layers it
collects (the sweep's ``layers`` serve the probes that name none); a kind whose params name the layers it analyses
(icl's ``at:``, interventions' ``layer_sets:``) checks them against those in ``Params.check``, which the run and its
dry run call alike (``check_probes``) before the first write.
"""

from __future__ import annotations

import html
import json
import multiprocessing
import os
import shutil
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import psutil
import torch
from threadpoolctl import threadpool_limits

from .. import __version__
from .config import SweepConfig, merge
from ..core.errors import CacheError, ConfigError
from ..core.layers import resolve_layers
from ..core.model_ref import ModelRef
from ..core.plugin import Kind, Params, PlanItem
from ..core.prompts import load_source, package_data_dir
from ..core.registry import get_kind, provenance
from ..core.results import Row, records, to_csv, write_rows
from ..core.stop import at_safe_points, check_stop, stop_on_signal
from ..core.store import (MANIFEST, atomic_write_text, building, checked_name, claim_folder_lock, content_key,
    environment, git_commit, inside, read_json, read_yaml, remove_if_unused, seal, slug, stage_lock, unseal, warn,
    working_in, write_json)
from ..model.collect import collect
from ..model.loading import (checkpoint_tokenizer, load_config, load_model, load_tokenizer, model_identity, model_info,
                             load_footprint)
from ..model.numerics import IEEE, float32_mode
from ..model.read import Activations, is_sequences, prompt_digest, read, sequences_digest, sites_of, tokenize
from ..report.html import Report, build_report
from ..report.view import RunView

PROBES_DIR = package_data_dir("probes")


@dataclass
class Probe:
    """A recipe: a name, its kind and its resolved parameters."""

    name: str
    kind: Kind
    params: Params
    kind_ref: str = ""  # the recipe's ``kind:`` as written (``module.py:NAME`` for a plugin), for the report
    default: bool = True  # ``default: false`` in a built-in recipe: run only when named (slow or specialised)

    def key(self) -> str:
        """The stage's identity: what it computes, not what it is called. A model folder the parameters name (a wind
        tunnel) enters by its content (``model_identity``: whole-file digests, memoised), not its path."""
        named = {name: model_identity(folder) for name, folder in self.params.checkpoints().items()}
        return content_key(self.kind.name, self.kind.version, self.params.to_dict(), named, __version__)


def builtin_probes() -> list[str]:
    return sorted(p.stem for p in PROBES_DIR.glob("*.yaml"))


def load_probe(name_or_path: str | Path, overrides: dict[str, dict] | None = None) -> Probe:
    """A built-in recipe by name or a YAML file with ``kind:`` and parameters (unknown parameters are refused).
    ``overrides[probe name]``, if present, is merged over the recipe's parameters (``config.merge``)."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROBES_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        raise ConfigError(f"No probe '{name_or_path}'; built-in probes: {', '.join(builtin_probes())} "
                          "(or pass a YAML path).")
    data = read_yaml(path, "Probe recipe") or {}
    if not isinstance(data, dict) or "kind" not in data:
        raise ConfigError(f"Probe recipe {path} needs a 'kind:' key (see `interp-bayes probes`).")
    ref = str(data.pop("kind"))
    if ":" in ref and not Path(ref.rsplit(":", 1)[0]).is_absolute() and ref.rsplit(":", 1)[0].endswith(".py"):
        ref = f"{(path.parent / ref.rsplit(':', 1)[0]).resolve()}:{ref.rsplit(':', 1)[1]}"  # relative to the recipe
    kind = get_kind(ref)
    name = checked_name(str(data.pop("name", path.stem)), f"The probe name of {path}")
    default = data.pop("default", True)
    if not isinstance(default, bool):
        raise ConfigError(f"'default:' in {path} must be true or false, not {default!r}.")
    data = merge(data, (overrides or {}).get(name, {}))
    params = kind.params.from_dict(data)
    params.checkpoints()  # a checkpoint that is not there, or not one this kind reads, is refused now
    return Probe(name=name, kind=kind, params=params, kind_ref=ref, default=default)


def run_folder(config: SweepConfig, ref: ModelRef | None = None) -> Path:
    """``<out>/<model slug>/<run key>``; ``ref``: the config's model resolved (``config.model_ref()``), else
    resolved here."""
    model = config.model.rstrip("/")
    root = Path(config.out)
    return inside(root, root / slug(Path(model).name if Path(model).exists() else model) / config.digest(ref))


class Context:
    """What a probe sees: the config, the model (loaded on first use), its tokenizer, layer specs, content-addressed
    activation sets, and its own folder for files it saves."""

    def __init__(self, folder: Path, config: SweepConfig, say: Callable[..., None], model=None,
                 identity: dict | None = None, dry_run: bool = False, ref: ModelRef | None = None) -> None:
        """``model``: an already loaded model (else ``config.model`` is loaded on first use); ``identity``: its
        identity in the cache keys, for a model that ``config.model`` does not name (e.g. one built in memory);
        ``dry_run``: a plan, which writes nothing; ``ref``: ``config.model_ref()`` when the caller has it (else
        resolved on first use)."""
        self.folder, self.config, self.say, self.dry_run = folder, config, say, dry_run
        self.probe_folder = folder
        self.redo = False  # recompute activation sets too (``--redo``)
        self._model = model
        self._tokenizer = None
        self._identity = identity
        self._ref = ref
        self.float32 = config.float32_resolved()  # the numeric mode of the sweep's matrix products, in every set's key

    @property
    def ref(self) -> ModelRef:
        """The sweep's model, resolved once: its identity, and where the loader, tokenizer and config come from."""
        if self._ref is None:
            self._ref = self.config.model_ref()
        return self._ref

    @property
    def model(self):
        if self._model is None:
            t = time.perf_counter()
            self._model = load_model(self.ref, device=self.config.device, allow_pickle=self.config.allow_pickle)
            self.say(f"loaded {self.config.model} in {time.perf_counter() - t:.1f}s")
        return self._model

    @property
    def tokenizer(self):
        """The checkpoint's own tokenizer (its BOS policy), without loading the weights when they are not needed."""
        if self._tokenizer is None:
            self._tokenizer = (checkpoint_tokenizer(self._model) if self._model is not None else
                               load_tokenizer(self.ref))
        return self._tokenizer

    @property
    def identity(self) -> dict:
        return self._identity if self._identity is not None else self.ref.identity

    def n_layers(self) -> int:
        """The model's depth: from the loaded model, else its config (no weights loaded). Never from the run folder's
        ``model.json``, a record for the report: the config is part of the model's identity, the record is not."""
        if self._model is not None:
            return self._model.cfg.n_layers
        cfg = load_config(self.ref.source, local=self.ref.local, revision=self.ref.load_revision)
        n = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer", None)
        if n is None:
            return self.model.cfg.n_layers
        return int(n)

    def layers(self, spec) -> list[int]:
        """The sweep model's layers of a parameter (``resolve_layers``; None: the sweep's ``layers``)."""
        return resolve_layers(spec, self.n_layers(), self.config.layers)

    def _acts_key(self, digest: str, layers, readings, label_tokens, identity: dict, at: str, positions,
                  logit_ids) -> str:
        # a final-token set's key has no position part: the keys of the sets cached before ``at`` existed still hold
        # nor, under IEEE float32, a mode part: the keys of the sets cached before the switch hold too
        where = () if at == "final" else (at, positions)
        return content_key(identity, self.config.dtype, digest, sorted(layers), sorted(readings),
                           list(label_tokens) if label_tokens is not None else None, __version__, *where,
                           *(() if logit_ids is None else ("logits", list(logit_ids))),
                           *(() if self.float32 == IEEE else ("float32", self.float32)))

    def token_ids(self, prompts: Sequence, subject=None) -> list[list[int]]:
        """Token ids of text prompts (the checkpoint's own tokenizer: the sweep model's, or ``subject``'s) or of id
        prompts as given."""
        if not (prompts and isinstance(prompts[0], str)):
            return [list(map(int, p)) for p in prompts]
        if subject is not None:
            return tokenize(subject.model, prompts)
        ids = []
        for p in prompts:
            check_stop()  # a tokenizer's finalisers would swallow a signal handler's exception (core.stop)
            ids.append(self.tokenizer(p, add_special_tokens=True)["input_ids"])
        return ids

    def _digest(self, inputs, subject) -> str:
        """The content digest of prompts (their token ids) or of a batch of sequences."""
        return sequences_digest(inputs) if is_sequences(inputs) else prompt_digest(self.token_ids(inputs, subject))

    def acts_path(self, label: str, inputs, *, layers, readings=("v",), label_tokens=None, at: str = "final",
                  logit_ids=None, subject=None) -> Path:
        identity = self.identity if subject is None else subject.identity
        positions = getattr(inputs, "query_pos", None) if at == "queries" else None
        key = self._acts_key(self._digest(inputs, subject), layers, readings, label_tokens, identity, at,
                             None if positions is None else positions.tolist(), logit_ids)
        return inside(self.folder, self.folder / "acts" / f"{checked_name(label, 'The activation-set label')}-{key}")

    def activations(self, label: str, inputs, *, layers, readings=("v",), label_tokens=None, at: str = "final",
                    logit_ids=None, subject=None):
        """The activation set of ``inputs`` (text or token-id prompts, or a batch of sequences: ``model.read.read``)
        at ``layers``/``readings`` and positions ``at``, loaded from ``acts/<label>-<key>`` when its content key
        matches, else read and saved. ``subject``: what is read (None: the sweep's model; a wind tunnel: anything
        with ``model`` and ``identity``), whose identity enters the key. Loading checks every file's digest and the
        stored content digest; a damaged set is read again, with one warning. Under the set's lock, so that two
        sweeps asking for it at once read it once."""
        texts = None if is_sequences(inputs) or not (inputs and isinstance(inputs[0], str)) else list(inputs)
        if texts is not None:
            inputs = self.token_ids(texts, subject)
        digest = self._digest(inputs, subject)
        path = self.acts_path(label, inputs, layers=layers, readings=readings, label_tokens=label_tokens, at=at,
                              logit_ids=logit_ids, subject=subject)
        with stage_lock(self.folder, f"acts-{path.name}",
                        lambda: self.say(f"[waiting] {label}: another process is collecting it")):
            if path.exists() and not self.redo:
                try:
                    acts = Activations.load(path)
                    if acts.meta["prompt_digest"] == digest:
                        return acts
                    problem = f"{path} holds activations of other inputs than its key says"
                except CacheError as err:
                    problem = str(err).rstrip(".")
                warn(f"{problem}; collecting it again.")
            self.say(f"collecting {label}" + ("" if is_sequences(inputs) else f" ({len(inputs)} prompts)"))
            model = self.model if subject is None else subject.model
            acts = read(model, inputs, sites_of(layers, readings), at, label_tokens=label_tokens, logit_ids=logit_ids,
                        progress=not self.config.quiet, batch_size=self.config.batch_size)
            if texts is not None:
                acts.meta["texts"] = texts  # so a run folder shows its prompts without the prompt files
            with building(path) as tmp:
                acts.save(tmp)
            return acts

    def plan_acts(self, probe: str, label: str, prompts: Sequence | int, *, layers, readings=("v",),
                  label_tokens=None, subject=None, dims: dict[str, int] | None = None) -> PlanItem:
        """A dry-run line for an activation set of prompts; ``prompts`` may be a count when the set is chosen from
        another."""
        n = prompts if isinstance(prompts, int) else len(prompts)
        path = None if isinstance(prompts, int) else self.acts_path(label, prompts, layers=layers, readings=readings,
                                                                    label_tokens=label_tokens, subject=subject)
        cached = None if path is None else (path / MANIFEST).exists()
        width = sum((dims or {}).get(r, 0) for r in readings) * len(layers)
        # a run of consecutive prompts from the middle of the set: sets are often ordered (e.g. by k, shortest
        # first), and neighbours batch together as they do in the sweep
        mid = max(0, n // 2 - CALIBRATION_PROMPTS // 2)
        sample = [] if path is None else self.token_ids(list(prompts[mid: mid + CALIBRATION_PROMPTS]), subject)
        return PlanItem(probe, f"activations {label}: {n} prompts, layers {list(layers)}, {', '.join(readings)}",
                        cached, 0 if cached else n, 0 if cached else 4 * n * (width + 2), key="" if path is None
                        else path.name, sample=sample)

    def site_dims(self) -> dict[str, int]:
        """Widths of the readings (from the config, no weights loaded): v, z, resid, attn_entropy."""
        cfg = load_config(self.ref.source, local=self.ref.local, revision=self.ref.load_revision)
        d = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", 0)
        heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head", 1)
        d_head = getattr(cfg, "head_dim", None) or d // heads
        kv = getattr(cfg, "num_key_value_heads", None) or heads
        return dict(v=kv * d_head, z=heads * d_head, resid=d, attn_entropy=heads)

    def save_json(self, name: str, obj) -> Path:
        """Write a file of the running probe (``probes/<name>/<file>``)."""
        return write_json(self.probe_folder / name, obj)


@dataclass
class Run:
    """A run folder and what was computed in it."""

    folder: Path
    config: SweepConfig
    computed: list[str] = field(default_factory=list)  # probes computed by this call (the others were cached)

    @property
    def rows(self) -> list[Row]:
        """Every number of the run, as tidy rows."""
        return RunView.load(self.folder).rows()

    def table(self):
        """The tidy rows as a pandas DataFrame (one row per number; scope keys as columns), as ``results.csv``."""
        import pandas as pd  # heavy, and only this table needs it

        view = RunView.load(self.folder)
        return pd.DataFrame(records(view.rows(), view.origins()))

    def summary(self) -> list:
        """The summary lines (label, value, verdict, paper key) of every finished probe."""
        return RunView.load(self.folder).summary()

    def report(self):
        """Build (or rebuild) ``report.html`` from the run folder; the result shows inline in Jupyter."""
        return Report.build(self.folder)

    def figure(self, figure_id: str | None = None):
        """A figure of the run by id (the first one when None), as a plotly figure."""
        figs = [f for f in RunView.load(self.folder).figures() if not isinstance(f.content, str)]
        for f in figs:
            if figure_id is None or f.id == figure_id:
                return f.content
        raise KeyError(f"No figure '{figure_id}' in this run; figures: {', '.join(f.id for f in figs)}.")

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{html.escape(line.label)}</td><td>{html.escape(line.value)}</td>"
                       f"<td>{html.escape(line.verdict)}</td></tr>" for line in self.summary())
        return (f"<b>Run</b> <code>{html.escape(str(self.folder))}</code><table><tr><th>measure</th>"
                f"<th>{html.escape(self.config.model)}</th><th>verdict</th></tr>{rows}</table>")


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep: says how far it got; the finished probes are saved and reported."""

    def __init__(self, done: int, total: int, folder: Path) -> None:
        super().__init__(f"interrupted after {done} of {total} probes; rerun the same command to resume "
                         f"({folder})")


def load_probes(config: SweepConfig) -> list[Probe]:
    """The named recipes, or every built-in recipe that is not opt-in (``default: false``)."""
    probes = [load_probe(name, config.overrides) for name in config.probes] if config.probes else \
        [p for p in (load_probe(name, config.overrides) for name in builtin_probes()) if p.default]
    names = [p.name for p in probes]
    stray = sorted(set(config.overrides) - set(names))
    if stray:
        raise ConfigError(f"Overrides name probe(s) {', '.join(stray)} that this sweep does not run; its probes: "
                          f"{', '.join(names)}.")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"Two probes are named {', '.join(dupes)}; give each recipe its own name (file name or "
                          "'name:' key).")
    return probes


def check_probes(ctx: Context, probes: list[Probe], redo: Sequence[str] = ()) -> None:
    """The one validation of a sweep, for the run and its dry run alike, before either writes or computes anything
    (ConfigError): ``redo`` names probes of the sweep, the sweep's ``layers`` lie in its model, and each recipe fits
    this sweep (its params' ``check``: layers it analyses but does not collect, ks beyond its task, ...)."""
    unknown = sorted(set(redo) - {p.name for p in probes})
    if unknown:
        raise ConfigError(f"--redo names {', '.join(unknown)}, which are not probes of this sweep; probes: "
                          f"{', '.join(p.name for p in probes)}.")
    ctx.layers(None)
    for probe in probes:
        probe.params.check(ctx, probe.name)


def stage_problem(folder: Path, key: str) -> str | None:
    """None when ``folder`` holds a finished stage of ``key`` whose files all match their digests; else why not:
    "" when it is absent or of other parameters (recomputed silently), a sentence when it is damaged."""
    try:
        if read_json(folder / "stage.json").get("key") != key:
            return ""
        unseal(folder, "stage.json")
    except FileNotFoundError:
        return ""
    except CacheError as err:
        return str(err).rstrip(".")
    return None


def plan_sweep(config: SweepConfig, redo: Sequence[str] = (), ref: ModelRef | None = None) -> list[PlanItem]:
    """What ``run_sweep`` would do: per probe, cached or not, and the activation sets and forward passes the rest
    needs (``--dry-run``). Refuses what the run refuses (``check_probes``); loads the tokenizer and config, never
    the weights, and writes nothing. ``ref``: ``config.model_ref()`` when the caller has it."""
    probes = load_probes(config)
    ref = ref or config.model_ref()
    folder = run_folder(config, ref)
    ctx = Context(folder, config, lambda *_: None, dry_run=True, ref=ref)
    check_probes(ctx, probes, redo)
    items, owner = [], {}
    for probe in probes:
        problem = "" if probe.name in redo else stage_problem(folder / "probes" / probe.name, probe.key())
        what = f"probe of kind {probe.kind.name}" + (f" (damaged cache, recomputed: {problem})" if problem else "")
        items.append(PlanItem(probe.name, what, problem is None))
        if problem is None:
            continue
        for item in probe.kind.plan(ctx, probe.params):
            item.probe = probe.name
            if item.key and item.key in owner:  # collected once, by the first probe that needs it
                item.what += f" (shared with {owner[item.key]})"
                item.forwards, item.disk_bytes = 0, 0
            elif item.key:
                owner[item.key] = probe.name
            items.append(item)
    return items


@contextmanager
def cpu_threads(threads: int | None):
    """torch's CPU threads set to ``threads`` (None: torch's default), and the BLAS of numpy and scipy (OpenBLAS)
    held to the same count while the context lasts. Left alone, OpenBLAS runs one thread per core for every small
    product and eigendecomposition of the statistics, and a thread that spins waiting for a core another job holds
    costs more than it brings: a bootstrap of PCA shares ran 8-10x slower in wall time at two BLAS threads than at
    one beside a one-thread sweep on the shared 2-core machine (docs/performance.md)."""
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        with threadpool_limits(limits=torch.get_num_threads(), user_api="blas"):
            yield
    finally:  # a caller in-process (a notebook) gets its count back, whatever the sweep set meanwhile
        torch.set_num_threads(previous)


# What each default recipe took on SmolLM2-135M in a default sweep from a fresh --out (two workers at one thread each,
# stage.json's seconds, so a stage's time includes the other worker's load on the machine; the first stage to need the
# model holds its load and the collection of the sets it shares), and the reference sample's seconds per prompt
# (``reference_pace``) at one thread: the cost of a probe never run under --out, analyses, wind tunnels and
# sequential stopping included. Measured on a quiet 2-core AMD EPYC (AVX2), 2026-12-03 (docs/performance.md,
# "The default sweep on a quiet machine", which says how to measure them again); entropy_neurons and focusing on
# 2026-12-04, after the pool's activation set moved from the first to the second (the first to need it).
REFERENCE_MODEL = "smollm2-135m"
REFERENCE_FORWARD = 0.114
REFERENCE_SECONDS = dict(
    axis=4.8, decoding=46.0, decoding_windtunnel=4.0, decoding_windtunnel_hmm=24.7,
    decoding_windtunnel_replacement=11.8, entropy_neurons=52.4, entropy_neurons_windtunnel=14.7,
    entropy_neurons_windtunnel_replacement=16.0, focusing=72.5, icl=150.3, keys=1.6, manifold_code=1.5,
    manifold_math=1.5, manifold_mixed=1.7, martingale=86.0, martingale_windtunnel=4.3,
    martingale_windtunnel_replacement=4.0, windtunnel=11.6, windtunnel_hmm=28.1,
    windtunnel_replacement=75.0,  # at 160 sequences (0.9.0), measured on a loaded machine: an upper figure
    # with the readout claim's 300 extra prompts: 736.2 s scaled by the stage's growth on one quiet machine (an Intel
    # Xeon, 2026-12-04: 415 -> 494 s, docs/performance.md)
    interventions=876.4)


def reference_seconds(probe: Probe, model: str, pace: float | None = None) -> float | None:
    """What ``probe`` should take here by its reference: ``REFERENCE_SECONDS`` of that built-in recipe with its
    parameters as shipped (an edited or overridden recipe: None), times ``pace``, the reference sample's seconds per
    prompt on the sweep's model here over ``REFERENCE_FORWARD`` (``reference_pace``; 1 when not timed). On another
    model than the reference one that pace holds the model's cost beside the machine's, and a stage's forwards scale
    with it; a wind tunnel's stage does not follow the sweep's model, so it takes the pace only where that model is
    the reference one (``follows_pace``)."""
    seconds = REFERENCE_SECONDS.get(probe.name)
    if seconds is None:
        return None
    try:
        shipped = load_probe(probe.name)
    except ConfigError:
        return None
    if shipped.kind.name != probe.kind.name or shipped.params != probe.params:
        return None
    return seconds * (pace or 1.0) if follows_pace(probe, model) else seconds


def follows_pace(probe: Probe, model: str) -> bool:
    """Whether ``probe``'s reference seconds scale with ``reference_pace`` timed on the sweep's ``model``: a stage of
    that model does; a wind tunnel's only where the model is the reference one (the pace is then this machine's)."""
    return model == REFERENCE_MODEL or getattr(probe.params, "tunnel", None) is None


@dataclass
class Estimate:
    """A dry run's time estimate: per probe, seconds and where they come from (a probe with neither is untimed)."""

    seconds: dict[str, float]
    source: dict[str, str]  # probe -> "recorded" (an earlier run under --out), "reference" or "throughput"
    per_forward: float | None  # seconds per prompt forward of the sweep's model, measured now
    calibration: str = ""
    load: float = 0.0  # seconds to load the sweep's model, measured now: paid once by the probes timed from it
    pace: float | None = None  # the sweep's model's forward here against the reference one (``reference_pace``)

    workers: int = 1  # processes the stages run in (``sweep_workers``)
    alone: float = 1.0  # the last worker's pace once the others are done (``alone_pace``)

    @property
    def total(self) -> float:
        """The probes' seconds spread over the workers (``makespan``), and the model's load where only forwards time
        them (a recorded or reference stage holds the load when it was the first to need the model)."""
        return makespan(self.seconds.values(), self.workers, self.alone) + \
            (self.load if "throughput" in self.source.values() else 0.0)


def makespan(seconds, workers: int, alone: float = 1.0) -> float:
    """Seconds until ``workers`` processes finish stages of these ``seconds``, each taking the longest stage left
    when it is free (as ``_compute`` orders them), the last one at pace ``alone`` once the others are done (it takes
    their cores: ``alone_pace``)."""
    loads = [0.0] * workers
    for s in sorted(seconds, reverse=True):
        loads[loads.index(min(loads))] += s
    *others, last = sorted(loads)
    done = others[-1] if others else 0.0
    return done + (last - done) * alone


def calibrate(config: SweepConfig, items: list[PlanItem],
              ref: ModelRef | None = None) -> tuple[float, str, float, float | None] | None:
    """(seconds per prompt forward of the sweep's model on this machine, how it was timed, seconds to load the
    model, its pace on the reference sample against the reference model's on the reference machine): a short forward
    (after a warm-up) of the first prompts of the activation set that needs the most forwards, batched as a sweep
    batches them, and the reference sample's (``reference_pace``) where an estimate takes it (``wants_pace``; else
    None). Nothing is written. None when no set of the sweep's model needs collecting (nothing to time). ``ref``:
    ``config.model_ref()`` when the caller has it."""
    sets = [i for i in items if i.sample and not i.model]
    if not sets:
        return None
    big = max(sets, key=lambda i: i.forwards)
    # at the threads of one of the sweep's workers, as its reference seconds were measured
    workers = sweep_workers(config, ref or config.model_ref(), stages=len({i.probe for i in items if not i.cached}))
    with cpu_threads(worker_threads(config, workers)), float32_mode(config.float32_resolved()):
        t = time.perf_counter()
        model = load_model(ref or config.model_ref(), device=config.device, allow_pickle=config.allow_pickle)
        load = time.perf_counter() - t
        ids = big.sample
        collect(model, ids[:2], progress=False)  # warm-up
        t = time.perf_counter()
        collect(model, ids, progress=False, batch_size=config.batch_size)
        seconds = (time.perf_counter() - t) / len(ids)
        left = {i.probe for i in items if i.what.startswith("probe of kind") and not i.cached}
        pace = reference_pace(model, config) \
            if wants_pace(load_probes(config), config.model, run_folder(config, ref), left) else None
    mean_len = sum(map(len, ids)) / len(ids)
    return seconds, (f"{seconds * 1000:.0f} ms per prompt, timed on {len(ids)} prompts of {big.what.split(':')[0]} "
                     f"(mean {mean_len:.0f} tokens), plus {load:.0f} s to load the model"), load, pace


def reference_pace(model, config: SweepConfig) -> float:
    """Seconds per prompt of the reference sample (the first ``CALIBRATION_PROMPTS`` prompts of the built-in pool,
    batched as a sweep batches them) over ``REFERENCE_FORWARD``: how much slower than the reference this machine
    runs now, and on another model than the reference one, times how much slower that model runs it."""
    texts = list(load_source("pool")["text"][:CALIBRATION_PROMPTS])
    t = time.perf_counter()
    collect(model, texts, progress=False, batch_size=config.batch_size)
    return (time.perf_counter() - t) / len(texts) / REFERENCE_FORWARD


def estimate(config: SweepConfig, items: list[PlanItem], per_forward: float | None = None,
             calibration: str = "", load: float = 0.0, pace: float | None = None, *,
             ref: ModelRef | None = None) -> Estimate:
    """Seconds per probe still to run: what the same probe took in an earlier run folder of this model under
    ``--out`` (its stage.json); else a shipped recipe's ``reference_seconds`` at ``pace`` (analyses, wind tunnels and
    draws stopped early included); else, with ``per_forward`` measured, the probe's prompt forwards on the sweep's
    model times ``per_forward`` (its analyses and wind-tunnel forwards not counted, and capped draws counted to
    their cap); without either, a probe is untimed. ``ref``: ``config.model_ref()`` when the caller has it."""
    folder = run_folder(config, ref)
    probes = {p.name: p for p in load_probes(config)}
    todo = [i for i in items if i.what.startswith("probe of kind") and not i.cached]
    seconds, source = {}, {}
    for item in todo:
        recorded = recorded_seconds(folder, item.probe)
        reference = reference_seconds(probes[item.probe], config.model, pace) if item.probe in probes else None
        if recorded is not None:
            seconds[item.probe], source[item.probe] = recorded, "recorded"
        elif reference is not None:
            seconds[item.probe], source[item.probe] = reference, "reference"
        elif per_forward is not None:
            forwards = sum(i.forwards for i in items if i.probe == item.probe and not i.model)
            seconds[item.probe], source[item.probe] = forwards * per_forward, "throughput"
    workers = sweep_workers(config, ref or config.model_ref(), stages=len(todo))
    return Estimate(seconds, source, per_forward, calibration, load, pace, workers, alone_pace(config, workers))


def _create(folder: Path) -> Path | None:
    """Make the run folder; the topmost folder this made (None if it existed), so a run that fails before it
    holds anything can leave no trace. An ``out`` that cannot hold folders is refused in one sentence."""
    missing = next((p for p in reversed([folder, *folder.parents]) if not p.exists()), None)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        claim_folder_lock(folder)
    except OSError as err:
        if missing is not None and missing.exists():
            shutil.rmtree(missing, ignore_errors=True)
        raise ConfigError(f"Cannot write the run folder {folder} ({err.strerror or err}); pass an --out folder "
                          "you can write to.") from None
    return missing


def _holds_results(folder: Path) -> bool:
    """Whether a run folder holds a finished probe or activation set (worth keeping after a failure)."""
    return any((folder / "probes").glob("*/stage.json")) or any((folder / "acts").glob(f"*/{MANIFEST}"))


def _remove_trace(folder: Path, created: Path) -> None:
    """Remove a run folder that this call created and that holds no result, unless another process works in it
    (it holds the folder lock), then the empty folders above it up to ``created``."""
    if not remove_if_unused(folder):
        return
    for parent in folder.parents:
        if created != parent and created not in parent.parents:
            break
        try:
            parent.rmdir()
        except OSError:
            break


def run_sweep(config: SweepConfig, model=None, *, redo: Sequence[str] = (), ref: ModelRef | None = None) -> Run:
    """Run (or resume) every probe of ``config`` on its model; returns the run.

    model: an already loaded bridge for ``config.model`` (saves a second load in a notebook). redo: probe names to
    recompute (with their activation sets) even when cached. ref: ``config.model_ref()`` when the caller has it (a
    grid resolves each model once for all its cells). With several workers (``sweep_workers``), helper processes
    compute other stages of the same folder beside this one.
    """
    probes = load_probes(config)
    ref = ref or config.model_ref()  # resolved once: the run's id, its cache keys and its load all use it
    folder = run_folder(config, ref)
    run = Run(folder, config)
    say = (lambda *_: None) if config.quiet else print
    ctx = Context(folder, config, say, model, ref=ref)
    check_probes(ctx, probes, redo)  # before anything is written
    # each stage's files are hashed once here: what is cached decides the workers and seeds the ETA
    cached = {p.name for p in probes if stage_problem(folder / "probes" / p.name, p.key()) is None}
    workers = sweep_workers(config, ref, model, stages=sum(p.name in redo or p.name not in cached for p in probes))
    created = _create(folder)
    record = dict(probes=[dict(name=p.name, kind=p.kind.name) for p in probes])
    helpers: list = []
    try:
        # other processes may work on this cell too (stale temp files are removed first)
        with working_in(folder), cpu_threads(worker_threads(config, workers)), float32_mode(ctx.float32):
            # config.yaml and run.json (the report's probe list) describe the last sweep that finished; a failing
            # sweep leaves a finished folder's as they were
            if not (folder / "run.json").exists():
                atomic_write_text(folder / "config.yaml", config.to_yaml())
                write_json(folder / "run.json", record)
            recorded = _record_text(folder)
            if not (folder / "env.json").exists():
                write_json(folder / "env.json", dict(environment(config.seed), float32=ctx.float32))
            views_current = (folder / "report.html").exists()
            try:
                pace = eta_pace(ctx, probes, cached)  # before the helpers start, so that they share it
                helpers = _start_helpers(config, workers, pace)
                taking = at_safe_points(_take_cores_of_finished_helpers(
                    helpers, workers * worker_threads(config, workers), say)) \
                    if takes_cores(config, workers) else nullcontext()
                with taking:
                    views_current = _compute(ctx, probes, redo, run, workers, cached=cached,
                                             pace=pace) and views_current
                _join_helpers(helpers)
                if (folder / "model.json").exists() and _model_json_stale(ctx):
                    say("model.json is damaged or does not match the model: loading it to write it again")
                    _write_model_json(ctx, load=True)
                atomic_write_text(folder / "config.yaml", config.to_yaml())
                write_json(folder / "run.json", record)
                views_current = views_current and _record_text(folder) == recorded  # the page shows both
            finally:  # the views show what the folder holds now, however the loop ended
                _stop_helpers(helpers)
                if not views_current and _holds_results(folder):
                    _views(folder)
    except BaseException as err:
        if created is not None and not _holds_results(folder):  # a failed first run leaves no trace
            _remove_trace(folder, created)
        if isinstance(err, KeyboardInterrupt):
            raise SweepInterrupted(sum(1 for p in probes if stage_problem(folder / "probes" / p.name, p.key()) is None),
                                   len(probes), folder) from None
        raise
    return run


WORKER_MIN_PARAMS = 10_000_000  # below this a sweep's stages take seconds, and a second process's start (~5 s) would not pay


def sweep_workers(config: SweepConfig, ref: ModelRef, model=None, stages: int = 2) -> int:
    """Processes a sweep computes its ``stages`` (those not cached) in: ``config.workers``; else two, at one torch
    thread each, on a CPU with two or more cores, for two or more stages of a model of ``WORKER_MIN_PARAMS`` or more
    whose two loads fit in free RAM, since two one-thread processes ran SmolLM2's forward passes 1.31x faster than two
    threads in one (``bench/cores.py``, docs/performance.md); else one (a model passed in, ``threads`` given, a GPU)."""
    if config.workers is not None:
        return config.workers
    device = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if model is not None or config.threads is not None or device != "cpu" or (os.cpu_count() or 1) < 2 or stages < 2:
        return 1
    footprint = load_footprint(ref)
    if footprint is None or footprint[0] < WORKER_MIN_PARAMS:
        return 1
    return 2 if 2 * footprint[1] <= psutil.virtual_memory().available else 1


def worker_threads(config: SweepConfig, workers: int) -> int | None:
    """torch threads of each worker: the config's, else one beside other workers (None: torch's default)."""
    return config.threads or (1 if workers > 1 else None)


# The first worker's pace once it is alone and takes the cores of the others (``_take_cores_of_finished_helpers``):
# the interventions stage, matrix products almost all, took 393 s at two torch threads and 736 s at one on the quiet
# 2-core machine (docs/performance.md).
TWO_THREAD_PACE = 393.3 / 736.2


def takes_cores(config: SweepConfig, workers: int) -> bool:
    """Whether the first worker takes the other workers' cores once they are done: two workers or more at threads
    the sweep chose (``--threads`` keeps every worker at its count)."""
    return workers > 1 and config.threads is None


def alone_pace(config: SweepConfig, workers: int) -> float:
    """The last worker's pace against one thread once the other workers are done: ``TWO_THREAD_PACE`` where it
    takes their cores (``takes_cores``), else 1."""
    return TWO_THREAD_PACE if takes_cores(config, workers) else 1.0


def _take_cores_of_finished_helpers(helpers: list, threads: int, say: Callable) -> Callable[[], None]:
    """A safe-point call (``core.stop.at_safe_points``) for the first worker: once every helper has exited, its
    torch threads go up to ``threads`` (the cores the workers held together), so that a long last stage does not
    go on at one thread beside idle cores (the default sweep's interventions stage ran alone for its last 185 s).
    SmolLM2's forwards gave byte-equal logits at one and two threads on the quiet 2-core machine; where the BLAS
    sums in another order at two, the numbers move by float32 rounding, as between any two thread counts."""
    taken = []

    def call() -> None:
        if taken or any(h.is_alive() for h in helpers):
            return
        taken.append(threads)
        torch.set_num_threads(threads)
        say(f"[workers] the other workers are done: {threads} torch threads from here")

    return call


def _compute(ctx: Context, probes: list[Probe], redo: Sequence[str], run: Run, workers: int,
             helper: bool = False, cached: set[str] | None = None, pace: float | None = None) -> bool:
    """Compute every stage of ``probes`` not cached, each under its lock; whether the views were rebuilt after the
    last stage computed here (``helper``: a helper worker, which speaks of the stages it computes only; ``cached``:
    the probes found cached just before, else looked up here; ``pace``: the ETA's first pace, ``eta_pace``). With
    several workers every worker takes the longest stages first (``expected``) and passes over a stage another
    worker holds, then waits for those at the end (finding them cached); a helper does not wait for them but ends,
    so that the first worker can take its cores (``_take_cores_of_finished_helpers``) while the stages another
    worker holds go on."""
    folder, say = ctx.folder, ctx.say
    eta = ETA(probes, folder, ctx.config.model, workers, cached=cached, alone=alone_pace(ctx.config, workers),
              pace=pace)
    index = {p.name: i for i, p in enumerate(probes, start=1)}
    order = probes if workers == 1 else sorted(probes, key=lambda p: -(eta.expected(p.name) or 0.0))
    views_current, passed = True, []
    for wait, todo in ((workers == 1, order), (True, passed if not helper else [])):
        for probe in todo:
            check_stop()
            pfolder = inside(folder, folder / "probes" / probe.name)  # never through a link out of the run
            # under the stage's lock, so that a second process on this cell waits and then finds it cached
            with stage_lock(folder, f"probe-{probe.name}", wait=wait,
                            on_wait=lambda: say(f"[waiting] {probe.name}: another process is computing it")) as held:
                if not held:
                    passed.append(probe)
                    continue
                problem = "" if probe.name in redo else stage_problem(pfolder, probe.key())
                if problem is not None or not helper:
                    eta.start(index[probe.name], probe, say)
                if problem is None:
                    eta.done(probe, cached=True)
                    if probe.name not in eta.cached_at_start:
                        run.computed.append(probe.name)  # by another worker of this sweep
                    if not helper:
                        say(f"[cached] {probe.name}")
                    continue
                if problem:
                    warn(f"{problem}; recomputing probe {probe.name}.")
                _run_probe(ctx, probe, pfolder, redo=probe.name in redo)
            eta.done(probe, cached=False)
            run.computed.append(probe.name)
            _views(folder)
            views_current = True
    return views_current


def _start_helpers(config: SweepConfig, workers: int, pace: float | None = None) -> list:
    """``workers - 1`` helper processes (spawned: a fresh interpreter each) computing stages of the same run."""
    spawn = multiprocessing.get_context("spawn")
    helpers = [spawn.Process(target=_helper, args=(asdict(config), workers, i, pace), name=f"worker {i}", daemon=True)
               for i in range(2, workers + 1)]
    for h in helpers:
        h.start()
    return helpers


def _helper(config: dict, workers: int, number: int, pace: float | None = None) -> None:
    """A helper worker: the sweep's stages, longest first, in its own process at the sweep's threads (1 by default);
    no progress bars (the first worker's are shown), its lines tagged with its number. It recomputes nothing cached
    (``--redo`` is the first worker's)."""
    quiet, config = config["quiet"], SweepConfig.from_dict(dict(config, quiet=True))
    say = (lambda *_: None) if quiet else (lambda *a: print(f"[worker {number}]", *a, flush=True))
    try:
        ref = config.model_ref()
        ctx = Context(run_folder(config, ref), config, say, ref=ref)
        with stop_on_signal(), cpu_threads(worker_threads(config, workers)), float32_mode(ctx.float32):
            _compute(ctx, load_probes(config), (), Run(ctx.folder, config), workers, helper=True, pace=pace)
    except KeyboardInterrupt:  # a stop (Ctrl-C reaches every worker; SIGTERM from the first): the first one reports
        pass


def _join_helpers(helpers: list) -> None:
    """Wait for helpers that have nothing left to compute (their last views), and say if one failed."""
    for h in helpers:
        h.join()
        if h.exitcode != 0:
            warn(f"sweep {h.name} ended with exit code {h.exitcode}; the first worker computed what it left.")


def _stop_helpers(helpers: list) -> None:
    """Stop helpers still running (the sweep failed or was stopped) at their next safe point, and wait for them."""
    for h in helpers:
        if h.is_alive():
            h.terminate()  # SIGTERM: a stop (core.stop), its stage's temporary folder removed
        h.join()


CALIBRATION_PROMPTS = 32  # prompts a dry run times the model on


def eta_pace(ctx: Context, probes: list[Probe], cached: set[str]) -> float | None:
    """The sweep's model's pace here against the reference one (``reference_pace``, as the dry run times it), for the
    ETA's estimates before the run's first stage ends: timed once where progress is shown and an estimate takes it
    (``wants_pace``); else None (the reference pace). The model it loads is the one the stages use."""
    config = ctx.config
    left = {p.name for p in probes if p.name not in cached}
    if config.quiet or not wants_pace(probes, config.model, ctx.folder, left):
        return None
    return reference_pace(ctx.model, config)


def wants_pace(probes: list[Probe], model: str, folder: Path, left: set[str]) -> bool:
    """Whether a stage to compute (its probe's name in ``left``) will be estimated from its reference seconds at the
    model's pace: never run under --out (``recorded_seconds``), a shipped recipe as shipped that ``follows_pace``."""
    return any(p.name in left and recorded_seconds(folder, p.name) is None and follows_pace(p, model)
               and reference_seconds(p, model) is not None for p in probes)


def recorded_seconds(folder: Path, name: str) -> float | None:
    """What probe ``name`` took when last computed in ``folder`` or a sibling run folder (None: never)."""
    for candidate in [folder, *sorted(p for p in folder.parent.glob("*") if p != folder)]:
        try:
            seconds = read_json(candidate / "probes" / name / "stage.json").get("seconds")
        except (FileNotFoundError, NotADirectoryError, CacheError, ValueError):
            continue
        if seconds:
            return float(seconds)
    return None


class ETA:
    """The sweep's progress line, "probe i/N: NAME (ETA ...)". A cached probe costs nothing; another is expected to
    take what it took when last computed (its stage.json's seconds, in this folder or a sibling run folder of the
    same model under ``--out``); one never computed here takes its ``reference_seconds`` at ``pace`` (timed at the
    start, ``eta_pace``), times how far this run's computed probes have strayed from theirs (their seconds over
    their reference seconds; 1 before the first ends), else the mean of the others. With several workers the rest
    takes its ``makespan``, and a stage another worker finished (its stage.json there) is no longer left."""

    def __init__(self, probes: list, folder: Path, model: str = "", workers: int = 1,
                 cached: set[str] | None = None, alone: float = 1.0, pace: float | None = None) -> None:
        """``cached``: the probes whose stages are cached now, when the caller has just checked them; ``alone``: the
        last worker's pace once the others are done (``alone_pace``); ``pace``: the model's pace here
        (``reference_pace``)."""
        if cached is None:
            cached = {p.name for p in probes if stage_problem(folder / "probes" / p.name, p.key()) is None}
        self.left, self.reference = {}, {}
        self.cached_at_start = {p.name for p in probes if p.name in cached}
        for p in probes:
            if p.name in cached:
                self.left[p.name] = 0.0
                continue
            self.left[p.name] = recorded_seconds(folder, p.name)
            if self.left[p.name] is None and (ref := reference_seconds(p, model, pace)) is not None:
                self.reference[p.name] = ref
        self.folder, self.workers, self.alone = folder, workers, alone
        self.t0, self.n = time.perf_counter(), len(probes)
        self.t_probe, self.measured = self.t0, []  # this run's computed probes' seconds
        self.paced = [0.0, 0.0]  # seconds and reference seconds of this run's probes that have a reference

    def expected(self, name: str) -> float | None:
        """Seconds probe ``name`` is expected to take (None: unknown)."""
        pace = self.paced[0] / self.paced[1] if self.paced[1] > 0 else 1.0
        seconds = self.left.get(name)
        return self.reference[name] * pace if seconds is None and name in self.reference else seconds

    def remaining(self) -> float | None:
        if self.workers > 1:  # stages another worker finished meanwhile
            for name in [n for n, s in self.left.items() if s != 0.0]:
                if (self.folder / "probes" / name / "stage.json").exists():
                    self.left[name] = 0.0
        left = {n: self.expected(n) for n in self.left}
        known = [s for s in left.values() if s is not None and s > 0] + self.measured
        if not known:
            return 0.0 if all(s == 0 for s in left.values()) else None
        mean = sum(known) / len(known)
        return makespan([s if s is not None else mean for s in left.values()], self.workers, self.alone)

    def start(self, i: int, probe, say) -> None:
        left = self.remaining()
        eta = f"ETA {_duration(left)} for this and the rest" if left is not None else "ETA unknown (first run here)"
        say(f"probe {i}/{self.n}: {probe.name} ({eta}; {_duration(time.perf_counter() - self.t0)} so far)")
        self.t_probe = time.perf_counter()

    def done(self, probe, cached: bool) -> None:
        self.left.pop(probe.name, None)
        if not cached:
            seconds = time.perf_counter() - self.t_probe
            self.measured.append(seconds)
            if probe.name in self.reference:
                self.paced[0] += seconds
                self.paced[1] += self.reference[probe.name]


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else \
        f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _record_text(folder: Path) -> str:
    """The run's record as the report shows it: its probe list and config."""
    return "".join((folder / name).read_text() if (folder / name).exists() else "" for name in ("run.json",
                                                                                             "config.yaml"))


def _run_probe(ctx: Context, probe: Probe, pfolder: Path, *, redo: bool) -> None:
    """Compute a probe into a temporary folder that replaces ``pfolder`` only when it succeeds, so a failure leaves
    the previous results (and the views of them) as they were."""
    _write_model_json(ctx)
    with building(pfolder) as tmp:
        ctx.probe_folder, ctx.redo = tmp, redo
        try:
            torch.manual_seed(ctx.config.seed)
            t = time.perf_counter()
            result = probe.kind.run(ctx, probe.params)
            seconds = time.perf_counter() - t
        finally:
            ctx.probe_folder, ctx.redo = pfolder, False
        for row in result.rows:
            row.probe, row.kind = probe.name, probe.kind.name
        write_rows(tmp / "rows.json", result.rows)
        write_json(tmp / "data.json", result.data)
        _write_model_json(ctx)
        # stage.json last, with the digest of every file: its presence with a matching key marks the probe as
        # finished; kind_module / kind_from say what a fresh `interp-bayes report` imports to get a plugin kind back
        seal(tmp, "stage.json", dict(key=probe.key(), kind=probe.kind.name, kind_ref=probe.kind_ref,
                                     **provenance(probe.kind), version=probe.kind.version,
                                     params=probe.params.to_dict(), package=__version__, git_commit=git_commit(),
                                     seconds=seconds))
    ctx.say(f"[done] {probe.name} in {seconds:.1f}s")


def _model_json_stale(ctx: Context) -> bool:
    """Whether ``model.json`` is absent, damaged, or disagrees with the model's identity or depth (both known without
    loading the weights)."""
    try:
        record = read_json(ctx.folder / "model.json")
    except (FileNotFoundError, CacheError):
        return True
    return not isinstance(record, dict) or record.get("identity") != _as_json(ctx.identity) or \
        record.get("n_layers") != ctx.n_layers()


def _as_json(obj):
    """``obj`` as ``write_json`` writes it and ``read_json`` reads it back."""
    return json.loads(json.dumps(obj, default=str))


def _write_model_json(ctx: Context, load: bool = False) -> None:
    """Record the loaded model's provenance in ``model.json`` for the report, unless the file holds it already, so
    a damaged or edited one is written again by the next sweep that loads the model (``load``: load it for this)."""
    if ctx._model is None and not load:
        return
    cfg = ctx.model.cfg
    record = _as_json(dict(model_info(ctx.model).to_dict(), n_layers=cfg.n_layers, n_heads=cfg.n_heads,
                           n_kv_heads=cfg.n_key_value_heads or cfg.n_heads, identity=ctx.identity))
    try:
        if read_json(ctx.folder / "model.json") == record:
            return
    except (FileNotFoundError, CacheError):
        pass
    write_json(ctx.folder / "model.json", record)


def _views(folder: Path) -> None:
    """Rebuild the tidy table and the report from the folder (after every probe, so partial runs are reported)."""
    with stage_lock(folder, "views"):  # a concurrent process's rebuild cannot overwrite this one with older rows
        view = RunView.load(folder)
        atomic_write_text(folder / "results.csv", to_csv(view.rows(), view.origins()))
        build_report(folder)

