"""The exact metric on the master: its run jobs, and whether every worker can count.

An exact comparison runs each binary once under Valgrind's cachegrind
(``workers/agent/cachegrind.py``) instead of timing pairs of runs: its counts depend on the
binary and its input only, so they need no quiet CPU and no interval (docs/measurement.md,
"Exact metrics").  A worker without valgrind cannot serve one: a session measuring in an
exact metric asks every slot's agent at start (``check_workers``) and stops with one line
naming the first that cannot, rather than failing its runs one by one later.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from dispatcher.core.jobs import RunJob
from dispatcher.running.agent_client import WorkerLost
from dispatcher.running.backend import BackendUnavailable
from workers.agent import cachegrind

#: What every exact count depends on besides binary and input: the tool and its fixed cache
#: geometry.  The agent is the master's own (its version is checked at hello), so each worker
#: reports this same identity; the store keys exact results by it.
IDENTITY = cachegrind.identity()
#: How much slower a run is under cachegrind than natively (its timeout is scaled by it).
SLOWDOWN = 100


class ExactUnavailable(BackendUnavailable):
    """A worker cannot run exact measurements (no valgrind there): one line naming it."""


def exact_job(job: RunJob, identity: str = IDENTITY) -> RunJob:
    """``job`` counted under cachegrind: one run, no perf counters or random layout (neither
    applies), a timeout for cachegrind's pace, keyed by the exact ``identity`` (the workers',
    ``check_workers``)."""
    return replace(job, runs=1, metric="cachegrind", exact_identity=identity, perf=False,
                   aslr=False, profile_period_ns=0, timeout=job.timeout * SLOWDOWN)


def check_workers(slots: Sequence[Any], metric: str) -> str:
    """Ask each slot's agent (``hello`` with ``exact: true``) whether it can count ->
    the identity of their counts (``IDENTITY`` and the valgrind version they run: another
    version may count differently, so its results are stored apart).  ExactUnavailable (one
    line naming the slot and its host) for the first that cannot, or for workers running
    different valgrind versions (one session's counts must be comparable), or for a slot that
    cannot be asked (a simulated backend's: it cannot count).  A slot whose worker is lost
    (a CPU another master holds) is left to the scheduler, which takes lost slots out of
    service."""
    versions: dict[str, str] = {}  # valgrind version -> the first slot that runs it
    for slot in slots:
        ask = getattr(slot, "exact_info", None)
        if ask is None:  # a simulated backend's: it times, it cannot count
            raise ExactUnavailable(f"{slot.name}: cannot measure in {metric}: its backend "
                                   "does not run cachegrind")
        try:
            info, host = ask()
        except WorkerLost:  # lost before it could say: the scheduler deals with it as ever
            continue
        where = f"{slot.name} (host {host})" if host else slot.name
        if not info or not info.get("available"):
            why = (info or {}).get("reason") or "its agent does not report exact measurements"
            raise ExactUnavailable(f"{where}: cannot measure in {metric}: {why}")
        if info.get("identity") != IDENTITY:
            raise ExactUnavailable(
                f"{where}: its exact counts are {info.get('identity')}, the master's "
                f"{IDENTITY}")
        versions.setdefault(str(info.get("version")), where)
        if len(versions) > 1:
            (v1, w1), (v2, w2) = list(versions.items())[:2]
            raise ExactUnavailable(f"{w2}: runs valgrind {v2} where {w1} runs {v1}: their "
                                   "counts may differ (install one version everywhere)")
    return f"{IDENTITY} valgrind-{next(iter(versions))}" if versions else IDENTITY
