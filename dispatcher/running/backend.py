"""The backend contract: what the scheduler and the commands may assume of a backend.

A backend (local CPUs, SSH hosts, a Ray cluster) provides worker *slots*, one per worker CPU,
each running one job at a time on its own agent.  Everything else (queueing, retries, back-off,
quarantine, measurement reuse) is the scheduler's and the measurement service's, the same for
every backend.

A backend lives in its own module, which defines ``BACKEND``, a ``BackendSpec``: how to read
its config section, and how to start it.  ``MODULES`` maps backend names to those modules; a
module is imported only when a config names its backend (paramiko and ray are slow to import).

Losses are told apart by type, not by attributes: ``WorkerLost`` means the job did not fail on
its own merits (run it again elsewhere), ``PermanentLoss`` that retrying this slot cannot help
(quarantine it at once).  Any other exception from ``Slot.run`` is the job's own failure.
"""
from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

from dispatcher.build.toolchain import Compiler
from dispatcher.core.jobs import RunJob
from dispatcher.core.records import RunResult
from dispatcher.core.validation import Reader
from dispatcher.running.agent_client import AgentError, WorkerLost

if TYPE_CHECKING:
    from dispatcher.build.remote import Builder

__all__ = ["AgentError", "Answer", "AnsweringSlot", "Backend", "BackendSpec",
           "BackendUnavailable", "MODULES", "PermanentLoss", "Slot", "WorkerLost",
           "backend_spec", "run_by_start"]


class PermanentLoss(WorkerLost):
    """A loss that retrying will not cure (an untrusted host key, no python3, a CPU the
    worker does not have): the slot is taken out of service at once."""


class BackendUnavailable(RuntimeError):
    """The backend cannot start at all (no cluster at that address, no token, no slot
    offered): nothing to retry.  The message is one line, for the user."""


class Slot(Protocol):
    """One CPU of one worker: runs jobs one at a time on its agent."""

    name: str  # unique, e.g. local/cpu1, ssh/h0/cpu2
    worker_class: str  # slots of one class are interchangeable for measurements
    cpu: int
    depth: int  # jobs the scheduler may hand it at once (it queues them on its worker)

    def run(self, job: RunJob) -> RunResult:
        """Run ``job``; WorkerLost if the worker went away, AgentError if it was refused."""

    def probe(self) -> None:
        """Make sure the worker answers (after a loss); WorkerLost if not."""

    def close(self) -> None: ...


# What a started job comes to: its result, or the exception ``Slot.run`` would have raised.
Answer = Callable[["RunResult | BaseException"], None]


@runtime_checkable
class AnsweringSlot(Slot, Protocol):
    """A slot that starts a job and answers later, on a thread of its backend's.  The
    scheduler then keeps no thread per job a slot may hold: hundreds of slots (Ray actors,
    simulated CPUs) cost it no more threads than one.

    ``start`` returns at once (it may block briefly, never for a job's duration: a slot whose
    worker must first be started does that on a thread of its own).  ``answer`` is called
    exactly once for each start, with the result or with the exception ``run`` would have
    raised (WorkerLost, AgentError, the job's own failure), never from inside ``start``, and
    it may start the slot's next job: the backend's thread must not hold a lock of its own
    while it answers.  Closing the slot answers every job in flight (with WorkerLost) soon."""

    def start(self, job: RunJob, answer: Answer) -> None: ...


def run_by_start(slot: AnsweringSlot, job: RunJob) -> RunResult:
    """``run`` for a slot that answers by itself: its job started, its answer waited for."""
    answered = threading.Event()
    outcome: list[RunResult | BaseException] = []

    def answer(given: RunResult | BaseException) -> None:
        outcome.append(given)
        answered.set()

    slot.start(job, answer)
    answered.wait()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


class Backend(Protocol):
    @property
    def slots(self) -> Sequence[Slot]: ...

    def remote_builder(self) -> Builder | None:
        """Where compiles run instead of the master (None: on the master)."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class BackendContext:
    """What starting a backend may use besides its own config section."""

    store_root: Path
    worker_cache: Path  # where binaries for agents on this machine go, one file per sha256
    # The session measures in an exact metric: a backend may add slots of ``EXACT_CLASS``
    # where timed runs must not go (the local backend: the CPUs the compiles use)
    exact: bool = False


# The class of slots that run exact (counted) jobs only: exact jobs go to any slot of any
# class (their counts are the same everywhere), timed jobs only to their own class's slots.
EXACT_CLASS = "exact-only"


@dataclass(frozen=True)
class BackendSpec:
    """How a backend is configured and started.

    ``parse(section, reader)``: its config section (a mapping, maybe empty) -> its settings;
    ``reader`` (a ``dispatcher.core.validation.Reader`` raising ConfigErrors) makes the
    one-line errors naming the file and key, and checks common values.
    ``worker_classes(settings)``: the classes its slots will have, without starting it.
    ``master_cpus(settings)``: the CPUs of this machine left to the master (its compiles),
    or None when the backend takes none of them.
    ``start(settings, context)``: the running backend; BackendUnavailable (one line) if it
    cannot start.
    ``toolchain(settings)``: the compiler of a backend that brings its own (the simulated
    one's stands in for the patched compiler); None: the patched compiler.
    """

    name: str
    parse: Callable[[dict, Reader], Any]
    worker_classes: Callable[[Any], list[str]]
    master_cpus: Callable[[Any], frozenset[int] | None]
    start: Callable[[Any, BackendContext], Backend]
    toolchain: Callable[[Any], Compiler] | None = None


MODULES: Mapping[str, str] = MappingProxyType({  # fixed: a new backend is a new line here
    "local": "dispatcher.running.local", "ssh": "dispatcher.running.ssh",
    "ray": "dispatcher.running.ray.cluster",
    "simulated": "dispatcher.running.simulated.spec"})


def backend_spec(name: str) -> BackendSpec:
    """The spec of backend ``name``, importing its module on first use (Python keeps it
    imported); KeyError if none."""
    return importlib.import_module(MODULES[name]).BACKEND
