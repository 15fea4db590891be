"""The sweep runner: one model, cached stages in a run folder, resumable.

A run folder is ``<out>/<model-slug>/<config digest>``, so rerunning the same config lands in the same folder and
skips every stage whose outputs already exist. The model is loaded only when a stage needs it.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .config import SweepConfig
from .extract import Activations, collect
from .geometry import manifold_summary
from .models import load_model
from .prompts import load_prompts
from .store import atomic_write_text, environment, read_json, write_json


@dataclass
class Run:
    """A run folder and what was computed in it."""

    folder: Path
    config: SweepConfig
    metrics: dict = field(default_factory=dict)
    computed: list[str] = field(default_factory=list)  # stages computed by this call (the others were cached)


def run_folder(config: SweepConfig) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(config.model).name if Path(config.model).exists() else config.model)
    return Path(config.out) / slug / config.digest()


def run_sweep(config: SweepConfig) -> Run:
    """Run (or resume) the sweep for ``config``; returns the run with its metrics."""
    folder = run_folder(config)
    folder.mkdir(parents=True, exist_ok=True)
    run = Run(folder, config)
    say = (lambda *_: None) if config.quiet else print
    atomic_write_text(folder / "config.yaml", config.to_yaml())
    if not (folder / "env.json").exists():
        write_json(folder / "env.json", environment(config.seed))
    torch.manual_seed(config.seed)
    model = None

    def get_model():
        nonlocal model
        if model is None:
            t = time.perf_counter()
            model = load_model(config.model, dtype=config.dtype, device=config.device)
            say(f"loaded {config.model} in {time.perf_counter() - t:.1f}s")
        return model

    values_dir = folder / "values"
    if (values_dir / "activations.json").exists():
        say(f"[cached] values: {values_dir}")
        acts = Activations.load(values_dir)
    else:
        prompts = load_prompts(config.prompts)
        acts = collect(get_model(), list(prompts["text"]), layers=config.layers, batch_size=config.batch_size,
                       progress=not config.quiet)
        acts.meta["domains"] = list(prompts["domain"])
        acts.save(values_dir)
        run.computed.append("values")

    metrics_path = folder / "metrics.json"
    if metrics_path.exists():
        say(f"[cached] metrics: {metrics_path}")
        run.metrics = read_json(metrics_path)
    else:
        manifold = {str(layer): manifold_summary(acts.values(layer), acts.entropy) for layer in acts.layers}
        run.metrics = dict(model=acts.meta["model"], prompts=config.prompts, prompt_digest=acts.meta["prompt_digest"],
                           entropy_unit="bits", value_manifold=manifold)
        write_json(metrics_path, run.metrics)
        run.computed.append("metrics")
    return run
