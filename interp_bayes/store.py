"""Run folders: atomic writes, content-addressed keys, JSON files and the environment a result was computed in.

Layout of a run folder ``<out>/<model slug>/<run key>/``:

- ``config.yaml``, ``env.json``, ``model.json``: what ran, where, on what;
- ``run.json``: the probes of the latest sweep in order (the report's order);
- ``acts/<label>-<key>/``: activation sets, keyed by a hash of everything that determines them;
- ``probes/<name>/``: one folder per probe: ``stage.json`` (its key, kind, resolved parameters, time),
  ``rows.json`` (its tidy results), ``data.json`` (per-prompt arrays its figures draw) and any files it saves;
- ``results.csv``, ``report.html``: views rebuilt after every finished probe.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

TRACKED_PACKAGES = ("interp_bayes", "torch", "transformer-lens", "transformers", "accelerate", "datasets",
                    "scikit-learn", "plotly", "numpy", "safetensors", "tokenizers", "gguf")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write to a temporary file beside ``path`` and rename it into place, so no reader sees half a file. The file
    gets the permissions a plain ``open(path, "w")`` would (0666 less the umask), not mkstemp's private 0600, so
    group members on a shared store can read each other's results."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: str | Path):
    return json.loads(Path(path).read_text())


def content_key(*parts) -> str:
    """A short hash of JSON-serialisable parts: the identity of a cached stage (same parts, same key)."""
    import hashlib

    text = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True,
                             timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(seed: int | None = None) -> dict:
    """Package versions, interpreter, threads, git commit and seed: enough to rerun a result."""
    import torch

    versions = {}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return dict(
        time=datetime.now(timezone.utc).isoformat(timespec="seconds"), python=sys.version.split()[0],
        platform=platform.platform(), packages=versions, torch_threads=torch.get_num_threads(),
        cuda=torch.cuda.is_available(), git_commit=_git_commit(), seed=seed,
    )
