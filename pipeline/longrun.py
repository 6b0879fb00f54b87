"""The long-run protocol: how a command that runs for hours reports and stops.

- ``progress``: the one progress writer of the project.  Every line a long command writes as it
  goes (a fold measured, a chain's step, a note before the work starts) reaches stderr through
  it, timestamped when stderr is a log rather than a terminal.
- ``watch``: the live status lines of the work in flight, a line per chain or labeller: redrawn
  in place on a terminal, otherwise a line whenever one changes and at least every
  ``PLAIN_EVERY_S`` seconds.
- ``GracefulStop``: Ctrl-C as a request.  The first one sets the stop event (the work ends at
  its next safe point, journaled as interrupted) and the session serving it aborts in its own
  exit (``Session.stop_on``); a second one is the hard stop: this process journals nothing
  more (what its threads would write then is the abort's doing, "scheduler stopped during the
  job", not a failure of the work) and raises KeyboardInterrupt, which the command turns into
  the ``--resume`` line and exit 130 (``hard_stop``).  The handler stays until the command
  exits, so the report is written whenever a stop comes (run-campaign's budget stop may land
  just as the work ends).
- ``InterruptLatch``: for a command whose Ctrl-C ends the work at once (search-policy): the
  KeyboardInterrupt as usual, remembered, so that one a library swallowed is raised again.
- ``Ending``: what the exit status says: 130 and a ``--resume`` line when a stop left work
  unfinished, 1 when something failed, 0 otherwise.
"""
from __future__ import annotations

import faulthandler
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any

from dispatcher.core.rundir import seal_journals, unseal_journals

INTERRUPTED = 130  # the exit status of a run a Ctrl-C (or a budget's stop) cut short
FAILED = 1  # some of the work failed (each says why)
PLAIN_EVERY_S = 60.0  # without a terminal: a line per unit of work at least this often
POLL_S = 0.5


def stamp() -> str:
    """The wall-clock time a log line is read by later."""
    return datetime.now().strftime("%Y-%m-%d %H:%M:%S")


def progress(line: str) -> None:
    """A progress line on stderr as a long command goes: on a terminal as it is; otherwise (a
    log file, a pipe) after a timestamp, so a log read later says when each thing ended."""
    if not sys.stderr.isatty():
        line = f"{stamp()} {line}"
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


# --------------------------------------------------------------------------- the graceful stop

class GracefulStop:
    """Ctrl-C as a request to stop (module docstring).  ``arm`` installs the handler once the
    work is planned (a Ctrl-C before that ends the command at once: nothing to keep yet);
    leaving the ``with`` block restores the previous one."""

    def __init__(self, message: str) -> None:
        self.event = threading.Event()
        self.message = message  # said on the first Ctrl-C: what a stop loses, what keeps it
        self._previous: Any = None
        self._armed = False
        # each unit of work's (state, rundir), asked on a hard stop for the --resume line
        self._states: Callable[[], Sequence[tuple[str, Path]]] = lambda: ()

    def is_set(self) -> bool:
        return self.event.is_set()

    def set(self) -> None:
        """Stop as a Ctrl-C would, without one (the work itself was interrupted)."""
        self.event.set()

    def arm(self, states: Callable[[], Sequence[tuple[str, Path]]] | None = None) -> None:
        """The handler installed; ``states``: each unit of work's (state, rundir) as it is
        now (what a hard stop's --resume line continues)."""
        if states is not None:
            self._states = states
        unseal_journals()  # work starts: journaled (an earlier hard stop in this process is over)
        self._previous = signal.signal(signal.SIGINT, self._interrupt)
        self._armed = True
        # `kill -USR1 <pid>` prints every thread's stack: a stuck run can be inspected.
        try:
            faulthandler.register(signal.SIGUSR1, all_threads=True)
        except (OSError, ValueError):  # a stderr without a descriptor (captured in-process)
            pass

    def _interrupt(self, signum: int, frame: FrameType | None) -> None:
        if self.event.is_set():
            seal_journals()  # the abort's doing is not the experiment's: nothing journaled
            raise KeyboardInterrupt
        self.event.set()
        sys.stderr.write(f"\n{self.message}\n")
        sys.stderr.flush()

    def hard_stop(self) -> Ending:
        """How a hard stop (the KeyboardInterrupt of a second Ctrl-C) left the work: every
        unit not finished is continued by --resume (a Ctrl-C before the work was armed left
        none)."""
        self.event.set()
        try:
            states = list(self._states())
        except Exception:  # the work half torn down: what can be said is said
            states = []
        unfinished = tuple(path for state, path in states if state != "finished")
        return Ending(unfinished, True, False)

    def __enter__(self) -> GracefulStop:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:  # not the hard stop's way out: the process goes on journaling
            unseal_journals()
        if self._armed:
            signal.signal(signal.SIGINT, self._previous)
            self._armed = False


class InterruptLatch:
    """Ctrl-C as KeyboardInterrupt, remembered.  Python drops an exception raised while a
    weakref callback or a ``__del__`` runs ("Exception ignored in ..."), so a Ctrl-C that lands
    there is lost and the command runs on (seen in search-policy: the trial finished and the
    study went on).  The latch keeps it: ``check`` raises it again at the work's next safe
    point.  For commands whose Ctrl-C ends the work at once (not ``GracefulStop``'s request)."""

    def __init__(self) -> None:
        self._hit = False
        self._previous: Any = None

    def is_set(self) -> bool:
        return self._hit

    def check(self) -> None:
        """A Ctrl-C seen since the latch was installed, raised (again) here."""
        if self._hit:
            raise KeyboardInterrupt

    def _interrupt(self, signum: int, frame: FrameType | None) -> None:
        self._hit = True
        raise KeyboardInterrupt

    def __enter__(self) -> InterruptLatch:
        self._previous = signal.signal(signal.SIGINT, self._interrupt)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)


@dataclass(frozen=True)
class Ending:
    """How a long run ended.  ``unfinished``: its rundirs that a ``--resume`` continues;
    ``interrupted``: a stop (or a compiler a Ctrl-C killed) left them so, rather than a
    failure."""

    unfinished: tuple[Path, ...]
    interrupted: bool
    failed: bool

    @classmethod
    def of(cls, stop: GracefulStop, states: Sequence[tuple[str, Path]]) -> Ending:
        """From each unit's (state, rundir): a stop that came after every unit had ended
        stopped nothing."""
        unfinished = tuple(path for state, path in states if state != "finished")
        stopped = stop.is_set() or any(state == "interrupted" for state, _ in states)
        return cls(unfinished, bool(unfinished) and stopped,
                   any(state == "failed" for state, _ in states))

    @property
    def exit_status(self) -> int:
        return INTERRUPTED if self.interrupted else FAILED if self.failed else 0

    def resume_line(self, command: str, config_path: Path | None) -> str:
        """``interrupted; to continue: <command> [--config C] --resume R ...`` (nothing to
        continue: ``interrupted before any work started``)."""
        if not self.unfinished:
            return "interrupted before any work started"
        again = " ".join(f"--resume {shlex.quote(str(p))}" for p in self.unfinished)
        conf = f"--config {shlex.quote(str(config_path))} " if config_path else ""
        return f"interrupted; to continue: {command} {conf}{again}"


# --------------------------------------------------------------------------- status lines

@dataclass(frozen=True)
class StatusLine:
    """A unit of work's status as a log line.  ``key``: what changing is worth a new line (None:
    nothing to say yet); ``repeat``: said again every PLAIN_EVERY_S while unchanged."""

    key: tuple | None
    text: str
    repeat: bool = True


def watch(alive: Callable[[], bool], lines: Callable[[], list[StatusLine]],
          live: Callable[[], list[str]] | None = None) -> None:
    """Show the work's status until ``alive`` says it has ended, then once more: ``live``'s
    lines redrawn in place on a terminal when given, else ``lines`` as log lines."""
    if live is not None and sys.stderr.isatty():
        _watch_live(alive, live)
    else:
        _watch_plain(alive, lines)


def _watch_plain(alive: Callable[[], bool], lines: Callable[[], list[StatusLine]]) -> None:
    shown: dict[int, tuple | None] = {}
    last: dict[int, float] = {}
    while True:
        running = alive()
        now = time.monotonic()
        for i, line in enumerate(lines()):
            if line.key is None:
                continue
            due = line.repeat and now - last.get(i, now) >= PLAIN_EVERY_S
            if shown.get(i) != line.key or due:
                shown[i], last[i] = line.key, now
                progress(line.text)
        if not running:
            return
        time.sleep(POLL_S)


def _watch_live(alive: Callable[[], bool], live: Callable[[], list[str]]) -> None:
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    def render() -> Text:
        return Text("\n".join(live()))

    with Live(render(), refresh_per_second=2, transient=False, redirect_stderr=False,
              console=Console(file=sys.stderr)) as shown:
        while alive():
            time.sleep(POLL_S)
            shown.update(render())
        shown.update(render())
    sys.stderr.write("\n")
