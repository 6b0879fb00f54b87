"""The run deadline: one long-lived thread that SIGKILLs the armed process group.

Why a thread and not a timeout on the wait: the agent waits with ``waitid`` (to keep the
zombie, and so its process-group id, until strays are killed), which takes no timeout.
"""
from __future__ import annotations

import threading
import time

from .proc import killpg_quietly


class Watchdog:
    """Arming and disarming do not wake the thread unless the new deadline comes before the
    end of its current wait: with runs of similar timeouts it wakes about once per timeout,
    not twice per run (each wake-up is a context switch and a GIL hand-over on the agent's
    CPU)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._target: tuple[int, float] | None = None  # (pgid, deadline)
        self._fired = False
        self._wake_at: float | None = None  # when the current wait ends (None: at a notify)
        self.thread = threading.Thread(target=self._loop, name="agent-watchdog", daemon=True)
        self.thread.start()

    def arm(self, pgid: int, timeout: float) -> None:
        with self._cond:
            deadline = time.monotonic() + timeout
            self._target = (pgid, deadline)
            self._fired = False
            if self._wake_at is None or deadline < self._wake_at:
                self._cond.notify()

    def disarm(self) -> bool:
        """Stop watching; -> whether it fired.  Once this returns it cannot fire."""
        with self._cond:
            self._target = None  # the thread finds nothing to do when it next wakes
            return self._fired

    def _loop(self) -> None:
        with self._cond:
            while True:
                if self._target is None:
                    self._wake_at = None
                    self._cond.wait()
                    continue
                pgid, deadline = self._target
                remaining = deadline - time.monotonic()
                if remaining > 0:
                    self._wake_at = deadline
                    self._cond.wait(remaining)
                    continue
                self._fired = True
                self._target = None
                killpg_quietly(pgid)
