"""Simulated slots hosted by Ray actors (config section ``simulated.ray``).

The same simulated slots as the local simulated backend (``backend.SimulatedSlot``: the same
model, the same draws for the same slot name), but each lives in an actor of a Ray cluster, so
the master pays what it pays on the Ray backend for every job: a remote call, the binary
shipped through the object store, the result pickled back.  For benches of the master over
Ray at scale (bench/search_sim --ray); never for data.

``actors`` actor processes host the slots, slot i on actor ``i mod actors``; each actor
(``SlotHost``) rebuilds its own ``World`` and slots from the (picklable) ``SimulatedConfig``
and runs up to ``depth`` jobs per slot at once (``max_concurrency``: depth x its slots, and a
little more for the master's own calls).  Compiles stay on the master (the simulated builder,
as in the local simulated backend).

Binaries: the master ``ray.put``s a binary once (the last few are kept) and sends its
reference only to an actor not known to have it; the actor writes it into its own temporary
cache, one file per sha256, and its slots read it there, as an agent reads its cache.

Unlike the Ray backend's actor (``dispatcher.running.ray.actor``), whose code travels by value
and needs nothing of ours on the nodes, this actor imports the simulation: the nodes need this
project installed (the master checks at start that their model is the master's).

Faults: an actor that dies or stops answering -> ``WorkerLost`` for every job in flight on its
slots (the scheduler runs them again elsewhere); the next probe of one of its slots starts a
new actor for all of them.  A simulated loss (``noise.lost``) is the slot's ``WorkerLost``, as
locally.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from dispatcher.core.files import owned_prefix, sweep_orphans
from dispatcher.core.jobs import RunJob
from dispatcher.core.records import RunResult
from dispatcher.running.agent_client import AgentError, WorkerLost
from dispatcher.running.backend import Answer, BackendUnavailable, run_by_start
from dispatcher.running.ray.replies import Outcome, Replies, reply_of
from dispatcher.running.ray.replies import one_line as _one_line
from dispatcher.running.simulated.backend import (
    BINARY_FORMAT,
    EXACT_INFO,
    SimulatedBuilder,
    SimulatedConfig,
    SimulatedSlot,
    World,
)
from dispatcher.running.simulated.ray_settings import RayHosts, parse_section

NOT_IN_CACHE = "not_in_cache"  # the agent's code (workers/agent/protocol.py)
CONTROL_CALLS = 2  # an actor's threads beyond its slots' jobs: hello, stats, close
JOB_SLACK_S = 30.0
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
SIM_HOST_PREFIX = "inlining-sim-host-"  # an actor's binary cache, named by its pid


# --------------------------------------------------------------------------- on the actor

class SlotHost:
    """The body of one actor: the simulated slots ``indices``, with a World of their own and
    a binary cache in a temporary directory."""

    def __init__(self, config: SimulatedConfig, indices: list[int]):
        self.world = World(config)
        self.slots = {i: SimulatedSlot(i, self.world, config.worker_class, config.depth)
                      for i in indices}
        sweep_orphans(SIM_HOST_PREFIX)  # what actors killed before left
        self.cache = Path(tempfile.mkdtemp(prefix=owned_prefix(SIM_HOST_PREFIX)))
        self.jobs = 0  # jobs answered (a simulated loss included)
        self.fetched = 0  # binaries taken from the object store
        self._lock = threading.Lock()
        self._install_lock = threading.Lock()

    def hello(self) -> dict:
        return {"pid": os.getpid(), "model": self.world.model.identity(),
                "format": BINARY_FORMAT, "slots": sorted(self.slots)}

    def run(self, index: int, job: RunJob, binary: Any = None) -> tuple:
        """One job on slot ``index`` -> ``("ok", RunResult)``, ``("lost", why)`` (the slot's
        simulated loss) or ``("refused", why, code)``.  ``binary``: None, or ``[ObjectRef]``
        of the binary's bytes (nested: fetched only when this actor lacks it)."""
        if not _SHA256_RE.match(job.sha256):  # a file name in the cache: never a path
            return ("refused", f"sim/cpu{index}: {job.sha256[:80]!r} is not a sha256",
                    "bad_request")
        path = self.cache / job.sha256
        try:
            if binary and not path.exists():
                with self._install_lock:  # once per binary, whichever job brings it first
                    if not path.exists():
                        self._install(job.sha256, path, binary[0])
            if not path.exists():
                return ("refused", f"sim/cpu{index}: binary {job.sha256[:12]} is not in the "
                        "actor's cache", NOT_IN_CACHE)
            result = self.slots[index].run(dataclasses.replace(job, binary=path))
        except WorkerLost as exc:
            return ("lost", str(exc))
        except AgentError as exc:
            return ("refused", str(exc), exc.code)
        finally:
            with self._lock:
                self.jobs += 1
        return ("ok", result)

    def _install(self, sha256: str, path: Path, ref: Any) -> None:
        import ray
        data = ray.get(ref)
        if hashlib.sha256(data).hexdigest() != sha256:
            raise AgentError(f"binary {sha256[:12]} arrived damaged from the object store",
                             code="checksum_mismatch")
        tmp = path.with_name(f"{sha256}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        with self._lock:
            self.fetched += 1

    def stats(self) -> dict:
        return {"pid": os.getpid(), "jobs": self.jobs, "fetched": self.fetched,
                "cpu_s": time.process_time(), "sim_cpu_s": self.world.cpu_s}

    def close(self) -> bool:
        for slot in self.slots.values():
            slot.close()
        shutil.rmtree(self.cache, ignore_errors=True)
        return True


# --------------------------------------------------------------------------- on the master

class Incarnation:
    """One life of a host's actor: its handle, its pid, the binaries it is known to have."""

    def __init__(self, actor: Any, pid: int):
        self.actor = actor
        self.pid = pid
        self.cached: set[str] = set()
        self.lock = threading.Lock()


class Host:
    """One actor and the slots it hosts, as the master sees it: started again (on a probe of
    one of its slots) after it was lost."""

    def __init__(self, backend: RayHostedBackend, number: int, indices: list[int]):
        self.backend = backend
        self.name = f"sim-host{number}"
        self.indices = indices
        self._life: Incarnation | None = None
        self._lock = threading.Lock()  # guards _life
        self._start_lock = threading.Lock()  # held while an actor starts
        self.starts = 0

    def launch(self) -> tuple[Any, Any]:
        """A new actor and the reference of its hello (not waited for)."""
        b = self.backend
        actor = b.actor_class.options(
            num_cpus=0, max_restarts=0, scheduling_strategy="SPREAD",
            max_concurrency=b.config.depth * len(self.indices) + CONTROL_CALLS,
        ).remote(b.actor_config, self.indices)
        return actor, actor.hello.remote()

    def adopt(self, actor: Any, hello_ref: Any, timeout: float) -> Incarnation:
        """The started actor, once its hello says it is the master's simulation; WorkerLost
        (one line) if it did not start or is not."""
        ray = self.backend.ray
        try:
            hello = ray.get(hello_ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            self._kill(actor)
            raise WorkerLost(f"{self.name}: the actor did not start within {timeout:.0f} s") \
                from None
        except ray.exceptions.RayError as exc:
            self._kill(actor)
            raise WorkerLost(f"{self.name}: the actor did not start: {_one_line(exc)}") \
                from None
        want = (self.backend.world.model.identity(), BINARY_FORMAT)
        if (hello.get("model"), hello.get("format")) != want:
            self._kill(actor)
            raise WorkerLost(f"{self.name}: the actor's simulation is not the master's (another "
                             "version of this project on the node?)")
        life = Incarnation(actor, int(hello["pid"]))
        with self._lock:
            self._life = life
            self.starts += 1
        return life

    def current(self) -> Incarnation | None:
        """Its actor's life now, None while none is up."""
        with self._lock:
            return self._life

    def ensure(self) -> Incarnation:
        with self._lock:
            if self._life is not None:
                return self._life
        with self._start_lock:  # one new actor for all its slots
            with self._lock:
                if self._life is not None:
                    return self._life
            actor, ref = self.launch()
            return self.adopt(actor, ref, self.backend.hosts.start_timeout)

    def drop(self, life: Incarnation) -> None:
        """Forget a broken actor (once, whichever of its slots' jobs notices first)."""
        with self._lock:
            if self._life is not life:
                return
            self._life = None
        self._kill(life.actor)

    def _kill(self, actor: Any) -> None:
        try:
            self.backend.ray.kill(actor, no_restart=True)
        except Exception:  # it is gone either way
            pass

    def stats(self, timeout: float = 30) -> dict | None:
        with self._lock:
            life = self._life
        if life is None:
            return None
        try:
            return self.backend.ray.get(life.actor.stats.remote(), timeout=timeout)
        except Exception:  # lost meanwhile: no figures
            return None

    def close(self) -> None:
        with self._lock:
            life, self._life = self._life, None
        if life is None:
            return
        try:
            self.backend.ray.get(life.actor.close.remote(), timeout=10)
        except Exception:  # killed below either way
            pass
        self._kill(life.actor)


class HostedSlot:
    """Simulated slot ``index`` (named as the local simulated backend names it, so its draws
    are the same), run by its host's actor.  It answers by itself (``AnsweringSlot``): a job
    is sent to the actor and its reply taken on the backend's one replies thread."""

    def __init__(self, host: Host, index: int, worker_class: str, depth: int):
        self.host = host
        self.cpu = index
        self.name = f"sim/cpu{index}"
        self.worker_class = worker_class
        self.depth = depth
        self._closed = False

    def run(self, job: RunJob) -> RunResult:
        return run_by_start(self, job)

    def start(self, job: RunJob, answer: Answer) -> None:
        if self._closed:
            raise WorkerLost(f"{self.name}: closed")
        life = self.host.current()
        if life is None:  # its actor starts first, on a thread of its own (it may take long)
            threading.Thread(target=self._start_on_new_actor, args=(job, answer), daemon=True,
                             name=f"slot {self.name} actor start").start()
            return
        self._send(life, job, answer, 1)

    def _start_on_new_actor(self, job: RunJob, answer: Answer) -> None:
        try:
            self._send(self.host.ensure(), job, answer, 1)
        except BaseException as exc:  # as run would raise it
            answer(exc)

    def _send(self, life: Incarnation, job: RunJob, answer: Answer, attempt: int) -> None:
        timeout = self.depth * job.runs * job.timeout * 1.5 + JOB_SLACK_S
        with life.lock:
            ship = job.sha256 not in life.cached
        binary = [self.host.backend.binary_ref(job.sha256, job.binary)] if ship else None
        ref = life.actor.run.remote(self.cpu, job, binary)
        self.host.backend.replies.expect(ref, timeout, self, functools.partial(
            self._replied, life, job, answer, attempt, ship))

    def _replied(self, life: Incarnation, job: RunJob, answer: Answer, attempt: int,
                 ship: bool, outcome: Outcome) -> None:
        """The actor's reply (on the replies thread): the job's answer, or the job sent again
        with its binary (the actor's cache lost it)."""
        try:
            reply = reply_of(outcome, self.host.backend.ray, self.name, f"actor {self.host.name}",
                             lambda: self.host.drop(life))
        except BaseException as exc:
            answer(exc)
            return
        if reply[0] == "ok":
            if ship:
                with life.lock:
                    life.cached.add(job.sha256)
            answer(reply[1])
        elif reply[0] == "lost":
            answer(WorkerLost(reply[1]))
        elif attempt == 1 and reply[2] == NOT_IN_CACHE:
            with life.lock:
                life.cached.discard(job.sha256)
            try:
                self._send(life, job, answer, 2)
            except BaseException as exc:
                answer(exc)
        else:
            answer(AgentError(reply[1], code=reply[2]))

    def exact_info(self) -> tuple[dict, str]:
        """Its actor's slot counts as the local simulated slot does (the same model, checked
        when the actor started): the same answer, once the actor is up."""
        if self._closed:
            raise WorkerLost(f"{self.name}: closed")
        self.host.ensure()
        return dict(EXACT_INFO), self.host.name

    def probe(self) -> None:
        """Start the host's actor again if it was lost; WorkerLost if it does not start."""
        if self._closed:
            raise WorkerLost(f"{self.name}: closed")
        self.host.ensure()

    def close(self) -> None:
        self._closed = True
        self.host.backend.replies.abandon(self, WorkerLost(f"{self.name}: closed"))


class RayHostedBackend:
    """The simulated backend whose slots live in Ray actors; its builder (and the World the
    builder reads programs into) stays on the master."""

    def __init__(self, config: SimulatedConfig):
        from dispatcher.running.ray.cluster import BinaryRefs, RayConfig, connect
        assert config.ray is not None
        self.config = config
        self.hosts: RayHosts = config.ray
        self.world = World(config)  # the master's: the builder's programs and shapes
        self.builder = SimulatedBuilder(self.world, config.compile_jobs)
        # what an actor rebuilds (its slots; the builds are the master's)
        self.actor_config = dataclasses.replace(config, ray=None, build_cpus=())
        self._closed = False
        self.ray = connect(RayConfig(address=self.hosts.address, auth=self.hosts.auth,
                                     token_file=self.hosts.token_file))
        self._binaries = BinaryRefs(self.ray)
        self.replies = Replies()  # of every slot's jobs
        try:
            self.actor_class = self.ray.remote(SlotHost)
            n = self.hosts.actors
            self.host_list = [Host(self, h, list(range(h, config.slots, n))) for h in range(n)]
            launched = [host.launch() for host in self.host_list]  # all at once
            deadline = time.monotonic() + self.hosts.start_timeout
            for host, (actor, ref) in zip(self.host_list, launched):
                try:
                    host.adopt(actor, ref, max(deadline - time.monotonic(), 1.0))
                except WorkerLost as exc:
                    raise BackendUnavailable(f"simulated.ray: {exc}") from None
            self.slots = [HostedSlot(self.host_list[i % n], i, config.worker_class,
                                     config.depth) for i in range(config.slots)]
        except BaseException:
            self.close()
            raise

    def binary_ref(self, sha256: str, path: Path) -> Any:
        """The object holding the binary ``sha256``, put into the store once."""
        return self._binaries.ref(sha256, path)

    def remote_builder(self) -> SimulatedBuilder:
        """Every compile is simulated, on the master."""
        return self.builder

    def host_stats(self) -> list[dict | None]:
        """Each host's figures now (pid, jobs, binaries fetched, the actor process's CPU
        seconds), None for a host that is down."""
        return [host.stats() for host in self.host_list]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            for slot in getattr(self, "slots", ()):
                slot.close()
            for host in getattr(self, "host_list", ()):
                host.close()
        finally:
            self.builder.close()
            self.replies.close()
            self._binaries.clear()
            self.ray.shutdown()


__all__ = ["Host", "HostedSlot", "RayHostedBackend", "RayHosts", "SlotHost", "parse_section"]
