"""The measurement service: run jobs for the search, beside the compile service.

It owns the path from "measure this binary" to stored run results: the store's measurements
(a binary already measured on a worker class is not run again unless asked), sharing of run
jobs in flight (the K chains' common baseline is run once), the scheduler, and the worker
class: every job of a request runs on slots of the class it names, so a baseline and its
candidates are timed on the same kind of machine and cached under that class.

Results of the jobs it submits are stored as soon as they arrive, whoever waits for them.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable

from dispatcher.records import RunResult
from dispatcher.scheduler import Scheduler
from dispatcher.store import Store, measurement_key
from dispatcher.worker import RunJob


@dataclass(frozen=True)
class Measured:
    """The results of one request; ``reused``: from the store or another request's job
    rather than measured for this one."""

    results: list[RunResult]
    reused: bool

    @property
    def times(self) -> list[float]:
        return [t for r in self.results for t in r.times]

    @property
    def failed(self) -> int:
        return sum(r.failed for r in self.results)


@dataclass(frozen=True)
class Pending:
    """A request in progress: a stored result, or a future of a job (own or shared)."""

    stored: list[RunResult] | None
    future: Future | None
    shared: bool


class MeasurementService:
    def __init__(self, scheduler: Scheduler, store: Store):
        self.scheduler = scheduler
        self.store = store
        self._lock = threading.Lock()
        # Jobs in flight by measurement key: (runs, future).
        self._running: dict[str, tuple[int, Future]] = {}

    def submit(self, job: RunJob, worker_class: str, reuse: bool = True) -> Pending:
        """Measure ``job`` on a slot of ``worker_class``.  With ``reuse``, a stored
        measurement with at least ``job.runs`` runs, or a job in flight for the same binary
        and arguments with at least as many, answers instead."""
        if reuse:
            known = [r for r in self.store.job_measurements(job, worker_class)
                     if len(r.records) >= job.runs]
            if known:
                return Pending(stored=known[:1], future=None, shared=True)
        mkey = measurement_key(job, worker_class)
        with self._lock:
            running = self._running.get(mkey)
            if reuse and running is not None and running[0] >= job.runs and not (
                    running[1].done() and running[1].exception() is not None):
                return Pending(stored=None, future=running[1], shared=True)
            future: Future = Future()
            future.set_running_or_notify_cancel()
            if reuse:
                self._running[mkey] = (job.runs, future)
        try:
            job_future = self.scheduler.submit(job, worker_class=worker_class)
        except BaseException as exc:  # closed, or no slot of this class
            with self._lock:
                if self._running.get(mkey, (0, None))[1] is future:
                    del self._running[mkey]
            future.set_exception(exc)
            raise
        job_future.add_done_callback(lambda f: self._finished(mkey, f, future, job))
        return Pending(stored=None, future=future, shared=False)

    def _finished(self, mkey: str, job: Future, future: Future, request: RunJob) -> None:
        """Store a job's result as it arrives (an interrupted chain loses nothing), then
        resolve the request's future: whoever sees the result finds it in the store."""
        try:
            exc = job.exception()
            if exc is None:
                self.store.add_measurement(job.result(), request)
        except BaseException as store_exc:  # e.g. a full disk: the waiter hears of it
            exc = store_exc
        with self._lock:
            running = self._running.get(mkey)
            if running is not None and running[1] is future:
                del self._running[mkey]
        if exc is None:
            future.set_result(job.result())
        else:
            future.set_exception(exc)

    @staticmethod
    def wait(pending: Pending, wait: Callable[[Future], RunResult] = Future.result) -> Measured:
        """The results of a request; ``wait`` waits for a future (the caller's, so it can
        give up on Ctrl-C)."""
        if pending.stored is not None:
            return Measured(pending.stored, reused=True)
        assert pending.future is not None
        return Measured([wait(pending.future)], reused=pending.shared)

    def measure(self, job: RunJob, worker_class: str, reuse: bool = True) -> Measured:
        return self.wait(self.submit(job, worker_class, reuse))
