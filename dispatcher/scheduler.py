"""The scheduler: hands run jobs to free worker slots and returns futures.

One thread per slot takes the next job meant for it, or else the oldest job meant for any
slot, so a slot never idles while work is queued.  Backends differ only in the slots they
provide; the search code sees ``submit`` and futures.
"""
from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Future
from typing import Sequence

from dispatcher.worker import RunJob, RunResult, Slot


class Scheduler:
    def __init__(self, slots: Sequence[Slot]):
        if not slots:
            raise ValueError("no worker slots")
        self.slots = list(slots)
        self._cond = threading.Condition()
        self._shared: collections.deque = collections.deque()
        self._pinned = {slot.name: collections.deque() for slot in self.slots}
        self._closing = False
        self.busy_s = {slot.name: 0.0 for slot in self.slots}  # time spent running jobs
        self._threads = [threading.Thread(target=self._serve, args=(slot,), daemon=True,
                                          name=f"slot {slot.name}") for slot in self.slots]
        for t in self._threads:
            t.start()

    def submit(self, job: RunJob, slot: str | None = None) -> "Future[RunResult]":
        """Queue a job for any free slot, or for the named slot."""
        future: Future = Future()
        with self._cond:
            if self._closing:
                raise RuntimeError("scheduler is closed")
            if slot is None:
                self._shared.append((job, future))
            elif slot in self._pinned:
                self._pinned[slot].append((job, future))
            else:
                raise KeyError(f"no slot named {slot}")
            self._cond.notify_all()
        return future

    def _next(self, name: str):
        with self._cond:
            while True:
                if self._pinned[name]:
                    return self._pinned[name].popleft()
                if self._shared:
                    return self._shared.popleft()
                if self._closing:
                    return None
                self._cond.wait()

    def _serve(self, slot: Slot) -> None:
        while (item := self._next(slot.name)) is not None:
            job, future = item
            if not future.set_running_or_notify_cancel():
                continue
            t0 = time.monotonic()
            try:
                result = slot.run(job)
            except BaseException as exc:  # reported through the future, never lost
                future.set_exception(exc)
            else:
                future.set_result(result)
            finally:
                self.busy_s[slot.name] += time.monotonic() - t0

    def close(self) -> None:
        """Finish queued jobs, stop the slot threads and close the slots."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        for t in self._threads:
            t.join()
        for slot in self.slots:
            slot.close()

    def __enter__(self) -> "Scheduler":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
