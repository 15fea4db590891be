"""Checks of the values a user types (seeds, counts, devices, output paths), shared by every command line and
config, so that each is refused the same way wherever it is read and before anything is written.

Each ``*_problem(value)`` returns None when the value is fine, else what it must be ("a seed from 0 to ...");
a config turns that into a ``ConfigError`` naming its key (``refuse``), a command line into argparse's refusal
naming its flag (the ``*_arg`` types: argparse prints ``error: argument --seed: must be ..., not '-1'`` and exits
with code 2).
"""

from __future__ import annotations

# torch is imported inside the functions that need it: core is the light bottom layer that every command imports
import argparse
import math
import os
from pathlib import Path
from typing import Callable

from .errors import ConfigError
from .plugin import is_int

SEED_MAX = 2**32 - 1  # numpy's and torch's seeding take 0 .. 2**32 - 1


def seed_problem(value) -> str | None:
    return None if is_int(value) and 0 <= value <= SEED_MAX else f"a seed from 0 to {SEED_MAX}"


def count_problem(value, least: int = 1) -> str | None:
    return None if is_int(value) and value >= least else f"a whole number of at least {least}"


def positive_problem(value) -> str | None:
    return None if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf \
        else "a finite number above 0"


def device_problem(value, here: bool = True) -> str | None:
    """A torch device this machine has: cpu, cuda[:i] with CUDA present (and i below the GPU count), mps on Apple;
    with ``here`` False any device torch can name (a config that may run on another machine, e.g. a grid's)."""
    import torch

    has = ["cpu"]
    if torch.cuda.is_available():
        has += ["cuda", f"cuda:0 .. cuda:{torch.cuda.device_count() - 1}"]
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        has.append("mps")
    want = f"a torch device this machine has ({', '.join(has)})"
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError, ValueError):
        return want if here else "a torch device (cpu, cuda, cuda:1, mps)"
    if device.type == "cpu" or not here:
        return None
    if device.type == "cuda" and torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count():
        return None
    if device.type == "mps" and "mps" in has:
        return None
    return want


def _name_max(path: Path) -> tuple[int, int]:
    """The file system's longest file name and path (bytes), read at the nearest existing folder of ``path``."""
    def exists(p: Path) -> bool:
        try:
            return p.exists()
        except OSError:  # e.g. a name too long to look up
            return False

    here = next((p for p in [path, *path.parents] if exists(p)), Path("."))
    try:
        return os.pathconf(here, "PC_NAME_MAX"), os.pathconf(here, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):  # no pathconf here (Windows): the common limits
        return 255, 4096


def path_problem(value, *, folder: bool) -> str | None:
    """An output path: not empty, each name within the file system's length, and a folder (``folder``) where a
    folder is written, a file (not an existing folder) where a file is."""
    what = "a folder" if folder else "a file"
    if not isinstance(value, (str, Path)) or not str(value).strip():
        return f"{what} path (it is empty)"
    path = Path(value).expanduser()
    name_max, path_max = _name_max(path.absolute())
    long = next((part for part in path.parts if len(os.fsencode(part)) > name_max), None)
    if long is not None:
        return f"{what} path whose names are at most {name_max} bytes long (one is {len(os.fsencode(long))})"
    if len(os.fsencode(str(path.absolute()))) >= path_max:
        return f"{what} path shorter than {path_max} bytes"
    if folder and path.exists() and not path.is_dir():
        return "a folder (this names a file)"
    if not folder and path.is_dir():
        return "a file name (this names a folder)"
    return None


def refuse(problem: str | None, what: str, value) -> None:
    """Raise ``ConfigError`` "WHAT must be PROBLEM, not VALUE." when there is a problem."""
    if problem is not None:
        raise ConfigError(f"{what} must be {problem}, not {value!r}.")


def _arg(convert: Callable[[str], object], problem: Callable[[object], str | None], name: str):
    """An argparse type: ``convert(text)`` (None when it cannot), refused with argparse's message on a problem."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        found = problem(value)
        if found is not None:
            raise argparse.ArgumentTypeError(f"must be {found}, not {text!r}")
        return Path(value) if convert is str and name in ("folder", "file") else value

    parse.__name__ = name  # argparse names the type in some messages
    return parse


def count_arg(least: int = 1):
    """argparse type: an integer of at least ``least``."""
    return _arg(int, lambda v: count_problem(v, least), "count")


seed_arg = _arg(int, seed_problem, "seed")
positive_arg = _arg(float, positive_problem, "number")
device_arg = _arg(str, device_problem, "device")
out_folder_arg = _arg(str, lambda v: path_problem(v, folder=True), "folder")  # -> Path
out_file_arg = _arg(str, lambda v: path_problem(v, folder=False), "file")  # -> Path
