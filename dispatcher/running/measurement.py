"""The measurement service: run jobs for the search, beside the compile service.

It owns the path from "measure this binary" to run results: the store's measurements (a
binary already measured on a worker class is not run again unless asked), sharing of run jobs
in flight (the K chains' common baseline is run once), the scheduler, and the worker class:
every job of a request runs on slots of the class it names, so a baseline and its candidates
are timed on the same kind of machine and cached under that class.  Results of the jobs it
submits are stored as soon as they arrive, whoever waits for them.

A speedup is measured as a *comparison* (``compare``): the candidate and its reference run in
alternation on one worker CPU, in rounds of reference, candidate, candidate, reference (ABBA:
a linear drift within a round biases neither side), one run per job, until the paired
interval of the speedup is as narrow as asked, the run budget is spent, or the candidate is
clearly worse than a bar it had to beat.  Pairs never mix slots: when the scheduler moves a
job to another slot (a lost worker), that round's pairs are dropped (their runs are kept in
the results) and the comparison goes on where the job went.

A comparison takes its slot when it starts, not when it is asked for: the first free slot
of its class (one comparison per slot at a time), in the order comparisons were asked for.
So a candidate compiled ahead (an asynchronous chain keeps one) waits for whichever slot
frees first instead of queueing behind a busy one while another idles.
"""
from __future__ import annotations

import collections
import hashlib
import json
import logging
import statistics
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from dispatcher.core.comparison import Comparison
from dispatcher.core.cycles import metric_value
from dispatcher.core.files import write_text_atomic
from dispatcher.core.jobs import RunJob
from dispatcher.core.records import RunResult
from dispatcher.core.stats import paired_speedup_ci, relative_half_width
from dispatcher.running.agent_client import AgentError
from dispatcher.running.exact import IDENTITY, exact_job
from dispatcher.running.scheduler import Scheduler
from dispatcher.storage.store import Store, measurement_key


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


@dataclass(frozen=True)
class PairingPolicy:
    """When a comparison stops: at ``half_width`` (relative: 0.01 is +-1%) once it has
    ``min_pairs``, at ``max_pairs`` regardless, or, with ``must_beat`` set, once the interval
    lies wholly below that speedup (the candidate cannot be the better one)."""

    min_pairs: int = 5
    max_pairs: int = 20
    half_width: float = 0.01
    must_beat: float | None = None

    @classmethod
    def between(cls, fewest: int, most: int, half_width: float,
                must_beat: float | None = None) -> PairingPolicy:
        """At least ``fewest`` pairs and at most ``most``, a budget below the fewest being
        raised to it (``--runs`` above ``measure.max_pairs``): the one place of that rule."""
        return cls(min_pairs=fewest, max_pairs=max(most, fewest), half_width=half_width,
                   must_beat=must_beat)


def comparison_key(reference: RunJob, candidate: RunJob, worker_class: str,
                   policy: PairingPolicy, trial: str | None = None,
                   metric: str = "time") -> str:
    """Everything a comparison's outcome depends on (and which trial it is, if named)."""
    data = {"reference": reference.measurement_identity(),
            "candidate": candidate.measurement_identity(), "worker_class": worker_class,
            "policy": asdict(policy)}
    if trial is not None:  # absent otherwise: the keys of stored comparisons stay valid
        data["trial"] = trial
    if metric != "time":  # likewise
        data["metric"] = metric
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


class ReferenceFailed(RuntimeError):
    """The reference binary (the baseline) failed a run: nothing can be compared with it."""


log = logging.getLogger(__name__)

# Exact comparisons: of the binaries counted anew, the first and every this many-th after it
# are counted twice; counts that differ make that comparison fall back to time (and so does
# every later one of that binary: both counts stay in the store).
DETERMINISM_EVERY = 10


class NotDeterministic(RuntimeError):
    """Two exact runs of one binary counted differently: its counts are no figure."""


@dataclass
class _Pairs:
    reference: list[float] = field(default_factory=list)
    candidate: list[float] = field(default_factory=list)
    results: list[RunResult] = field(default_factory=list)
    failed: int = 0
    dropped: int = 0


# Every timed run is judged by its CPU share (CPU time / wall time), twice (docs/measurement.md,
# "Disturbed runs"):
# - against an absolute floor, always: below it something else had the CPU for a fifth of the
#   run or more, whatever the binary.  This is what catches a load present from the start,
#   which a relative check takes as the binary's own level.  ``measure.min_cpu_share``;
# - against the binary's own quiet share on that slot, once it has SHARE_HISTORY undisturbed
#   runs there (the service keeps them across comparisons): more than SHARE_MARGIN below its
#   median, the CPU was taken from it (a binary's quiet share depends on it: kahan's sit at
#   0.94-0.96 on a 2-CPU VM, one that waits on I/O lower).
DEFAULT_MIN_CPU_SHARE = 0.80
SHARE_MARGIN = 0.05
SHARE_HISTORY = 3  # undisturbed runs of the binary on the slot needed before it is judged
QUIET_KEPT = 50  # the most recent undisturbed shares kept per binary and slot


def judge_shares(shares: dict[str, list[float]], result: RunResult,
                 floor: float = 0.0, learn: bool = True,
                 margin: float = SHARE_MARGIN) -> RunResult:
    """``result`` with its runs marked disturbed where their CPU share is below ``floor`` or
    clearly below their binary's own quiet share (``shares``, by binary, updated with the
    undisturbed ones unless ``learn`` is false: a stored result read again)."""
    seen = shares.setdefault(result.sha256, [])
    records = []
    for rec in result.records:
        share = rec.cpu_share
        if rec.usable and share is not None and rec.profile is None and rec.counts is None:
            if share < floor:
                rec = rec.model_copy(update={"disturbed": (
                    f"CPU share {share:.2f}, below the floor {floor:.2f}")})
            elif len(seen) >= SHARE_HISTORY:
                typical = statistics.median(seen)
                if share < typical - margin:
                    rec = rec.model_copy(update={"disturbed": (
                        f"CPU share {share:.2f}, below this binary's {typical:.2f} on this "
                        "CPU")})
            if rec.usable and learn:
                seen.append(share)
                del seen[:-QUIET_KEPT]
        records.append(rec)
    if all(a is b for a, b in zip(records, result.records)):
        return result
    return result.model_copy(update={"records": tuple(records)})


class ShareJudge:
    """The service's judge of CPU shares: the floor, and each binary's quiet shares per slot,
    kept across comparisons and run jobs (thread-safe: comparisons run in threads)."""

    def __init__(self, floor: float = DEFAULT_MIN_CPU_SHARE, margin: float = SHARE_MARGIN):
        if not 0.0 <= floor < 1.0:
            raise ValueError(f"a CPU share floor must lie in [0, 1), got {floor!r}")
        self.floor, self.margin = floor, margin
        self._lock = threading.Lock()
        self._quiet: dict[str, dict[str, list[float]]] = {}  # slot -> binary -> shares

    def __call__(self, result: RunResult, learn: bool = True) -> RunResult:
        with self._lock:
            shares = self._quiet.setdefault(result.worker, {})
            return judge_shares(shares, result, self.floor, learn, self.margin)

    def stored(self, result: RunResult) -> RunResult:
        """A stored result judged again, against the floor only: what this process happens to
        have measured (its quiet history) must not decide whether a stored result is reused,
        or a resumed chain would measure again what the uninterrupted one reused, and the two
        would part ways (the kill/resume replay test)."""
        return judge_shares({}, result, self.floor, learn=False)

    def quiet(self, sha256: str, worker: str) -> float | None:
        """The binary's median quiet share on ``worker`` (None: not known yet)."""
        with self._lock:
            seen = self._quiet.get(worker, {}).get(sha256, [])
            return statistics.median(seen) if len(seen) >= SHARE_HISTORY else None


class MeasurementService:
    def __init__(self, scheduler: Scheduler, store: Store,
                 min_cpu_share: float = DEFAULT_MIN_CPU_SHARE,
                 share_margin: float = SHARE_MARGIN, exact_identity: str = IDENTITY):
        self.scheduler = scheduler
        self.store = store
        # What exact counts here depend on (the tool, its geometry, the workers' valgrind:
        # ``check_workers``): part of every exact measurement's key.
        self.exact_identity = exact_identity
        # Every run it hands out is judged by its CPU share (the floor, the binary's quiet
        # share on its slot), stored ones again when read: a run below is never used.
        self.judge = ShareJudge(min_cpu_share, share_margin)
        self._lock = threading.Lock()
        # Jobs in flight by measurement key: (runs, future).
        self._running: dict[str, tuple[int, Future]] = {}
        # Comparisons run in threads of their own (each waits on its rounds' jobs), so a
        # chain's candidates are compared at once on different slots.
        self._comparisons = ThreadPoolExecutor(max(4, 2 * len(scheduler.slots)),
                                               thread_name_prefix="compare")
        self._comparing: dict[str, Future[Comparison]] = {}  # in flight, by comparison key
        # Slots taken by running comparisons (how many each), comparisons waiting for one (in
        # the order they asked, by class), and where the next search for a free slot begins
        # (so ties spread over the slots).
        self._slot_free = threading.Condition(self._lock)
        self._active: dict[str, int] = {}
        self._waiting: dict[str, collections.deque[object]] = {}
        self._turn: dict[str, int] = {}
        self._closed = False
        self._exact_counted = 0  # binaries counted anew (the determinism sample's clock)

    def submit(self, job: RunJob, worker_class: str, reuse: bool = True) -> Pending:
        """Measure ``job`` on a slot of ``worker_class``.  With ``reuse``, a stored result of
        the same job (``RunJob.measurement_identity``) with at least ``job.runs`` runs, or such
        a job in flight with at least as many, answers instead (it may hold more runs)."""
        if reuse:
            known = [self.judge.stored(r)
                     for r in self.store.job_measurements(job, worker_class)
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
        try:  # an exact job on any slot of any class (counts are the same everywhere)
            job_future = self.scheduler.submit(
                job, worker_class=None if job.exact else worker_class)
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
        judged = None
        try:
            exc = job.exception()
            if exc is None:
                judged = self.judge(job.result())
                self.store.add_measurement(judged, request)
        except BaseException as store_exc:  # e.g. a full disk: the waiter hears of it
            exc = store_exc
        with self._lock:
            running = self._running.get(mkey)
            if running is not None and running[1] is future:
                del self._running[mkey]
        if exc is None:
            future.set_result(judged)
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

    # ------------------------------------------------------------------ comparisons

    def compare(self, reference: RunJob, candidate: RunJob, worker_class: str,
                policy: PairingPolicy, reuse: bool = True,
                trial: str | None = None, metric: str = "time") -> Future[Comparison]:
        """Measure ``candidate`` against ``reference`` in pairs on one slot of
        ``worker_class`` (the jobs' ``runs`` are ignored: the policy decides).  A comparison
        of the same jobs, class and policy is answered from the store, or shared while it is
        in flight: identical binaries are compared once (``reuse=False``: measured anew, as
        A/A trials must be).  ``trial`` names a repetition meant to be measured apart (the
        search's re-measurement at step N): other trials do not answer it, the same trial
        does (a resumed chain redoing that step).

        ``metric`` exact (``instructions``, ``cycles``): one cachegrind run of each binary
        instead of pairs, on any slot of the class (``_compare_exact``); the store answers
        from the runs it holds, not from a stored comparison."""
        key = comparison_key(reference, candidate, worker_class, policy, trial, metric)
        with self._lock:
            running = self._comparing.get(key) if reuse else None
            if running is not None and not (running.done() and running.exception()):
                return running
            exact: Future[Comparison] = Future()
            if metric != "time":
                self._class_slots(worker_class)
                exact.set_running_or_notify_cancel()
                self._comparing[key] = exact
            else:
                stored = self._stored(key, policy) if reuse else None
                if stored is not None:
                    done: Future[Comparison] = Future()
                    done.set_result(stored)
                    return done
                self._class_slots(worker_class)  # none of the class: KeyError, here and now
                # Its place in the line for a slot is taken now, in the order comparisons
                # are asked for (not when a pool thread happens to start it).
                ticket = object()
                self._waiting.setdefault(worker_class, collections.deque()).append(ticket)
                future = self._comparisons.submit(self._compare_and_store, key, reference,
                                                  candidate, worker_class, ticket, policy)
                self._comparing[key] = future
        if metric != "time":  # (its jobs submitted outside the lock: they take it)
            self._compare_exact(exact, key, reference, candidate, worker_class, policy, reuse,
                                trial, metric)
            return exact
        # A comparison cancelled before it started must not hold its place (outside the
        # lock: the callback takes it, and runs here if the future is done already).
        future.add_done_callback(lambda _f: self._leave_line(worker_class, ticket))
        return future

    def _compare_exact(self, future: Future[Comparison], key: str, reference: RunJob,
                       candidate: RunJob, worker_class: str, policy: PairingPolicy,
                       reuse: bool, trial: str | None, metric: str) -> None:
        """One exact run of each binary (both at once, on any slots of the class), the
        figure the ratio of their ``metric_value``, into ``future``; a binary found not
        deterministic makes it a timed comparison (one warning line).  No thread waits for
        the counts: the last of the two jobs to land finishes the comparison (on the thread
        that resolved it), so comparisons in flight cost no thread each."""
        try:
            asked = [self._exact_submit(exact_job(job, self.exact_identity), worker_class, reuse)
                     for job in (reference, candidate)]
        except BaseException as exc:
            self._exact_end(key, future, exc)
            return
        pending = [a.future for a in asked if isinstance(a, Pending) and a.future is not None]
        left = [len(pending)]

        def landed(_job: Future) -> None:
            with self._lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                self._exact_finish(future, key, asked, reference, candidate, worker_class,
                                   policy, reuse, trial, metric)

        if not pending:
            self._exact_finish(future, key, asked, reference, candidate, worker_class, policy,
                               reuse, trial, metric)
        for job in pending:
            job.add_done_callback(landed)

    def _exact_finish(self, future: Future[Comparison], key: str,
                      asked: list[list[RunResult] | Pending], reference: RunJob,
                      candidate: RunJob, worker_class: str, policy: PairingPolicy,
                      reuse: bool, trial: str | None, metric: str) -> None:
        """Both counts are in: the comparison."""
        try:
            (ref, ref_reused), (cand, cand_reused) = [self._exact_wait(a) for a in asked]
            try:
                ref_value = self._exact_value(ref, metric, reference=True)
                cand_value = self._exact_value(cand, metric, reference=False)
            except NotDeterministic as exc:
                log.warning("%s; this comparison falls back to time", exc)
                timed = self._comparisons.submit(self._timed_fallback, reference, candidate,
                                                 worker_class, policy, reuse, trial)
                timed.add_done_callback(lambda f: self._exact_end(
                    key, future, f.exception() or f.result()))
                return
            results = [*ref, *cand]
            if cand_value is None:  # the candidate's run failed
                compared = Comparison(worker=cand[-1].worker, reference_times=[],
                                      candidate_times=[], results=results, stopped="failed",
                                      failed=sum(r.failed for r in cand), metric=metric)
            else:
                assert ref_value is not None
                compared = Comparison(worker=cand[-1].worker, reference_times=[ref_value],
                                      candidate_times=[cand_value], results=results,
                                      stopped="exact", min_pairs=1, metric=metric,
                                      reused=ref_reused and cand_reused)
        except BaseException as exc:
            self._exact_end(key, future, exc)
        else:
            self._exact_end(key, future, compared)

    def _exact_end(self, key: str, future: Future[Comparison],
                   outcome: Comparison | BaseException) -> None:
        with self._lock:
            if self._comparing.get(key) is future:
                del self._comparing[key]
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    def _exact_submit(self, job: RunJob, worker_class: str,
                      reuse: bool) -> list[RunResult] | Pending:
        """The stored results of an exact job (every one that succeeded: all are checked for
        agreement; the latest failed: counted again), or its request: counted twice for the
        first binary and every ``DETERMINISM_EVERY``-th counted anew."""
        stored = self.store.job_measurements(job, worker_class) if reuse else []
        if stored and not stored[-1].failed:  # a failed count is counted again (a timeout)
            return [r for r in stored if not r.failed]
        with self._lock:
            counted = self._exact_counted
            self._exact_counted += 1
        runs = 2 if counted % DETERMINISM_EVERY == 0 else 1
        return self.submit(replace(job, runs=runs), worker_class, reuse and not stored)

    def _exact_wait(self, asked: list[RunResult] | Pending) -> tuple[list[RunResult], bool]:
        if isinstance(asked, list):
            return asked, True
        measured = self.wait(asked)
        return measured.results, measured.reused

    @staticmethod
    def _exact_value(results: list[RunResult], metric: str, reference: bool) -> float | None:
        """The figure of one binary's exact runs; None if the candidate failed;
        ReferenceFailed if the reference did, NotDeterministic if two runs counted
        differently, AgentError for runs without counts (a worker that does not count)."""
        records = [rec for r in results for rec in r.records]
        failed = next((rec.failure for rec in records if rec.failure), None)
        if failed is not None:
            if reference:
                raise ReferenceFailed(f"the reference {results[0].sha256[:12]} failed on "
                                      f"{results[0].worker}: {failed}")
            return None
        counts = [rec.counts for rec in records]
        if not counts or any(c is None for c in counts):
            raise AgentError(f"{results[0].worker}: an exact run came back without counts")
        if any(c != counts[0] for c in counts[1:]):
            differ = sorted(e for e in counts[0] if any(c.get(e) != counts[0][e]  # type: ignore
                                                         for c in counts[1:]))
            raise NotDeterministic(
                f"exact runs of {results[0].sha256[:12]} counted differently "
                f"({', '.join(differ) or 'events'}): it is not deterministic")
        return metric_value(metric, counts[0])  # type: ignore[arg-type]

    def _timed_fallback(self, reference: RunJob, candidate: RunJob, worker_class: str,
                        policy: PairingPolicy, reuse: bool, trial: str | None) -> Comparison:
        """The comparison in wall time, in this thread, stored as every timed one is."""
        key = comparison_key(reference, candidate, worker_class, policy, trial)
        stored = self._stored(key, policy) if reuse else None
        if stored is not None:
            return stored
        ticket = object()
        with self._lock:
            self._waiting.setdefault(worker_class, collections.deque()).append(ticket)
        try:
            return self._compare_and_store(key, reference, candidate, worker_class, ticket,
                                           policy)
        finally:
            self._leave_line(worker_class, ticket)

    def _path(self, key: str) -> Path:
        return self.store.root / "comparisons" / key[:2] / f"{key}.json"

    def _stored(self, key: str, policy: PairingPolicy) -> Comparison | None:
        """The stored comparison of ``key`` if it can still be trusted, else None (measured
        again): absent or damaged; unresolved (the CPU may be quiet now); a pair count
        outside the policy's bounds (stored before they were kept exactly); or a run it used
        below the floor (stored before the floor, or with a lower one)."""
        try:
            stored = Comparison.from_json(json.loads(self._path(key).read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not stored.resolved or stored.pairs > policy.max_pairs or (
                stored.pairs < policy.min_pairs and stored.stopped != "failed"):
            return None
        if any(self.judge.stored(r) is not r for r in stored.results):
            return None
        return replace(stored, min_pairs=policy.min_pairs, reused=True)

    def _compare_and_store(self, key: str, reference: RunJob, candidate: RunJob,
                           worker_class: str, ticket: object,
                           policy: PairingPolicy) -> Comparison:
        try:
            slot = self._take_slot(worker_class, ticket)
            try:
                compared = self._compare(reference, candidate, slot, policy)
            finally:
                self._give_slot(slot)
            write_text_atomic(self._path(key), compared.text())
            return compared
        finally:
            with self._lock:
                self._comparing.pop(key, None)

    def _class_slots(self, worker_class: str) -> list[str]:
        names = [s.name for s in self.scheduler.slots if s.worker_class == worker_class]
        if not names:
            raise KeyError(f"no worker slot of class {worker_class!r}")
        return names

    def _take_slot(self, worker_class: str, ticket: object) -> str:
        """The slot this comparison runs on: the first of its class with no comparison
        running, taken in the order comparisons were asked for (``ticket``: its place in that
        line); while none is free, it waits.  Slots out of service or backing off after a
        loss are passed over while others are in service (if none is, it takes one anyway:
        the scheduler moves or fails its jobs).  Once the service is closed, nothing waits."""
        names = self._class_slots(worker_class)
        with self._slot_free:
            line = self._waiting[worker_class]
            try:
                while True:
                    # Only the head of the line looks at the slots: every release wakes
                    # every waiter, and with hundreds waiting a scan by each of them kept
                    # the slots free while the line moved (bench/search_sim, 1,000 slots).
                    if self._closed or (line and line[0] is ticket):
                        lost = set(getattr(self.scheduler, "quarantined", ())) | set(
                            getattr(self.scheduler, "down", ()))
                        usable = {n for n in names if n not in lost} or set(names)
                        start = self._turn.get(worker_class, 0) % len(names)
                        ordered = [n for n in names[start:] + names[:start] if n in usable]
                        free = [n for n in ordered if not self._active.get(n)]
                        if self._closed or free:
                            slot = free[0] if free else min(
                                ordered, key=lambda n: self._active.get(n, 0))
                            self._turn[worker_class] = names.index(slot) + 1
                            self._active[slot] = self._active.get(slot, 0) + 1
                            return slot
                    # a slot lost or back in service changes nothing here: look again soon
                    self._slot_free.wait(0.5)
            finally:
                if ticket in line:
                    line.remove(ticket)
                self._slot_free.notify_all()  # the next in line may take a free slot too

    def _leave_line(self, worker_class: str, ticket: object) -> None:
        with self._slot_free:
            line = self._waiting.get(worker_class)
            if line is not None and ticket in line:
                line.remove(ticket)
                self._slot_free.notify_all()

    def _give_slot(self, slot: str) -> None:
        with self._slot_free:
            self._active[slot] -= 1
            self._slot_free.notify_all()

    def _compare(self, reference: RunJob, candidate: RunJob, slot: str,
                 policy: PairingPolicy) -> Comparison:
        """ABBA rounds until the policy stops it.  Exactly ``max_pairs`` at most: when one pair
        is missing a half round (AB) is run.  Disturbed runs lose their pair and another round
        is run, up to ``max_pairs`` rounds in all (twice what a full budget needs); when the
        minimum can no longer be reached in them, it stops as ``unresolved``."""
        ref, cand = replace(reference, runs=1), replace(candidate, runs=1)
        got = _Pairs()
        stopped = "budget"
        rounds = 0
        most_rounds = max(policy.max_pairs, 1)
        while len(got.candidate) < policy.max_pairs:
            if rounds >= most_rounds or \
                    len(got.candidate) + 2 * (most_rounds - rounds) < policy.min_pairs:
                break  # the minimum is out of reach: unresolved, below
            rounds += 1
            order = [ref, cand, cand, ref]  # ABBA
            if policy.max_pairs - len(got.candidate) == 1:
                order = [ref, cand]  # the last pair of the budget: half a round
            futures = [self.scheduler.submit(job, slot=slot) for job in order]
            results = [self.judge(f.result()) for f in futures]
            got.results.extend(results)
            slot = self._round(got, results, slot, policy.max_pairs)
            if got.failed:
                stopped = "failed"
                break
            if len(got.candidate) >= policy.min_pairs:
                speedup, low, high = paired_speedup_ci(got.reference, got.candidate)
                if relative_half_width(speedup, low, high) <= policy.half_width:
                    stopped = "target"
                    break
                if policy.must_beat is not None and high is not None \
                        and high < policy.must_beat:
                    stopped = "worse"
                    break
        if stopped != "failed" and len(got.candidate) < policy.min_pairs:
            stopped = "unresolved"
        return Comparison(worker=slot, reference_times=got.reference,
                          candidate_times=got.candidate, results=got.results,
                          stopped=stopped, failed=got.failed, dropped=got.dropped,
                          min_pairs=policy.min_pairs)

    @staticmethod
    def _round(got: _Pairs, results: list[RunResult], slot: str, most: int) -> str:
        """Add one round's pairs (ABBA, or AB for half a round), never beyond ``most``; the
        slot the next round goes to."""
        r1, c1 = results[0], results[1]
        pairs = [(r1, c1)] + ([(results[3], results[2])] if len(results) == 4 else [])
        for r in [r for r, _ in pairs]:
            if r.failed:
                failure = next(rec.failure for rec in r.records if rec.failure)
                raise ReferenceFailed(f"the reference {r.sha256[:12]} failed on {r.worker}: "
                                      f"{failure}")
        got.failed += sum(c.failed for _, c in pairs)
        if got.failed:
            return slot
        workers = {r.worker for r in results}
        if workers != {slot}:  # moved by the scheduler: these runs are not pairs
            got.dropped += len(pairs)
            return results[-1].worker
        for r, c in pairs:
            if r.times and c.times and len(got.candidate) < most:
                got.reference.append(r.times[0])
                got.candidate.append(c.times[0])
            else:  # a run without a usable time (disturbed, say): no pair
                got.dropped += 1
        return slot

    def close(self) -> None:
        with self._slot_free:  # comparisons waiting for a slot go on (and fail: closed)
            self._closed = True
            self._slot_free.notify_all()
        self._comparisons.shutdown(wait=False, cancel_futures=True)
