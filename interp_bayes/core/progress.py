"""Progress bars: tqdm's in a terminal or a notebook; where the output is a file or a pipe (a log, ``make sweep >
log``), plain lines, one at the start, at most one a minute, one at the end, since a bar's carriage-return
refreshes pile up there as hundreds of lines of half-drawn bars."""

from __future__ import annotations

# tqdm is imported inside the functions that need it: core is the light bottom layer that every command imports
import sys
from typing import Any, Iterable

LOG_INTERVAL = 60.0  # seconds between the lines a bar writes into a log


class _Lines:
    """A stream that turns tqdm's in-place refreshes into lines: carriage returns, cursor moves and the padding
    that clears a shorter refresh are dropped, every refresh ends in a newline, and empty writes vanish."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").replace("\x1b[A", "").strip()
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:  # encoding, isatty, ... as the stream has them
        return getattr(self.stream, name)


def _interactive(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def progress_bar(iterable: Iterable | None = None, **kwargs: Any):
    """A tqdm bar (the arguments are tqdm's; ``file`` defaults to standard error): tqdm.auto's in a notebook or a
    terminal, plain lines at most every ``LOG_INTERVAL`` seconds anywhere else."""
    from tqdm.auto import tqdm

    stream = kwargs.pop("file", None) or sys.stderr
    notebook = any(c.__module__.startswith("tqdm.notebook") for c in tqdm.__mro__)
    if notebook or _interactive(stream) or kwargs.get("disable"):
        return tqdm(iterable, file=stream, **kwargs)
    from tqdm import tqdm as plain

    kwargs.setdefault("mininterval", LOG_INTERVAL)
    kwargs.setdefault("bar_format", "{desc}: {percentage:3.0f}% {n_fmt}/{total_fmt} [{elapsed}<{remaining}, "
                                    "{rate_fmt}{postfix}]")  # no bar drawing: a log has no width to fill
    return plain(iterable, file=_Lines(stream), **kwargs)
