"""Remote calls in flight, answered from one thread of the master whatever their number.

A Ray slot's job is one remote call (an actor method).  Waiting for it in a thread of its own
(``ray.get`` with a timeout) costs the master a thread per job in flight: two per slot.
``RayCalls`` instead asks Ray to tell it when each call's reply is in (``ObjectRef.future``:
Ray resolves it from its own thread, at no cost per call in flight) and hands each answer, in
one thread of its own, to the function the caller gave; a call with no answer by its deadline
is answered as timed out (the caller presumes its actor hung).  Each call is answered exactly
once; when ``close``\\ d, every call still in flight is answered as lost.

(Not ``ray.wait`` over the calls in flight: a wait cannot take in a call made while it waits,
so it would poll, and each poll costs the whole list.)
"""
from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from typing import Any, Callable

log = logging.getLogger(__name__)

SWEEP_S = 1.0  # how often the calls in flight are checked against their deadlines


class CallTimedOut(Exception):
    """No answer within the call's timeout."""

    def __init__(self, timeout: float):
        super().__init__(f"no answer within {timeout:.0f} s")
        self.timeout = timeout


class CallsClosed(Exception):
    """The calls' thread stopped (the backend closes) before the answer came."""


# answer(value, error): error None and the call's value, or error the RayError the call failed
# with (a RayTaskError: the actor's code raised; another: the actor or its node is gone),
# CallTimedOut or CallsClosed.
Answer = Callable[[Any, "BaseException | None"], None]


class _Call:
    __slots__ = ("answer", "deadline", "timeout", "answered")

    def __init__(self, answer: Answer, timeout: float):
        self.answer = answer
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.answered = False


class RayCalls:
    """The remote calls of one backend in flight, and the thread that answers them."""

    def __init__(self, name: str = "ray calls"):
        self._inflight: dict[int, _Call] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._replies: queue.SimpleQueue = queue.SimpleQueue()  # (id, concurrent future)|None
        self._closed = False
        self._thread = threading.Thread(target=self._serve, daemon=True, name=name)
        self._thread.start()

    def call(self, ref: Any, timeout: float, answer: Answer) -> None:
        """Answer the call whose reply is ``ref`` (an ObjectRef) with ``answer``, from this
        object's thread, once: its value, its error, or ``CallTimedOut`` after ``timeout``
        seconds.  CallsClosed (at once) if closed."""
        call = _Call(answer, timeout)
        with self._lock:
            if self._closed:
                raise CallsClosed("the backend is closed")
            key = next(self._ids)
            self._inflight[key] = call
        # Ray resolves it from its own thread: only a put there, the answer in ours.
        try:
            future = ref.future()
        except BaseException:
            with self._lock:
                self._inflight.pop(key, None)
            raise
        future.add_done_callback(lambda f: self._replies.put((key, f)))

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._inflight)

    def _serve(self) -> None:
        sweep = time.monotonic() + SWEEP_S
        while True:
            try:
                reply = self._replies.get(timeout=max(sweep - time.monotonic(), 0.0))
            except queue.Empty:
                reply = ()
            if reply is None:
                return
            if reply:
                key, future = reply
                with self._lock:
                    call = self._inflight.pop(key, None)
                if call is not None:  # else answered already (timed out, or closed)
                    error = future.exception()
                    self._answer(call, None if error is not None else future.result(), error)
            if time.monotonic() >= sweep:
                now = time.monotonic()
                sweep = now + SWEEP_S
                with self._lock:
                    late = [k for k, c in self._inflight.items() if c.deadline <= now]
                    expired = [self._inflight.pop(k) for k in late]
                for call in expired:
                    self._answer(call, None, CallTimedOut(call.timeout))

    @staticmethod
    def _answer(call: _Call, value: Any, error: BaseException | None) -> None:
        if call.answered:
            return
        call.answered = True
        try:
            call.answer(value, error)
        except BaseException:  # an answer's own bug must not stop every other call's
            log.exception("answering a remote call failed")

    def close(self) -> None:
        """Stop the thread; every call still in flight is answered CallsClosed (here)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._replies.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        with self._lock:
            left, self._inflight = list(self._inflight.values()), {}
        for call in left:
            self._answer(call, None, CallsClosed("the backend closed during the call"))


class Waiter:
    """What a blocking ``run`` waits on: the outcome handed to it, once."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._outcome: Callable[[], Any] | None = None

    def __call__(self, outcome: Callable[[], Any]) -> None:
        self._outcome = outcome
        self._event.set()

    def result(self) -> Any:
        """The outcome's value (or what it raises), once it is in."""
        self._event.wait()
        assert self._outcome is not None
        return self._outcome()

