"""The replies of the jobs in flight on a Ray backend's actors, taken on one thread.

A slot that answers by itself (``AnsweringSlot``) sends a job to its actor and hands the
reply's reference here (``expect``).  Ray resolves the reference on a thread of its own and
tells us by a callback that only queues it; this module's one thread takes each reply from the
queue and gives it to the slot's handler, which may send the slot's next job at once.  So the
master keeps one thread for the replies of every slot instead of a thread blocked in
``ray.get`` per job in flight (two per slot before), and nothing of ours runs on Ray's own
threads.  A reply that does not come in time (``timeout_s``) is given as ``NoReply``.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Union

from dispatcher.running.agent_client import WorkerLost

log = logging.getLogger(__name__)


class NoReply(Exception):
    """The reply did not come within its time: the actor is presumed hung."""


# A handler gets the reply's future (done), or an exception: NoReply, or what ``abandon`` said.
Outcome = Union[Future, BaseException]


def reply_of(outcome: Outcome, ray: Any, slot: str, actor: str,
             drop: Callable[[], None]) -> Any:
    """The value a slot's actor replied; else raises what the job comes to.  WorkerLost when
    no reply came in time (the actor presumed hung: ``drop``ped), when the actor's own code
    failed, or when the actor or its node is gone (``drop``ped); the exception of an
    abandoned reply (its slot closed) as it is.  ``slot`` and ``actor`` name them in the
    message."""
    if isinstance(outcome, NoReply):
        drop()
        raise WorkerLost(f"{slot}: {outcome} from {actor}; it is presumed hung")
    if isinstance(outcome, BaseException):
        raise outcome
    try:
        return outcome.result()
    except ray.exceptions.RayTaskError as exc:  # the actor's own code failed
        raise WorkerLost(f"{slot}: {one_line(exc)}") from None
    except ray.exceptions.RayError as exc:  # the actor, its node or an object is gone
        drop()
        raise WorkerLost(f"{slot}: {actor} lost: {one_line(exc)}") from None


def one_line(exc: BaseException) -> str:
    """An exception's first line, at most 300 characters (Ray's run to pages)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


@dataclass(eq=False)
class _Expected:
    owner: object
    handle: Callable[[Outcome], None]
    deadline: float
    timeout_s: float
    done: bool = field(default=False)


class Replies:
    """One thread that gives every expected reply to its handler, once: the reply, its
    deadline passed, or ``abandon``, whichever comes first."""

    def __init__(self, name: str = "slot answers (ray)"):
        self._queue: queue.SimpleQueue[tuple[_Expected, Future] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._deadlines: list[tuple[float, int, _Expected]] = []
        self._seq = itertools.count()
        self._live = 0  # expected and not yet given
        self._by_owner: dict[object, set[_Expected]] = {}
        self._thread = threading.Thread(target=self._loop, daemon=True, name=name)
        self._thread.start()

    def expect(self, ref: Any, timeout_s: float, owner: object,
               handle: Callable[[Outcome], None]) -> None:
        """Give ``handle`` the reply of ``ref`` (a Ray object reference), on this module's
        thread; or ``NoReply`` after ``timeout_s``."""
        entry = _Expected(owner, handle, time.monotonic() + timeout_s, timeout_s)
        with self._lock:
            heapq.heappush(self._deadlines, (entry.deadline, next(self._seq), entry))
            self._by_owner.setdefault(owner, set()).add(entry)
            self._live += 1
            if len(self._deadlines) > 64 and len(self._deadlines) > 4 * self._live:
                # those given long before their deadline: drop them from the heap
                self._deadlines = [d for d in self._deadlines if not d[2].done]
                heapq.heapify(self._deadlines)
        ref.future().add_done_callback(lambda f: self._queue.put((entry, f)))

    def abandon(self, owner: object, exc: BaseException) -> None:
        """Give ``exc`` now to each handler of ``owner`` still waiting (its slot is closed),
        on the calling thread; their replies, if they come, are dropped."""
        with self._lock:
            mine = [e for e in self._by_owner.pop(owner, ()) if self._claim(e)]
        for entry in mine:
            self._give(entry, exc)

    def close(self) -> None:
        """The thread ends (replies still due are dropped)."""
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _claim(self, entry: _Expected) -> bool:
        """(lock held) True once: whoever gets True gives the entry its outcome."""
        if entry.done:
            return False
        entry.done = True
        self._live -= 1
        waiting = self._by_owner.get(entry.owner)
        if waiting is not None:
            waiting.discard(entry)
            if not waiting:
                del self._by_owner[entry.owner]
        return True

    @staticmethod
    def _give(entry: _Expected, outcome: Outcome) -> None:
        try:
            entry.handle(outcome)
        except Exception:  # this thread must go on for the other slots
            log.exception("a reply's handler failed")

    def _loop(self) -> None:
        while True:
            with self._lock:
                first = self._deadlines[0][0] if self._deadlines else None
            wait = 1.0 if first is None else min(1.0, max(first - time.monotonic(), 0.0))
            try:
                item = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            except queue.Empty:
                item = ()  # type: ignore[assignment]
            if item is None:
                return
            if item:
                entry, future = item
                with self._lock:
                    mine = self._claim(entry)
                if mine:
                    self._give(entry, future)
            now = time.monotonic()
            expired = []
            with self._lock:
                while self._deadlines and self._deadlines[0][0] <= now:
                    _, _, entry = heapq.heappop(self._deadlines)
                    if self._claim(entry):
                        expired.append(entry)
            for entry in expired:
                self._give(entry, NoReply(f"no answer within {entry.timeout_s:.0f} s"))
