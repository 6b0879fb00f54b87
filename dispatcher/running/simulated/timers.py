"""When simulated jobs answer: one thread for every slot of a simulated backend.

A simulated slot draws a job's outcome when it starts (``SimulatedSlot.start``) and asks for
it to be answered once the job's modelled time has passed on that slot; this thread keeps
those answers in order of their time and gives each at its time.  So a thousand slots cost
one thread, as the slots of a real cluster cost the master none.
"""
from __future__ import annotations

import heapq
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(order=True)
class _Due:
    at: float  # time.monotonic()
    seq: int
    owner: object = field(compare=False)
    answer: Callable[[Any], None] = field(compare=False)
    outcome: Any = field(compare=False)
    done: bool = field(default=False, compare=False)


class Timers:
    """Answers given at their times, on one thread (started on first use)."""

    def __init__(self, name: str = "slot answers (simulated)"):
        self._name = name
        self._cond = threading.Condition()
        self._heap: list[_Due] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def at(self, when: float, owner: object, answer: Callable[[Any], None],
           outcome: Any) -> None:
        """Call ``answer(outcome)`` at ``when`` (``time.monotonic()``), for ``owner`` (whose
        ``flush`` answers it early)."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name=self._name)
                self._thread.start()
            due = _Due(when, next(self._seq), owner, answer, outcome)
            heapq.heappush(self._heap, due)
            if self._heap[0] is due:  # the thread waits for a later one: wake it
                self._cond.notify()

    def flush(self, owner: object, outcome: Any) -> None:
        """Answer every pending answer of ``owner`` now, with ``outcome`` instead of its own
        (a slot closed under its jobs), on the calling thread."""
        with self._cond:
            mine = [d for d in self._heap if d.owner is owner and not d.done]
            for d in mine:
                d.done = True
        for d in mine:
            d.answer(outcome)

    def stop(self) -> None:
        """The thread ends once no answer is pending."""
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._heap and self._heap[0].done:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        if self._stopped:
                            self._thread = None
                            return
                        self._cond.wait()
                        continue
                    wait = self._heap[0].at - time.monotonic()
                    if wait <= 0:
                        break
                    self._cond.wait(wait)
                due = []
                now = time.monotonic()
                while self._heap and self._heap[0].at <= now:
                    d = heapq.heappop(self._heap)
                    if not d.done:
                        d.done = True
                        due.append(d)
            for d in due:  # outside the lock: an answer starts the slot's next job
                d.answer(d.outcome)
