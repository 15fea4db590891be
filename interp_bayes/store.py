"""Run folders: atomic writes, content-addressed keys, JSON files and the environment a result was computed in.

Layout of a run folder ``<out>/<model slug>/<run key>/``:

- ``config.yaml``, ``env.json``, ``model.json``: what ran, where, on what;
- ``run.json``: the probes of the latest sweep in order (the report's order);
- ``acts/<label>-<key>/``: activation sets, keyed by a hash of everything that determines them;
- ``probes/<name>/``: one folder per probe: ``stage.json`` (its key, kind, resolved parameters, time),
  ``rows.json`` (its tidy results), ``data.json`` (per-prompt arrays its figures draw) and any files it saves;
- ``results.csv``, ``report.html``: views rebuilt after every finished probe;
- ``locks/``: lock files of the stages, the views and the folder itself, so that several processes (on one machine
  or on several, over a shared filesystem with working ``flock``) can work on one cell without corrupting it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterator

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


def _lock_file(folder: Path, name: str) -> int:
    """An open descriptor of ``folder/locks/<name>.lock`` (created with the umask's permissions, never deleted:
    removing a lock file that another process holds would let a third one in)."""
    path = Path(folder) / "locks" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # read-write: NFS grants locks on writable files only


@contextmanager
def stage_lock(folder: str | Path, name: str, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold the exclusive lock of one stage of a run folder while it is checked and computed, so that a second
    process on the same cell (a rerun grid, a retried task, a colleague) waits and then finds it cached. The kernel
    releases the lock when its process dies, so a killed worker never blocks a retry. ``on_wait`` is called once
    when another process holds the lock."""
    import fcntl

    fd = _lock_file(Path(folder), name)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _is_temp_file(path: Path) -> bool:
    return path.is_file() and path.name.startswith(".") and "." in path.name[1:]  # mkstemp's ".<name>.<random>"


@contextmanager
def working_in(folder: str | Path) -> Iterator[None]:
    """Hold a shared lock on a run folder while a sweep works in it. The first process to arrive (none holds it)
    removes the temporary files of atomic writes that killed runs left behind; while any process works there, none
    is removed, so a temporary file that another process is about to rename into place survives."""
    import fcntl

    folder = Path(folder)
    fd = _lock_file(folder, "folder")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            for stale in [p for p in folder.rglob(".*") if _is_temp_file(p)]:
                stale.unlink(missing_ok=True)
        except BlockingIOError:
            pass  # another process works here: its temporary files are live
        fcntl.flock(fd, fcntl.LOCK_SH)  # from exclusive (or nothing) to shared: others may join now
        yield
    finally:
        os.close(fd)


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
