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

# fcntl is imported inside functions because it exists on POSIX only; torch because core is the light bottom layer that
# every command imports
import functools
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterator

import yaml

from .errors import CacheError, ConfigError
from .stop import check_stop

LOCK_POLL_S = 0.2  # how often a process waiting for a stage lock tries again
MANIFEST = "manifest.json"  # the digests of a saved activation set (``seal``), written last
TRACKED_PACKAGES = ("interp_bayes", "torch", "transformer-lens", "transformers", "accelerate", "datasets",
                    "scikit-learn", "plotly", "numpy", "safetensors", "tokenizers", "gguf")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def apply_umask(folder: str | Path) -> None:
    """Give ``folder`` and everything in it the modes a plain ``mkdir`` / ``open`` would (0777 / 0666 less the
    umask), replacing the private 0700 / 0600 of ``mkdtemp`` / ``mkstemp``-style writers."""
    mask = _umask()
    folder = Path(folder)
    os.chmod(folder, 0o777 & ~mask)
    for path in folder.rglob("*"):
        if not path.is_symlink():
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


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
def stage_lock(folder: str | Path, name: str, on_wait: Callable[[], None] | None = None, *,
               wait: bool = True) -> Iterator[bool]:
    """Hold the exclusive lock of one stage of a run folder while it is checked and computed, so that a second
    process on the same cell (a rerun grid, a retried task, a colleague) waits and then finds it cached. The kernel
    releases the lock when its process dies, so a killed worker never blocks a retry. ``on_wait`` is called once
    when another process holds the lock. ``wait=False``: do not wait; the block runs without the lock and is given
    False (a sweep's worker then takes another stage first)."""
    import fcntl

    fd = _lock_file(Path(folder), name)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                yield False
                return
            if on_wait is not None:
                on_wait()
            while True:  # polled, not blocking: a stop asked meanwhile is honoured (core.stop)
                check_stop()
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    time.sleep(LOCK_POLL_S)
        yield True
    finally:
        os.close(fd)  # releases the lock


def claim_folder_lock(folder: str | Path) -> None:
    """Create ``folder``'s lock file (``locks/folder.lock``): the first write of a run, so an unwritable folder is
    refused before anything else is written."""
    os.close(_lock_file(Path(folder), "folder"))


def remove_if_unused(folder: str | Path) -> bool:
    """Remove ``folder`` unless another process works in it (holds its folder lock, ``working_in``); whether it was
    removed."""
    import fcntl

    fd = _lock_file(Path(folder), "folder")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    shutil.rmtree(folder, ignore_errors=True)
    return True


def _is_temp(path: Path) -> bool:
    """A temporary file of an atomic write or folder of a stage being built: mkstemp's / mkdtemp's
    ``.<name>.<random>``."""
    return path.name.startswith(".") and "." in path.name[1:] and (path.is_file() or path.is_dir())


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
            for stale in [p for p in folder.rglob(".*") if _is_temp(p)]:
                if stale.is_dir():
                    shutil.rmtree(stale, ignore_errors=True)
                else:
                    stale.unlink(missing_ok=True)
        except BlockingIOError:
            pass  # another process works here: its temporary files are live
        fcntl.flock(fd, fcntl.LOCK_SH)  # from exclusive (or nothing) to shared: others may join now
        yield
    finally:
        os.close(fd)


def read_json(path: str | Path):
    """A JSON file; one that is not valid JSON (truncated, overwritten) raises CacheError naming it."""
    try:
        return json.loads(Path(path).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CacheError(f"{path} is damaged ({err.__class__.__name__}: {err}); delete it or rerun the sweep to "
                         "recompute it.") from None


# Names that become file or folder names (probe names, activation-set labels, grid names): a letter or digit first,
# so "." and ".." and hidden names are impossible, and no separator
def parse_yaml(text: str, what: str):
    """YAML text (safe loader); ConfigError naming ``what`` and where the text is malformed."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{what} is not valid YAML ({getattr(err, 'problem', None) or err}{where}); fix it "
                          "and rerun.") from None


def read_yaml(path: str | Path, what: str):
    """A YAML file; ConfigError (one sentence) when it is missing, unreadable or malformed."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        problem = "does not exist" if isinstance(err, FileNotFoundError) else f"cannot be read ({err})"
        raise ConfigError(f"{what} {path} {problem}; check the path.") from None
    return parse_yaml(text, f"{what} {path}")


NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def checked_name(name: str, what: str) -> str:
    """``name`` if it is safe as one path component (``NAME_PATTERN``), else ConfigError naming ``what``."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ConfigError(f"{what} {name!r} cannot be a folder name; use letters, digits, '.', '_' and '-' only, "
                          "starting with a letter or digit (at most 128 characters).")
    return name


def slug(text: str, limit: int = 80) -> str:
    """A safe path component made from any text (``checked_name`` accepts it)."""
    out = re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).lstrip("._-")[:limit]
    return out or "_"


def inside(root: str | Path, path: str | Path) -> Path:
    """``path``, after checking that it resolves inside ``root`` (symbolic links followed): nothing a user names may
    write outside the run folder."""
    root_r, path_r = Path(root).resolve(), Path(path).resolve()
    if path_r != root_r and root_r not in path_r.parents:
        raise ConfigError(f"{path} lies outside {root}; names in recipes and configs may not climb out of the run "
                          "folder.")
    return Path(path)


def file_digest(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def seal(folder: str | Path, record: str, content: dict) -> Path:
    """Write ``folder/record`` (JSON): ``content`` plus ``files``, the sha256 of every other file under ``folder``.
    Written last, so its presence marks the folder complete; ``unseal`` checks every digest on load."""
    folder = Path(folder)
    files = {p.relative_to(folder).as_posix(): file_digest(p) for p in sorted(folder.rglob("*"))
             if p.is_file() and p.name != record and not _is_temp(p)}
    return write_json(folder / record, dict(content, files=files))


def unseal(folder: str | Path, record: str) -> dict:
    """The record ``seal`` wrote, after checking that every file it lists is there with its digest; CacheError
    (naming the first damaged file) when one is missing, truncated or changed, or the record itself is damaged."""
    folder = Path(folder)
    path = folder / record
    if not path.is_file():
        raise CacheError(f"{folder} is incomplete (no {record}).")
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise CacheError(f"{path} lists no file digests (written by an older version or damaged).")
    for name, digest in data["files"].items():
        f = folder / name
        if not f.is_file() or file_digest(f) != digest:
            raise CacheError(f"{f} does not match the digest recorded in {record} (missing, truncated or changed).")
    return data


@contextmanager
def building(final: str | Path) -> Iterator[Path]:
    """A fresh temporary folder beside ``final`` to compute a stage into. When the block succeeds it replaces
    ``final`` (whose old files go only then); when it fails it is removed and ``final`` is left as it was."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    apply_umask(tmp)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
        os.replace(final, old / "old")
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


def warn(message: str) -> None:
    """One warning line on standard error (standard output may carry a table)."""
    print(f"interp-bayes: warning: {message}", file=sys.stderr)


def content_key(*parts) -> str:
    """A short hash of JSON-serialisable parts: the identity of a cached stage (same parts, same key)."""
    text = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def git_commit() -> str | None:
    """The checkout's commit of this package (None outside a git checkout), looked up once per process: every
    stage a sweep seals records it, and the code a process runs is the code it first found."""
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
        cuda=torch.cuda.is_available(), git_commit=git_commit(), seed=seed,
    )
