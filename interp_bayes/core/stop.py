"""A stop asked by a signal (SIGTERM: a scheduler's stop, ``kill``), honoured at safe points.

A handler that raises runs in whatever frame is current; when that frame is a finaliser (``regex``'s
``Group.__del__`` during tokenisation), Python prints "Exception ignored" and drops the exception, and the work
runs to the end. So the handler only records the signal, and long loops call ``check_stop()`` between steps, where
raising is safe. ``Stopped`` is a KeyboardInterrupt, so a stop takes Ctrl-C's path (a sweep rebuilds its views).
The same safe points run other calls a caller registers (``at_safe_points``): a sweep's first worker takes the
cores of helpers that have finished there.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

_requested: list[int] = []  # the signals received since ``stop_on_signal`` was entered
_safe_point_calls: list[Callable[[], None]] = []  # what ``check_stop`` runs besides (``at_safe_points``)


class Stopped(KeyboardInterrupt):
    """Raised by ``check_stop`` at a safe point after a stop was asked."""


def stop_requested() -> int | None:
    """The number of the first stop signal received, or None."""
    return _requested[0] if _requested else None


def check_stop() -> None:
    """Raise ``Stopped`` if a stop was asked, else run the calls ``at_safe_points`` holds; call between steps of a
    long loop."""
    if _requested:
        raise Stopped()
    for call in _safe_point_calls:
        call()


@contextmanager
def at_safe_points(call: Callable[[], None]) -> Iterator[None]:
    """Run ``call`` at every ``check_stop`` while the block runs: in the thread of the work itself, between its
    steps, where a change to that thread's settings (torch's thread count) takes effect at once."""
    _safe_point_calls.append(call)
    try:
        yield
    finally:
        _safe_point_calls.remove(call)


@contextmanager
def stop_on_signal(signum: int = signal.SIGTERM) -> Iterator[None]:
    """Record ``signum`` as a stop request while the block runs (``check_stop`` raises from then on); the previous
    handler comes back afterwards, for callers in-process. Handlers can be set from the main thread only: elsewhere
    the block runs with the process's handler as it is."""
    installed = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signum, lambda received, frame: _requested.append(received)) if installed else None
    try:
        yield
    finally:
        if installed:
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
            _requested.clear()
