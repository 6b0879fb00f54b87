"""The scheduler core as it was before issue 14 (one condition, every slot thread woken on
every submit), kept only as the reference ``bench/scheduler_core`` measures the current one
against.  Copied verbatim from dispatcher/running/scheduler.py at commit 90d8853 (docstring aside);
not used by anything else, and not to be fixed or extended.

The original docstring:

One thread per slot takes the next job meant for it, or else the oldest job meant for any
slot, so a slot never idles while work is queued.  Backends differ only in the slots they
provide; the search code sees ``submit`` and futures.

When a slot loses its worker (``WorkerLost``: a broken connection, a dead agent, a host gone
quiet) the job goes back to the front of the queue for another slot, up to
``attempts`` times; the slot pauses with exponential back-off and probes its worker before it
takes work again; after ``quarantine_after`` losses in a row (or one loss that retrying cannot
cure, such as an untrusted host key) it is taken out of service and reported.  A job's future
is resolved exactly once, so no measurement is lost or recorded twice.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from dispatcher.config import SchedulerConfig  # noqa: E402
from dispatcher.core.jobs import RunJob  # noqa: E402
from dispatcher.core.records import RunResult  # noqa: E402
from dispatcher.running.backend import PermanentLoss, Slot, WorkerLost  # noqa: E402

log = logging.getLogger(__name__)


class NoWorkers(WorkerLost):
    """Every slot has been taken out of service: queued jobs cannot run."""


@dataclass
class _Queued:
    job: RunJob
    future: Future
    worker_class: str | None = None  # None: any slot
    losses: list[str] = field(default_factory=list)  # why earlier attempts were lost


class Scheduler:
    def __init__(self, slots: Sequence[Slot], policy: SchedulerConfig | None = None):
        if not slots:
            raise ValueError("no worker slots")
        self.slots = list(slots)
        self.policy = policy or SchedulerConfig()
        self._cond = threading.Condition()
        self._shared: collections.deque[_Queued] = collections.deque()
        self._pinned: dict[str, collections.deque[_Queued]] = {
            slot.name: collections.deque() for slot in self.slots}
        self._class_of = {slot.name: slot.worker_class for slot in self.slots}
        self._class_slots: dict[str, list[str]] = {}
        for slot in self.slots:
            self._class_slots.setdefault(slot.worker_class, []).append(slot.name)
        self._closing = False
        self._aborting = False  # close(abort=True): jobs lost now fail, never run again
        self.busy_s = {slot.name: 0.0 for slot in self.slots}  # time spent running jobs
        self.lost_jobs = 0  # attempts lost with their worker (each was retried or failed)
        self.quarantined: dict[str, str] = {}  # slot name -> the last loss
        self.down: dict[str, str] = {}  # slots backing off after a loss -> why (until a probe
        # succeeds; then they serve again)
        # A slot with ``depth`` > 1 takes that many jobs at once (it queues them on its worker).
        self._threads = [threading.Thread(target=self._serve, args=(slot,), daemon=True,
                                          name=f"slot {slot.name}") for slot in self.slots
                         for _ in range(slot.depth)]
        self._in_flight = {slot.name: [0, 0.0] for slot in self.slots}  # [jobs, since]
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
        future: Future = Future()
        with self._cond:
            if self._closing:
                raise RuntimeError("scheduler is closed")
            if slot is not None and slot not in self._pinned:
                raise KeyError(f"no slot named {slot}")
            if slot is not None:
                worker_class = self._class_of[slot]
            if worker_class is not None and worker_class not in self._class_slots:
                raise KeyError(f"no worker slot of class {worker_class!r} "
                               f"(there are: {', '.join(self.worker_classes)})")
            item = _Queued(job, future, worker_class)
            if self._all_quarantined(worker_class):
                self._fail(item, self._no_workers(worker_class))
            elif slot is None or slot in self.quarantined or slot in self.down:
                self._shared.append(item)  # its preferred slot is lost: any other will do
            else:
                self._pinned[slot].append(item)
            self._cond.notify_all()
        return future

    # ------------------------------------------------------------------ slot threads

    def _next(self, name: str) -> _Queued | None:
        """The next job for slot ``name``: its own first, then the oldest shared job of its
        class (or of no class)."""
        cls = self._class_of[name]
        with self._cond:
            while True:
                if name in self.quarantined:  # a sibling thread of this slot gave it up
                    return None
                if name in self.down:
                    # A sibling thread of this slot lost its worker and is backing off: a job
                    # taken now would most likely be lost too, at the cost of an attempt.
                    if self._closing:
                        return None
                    self._cond.wait()
                    continue
                if self._pinned[name]:
                    return self._pinned[name].popleft()
                for i, item in enumerate(self._shared):
                    if item.worker_class is None or item.worker_class == cls:
                        del self._shared[i]
                        return item
                if self._closing:
                    return None
                self._cond.wait()

    def _serve(self, slot: Slot) -> None:
        losses = 0  # in a row, on this slot
        while True:
            if losses:
                if not self._pause(self._backoff(losses)):
                    return
                try:
                    slot.probe()
                except WorkerLost as exc:
                    losses += 1
                    if self._give_up(slot, exc, losses):
                        return
                    log.warning("%s: still unavailable (%s)", slot.name, exc)
                    with self._cond:
                        self.down[slot.name] = str(exc)
                    continue
                with self._cond:
                    self.down.pop(slot.name, None)
                    self._cond.notify_all()  # its sibling threads take work again
            item = self._next(slot.name)
            if item is None:
                return
            if not item.losses and not item.future.set_running_or_notify_cancel():
                continue  # cancelled while queued (a retried job's future is running already)
            self._busy(slot.name, +1)
            try:
                result = slot.run(item.job)
            except WorkerLost as exc:
                if self._aborting:  # closed under the job on purpose: not a lost worker
                    self._fail(item, RuntimeError(f"scheduler stopped during the job ({exc})"))
                    return
                losses += 1
                self._mark_down(slot, exc)
                self._retry(item, slot, exc)
                if self._give_up(slot, exc, losses):
                    return
            except BaseException as exc:  # the job's own failure: reported through the future
                losses = 0
                item.future.set_exception(exc)
            else:
                losses = 0
                if item.losses:
                    result = result.model_copy(update={"lost_on": tuple(item.losses)})
                item.future.set_result(result)
            finally:
                self._busy(slot.name, -1)

    def _busy(self, name: str, delta: int) -> None:
        """busy_s counts the time a slot has at least one job, however many it holds."""
        with self._cond:
            entry = self._in_flight[name]
            if entry[0] == 0:
                entry[1] = time.monotonic()
            entry[0] += delta
            if entry[0] == 0:
                self.busy_s[name] += time.monotonic() - entry[1]

    def _mark_down(self, slot: Slot, exc: WorkerLost) -> None:
        """Jobs that prefer a lost slot go to the others while it backs off."""
        with self._cond:
            self.down[slot.name] = str(exc)
            pinned = self._pinned[slot.name]
            self._shared.extend(pinned)
            pinned.clear()
            self._cond.notify_all()

    def _backoff(self, losses: int) -> float:
        return min(self.policy.backoff_s * 2 ** (losses - 1), self.policy.backoff_max_s)

    def _pause(self, seconds: float) -> bool:
        """Sleep, unless the scheduler closes meanwhile (then False)."""
        deadline = time.monotonic() + seconds
        with self._cond:
            while not self._closing:
                left = deadline - time.monotonic()
                if left <= 0:
                    return True
                self._cond.wait(left)
        return False

    def _retry(self, item: _Queued, slot: Slot, exc: WorkerLost) -> None:
        """Put a job lost with its worker back at the front of the queue, or fail it."""
        item.losses.append(f"{slot.name}: {exc}")
        with self._cond:
            self.lost_jobs += 1
            if len(item.losses) >= self.policy.attempts:
                self._fail(item, WorkerLost(
                    f"job {item.job.sha256[:12]} lost its worker {len(item.losses)} times; "
                    f"last: {exc}"))
                return
            log.warning("%s: lost a job (%s); it runs again elsewhere (attempt %d of %d)",
                        slot.name, exc, len(item.losses) + 1, self.policy.attempts)
            self._shared.appendleft(item)
            self._fail_orphans()  # this slot may have been its class's last
            self._cond.notify_all()

    def _give_up(self, slot: Slot, exc: WorkerLost, losses: int) -> bool:
        """Quarantine the slot if retrying is hopeless; True if it was quarantined."""
        if not (isinstance(exc, PermanentLoss) or losses >= self.policy.quarantine_after):
            return False
        with self._cond:
            if slot.name in self.quarantined:  # a sibling thread of this slot got here first:
                self._fail_orphans()  # a job it put back meanwhile must not wait forever
                self._cond.notify_all()
                return True
            self.quarantined[slot.name] = str(exc)
            self.down.pop(slot.name, None)
            log.error("%s: taken out of service after %d loss(es): %s", slot.name, losses, exc)
            pinned = self._pinned[slot.name]
            self._shared.extendleft(reversed(pinned))
            pinned.clear()
            self._fail_orphans()
            self._cond.notify_all()
        try:
            slot.close()
        except Exception:  # closing a broken slot must not take the thread's report with it
            pass
        return True

    def _fail_orphans(self) -> None:
        """Fail the queued jobs no slot in service can run (with the lock held)."""
        for item in [i for i in self._shared if self._all_quarantined(i.worker_class)]:
            self._shared.remove(item)
            self._fail(item, self._no_workers(item.worker_class))

    def _all_quarantined(self, worker_class: str | None = None) -> bool:
        """Every slot (of ``worker_class``, if given) is out of service."""
        names = self._class_slots[worker_class] if worker_class is not None else self._pinned
        return all(name in self.quarantined for name in names)

    def _no_workers(self, worker_class: str | None = None) -> NoWorkers:
        names = self._class_slots[worker_class] if worker_class is not None else self._pinned
        reasons = "; ".join(f"{name}: {why}" for name, why in self.quarantined.items()
                            if name in names)
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
        with self._cond:
            self._closing = True
            if abort:
                self._aborting = True
                leftovers = list(self._shared) + [i for q in self._pinned.values() for i in q]
                self._shared.clear()
                for q in self._pinned.values():
                    q.clear()
            self._cond.notify_all()
        if abort:
            for item in leftovers:
                self._fail(item, RuntimeError("scheduler stopped before the job could run"))
            for slot in self.slots:
                if slot.name not in self.quarantined:
                    try:
                        slot.close()
                    except Exception:  # a broken slot must not keep the others running
                        pass
        for t in self._threads:
            t.join(timeout=5 if abort else None)
        with self._cond:  # left by slots that stopped while backing off
            leftovers = list(self._shared) + [i for q in self._pinned.values() for i in q]
            self._shared.clear()
            for q in self._pinned.values():
                q.clear()
        for item in leftovers:
            self._fail(item, RuntimeError("scheduler closed before the job could run"))
        for slot in self.slots:
            if slot.name not in self.quarantined:
                slot.close()

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
