"""A status line on stderr while planning takes long: the stage, the ILP size, the elapsed time.

``AutoShardingOption.show_progress``: ``None`` (default) shows it only when stderr is a terminal
and planning has run for more than ``AUTO_DELAY_S`` (short plans print nothing, tests and logs stay
clean); ``True`` shows it from the start, also when stderr is not a terminal (one plain line per
stage, e.g. into a log file); ``False`` never shows it.
"""
from __future__ import annotations

import sys
import threading
import time

AUTO_DELAY_S = 2.0


class PlanningProgress:
    """Context manager: ``with PlanningProgress(enabled, delay_s) as p: p.stage("solve ...")``.

    On a terminal it is a transient rich status line (spinner, stage, elapsed) that disappears when
    planning ends; elsewhere each stage reached after ``delay_s`` prints one line
    ``alpa_pass planning: <stage> (<elapsed> s)``.
    """

    def __init__(self, enabled: bool, delay_s: float = 0.0, file=None):
        self.enabled = enabled
        self.delay_s = delay_s
        self._file = file
        self._stage = "start"
        self._start = time.perf_counter()
        self._lock = threading.Lock()
        self._timer = None
        self._status = None
        self._console = None
        self._closed = False
        self._visible = False

    def __enter__(self):
        if not self.enabled:
            return self
        from rich.console import Console

        self._console = Console(file=self._file or sys.stderr)
        self._start = time.perf_counter()
        self._timer = threading.Timer(self.delay_s, self._show)
        self._timer.daemon = True
        self._timer.start()
        return self

    def __exit__(self, *exc):
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            if self._status is not None:
                self._status.stop()

    def stage(self, text: str) -> None:
        """Enter a new stage (e.g. "extract", "solve ILP (1200 columns)")."""
        with self._lock:
            self._stage = text
            if not self._closed and self._status is None and self._visible:
                self._console.print(self._line(), markup=False, highlight=False)

    def __rich__(self):  # re-rendered by the status line's refresh thread: stage and time tick
        from rich.text import Text

        return Text(self._line())

    def _line(self) -> str:
        return f"alpa_pass planning: {self._stage} ({time.perf_counter() - self._start:.1f} s)"

    def _show(self) -> None:
        with self._lock:
            if self._closed or self._visible:
                return
            self._visible = True
            if self._console.is_terminal:
                self._status = self._console.status(self, spinner="dots")
                self._status.start()
            else:
                self._console.print(self._line(), markup=False, highlight=False)


def planning_progress(show: bool | None, stream=None) -> PlanningProgress:
    """The progress display for ``AutoShardingOption.show_progress`` (see the module docstring)."""
    stream = sys.stderr if stream is None else stream
    if show is None:
        return PlanningProgress(_isatty(stream), AUTO_DELAY_S, stream)
    return PlanningProgress(bool(show), 0.0, stream)


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
