"""The agent: answers requests, and pipelines runs so that a CPU idles as little as possible.

One agent per worker CPU slot, one binary at a time.  ``handle`` answers one request;
``serve_fd`` reads requests as they come and, while a run goes on, finishes the previous run
(counters, output check, response) and prepares the next queued one, on a CPU of its own
mask other than the run's.  Between two runs on a CPU there is then only: reap, arm the
watchdog, start the clock, open the gate.  With no other CPU in the mask, or a spawner that
cannot prepare ahead (gated, direct), every step happens between runs.
"""
from __future__ import annotations

import collections
import json
import os
import platform
import select
import socket
import sys
import threading
from collections.abc import Iterable
from typing import Any, Callable

from .cache import BinaryCache
from .perf import DEFAULT_PERF_EVENTS
from .proc import FILE_SIZE_LIMIT, pidfd_open
from .protocol import (
    UNKNOWN_OP,
    RequestError,
    Requests,
    check_sha,
    error_response,
    internal_error,
    parse_run,
)
from .runner import Plan, Run, Runner
from .version import agent_version

SPAWN_METHODS = ("auto", "forkserver", "gated", "direct")
# Fields whose JSON type equality alone does not pin down (1 == 1.0 == true in Python).
_TYPED_FIELDS = ("runs", "cpu", "timeout", "perf", "aslr")


_EXITED, _REQUEST, _HANGUP = "exited", "request", "hangup"
_POLLRDHUP = getattr(select, "POLLRDHUP", 0x2000)
_HUNG_UP = select.POLLHUP | select.POLLERR | select.POLLNVAL | _POLLRDHUP
# Without a pidfd (Linux < 5.3), how often a run's exit is checked while watching the master.
_EXIT_CHECK_S = 0.2


def await_run(run: Run, fd: int, requests: bool) -> str:
    """Wait until the launched ``run`` exits (_EXITED), the master's stream ``fd`` hangs up or
    ends (_HANGUP: the master is gone), or, if ``requests``, a request arrives (_REQUEST).

    Without ``requests`` only a hang-up wakes the agent, so a master that writes ahead
    does not (nothing is read until the run ends).  A pipe reports POLLHUP once its last
    writer is gone, a socket POLLRDHUP once its peer shut down writing: either way within
    one wake-up of the master's death, so its running binary is killed at once."""
    poller = select.poll()
    poller.register(fd, _POLLRDHUP | (select.POLLIN if requests else 0))
    pidfd = run.pidfd
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    while True:
        events = dict(poller.poll(None if pidfd is not None else _EXIT_CHECK_S * 1000))
        if pidfd is not None and pidfd in events:
            return _EXITED
        if pidfd is None and run.pid is not None and os.waitid(
                os.P_PID, run.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return _EXITED
        got = events.get(fd, 0)
        if got & _HUNG_UP:
            return _HANGUP
        if got & select.POLLIN:
            return _REQUEST


class Agent:
    """The request handler; usable in-process (e.g. by a Ray actor) or via ``__main__``.

    ``spawn``: "auto" (the fork server when possible, else gated sh, else direct),
    "forkserver", "gated" or "direct" (see ``spawn``).  ``own_process``: the agent is the
    only user of this process (``__main__``), so what a run leaves running is killed when it
    ends; in another program's process only the run's process group is.
    """

    def __init__(self, cache_dir: str, worker_class: str | None = None,
                 perf_events: Iterable[str] = DEFAULT_PERF_EVENTS, spawn: str = "auto",
                 own_process: bool = False):
        if spawn not in SPAWN_METHODS:
            raise ValueError("spawn must be auto, forkserver, gated or direct")
        self.cache = BinaryCache(cache_dir)
        self.worker_class = worker_class
        self.runner = Runner(perf_events, spawn, own_process)
        self._last_plan: tuple[dict, Plan] | None = None  # the last run request checked
        self._lock = threading.Lock()  # one request at a time per Agent
        self._version: str | None = None
        self.closed = False

    def close(self) -> None:
        self.closed = True
        self.runner.close()

    # ----------------------------------------------------------------- one request

    def handle(self, request: Any) -> dict:
        """Answer one request (a decoded JSON value); never raises for a bad request."""
        req_id = request.get("id") if isinstance(request, dict) else None
        try:
            if not isinstance(request, dict):
                raise RequestError("request must be a JSON object")
            op = request.get("op")
            handler = self._OPS.get(op) if isinstance(op, str) else None
            if handler is None:
                raise RequestError("unknown op %s" % json.dumps(op), UNKNOWN_OP)
            with self._lock:
                response = handler(self, request)
        except RequestError as e:
            response = error_response(e.code, e)
        except Exception as e:  # never die from a request
            sys.stderr.write("agent: internal error: %s: %s\n" % (type(e).__name__, e))
            response = internal_error(e)
        out = {"id": req_id}
        out.update(response)
        return out

    def perf_info(self) -> dict:
        return self.runner.perf_info()

    def spawn_info(self) -> dict:
        return self.runner.spawner.info()

    def _op_hello(self, request: dict) -> dict:
        if self._version is None:
            try:
                self._version = agent_version()
            except OSError:
                self._version = "unknown"
        return {
            "ok": True,
            "agent_version": self._version,
            "python": platform.python_version(),
            "hostname": socket.gethostname(),
            "cpus": sorted(self.runner.cpus),
            "perf": self.perf_info(),
            "spawn": self.spawn_info(),
            "worker_class": self.worker_class,
            # runs start without address-space randomisation unless this says why not
            "aslr_error": self.runner.aslr_error,
            # what a run leaves running is killed when it ends unless this says why not
            "strays_error": self.runner.strays_error,
            # a run's stdout, stderr and any file it writes stop at this size (RLIMIT_FSIZE)
            "file_size_limit": FILE_SIZE_LIMIT,
            # asked for: whether exact (cachegrind) runs work here (valgrind probed once)
            **({"exact": self.runner.exact_info()} if request.get("exact") is True else {}),
        }

    def _op_has(self, request: dict) -> dict:
        return {"ok": True, "present": self.cache.has(check_sha(request.get("sha256")))}

    def _op_shutdown(self, request: dict) -> dict:
        self.closed = True
        return {"ok": True}

    def _op_run(self, request: dict) -> dict:
        return self.runner.run_all(self._plan_run(request))

    _OPS: dict[str, Callable[[Agent, dict], dict]] = {
        "hello": _op_hello, "has": _op_has, "run": _op_run, "shutdown": _op_shutdown}

    def _plan_run(self, request: dict) -> Plan:
        """Check a run request and get everything its runs share (RequestError).

        A request equal to the last one checked (ids aside; the same JSON types) reuses its
        checks and its environment: only the binary is verified again (a stat, and a rehash
        if the file changed)."""
        key = dict(request)
        key.pop("id", None)
        last = self._last_plan
        if last is not None and key == last[0] and all(
                type(key.get(f)) is type(last[0].get(f)) for f in _TYPED_FIELDS):
            proto = last[1]
            if self.cache.verify(proto.sha) == proto.binary:
                return proto.copy(request.get("id"))
        self._last_plan = None
        checked = parse_run(request, self.runner.cpus)
        binary = self.cache.verify(checked.sha)
        plan = self.runner.plan(request.get("id"), checked, binary)
        self._last_plan = (key, plan.copy(None))
        return plan

    # ----------------------------------------------------------------- a stream of requests

    def _pipelinable(self, item: tuple[str, Any]) -> bool:
        """Whether queued ``item`` is a run request the pipeline can take."""
        if item[0] != "req" or not isinstance(item[1], dict) or item[1].get("op") != "run":
            return False
        try:
            return self.runner.spawner is not None
        except RequestError:
            return False  # handle() reports it

    def serve_fd(self, fd: int, emit: Callable[[dict], None]) -> None:
        """Answer the requests read from ``fd`` through ``emit(response)``, in order, until
        EOF or shutdown, pipelining runs (see the module's docstring).  Other requests wait
        until no run is in progress."""
        runner = self.runner
        reqs = Requests(fd)
        outq: collections.deque[list[Any]] = collections.deque()  # [response, done], in order
        current: Plan | None = None  # the plan whose runs are being started
        again: collections.deque[Plan] = collections.deque()  # earlier plans owed a run

        def flush() -> None:
            while outq and outq[0][1]:
                emit(outq.popleft()[0])

        def next_plan() -> Plan | None:
            """The plan of the next run to start, or None (nothing queued that can run)."""
            nonlocal current
            if again:  # a disturbed run of an earlier request is made again first
                owed = again.popleft()
                owed.started += 1
                return owed
            plan = current
            while plan is None or plan.started >= plan.target:
                current = plan = None
                if not reqs.items or not self._pipelinable(reqs.items[0]):
                    return None
                request = reqs.items.popleft()[1]
                entry: list[Any] = [{"id": request.get("id")}, False]
                outq.append(entry)
                try:
                    with self._lock:
                        plan = self._plan_run(request)
                except RequestError as e:
                    entry[0].update(error_response(e.code, e))
                    entry[1] = True
                    continue
                except Exception as e:  # never die from a request
                    sys.stderr.write("agent: internal error: %s: %s\n" % (type(e).__name__, e))
                    entry[0].update(internal_error(e))
                    entry[1] = True
                    continue
                plan.entry = entry
                current = plan
            plan.started += 1
            return plan

        finished: list[Run] = []  # runs waiting for their records, in start order

        def finish_all() -> None:
            while finished:
                run = finished.pop(0)
                runner.finish(run)
                plan = run.plan
                if plan.done:
                    assert plan.entry is not None
                    plan.entry[0].update(plan.response())
                    plan.entry[1] = True
                elif (plan is not current and plan.started < plan.target
                      and plan not in again):
                    again.append(plan)

        pinned: frozenset[int] | None = None
        prepared: Run | None = None
        running: Run | None = None
        try:
            while True:
                if running is None:
                    plan = prepared.plan if prepared is not None else next_plan()
                    if plan is None:  # nothing to run now
                        finish_all()
                        flush()
                        if again:
                            continue
                        if reqs.items:  # a request that is not a pipelined run
                            kind, value = reqs.items.popleft()
                            emit(self.handle(value) if kind == "req" else value)
                            if self.closed:
                                return
                            continue
                        if reqs.eof or self.closed:
                            return
                        reqs.fill(None)
                        continue
                    overlap = runner.overlap_cpus(plan)
                    if overlap and pinned != overlap:  # the agent keeps off the run's CPU
                        self._pin_self(overlap)
                        pinned = overlap
                    run, prepared = prepared, None
                    if run is None:
                        run = runner.prepare(plan, overlap or {plan.cpu})
                    if not overlap:  # nothing else may happen during the run
                        finish_all()
                        flush()
                    if run.failure is not None:
                        finished.append(run)
                        continue
                    if run.pid is not None:
                        run.pidfd = pidfd_open(run.pid)
                    if not runner.launch(run):
                        finished.append(run)
                        continue
                    running = run
                    continue
                overlap = runner.overlap_cpus(running.plan)
                if overlap:
                    finish_all()
                    flush()
                    if prepared is None:
                        reqs.fill(0)
                        if reqs.eof:
                            return  # the master is gone: the run is killed (finally)
                        plan = next_plan()
                        if plan is not None:
                            prepared = runner.prepare(plan, overlap)
                if running.pidfd is None and running.pid is not None:  # direct: started now
                    running.pidfd = pidfd_open(running.pid)
                woke = await_run(running, fd, bool(overlap) and prepared is None)
                if woke == _REQUEST:
                    continue  # a request came: prepare it while the run goes on
                if woke == _HANGUP:
                    return  # the master is gone: the run is killed (finally)
                runner.wait(running)
                finished.append(running)
                running = None
        finally:
            for run in (running, prepared):
                if run is not None:
                    runner.disarm()
                    runner.abort(run)

    def _pin_self(self, cpus: frozenset[int]) -> None:
        """This thread and the watchdog onto ``cpus`` (they must stay off the run's CPU)."""
        os.sched_setaffinity(0, cpus)
        thread = self.runner.watchdog_thread
        tid = getattr(thread, "native_id", None)
        if tid is not None:
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:
                pass

