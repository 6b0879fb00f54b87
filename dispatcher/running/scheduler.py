"""The scheduler: hands run jobs to free worker slots and returns futures.

``Slot.run`` blocks, so each slot has one thread per job it may hold at once (its ``depth``):
a *runner*.  A slot that answers by itself (``AnsweringSlot``: Ray actors, simulated CPUs)
gets runners without threads instead: a job handed to one is started on its slot, and the
slot's answer (on its backend's thread) ends the job and starts the runner's next one, so the
scheduler's threads do not grow with the slots (a thread lives only while a lost slot backs
off and is probed).

Which runner takes which job is decided by a ``JobBoard``, which has no threads: a runner
that finishes a job takes the next one meant for its slot, or else the oldest one meant for
any slot of its class (or for any slot); a job submitted while runners wait is handed to
one of them (of the slot with the fewest jobs), and only that runner is woken.
So a slot never idles while work is queued for it, and no submit wakes more than one thread
(``bench/scheduler_core``, instant runs, 2 CPUs: 1,000 slots of depth 2 took 75 jobs/s when
every submit woke every thread, as this module did before, and take 17,800 now).  Backends
differ only in the slots they provide; the search code sees ``submit`` and futures.

When a slot loses its worker (``WorkerLost``: a broken connection, a dead agent, a host gone
quiet) the job goes back to the front of the queue for another slot, up to
``attempts`` times; the slot pauses with exponential back-off and probes its worker before it
takes work again; after ``quarantine_after`` losses in a row (or one loss that retrying cannot
cure, such as an untrusted host key) it is taken out of service and reported.  A job's future
is resolved exactly once, so no measurement is lost or recorded twice.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar, Union

from dispatcher.core.jobs import RunJob
from dispatcher.core.records import RunResult
from dispatcher.running.backend import AnsweringSlot, PermanentLoss, Slot, WorkerLost

log = logging.getLogger(__name__)

# A submit that wakes a runner lets the GIL go (sleep(0)) every so many hand-offs while many
# runners wait, so that those it woke run their jobs before it wakes more.  Otherwise, with
# hundreds of runners waiting, it wakes one per job for a whole switch interval (5 ms) and
# they queue for the GIL, each waking every interval to ask for it: 1,000 slots ran about
# 8,000 jobs/s, 12,000 with this (bench/scheduler_core, 2 CPUs).  Not with fewer waiting:
# then a burst of submits finds every runner busy, and the runners take the jobs queued
# meanwhile without being woken at all (100 slots: 24,000 jobs/s without, 13,000 with).
_LET_GO_EVERY = 32  # hand-offs
_LET_GO_ABOVE = 256  # runners waiting
# Threads that resolve the futures of answering slots' jobs.  A future's callbacks store its
# result (a file written and fsynced, ``MeasurementService``): on the backend's one answering
# thread those waits would come one after another; here they overlap, a bounded few at once.
_RESOLVERS = 8


@dataclass(frozen=True)
class SchedulerConfig:
    """What happens when a worker is lost (its connection broke, its agent died): the
    scheduler's own settings, which the config's ``scheduler:`` section fills."""

    attempts: int = 3  # runs of one job on different slots before it is reported failed
    quarantine_after: int = 5  # consecutive losses before a slot is taken out of service
    backoff_s: float = 1.0  # first pause before re-probing a lost slot; doubles each time
    backoff_max_s: float = 60.0


class NoWorkers(WorkerLost):
    """Every slot has been taken out of service: queued jobs cannot run."""


@dataclass
class _Queued:
    job: RunJob
    future: Future
    worker_class: str | None = None  # None: any slot
    losses: list[str] = field(default_factory=list)  # why earlier attempts were lost


# ---------------------------------------------------------------------- who takes which job

R = TypeVar("R")  # a runner, to the board: whatever the caller hands jobs to and wakes


@dataclass(eq=False)
class _SlotState(Generic[R]):
    name: str
    worker_class: str
    depth: int
    pinned: collections.deque[_Queued] = field(default_factory=collections.deque)
    waiting: list[R] = field(default_factory=list)  # its runners with nothing to do
    out: bool = False  # down or quarantined: its runners are handed nothing

    @property
    def load(self) -> int:
        """Its runners that are not waiting (they hold a job, or soon look for one)."""
        return self.depth - len(self.waiting)


class JobBoard(Generic[R]):
    """Which runner takes which job: the queued jobs and the waiting runners, with no
    threads and no lock (its caller holds one).

    Invariant: no waiting runner of a slot in service may take a queued job.  So ``place``
    either hands a job to a waiting runner (its caller wakes that runner only) or queues it,
    and a runner that ``take``s nothing waits until it is handed a job.  A runner taken off
    the waiting list (returned by ``place``, ``set_in``, ``set_out``, ``stop_waiting``) must be
    woken by the caller, exactly once.
    """

    def __init__(self, slots: Iterable[tuple[str, str, int]]):
        """``slots``: (name, worker class, depth) of each slot."""
        self._slots: dict[str, _SlotState[R]] = {
            name: _SlotState(name, cls, depth) for name, cls, depth in slots}
        self._classes = list(dict.fromkeys(s.worker_class for s in self._slots.values()))
        # Jobs for any slot (key None) or for any slot of a class, each with its rank in one
        # order across the queues (negative: put back at the front), so a runner takes the
        # older of the heads of the two queues it may take from, scanning neither.
        self._shared: dict[str | None, collections.deque[tuple[int, _Queued]]] = {
            cls: collections.deque() for cls in [None, *self._classes]}
        self._back = 0
        self._front = 0
        self.idle = 0  # waiting runners of slots in service
        # Slots in service with a waiting runner, per class and load, longest waiting first:
        # each slot gets a job before any slot gets a second one.
        depth = max(s.depth for s in self._slots.values())
        self._ready: dict[str, list[dict[str, None]]] = {
            cls: [{} for _ in range(depth)] for cls in self._classes}

    def place(self, item: _Queued, slot: str | None = None, front: bool = False) -> R | None:
        """The waiting runner that takes ``item`` now, or None: queued.  ``slot``: the slot
        it is meant for (if that one is out, any slot of its class takes it); ``front``: before
        the other jobs of the shared queues (a job put back)."""
        if slot is not None and not self._slots[slot].out:
            state = self._slots[slot]
            if state.waiting:
                return self._pop_waiting(state)
            state.pinned.append(item)
            return None
        chosen = self._least_loaded(item.worker_class)
        if chosen is not None:
            return self._pop_waiting(chosen)
        queue = self._shared[item.worker_class]
        if front:
            self._front -= 1
            queue.appendleft((self._front, item))
        else:
            self._back += 1
            queue.append((self._back, item))
        return None

    def take(self, slot: str, runner: R) -> _Queued | None:
        """The job a free ``runner`` of ``slot`` runs next: its slot's own, else the oldest
        for its class or for any slot.  None: nothing for it (or its slot is out), and it now
        waits until it is handed a job."""
        state = self._slots[slot]
        if not state.out:
            item = self._next_for(state)
            if item is not None:
                return item
        self._unlist(state)
        state.waiting.append(runner)
        self._list(state)
        return None

    def withdraw(self, slot: str, runner: R) -> None:
        """``runner`` stops waiting by itself (it stops for good)."""
        state = self._slots[slot]
        if runner in state.waiting:
            self._unlist(state)
            state.waiting.remove(runner)
            self._list(state)

    def stop_waiting(self, slot: str) -> list[R]:
        """Take every waiting runner of ``slot`` off the list (to wake them for good)."""
        state = self._slots[slot]
        self._unlist(state)
        runners, state.waiting = state.waiting, []
        return runners

    def set_out(self, slot: str, front: bool = False) -> list[tuple[R, _Queued]]:
        """``slot`` is handed nothing until ``set_in``; the jobs queued for it go to the
        others (to the front of the shared queues if ``front``, else to the back).  Returns
        the runners (of other slots) those jobs were handed to."""
        state = self._slots[slot]
        self._unlist(state)
        state.out = True
        pinned = list(state.pinned)
        state.pinned.clear()
        handed = [(self.place(item, front=front), item)
                  for item in (reversed(pinned) if front else pinned)]
        return [(runner, item) for runner, item in handed if runner is not None]

    def set_in(self, slot: str) -> list[tuple[R, _Queued]]:
        """``slot`` is in service again.  Returns its waiting runners handed what they may
        take now."""
        state = self._slots[slot]
        state.out = False
        handed = []
        while state.waiting:
            item = self._next_for(state)
            if item is None:
                break
            handed.append((state.waiting.pop(0), item))
        self._list(state)
        return handed

    def remove_queued(self, worker_class: str | None) -> list[_Queued]:
        """Take out the queued jobs for any slot of ``worker_class`` (None: for any slot)."""
        queue = self._shared[worker_class]
        items = [item for _, item in queue]
        queue.clear()
        return items

    def drain(self) -> list[_Queued]:
        """Take out every queued job."""
        items = [item for cls in self._shared for item in self.remove_queued(cls)]
        for state in self._slots.values():
            items += state.pinned
            state.pinned.clear()
        return items

    def _next_for(self, state: _SlotState[R]) -> _Queued | None:
        if state.pinned:
            return state.pinned.popleft()
        anyone, own = self._shared[None], self._shared[state.worker_class]
        if anyone and (not own or anyone[0][0] < own[0][0]):
            return anyone.popleft()[1]
        if own:
            return own.popleft()[1]
        return None

    def _least_loaded(self, worker_class: str | None) -> _SlotState[R] | None:
        """The slot in service (of ``worker_class``, if given) with a waiting runner and the
        fewest jobs, longest waiting first; None if no runner waits."""
        best: dict[str, None] | None = None
        best_load = 0
        for cls in self._classes if worker_class is None else [worker_class]:
            for load, slots in enumerate(self._ready[cls]):
                if best is not None and load >= best_load:
                    break
                if slots:
                    best, best_load = slots, load
                    break
        return None if best is None else self._slots[next(iter(best))]

    def _pop_waiting(self, state: _SlotState[R]) -> R:
        self._unlist(state)
        runner = state.waiting.pop(0)
        self._list(state)
        return runner

    def _unlist(self, state: _SlotState[R]) -> None:
        """Before its waiting runners change: out of ``_ready``."""
        if state.waiting and not state.out:
            del self._ready[state.worker_class][state.load][state.name]
            self.idle -= len(state.waiting)

    def _list(self, state: _SlotState[R]) -> None:
        """After: back in, at the end of its load's slots."""
        if state.waiting and not state.out:
            self._ready[state.worker_class][state.load][state.name] = None
            self.idle += len(state.waiting)


# ---------------------------------------------------------------------- threads


@dataclass(eq=False)
class _Runner:
    """One thread of a slot, running one job at a time.  It waits on a gate of its own, so
    that handing it a job wakes it alone, and takes the job handed to it without the
    scheduler's lock."""

    slot: Slot
    gate: threading.Lock = field(default_factory=threading.Lock)  # held while it waits
    handed: _Queued | None = None  # put here before the gate opens

    def __post_init__(self) -> None:
        self.gate.acquire()  # closed: opened once for each time it is taken off the list

    def wake(self, item: _Queued | None = None) -> None:
        """Open its gate, handing it ``item`` if given: by whoever took it off the board's
        waiting list, once."""
        self.handed = item
        self.gate.release()


@dataclass(eq=False)
class _Answerer:
    """A runner of an ``AnsweringSlot``, without a thread: handing it a job queues the job's
    start (made by whoever handed it, once it has let the scheduler's lock go), and the
    slot's answer ends the job."""

    slot: AnsweringSlot
    starts: collections.deque[tuple[_Answerer, _Queued]]
    losses: int = 0  # in a row

    def wake(self, item: _Queued | None = None) -> None:
        """As ``_Runner.wake``; without a job (it is to stop) there is nothing to do."""
        if item is not None:
            self.starts.append((self, item))


_AnyRunner = Union[_Runner, _Answerer]


class Scheduler:
    def __init__(self, slots: Sequence[Slot], policy: SchedulerConfig | None = None):
        if not slots:
            raise ValueError("no worker slots")
        self.slots = list(slots)
        self.policy = policy or SchedulerConfig()
        self._lock = threading.Lock()  # the board and the state below
        self._board: JobBoard[_AnyRunner] = JobBoard(
            (slot.name, slot.worker_class, slot.depth) for slot in self.slots)
        self._class_of = {slot.name: slot.worker_class for slot in self.slots}
        self._in_service = collections.Counter(slot.worker_class for slot in self.slots)
        self._closing = False
        self._handoffs = 0
        self._stopping = threading.Event()  # set with _closing: ends back-off pauses
        self._aborting = False  # close(abort=True): jobs lost now fail, never run again
        self.busy_s = {slot.name: 0.0 for slot in self.slots}  # time spent running jobs
        self.lost_jobs = 0  # attempts lost with their worker (each was retried or failed)
        self.quarantined: dict[str, str] = {}  # slot name -> the last loss
        self.down: dict[str, str] = {}  # slots backing off after a loss -> why (until a probe
        # succeeds; then they serve again)
        # A slot with ``depth`` > 1 takes that many jobs at once (it queues them on its worker).
        self._starts: collections.deque[tuple[_Answerer, _Queued]] = collections.deque()
        self._starting = threading.local()  # .on: this thread is starting handed jobs
        self._runners: dict[str, list[_AnyRunner]] = {
            slot.name: [_Answerer(slot, self._starts) if isinstance(slot, AnsweringSlot)
                        else _Runner(slot) for _ in range(slot.depth)]
            for slot in self.slots}
        self._answering = {slot.name for slot in self.slots if isinstance(slot, AnsweringSlot)}
        self._in_flight = {slot.name: [0, 0.0] for slot in self.slots}  # [jobs, since]
        self._answers_due = 0  # jobs held by answering slots' runners
        self._settled = threading.Condition(self._lock)  # ... fell to 0
        self._threads = [threading.Thread(target=self._serve, args=(runner,), daemon=True,
                                          name=f"slot {runner.slot.name}")
                         for runners in self._runners.values() for runner in runners
                         if isinstance(runner, _Runner)]
        self._recovering: set[threading.Thread] = set()  # answering slots' back-offs
        self._resolver = (ThreadPoolExecutor(_RESOLVERS, thread_name_prefix="slot results")
                          if self._answering else None)
        for runners in self._runners.values():  # they wait for their first jobs
            for runner in runners:
                if isinstance(runner, _Answerer):
                    self._board.take(runner.slot.name, runner)
        for t in self._threads:
            t.start()

    @property
    def worker_classes(self) -> list[str]:
        """The classes of the slots, in slot order."""
        return list(dict.fromkeys(slot.worker_class for slot in self.slots))

    def submit(self, job: RunJob, slot: str | None = None,
               worker_class: str | None = None) -> Future[RunResult]:
        """Queue a job for any free slot (of ``worker_class``, if given), or preferably for
        the named slot (if that slot is lost, the job runs on another one of its class: the
        result names the slot that ran it)."""
        if self._closing:
            raise RuntimeError("scheduler is closed")
        if slot is not None and slot not in self._runners:
            raise KeyError(f"no slot named {slot}")
        if slot is not None:
            worker_class = self._class_of[slot]
        if worker_class is not None and worker_class not in self._in_service:
            raise KeyError(f"no worker slot of class {worker_class!r} "
                           f"(there are: {', '.join(self.worker_classes)})")
        future: Future = Future()
        item = _Queued(job, future, worker_class)
        with self._lock:  # as little as can be: every runner that ends a job takes it too
            if self._closing:  # since the first look
                raise RuntimeError("scheduler is closed")
            if self._all_quarantined(worker_class):
                self._fail(item, self._no_workers(worker_class))
                return future
            runner = self._board.place(item, slot)
            if runner is None:
                return future  # queued
            self._count(runner.slot.name, +1)
            self._handoffs += 1
            let_go = self._handoffs % _LET_GO_EVERY == 0 and self._board.idle > _LET_GO_ABOVE
        runner.wake(item)  # no one else hands this runner a job: no need for the lock
        if self._starts:
            self._start_handed()
        if let_go:
            time.sleep(0)
        return future

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The lock, for code that may hand jobs to answering runners: their starts are made
        once it is let go."""
        with self._lock:
            yield
        if self._starts:
            self._start_handed()

    # ------------------------------------------------------------------ runner threads

    def _place(self, item: _Queued, slot: str | None = None, front: bool = False) -> None:
        """Queue ``item``, or hand it to a waiting runner and wake that one (lock held)."""
        runner = self._board.place(item, slot, front)
        if runner is not None:
            self._hand([(runner, item)])

    def _hand(self, handed: Iterable[tuple[_AnyRunner, _Queued]]) -> None:
        """Wake runners the board handed jobs to; they hold them from now (lock held)."""
        for runner, item in handed:
            self._count(runner.slot.name, +1)
            runner.wake(item)

    def _next(self, runner: _Runner, held: bool) -> _Queued | None:
        """The next job for ``runner`` (``held``: it ends the one it held); None when it is
        to stop (its slot is out of service, or the scheduler closes and nothing is left for
        it).  One acquisition of the lock per job when jobs are queued, none when it is
        handed one."""
        name = runner.slot.name
        while True:
            with self._lock:
                if held:
                    self._count(name, -1)
                    held = False
                if name in self.quarantined:  # a sibling runner of this slot gave it up
                    self._board.withdraw(name, runner)
                    return None
                # Nothing while its slot is down (a sibling runner lost its worker and backs
                # off): a job taken now would most likely be lost too, at the cost of an attempt.
                item = self._board.take(name, runner)
                if item is not None:
                    self._count(name, +1)
                    return item
                if self._closing:
                    self._board.withdraw(name, runner)
                    return None
            runner.gate.acquire()  # until it is handed a job, or to stop
            handed, runner.handed = runner.handed, None
            if handed is not None:
                return handed

    def _serve(self, runner: _Runner) -> None:
        slot = runner.slot
        losses = 0  # in a row, on this runner
        held = False  # it still holds the job it ended (counted in busy_s until it asks again)
        while True:
            if losses:
                if self._stopping.wait(self._backoff(losses)):
                    return
                try:
                    slot.probe()
                except WorkerLost as exc:
                    losses += 1
                    if self._give_up(slot, exc, losses):
                        return
                    log.warning("%s: still unavailable (%s)", slot.name, exc)
                    self._mark_down(slot, exc)  # again, if a sibling's probe set it in
                    continue
                self._set_in(slot)
            item = self._next(runner, held)
            if item is None:
                return
            held = True
            if not item.losses and not item.future.set_running_or_notify_cancel():
                continue  # cancelled while queued (a retried job's future is running already)
            try:
                result = slot.run(item.job)
            except WorkerLost as exc:
                held = False
                losses += 1
                if not self._lost(item, slot, exc, losses):
                    return
            except BaseException as exc:  # the job's own failure: reported through the future
                losses = 0
                item.future.set_exception(exc)
            else:
                losses = 0
                self._succeed(item, result)

    def _set_in(self, slot: Slot) -> None:
        """A lost slot answered its probe: it serves again (unless a sibling runner set it in
        already, or quarantined it)."""
        with self._locked():
            if self.down.pop(slot.name, None) is not None and slot.name not in self.quarantined:
                self._hand(self._board.set_in(slot.name))

    def _lost(self, item: _Queued, slot: Slot, exc: WorkerLost, losses: int) -> bool:
        """``item`` was lost with its slot's worker (the ``losses``-th time in a row for this
        runner): put it back, mark the slot down.  False: the runner stops (its slot was
        quarantined, or the scheduler closed under the job on purpose)."""
        with self._locked():
            self._count(slot.name, -1)  # not while it backs off
        if self._aborting:  # closed under the job on purpose: not a lost worker
            self._fail(item, RuntimeError(f"scheduler stopped during the job ({exc})"))
            return False
        self._mark_down(slot, exc)
        self._retry(item, slot, exc)
        return not self._give_up(slot, exc, losses)

    @staticmethod
    def _succeed(item: _Queued, result: RunResult) -> None:
        if item.losses:
            result = result.model_copy(update={"lost_on": tuple(item.losses)})
        item.future.set_result(result)

    # ------------------------------------------------------------------ answering slots

    def _start_handed(self) -> None:
        """Start the jobs handed to answering runners (by this thread or another).  A thread
        already starting them goes on with those added meanwhile: an answer given while a
        job starts (a start that failed) never nests a start in a start."""
        if getattr(self._starting, "on", False):
            return
        self._starting.on = True
        try:
            while True:
                try:
                    runner, item = self._starts.popleft()
                except IndexError:
                    return
                self._launch(runner, item)
        finally:
            self._starting.on = False

    def _launch(self, runner: _Answerer, item: _Queued) -> None:
        if not item.losses and not item.future.set_running_or_notify_cancel():
            self._resume(runner, held=True)  # cancelled while queued
            return
        try:
            runner.slot.start(item.job, functools.partial(self._answered, runner, item))
        except BaseException as exc:  # as run would have raised it
            self._answered(runner, item, exc)

    def _answered(self, runner: _Answerer, item: _Queued,
                  outcome: RunResult | BaseException) -> None:
        """A started job's answer (on the slot's thread, or a start that failed): as a
        runner thread ends a job, then the runner's next job."""
        slot = runner.slot
        try:
            if isinstance(outcome, WorkerLost):
                runner.losses += 1
                if self._lost(item, slot, outcome, runner.losses):
                    self._recover_later(runner)
                return
            runner.losses = 0
            self._resolve(item, outcome)
            self._resume(runner, held=True)
        except Exception:  # the backend's thread must go on answering the other slots
            log.exception("%s: the scheduler failed to take a job's answer", slot.name)
        finally:
            self._start_handed()

    def _resolve(self, item: _Queued, outcome: RunResult | BaseException) -> None:
        """Resolve ``item``'s future with a job's answer, on the resolvers' pool (inline
        once it is shut: an answer that came after close gave up waiting)."""
        def resolve() -> None:
            if isinstance(outcome, BaseException):
                item.future.set_exception(outcome)
            else:
                self._succeed(item, outcome)
        assert self._resolver is not None
        try:
            self._resolver.submit(resolve)
        except RuntimeError:  # shut down
            if not item.future.done():
                resolve()

    def _resume(self, runner: _Answerer, held: bool) -> None:
        """As ``_next`` without the wait: ``runner``'s next job is queued to start, or it waits
        on the board until one is handed to it (or it stops)."""
        name = runner.slot.name
        with self._lock:
            if held:
                self._count(name, -1)
            if name in self.quarantined:
                self._board.withdraw(name, runner)
                return
            item = self._board.take(name, runner)
            if item is None:
                if self._closing:
                    self._board.withdraw(name, runner)
                return
            self._count(name, +1)
        self._starts.append((runner, item))

    def _recover_later(self, runner: _Answerer) -> None:
        """Back off, probe the lost slot and serve again, on a thread of its own (as a runner
        thread does after a loss): one per slot down, none otherwise."""
        thread = threading.Thread(target=self._recover, args=(runner,), daemon=True,
                                  name=f"slot {runner.slot.name} probe")
        with self._lock:  # (started under it: close joins only started threads)
            if self._closing:
                return
            self._recovering.add(thread)
            thread.start()

    def _recover(self, runner: _Answerer) -> None:
        slot = runner.slot
        try:
            while True:
                if self._stopping.wait(self._backoff(runner.losses)):
                    return
                try:
                    slot.probe()
                except WorkerLost as exc:
                    runner.losses += 1
                    if self._give_up(slot, exc, runner.losses):
                        return
                    log.warning("%s: still unavailable (%s)", slot.name, exc)
                    self._mark_down(slot, exc)
                    continue
                self._set_in(slot)
                self._resume(runner, held=False)
                self._start_handed()
                return
        finally:
            with self._lock:
                self._recovering.discard(threading.current_thread())

    # ------------------------------------------------------------------ accounting, losses

    def _count(self, name: str, delta: int) -> None:
        """busy_s counts the time a slot holds at least one job, however many (lock held)."""
        entry = self._in_flight[name]
        if entry[0] == 0:
            entry[1] = time.monotonic()
        entry[0] += delta
        if entry[0] == 0:
            self.busy_s[name] += time.monotonic() - entry[1]
        if name in self._answering:
            self._answers_due += delta
            if self._answers_due == 0:
                self._settled.notify_all()

    def _mark_down(self, slot: Slot, exc: WorkerLost) -> None:
        """Jobs that prefer a lost slot go to the others while it backs off."""
        with self._locked():
            if slot.name in self.quarantined:  # by a sibling runner meanwhile
                return
            self.down[slot.name] = str(exc)
            self._hand(self._board.set_out(slot.name))

    def _backoff(self, losses: int) -> float:
        return min(self.policy.backoff_s * 2 ** (losses - 1), self.policy.backoff_max_s)

    def _retry(self, item: _Queued, slot: Slot, exc: WorkerLost) -> None:
        """Put a job lost with its worker back at the front of the queue, or fail it."""
        item.losses.append(f"{slot.name}: {exc}")
        with self._locked():
            self.lost_jobs += 1
            if len(item.losses) >= self.policy.attempts:
                self._fail(item, WorkerLost(
                    f"job {item.job.sha256[:12]} lost its worker {len(item.losses)} times; "
                    f"last: {exc}"))
                return
            log.warning("%s: lost a job (%s); it runs again elsewhere (attempt %d of %d)",
                        slot.name, exc, len(item.losses) + 1, self.policy.attempts)
            self._place(item, front=True)
            self._fail_orphans()  # this slot may have been its class's last

    def _give_up(self, slot: Slot, exc: WorkerLost, losses: int) -> bool:
        """Quarantine the slot if retrying is hopeless; True if it was quarantined."""
        if not (isinstance(exc, PermanentLoss) or losses >= self.policy.quarantine_after):
            return False
        with self._locked():
            if slot.name in self.quarantined:  # a sibling runner of this slot got here first:
                self._fail_orphans()  # a job it put back meanwhile must not wait forever
                return True
            self.quarantined[slot.name] = str(exc)
            self._in_service[slot.worker_class] -= 1
            self.down.pop(slot.name, None)
            log.error("%s: taken out of service after %d loss(es): %s", slot.name, losses, exc)
            self._hand(self._board.set_out(slot.name, front=True))
            self._fail_orphans()
            for runner in self._board.stop_waiting(slot.name):  # its idle siblings stop
                runner.wake()
        try:
            slot.close()
        except Exception:  # closing a broken slot must not take the thread's report with it
            pass
        return True

    def _fail_orphans(self) -> None:
        """Fail the queued jobs no slot in service can run (with the lock held)."""
        for cls in [c for c, n in self._in_service.items() if n == 0]:
            for item in self._board.remove_queued(cls):
                self._fail(item, self._no_workers(cls))
        if self._all_quarantined():
            for item in self._board.remove_queued(None):
                self._fail(item, self._no_workers())

    def _all_quarantined(self, worker_class: str | None = None) -> bool:
        """Every slot (of ``worker_class``, if given) is out of service."""
        if worker_class is not None:
            return self._in_service[worker_class] == 0
        return not any(self._in_service.values())

    def _no_workers(self, worker_class: str | None = None) -> NoWorkers:
        reasons = "; ".join(f"{name}: {why}" for name, why in self.quarantined.items()
                            if worker_class is None or self._class_of[name] == worker_class)
        of = (f" of class {worker_class}" if worker_class is not None
              and not self._all_quarantined() else "")
        return NoWorkers(f"no worker slot{of} left in service ({reasons})")

    @staticmethod
    def _fail(item: _Queued, exc: BaseException) -> None:
        if item.future.done():
            return
        if not item.future.running():
            item.future.set_running_or_notify_cancel()
        item.future.set_exception(exc)

    # ------------------------------------------------------------------ shutdown

    def close(self, abort: bool = False) -> None:
        """Finish queued jobs, stop the slot threads and close the slots.  ``abort``: fail
        queued jobs instead, and close the slots first, which ends the runs in flight (their
        jobs fail; nothing is retried)."""
        with self._lock:
            self._closing = True
            self._stopping.set()
            if abort:
                self._aborting = True
                leftovers = self._board.drain()
            for name in self._runners:  # those waiting find nothing left, and stop
                for runner in self._board.stop_waiting(name):
                    runner.wake()
        if abort:
            for item in leftovers:
                self._fail(item, RuntimeError("scheduler stopped before the job could run"))
            for slot in self.slots:
                if slot.name not in self.quarantined:
                    try:
                        slot.close()
                    except Exception:  # a broken slot must not keep the others running
                        pass
        deadline = time.monotonic() + 5 if abort else None
        for t in self._threads:
            t.join(timeout=5 if abort else None)
        with self._lock:
            recovering = list(self._recovering)
        for t in recovering:  # their back-off ends with _stopping
            t.join(timeout=5)
        with self._lock:  # answering slots' jobs in flight end (abort: their slots answer)
            while self._answers_due > 0:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._settled.wait(left)
        if self._resolver is not None:  # their futures resolved
            self._resolver.shutdown(wait=True)
        with self._lock:  # left by slots that stopped while backing off
            leftovers = self._board.drain()
        for item in leftovers:
            self._fail(item, RuntimeError("scheduler closed before the job could run"))
        for slot in self.slots:
            if slot.name not in self.quarantined:
                slot.close()

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
