"""The local backend: one worker slot per CPU of this machine, each slot an agent process.

What every command uses when no config says otherwise (config section ``local:``, with
``cpus``: ``auto`` or a list, and ``worker_class``).  Binaries reach the agents through a
cache directory shared by the local slots, one file per sha256.

A CPU belongs to one agent at a time on this machine, whichever master started it: each
agent holds a kernel lock (``flock``) on ``<lock_dir>/cpu<N>.lock`` for its life, in a
directory every user of the machine shares (``/tmp/inlining-orchestrator-locks`` by default,
sticky and world-writable like /tmp; ``local.lock_dir`` or ``$INLINING_ORCHESTRATOR_LOCK_DIR``
to change it).  A second master's agent waits up to ``local.lock_wait`` s for it, then the
slot is lost for good (``PermanentLoss``) with one line naming the CPU and the holder.  The
lock dies with its agent, so a master that crashed leaves nothing that blocks the next one.
"""
from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from dispatcher.core.jobs import RunJob
from dispatcher.core.records import RunResult
from dispatcher.running.agent_client import (
    LocalAgent,
    SlotLockBusy,
    WorkerLost,
    encode_request,
    result_from_response,
)
from dispatcher.running.backend import EXACT_CLASS, BackendContext, BackendSpec, PermanentLoss
from workers.agent.protocol import (
    CPU_LOCK_NAME,
    DEFAULT_LOCK_DIR,
    DEFAULT_LOCK_WAIT_S,
    LOCK_DIR_ENV,
)

if TYPE_CHECKING:
    from dispatcher.core.validation import Reader


# The CPUs this process could use when keep_master_off confined the master (None: not done).
_confined_from: frozenset[int] | None = None


def agent_cpus() -> frozenset[int]:
    """The CPUs local agents may use: every CPU this process may use, read when asked, and
    once the master has confined its own threads (``keep_master_off``) to the CPUs left over
    from the workers, still those it could use before."""
    if _confined_from is not None:
        return _confined_from
    return frozenset(os.sched_getaffinity(0))


def default_lock_dir() -> Path:
    return Path(os.environ.get(LOCK_DIR_ENV) or DEFAULT_LOCK_DIR)


def cpu_lock(lock_dir: Path, cpu: int) -> Path:
    """The lock file of ``cpu``, its directory made if need be: sticky and writable by every
    user (mode 1777, as /tmp) when this process creates it.  OSError if it cannot be."""
    if not lock_dir.is_dir():
        try:
            lock_dir.mkdir(parents=True)
        except FileExistsError:
            pass
        else:
            os.chmod(lock_dir, 0o1777)  # mkdir's mode is cut by the umask
    return lock_dir / (CPU_LOCK_NAME % cpu)


def keep_master_off(worker_cpus: tuple[int, ...]) -> None:
    """Confine this thread, and the threads it starts from now on, to the CPUs not given to
    local workers: the master's bookkeeping must not wake up on a CPU being timed."""
    global _confined_from
    cpus = agent_cpus()
    rest = cpus - set(worker_cpus)
    if rest:
        _confined_from = cpus
        os.sched_setaffinity(0, rest)


def install_binary(cache_dir: Path, sha256: str, source: Path) -> Path:
    """Put a binary into an agent cache under its sha256, atomically (the agent verifies it)."""
    dest = cache_dir / sha256
    if dest.exists():
        return dest
    tmp = cache_dir / f".{sha256}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
        os.chmod(tmp, 0o755)
    os.replace(tmp, dest)
    try:  # a no-op if another thread installed the same link first: tmp is still there
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    return dest


class LocalSlot:
    """One CPU of this machine, served by one agent process.

    ``depth`` = 2: the scheduler may have two jobs on the slot at once; the second waits in
    the agent's queue, which starts it the moment the first run ends (and prepares it while
    that run goes on), so the master's round trip overlaps a run instead of separating two.
    The agent still runs one binary at a time on the CPU.  If the agent dies, every job
    outstanding on it gets ``WorkerLost`` and the scheduler runs it again.
    """

    depth = 2
    background = False  # its agent at the lowest priority (a CPU lent by the compiles)

    def probe(self) -> None:
        """Nothing to do: a dead agent is replaced by the next ``run``."""

    def __init__(self, cpu: int, cache_dir: Path, worker_class: str,
                 lock_dir: Path | None = None, lock_wait: float = DEFAULT_LOCK_WAIT_S):
        self.cpu = cpu
        self.name = f"local/cpu{cpu}"
        self.worker_class = worker_class
        self._cache_dir = cache_dir
        self._lock_dir = lock_dir if lock_dir is not None else default_lock_dir()
        self._lock_wait = lock_wait
        self._agent: LocalAgent | None = None
        self._closed = False  # closed for good: no agent is started again
        self._lock = threading.Lock()
        # (job, its encoded request): the same job is encoded once
        self._encoded: tuple[RunJob | None, bytes] = (None, b"")

    def run(self, job: RunJob) -> RunResult:
        install_binary(self._cache_dir, job.sha256, job.binary)
        last, head = self._encoded
        if last is not job:
            head = encode_request(job.request(self.cpu))
            self._encoded = (job, head)
        with self._lock:
            if self._closed:
                raise WorkerLost(f"{self.name}: closed")
            if self._agent is None or self._agent.process.poll() is not None:
                if self._agent is not None:
                    self._agent.close()
                self._agent = None
                self._agent = self._start_agent()
            agent = self._agent
            try:
                rid = agent.connection.send_encoded(head)
            except WorkerLost:
                self._drop(agent)
                raise
        try:
            response = agent.connection.receive(rid)
        except WorkerLost:
            with self._lock:
                self._drop(agent)  # a fresh agent serves the next job
            raise
        return result_from_response(job, self, response)

    def exact_info(self) -> tuple[dict, str]:
        """The agent's ``exact`` (whether it can count under cachegrind) and its host."""
        with self._lock:
            if self._closed:
                raise WorkerLost(f"{self.name}: closed")
            if self._agent is None or self._agent.process.poll() is not None:
                self._agent = self._start_agent()
            agent = self._agent
        hello = agent.connection.request({"op": "hello", "exact": True})
        return hello.get("exact") or {}, str(hello.get("hostname") or "")

    def _start_agent(self) -> LocalAgent:
        """A new agent holding this CPU's lock; PermanentLoss if another master holds it."""
        try:
            lock = cpu_lock(self._lock_dir, self.cpu)
        except OSError as exc:
            raise PermanentLoss(f"{self.name}: cannot make the CPU lock directory "
                                f"{self._lock_dir}: {exc.strerror or exc}") from None
        try:
            return LocalAgent(self.name, self._cache_dir, self.worker_class, cpus=agent_cpus(),
                              lock=lock, lock_wait=self._lock_wait,
                              background=self.background)
        except SlotLockBusy as exc:
            raise PermanentLoss(
                f"{self.name}: CPU {self.cpu} is in use by another master on this machine "
                f"(waited {self._lock_wait:g}s; {exc.holder})") from None

    def _drop(self, agent: LocalAgent) -> None:
        """Forget a broken agent (once, whichever of its jobs notices first); with the lock."""
        if self._agent is agent:
            self._agent = None
            agent.close()

    def close(self) -> None:
        """Stop the agent (it kills a run in progress); the slot runs nothing after this."""
        with self._lock:
            self._closed = True
            if self._agent is not None:
                self._agent.close()
                self._agent = None


class ExactSlot(LocalSlot):
    """A CPU the compiles use, lent to exact jobs (``EXACT_CLASS``): a cachegrind run's
    counts do not depend on what else runs there, and it times nothing.  Its agent holds the
    CPU's lock like any slot's (not waiting for it: a CPU another master times on is not
    lent), so a timed run's own CPU stays isolated; the scheduler hands it no timed job (their
    class is never this one), and it refuses one if it gets it.  Its agent and counts run at
    the lowest priority (nice 19): a compile takes the CPU whenever it needs it and the counts
    have what the compiles leave, so lending never slows the compiles (the split between the
    two is the kernel's, moment by moment)."""

    background = True

    def __init__(self, cpu: int, cache_dir: Path, lock_dir: Path | None = None):
        super().__init__(cpu, cache_dir, EXACT_CLASS, lock_dir, lock_wait=0.0)
        self.name = f"local/cpu{cpu}/exact"

    def run(self, job: RunJob) -> RunResult:
        if not job.exact:
            raise ValueError(f"{self.name}: a timed job on a CPU lent to exact jobs only")
        return super().run(job)


class LocalBackend:
    def __init__(self, cpus: tuple[int, ...], cache_dir: Path, worker_class: str = "local",
                 lock_dir: Path | None = None, lock_wait: float = DEFAULT_LOCK_WAIT_S,
                 exact_cpus: tuple[int, ...] = ()):
        """``exact_cpus``: CPUs the compiles use, lent to exact jobs too (``ExactSlot``)."""
        cache_dir.mkdir(parents=True, exist_ok=True)
        self.slots: list[LocalSlot] = [LocalSlot(cpu, cache_dir, worker_class, lock_dir,
                                                 lock_wait) for cpu in cpus]
        self.slots += [ExactSlot(cpu, cache_dir, lock_dir) for cpu in exact_cpus]

    def remote_builder(self) -> None:
        """Compiles stay on the master."""
        return None

    def close(self) -> None:
        for slot in self.slots:
            slot.close()


# --------------------------------------------------------------------------- configuration

@dataclass(frozen=True)
class LocalConfig:
    cpus: tuple[int, ...]  # one worker slot per CPU
    worker_class: str = "local"
    auto: bool = False  # cpus: auto (a search may split the CPUs by measurement instead)
    lock_dir: Optional[Path] = None  # None: $INLINING_ORCHESTRATOR_LOCK_DIR or the default
    lock_wait: float = DEFAULT_LOCK_WAIT_S


def default_cpus() -> tuple[int, ...]:
    """Every CPU this process may use but one (the master's), at least one."""
    cpus = sorted(agent_cpus())
    return tuple(cpus[1:] if len(cpus) > 1 else cpus)


def master_cpus(worker_cpus: tuple[int, ...]) -> frozenset[int] | None:
    """The CPUs left to the master (its compiles) when local workers take ``worker_cpus``;
    None when workers take them all (then nothing can be kept apart)."""
    rest = agent_cpus() - set(worker_cpus)
    return rest or None


def parse_config(section: dict, r: Reader) -> LocalConfig:
    """The ``local:`` section."""
    fail = r.fail
    unknown = sorted(set(section) - {"cpus", "worker_class", "lock_dir", "lock_wait"})
    if unknown:
        raise fail(f"local.{unknown[0]}", "one of cpus, worker_class, lock_dir, lock_wait")
    cpus_raw = section.get("cpus", "auto")
    if cpus_raw == "auto":
        cpus = default_cpus()
    elif (isinstance(cpus_raw, list) and cpus_raw
          and all(isinstance(c, int) and not isinstance(c, bool) for c in cpus_raw)):
        here = agent_cpus()
        missing = sorted(set(cpus_raw) - here)
        if missing:
            raise fail("local.cpus", f"CPUs of this machine ({sorted(here)})", missing)
        if len(set(cpus_raw)) != len(cpus_raw):
            raise fail("local.cpus", "distinct CPU numbers", cpus_raw)
        cpus = tuple(cpus_raw)
    else:
        raise fail("local.cpus", "auto or a list of CPU numbers", cpus_raw)
    worker_class = section.get("worker_class", "local")
    if not isinstance(worker_class, str) or not worker_class:
        raise fail("local.worker_class", "a non-empty string", worker_class)
    lock_dir = section.get("lock_dir")
    if lock_dir is not None and (not isinstance(lock_dir, str) or not lock_dir):
        raise fail("local.lock_dir", "a directory path", lock_dir)
    lock_wait = section.get("lock_wait", DEFAULT_LOCK_WAIT_S)
    if (not isinstance(lock_wait, (int, float)) or isinstance(lock_wait, bool)
            or not 0 <= lock_wait <= 24 * 3600):
        raise fail("local.lock_wait", "seconds in 0..86400", lock_wait)
    return LocalConfig(cpus=cpus, worker_class=worker_class, auto=cpus_raw == "auto",
                       lock_dir=Path(lock_dir).expanduser() if lock_dir else None,
                       lock_wait=float(lock_wait))


def start(config: LocalConfig, context: BackendContext) -> LocalBackend:
    """The slots of ``config.cpus``; in an exact session, the master's CPUs lent to exact
    jobs as well (docs/measurement.md, "Where exact jobs run")."""
    lent = sorted(master_cpus(config.cpus) or ()) if context.exact else []
    keep_master_off(config.cpus)  # before the scheduler starts its threads
    return LocalBackend(config.cpus, context.worker_cache, config.worker_class,
                        config.lock_dir, config.lock_wait, exact_cpus=tuple(lent))


BACKEND = BackendSpec(name="local", parse=parse_config,
                      worker_classes=lambda c: [c.worker_class],
                      master_cpus=lambda c: master_cpus(c.cpus), start=start)
