"""The Ray backend: worker slots on the nodes of an existing Ray cluster.

Each node offers one custom resource per CPU that may time runs, ``<prefix><N>: 1``
(``inlining_cpu_3``: CPU 3 of that node; ``ray start --resources='{"inlining_cpu_3": 1}'``).
Ray's ``num_cpus`` pins nothing, so the backend makes one slot per such resource and places
one actor there (``dispatcher.running.ray.actor.AgentHost``: that resource, ``num_cpus=0``, hard
affinity to the node), which hosts the same worker agent zipapp every backend runs, as a
subprocess pinning its runs to CPU N.  No two of our actors share a resource, so no two runs
share a core; the agent also holds the CPU's lock on the node (the local backend's).

Binaries travel through the object store: the master ``ray.put``s a binary once (the last few
are kept), and a job carries its reference only to a node that does not have it yet; the actor
then fetches it (once per node: Ray copies an object to a node once) and writes it into the
node's cache, one file per sha256, where the agent checks it before it runs.

The master must be a node of the cluster (normally the head: ``ray start --head``), since
``ray.put`` stores into its own node.  Slots are found when the backend starts: nodes that
join later serve the next command.  Each slot keeps two jobs in flight (``depth``), as local
slots do: a bare actor call costs milliseconds, and the agent starts the queued job as the
running one ends.

Faults: a dead actor, a dead agent or a node that left -> ``WorkerLost`` for the jobs in flight
(the scheduler runs them again elsewhere); the slot's next probe starts a new actor, and a
node that has left the cluster (a Ray node id never comes back) is ``PermanentLoss``.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from dispatcher.build.driver import BuildResult
from dispatcher.build.manifest import Benchmark
from dispatcher.build.remote import NO_REUSE, BuilderLost, UnitReuse, build_request, build_result
from dispatcher.build.toolchain import Compiler
from dispatcher.core.jobs import RunJob
from dispatcher.core.records import RunResult
from dispatcher.running.agent_client import (
    AGENT_PATH,
    AgentError,
    WorkerLost,
    agent_zipapp,
    result_from_response,
)
from dispatcher.running.backend import (
    Answer,
    BackendContext,
    BackendSpec,
    BackendUnavailable,
    PermanentLoss,
    run_by_start,
)
from dispatcher.running.ray.connection import parse_connection
from dispatcher.running.ray.local_session import auto_address
from dispatcher.running.ray.replies import Outcome, Replies, reply_of
from dispatcher.running.ray.replies import one_line as _one_line
from workers.agent.protocol import CHECKSUM_MISMATCH, DEFAULT_LOCK_WAIT_S, NOT_IN_CACHE

if TYPE_CHECKING:
    from dispatcher.core.validation import Reader

log = logging.getLogger(__name__)

JOB_SLACK_S = 30.0  # beyond 1.5 x the runs' own timeouts, before a silent actor is presumed hung
MAX_REFS = 16  # binaries kept in the object store by the master (put again if needed later)
DEFAULT_PREFIX = "inlining_cpu_"
DEFAULT_CACHE_DIR = "~/.cache/inlining-orchestrator/ray"
TOKEN_PATH = Path("~/.ray/auth_token").expanduser()  # Ray's default token file


@dataclass(frozen=True)
class RayConfig:
    address: str = "auto"  # "auto" (this machine's cluster) or the head's GCS host:port
    auth: str = "token"  # "token" or "none"
    token_file: Optional[Path] = None  # None: $RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH, ~/.ray/...
    resource_prefix: str = DEFAULT_PREFIX
    slots: Optional[int] = None  # None: one per per-CPU resource the cluster offers
    worker_class: str = "ray"
    cache_dir: str = DEFAULT_CACHE_DIR  # on each node; ~ is the node's
    namespace: str = "inlining-orchestrator"
    start_timeout: float = 90.0  # for an actor to be placed and its agent to answer
    compile_resource: Optional[str] = "compile"  # None: every compile on the master


def _last_line(exc: BaseException) -> str:
    """The error at the end of a traceback Ray put in a message, its first sentence."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[-1] if lines else type(exc).__name__
    text = text.removeprefix("ray.exceptions.").split(". ")[0]
    return text if len(text) <= 300 else text[:297] + "..."


class RayNode:
    """A node of the cluster with per-CPU resources, as the backend found it at start."""

    def __init__(self, node_id: str, name: str, cpus: list[int],
                 raylet: tuple[str, int] | None = None):
        self.node_id = node_id
        self.name = name  # its label in slot names: its node name (by default its address)
        self.cpus = cpus
        self.raylet = raylet  # its raylet's address and port
        self.cached: set[str] = set()  # sha256s known to be in its cache
        self.lock = threading.Lock()


class RaySlot:
    """One CPU of one node: an actor hosting the agent, started on first use.  It answers by
    itself (``AnsweringSlot``): a job is sent to the actor and its reply taken on the
    backend's one replies thread (``replies``), not on a thread of the scheduler's."""

    depth = 2

    def __init__(self, backend: RayBackend, node: RayNode, cpu: int):
        self.backend = backend
        self.node = node
        self.cpu = cpu
        self.name = f"ray/{node.name}/cpu{cpu}"
        self.worker_class = backend.config.worker_class
        self.resource = f"{backend.config.resource_prefix}{cpu}"
        self._actor: Any = None
        self._lock = threading.Lock()
        self._budget = 0.0  # the time limits of the jobs in flight on this slot, summed

    # ------------------------------------------------------------------ the actor

    def probe(self) -> None:
        """Make sure the actor and its agent are up; WorkerLost if not, PermanentLoss if the
        node has left the cluster or the CPU is taken."""
        self._ensure()

    def _ensure(self) -> Any:
        with self._lock:
            if self._actor is None:
                self._actor = self._start_actor()
            return self._actor

    def _start_actor(self) -> Any:
        ray, backend, config = self.backend.ray, self.backend, self.backend.config
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        if not backend.node_alive(self.node):
            raise PermanentLoss(f"{self.name}: node {self.node.name} has left the cluster")
        actor = backend.actor_class.options(
            num_cpus=0, resources={self.resource: 1}, max_restarts=0, max_concurrency=4,
            scheduling_strategy=NodeAffinitySchedulingStrategy(self.node.node_id, soft=False),
        ).remote(self.name, self.cpu, self.worker_class, config.cache_dir, backend.agent_name,
                 backend.agent_ref, DEFAULT_LOCK_WAIT_S)
        ref = actor.start.remote()
        deadline = time.monotonic() + config.start_timeout
        try:
            while True:  # waiting in steps: a node that leaves meanwhile ends the wait
                ready, _ = ray.wait([ref], timeout=min(2.0, config.start_timeout))
                if ready:
                    started = ray.get(ref)
                    break
                if not backend.node_alive(self.node):
                    raise PermanentLoss(f"{self.name}: node {self.node.name} has left the "
                                        "cluster")
                if time.monotonic() >= deadline:
                    raise WorkerLost(
                        f"{self.name}: no actor started within {config.start_timeout:g} s (is "
                        f"resource {self.resource} of node {self.node.name} held by another "
                        "master?)")
        except WorkerLost:
            self._kill(actor)
            raise
        except ray.exceptions.RayError as exc:
            self._kill(actor)
            if not backend.node_alive(self.node):
                raise PermanentLoss(f"{self.name}: node {self.node.name} has left the "
                                    "cluster") from None
            raise WorkerLost(f"{self.name}: the actor did not start: {_one_line(exc)}") from None
        if not started.get("ok"):
            self._kill(actor)
            if "lock_busy" in started:
                raise PermanentLoss(f"{self.name}: CPU {self.cpu} of node {self.node.name} is "
                                    f"in use by another master ({started['lock_busy']})")
            loss = PermanentLoss if started.get("permanent") else WorkerLost
            raise loss(f"{self.name}: {started.get('error')}")
        hello = started["hello"]
        if hello.get("agent_version") != backend.agent_sha256:
            self._kill(actor)
            raise WorkerLost(f"{self.name}: the agent on node {self.node.name} is not the "
                             f"master's (hash {str(hello.get('agent_version'))[:16]})")
        if self.cpu not in hello.get("cpus", []):
            self._kill(actor)
            raise PermanentLoss(f"{self.name}: CPU {self.cpu} is not available to the agent on "
                                f"node {self.node.name} (it may use {hello.get('cpus')})")
        with self.node.lock:
            self.node.cached.update(started.get("cached", ()))
        return actor

    def _kill(self, actor: Any) -> None:
        try:
            self.backend.ray.kill(actor, no_restart=True)
        except Exception:  # it is gone either way
            pass

    def _drop(self, actor: Any) -> None:
        """Forget a broken actor (once, whichever of its jobs notices first)."""
        with self._lock:
            if self._actor is actor:
                self._actor = None
            else:
                return
        self._kill(actor)

    # ------------------------------------------------------------------ jobs

    def exact_info(self) -> tuple[dict, str]:
        """The agent's ``exact`` (whether it can count under cachegrind) and its node."""
        ray = self.backend.ray
        actor = self._ensure()
        try:
            hello = ray.get(actor.run.remote({"op": "hello", "exact": True}, None),
                            timeout=JOB_SLACK_S + 60)
        except ray.exceptions.RayError as exc:
            raise WorkerLost(f"{self.name}: {_one_line(exc)}") from None
        if "lost" in hello:
            raise WorkerLost(f"{self.name}: {hello['lost']}")
        return hello.get("exact") or {}, self.node.name

    def run(self, job: RunJob) -> RunResult:
        return run_by_start(self, job)

    def start(self, job: RunJob, answer: Answer) -> None:
        """Send ``job`` to the actor; its reply is taken on the backend's replies thread (an
        actor not up yet is started first, on a thread of its own)."""
        with self._lock:
            actor = self._actor
        if actor is None:
            threading.Thread(target=self._start_on_new_actor, args=(job, answer), daemon=True,
                             name=f"slot {self.name} actor start").start()
            return
        self._send(actor, job, answer, 1)

    def _start_on_new_actor(self, job: RunJob, answer: Answer) -> None:
        try:
            self._send(self._ensure(), job, answer, 1)
        except BaseException as exc:  # as run would raise it
            answer(exc)

    def _send(self, actor: Any, job: RunJob, answer: Answer, attempt: int) -> None:
        with self.node.lock:
            ship = job.sha256 not in self.node.cached
        binary = [self.backend.binary_ref(job.sha256, job.binary)] if ship else None
        own = job.runs * job.timeout * 1.5
        with self._lock:  # a queued job also waits for the one ahead of it
            self._budget += own
            deadline = self._budget + JOB_SLACK_S
        try:
            ref = actor.run.remote(job.request(self.cpu), binary)
        except BaseException:
            with self._lock:
                self._budget -= own
            raise
        self.backend.replies.expect(ref, deadline, self, functools.partial(
            self._replied, actor, job, answer, attempt, ship, own))

    def _replied(self, actor: Any, job: RunJob, answer: Answer, attempt: int, ship: bool,
                 own: float, outcome: Outcome) -> None:
        """The actor's reply (on the replies thread): the job's answer, or the job sent again
        with its binary (removed or damaged on the node)."""
        with self._lock:
            self._budget -= own
        try:
            response = reply_of(outcome, self.backend.ray, self.name, "its actor",
                                lambda: self._drop(actor))
        except BaseException as exc:
            answer(exc)
            return
        if "lost" in response:
            self._drop(actor)
            answer(WorkerLost(f"{self.name}: {response['lost']}"))
            return
        if not response.get("ok"):
            code = response.get("code")
            if attempt == 1 and code in (NOT_IN_CACHE, CHECKSUM_MISMATCH):
                with self.node.lock:  # removed or damaged on the node: send it again
                    self.node.cached.discard(job.sha256)
                try:
                    self._send(actor, job, answer, 2)
                except BaseException as exc:
                    answer(exc)
                return
            answer(AgentError(f"{self.name}: {response.get('error', 'request refused')}",
                              code=code))
            return
        if ship:
            with self.node.lock:
                self.node.cached.add(job.sha256)
        try:
            answer(result_from_response(job, self, response))
        except Exception as exc:  # a malformed response: the job's own failure, as run had it
            answer(exc)

    def close(self) -> None:
        with self._lock:
            actor, self._actor = self._actor, None
        self.backend.replies.abandon(self, WorkerLost(f"{self.name}: closed"))
        if actor is None:
            return
        try:  # the agent kills a run in progress on EOF
            self.backend.ray.get(actor.close.remote(), timeout=10)
        except Exception:  # killed below either way
            pass
        self._kill(actor)


class RayBuilder:
    """Compiles as Ray tasks on the nodes that offer the compile resource (one unit of it
    per build), so compile capacity grows with the cluster: ``workers.agent.build`` runs the
    build there with the patched compiler installed at the master's path, the units the
    master's unit cache holds sent along (a node whose compiler there is another one builds
    nothing)."""

    overflow_to_master = True
    shares_unit_cache = True

    def __init__(self, backend: RayBackend, resource: str, jobs: int):
        self.ray = backend.ray
        self.resource = resource
        self.jobs = jobs
        self.name = f"ray/{resource}"
        from workers.agent import build as worker_build
        self._task = self.ray.remote(worker_build.build)

    def build(self, bench: Benchmark, outdir: Path, compiler: Compiler, flags: tuple[str, ...],
              overrides: dict[str, Path], dump_decisions: bool,
              reuse: UnitReuse = NO_REUSE) -> tuple[BuildResult, str]:
        request = build_request(bench, compiler, flags, overrides, dump_decisions, reuse=reuse)
        timeout = request.timeout
        ref = self._task.options(num_cpus=0, resources={self.resource: 1},
                                 max_retries=2).remote(**request.arguments())
        try:
            reply = self.ray.get(ref, timeout=timeout + JOB_SLACK_S)
        except self.ray.exceptions.GetTimeoutError:
            self.ray.cancel(ref, force=True)
            raise BuilderLost(f"{self.name}: no answer within {timeout + JOB_SLACK_S:.0f} s") \
                from None
        except self.ray.exceptions.RayError as exc:
            raise BuilderLost(f"{self.name}: build task lost: {_one_line(exc)}") from None
        return build_result(bench, outdir, reply, self.name, timeout, reuse), self.name


class BinaryRefs:
    """Binaries put into Ray's object store by the master, each once while it is among the
    last ``MAX_REFS`` asked for (a job in flight keeps its own reference; one asked for
    again later is put again)."""

    def __init__(self, ray: Any):
        self.ray = ray
        self._refs: OrderedDict[str, Any] = OrderedDict()  # sha256 -> ObjectRef
        self._lock = threading.Lock()

    def ref(self, sha256: str, path: Path) -> Any:
        with self._lock:
            ref = self._refs.get(sha256)
            if ref is None:
                ref = self.ray.put(path.read_bytes())
                self._refs[sha256] = ref
                while len(self._refs) > MAX_REFS:
                    self._refs.popitem(last=False)
            else:
                self._refs.move_to_end(sha256)
            return ref

    def clear(self) -> None:
        with self._lock:
            self._refs.clear()


class RayBackend:
    """Connects to the cluster and makes a slot per per-CPU resource of its live nodes,
    interleaved across nodes so that a queue of jobs spreads over the machines."""

    def __init__(self, config: RayConfig, agent_path: Path = AGENT_PATH):
        self.config = config
        self._closed = False
        self.ray = connect(config)
        self._binaries = BinaryRefs(self.ray)
        self.replies = Replies()  # of every slot's jobs
        try:
            from dispatcher.running.ray import actor as ray_actor
            from workers.agent import build as worker_build
            # The actor's code goes to the nodes by value: nothing of ours is installed there.
            self.ray.cloudpickle.register_pickle_by_value(ray_actor)
            self.actor_class = self.ray.remote(ray_actor.AgentHost)
            zipapp = agent_zipapp(agent_path) if agent_path.is_dir() else agent_path
            data = zipapp.read_bytes()
            self.agent_sha256 = hashlib.sha256(data).hexdigest()
            self.agent_name = f"agent-{self.agent_sha256[:16]}.pyz"
            self.agent_ref = self.ray.put(data)
            self.nodes = discover_nodes(self.ray, config)
            width = max(len(n.cpus) for n in self.nodes)
            slots = [RaySlot(self, n, n.cpus[i]) for i in range(width) for n in self.nodes
                     if i < len(n.cpus)]
            self.slots = slots[:config.slots] if config.slots else slots
            self.ray.cloudpickle.register_pickle_by_value(worker_build)
        except BaseException:
            self.replies.close()
            self.ray.shutdown()
            raise

    def binary_ref(self, sha256: str, path: Path) -> Any:
        """The object holding the binary ``sha256``, put into the store once."""
        return self._binaries.ref(sha256, path)

    def remote_builder(self) -> RayBuilder | None:
        """Compiles on the nodes offering ``ray.compile_resource`` (None: none does, or it
        is off: compiles stay on the master)."""
        resource = self.config.compile_resource
        if resource is None:
            return None
        try:
            total = self.ray.cluster_resources().get(resource, 0)
        except Exception:  # cannot tell: compile on the master
            return None
        jobs = int(total)
        return RayBuilder(self, resource, jobs) if jobs >= 1 else None

    def node_alive(self, node: RayNode) -> bool:
        """False once the cluster has marked the node dead, or its raylet refuses connections
        (the process is gone: a node that restarts joins under a new id).  The cluster takes
        its health checks' time (15 s by default) to notice a node that went quiet."""
        try:
            nodes = self.ray.nodes()
        except Exception:  # cannot tell: let the attempt decide
            return True
        if not any(n.get("NodeID") == node.node_id and n.get("Alive") for n in nodes):
            return False
        if node.raylet is not None:
            try:
                socket.create_connection(node.raylet, timeout=2).close()
            except ConnectionRefusedError:
                return False
            except OSError:  # unreachable or slow: the cluster's health checks will tell
                pass
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            for slot in self.slots:
                slot.close()
        finally:
            self.replies.close()
            self._binaries.clear()
            self.ray.shutdown()


# --------------------------------------------------------------------------- connecting

def connect(config: RayConfig) -> Any:
    """``ray`` connected to the cluster as a driver; BackendUnavailable (one line) if not."""
    if config.auth == "token":
        os.environ["RAY_AUTH_MODE"] = "token"
        if config.token_file is not None:
            if not config.token_file.is_file():
                raise BackendUnavailable(f"ray.token_file: {config.token_file} does not exist")
            os.environ["RAY_AUTH_TOKEN_PATH"] = str(config.token_file)
        elif not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
                  or TOKEN_PATH.is_file()):
            raise BackendUnavailable(
                "ray: token authentication is on (ray.auth) but there is no token: set "
                "RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ray.token_file, or copy the cluster's "
                f"token to {TOKEN_PATH}")
    else:
        os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing leaves the cluster
    try:
        import ray
    except ImportError:
        raise BackendUnavailable("backend ray needs the ray package: pip install "
                                 "'inlining-orchestrator[ray]'") from None
    # Ray itself waits minutes for an address nobody serves, and its "auto" takes whatever
    # session file or raylet it finds: auto is resolved to this user's cluster on this
    # machine first (local_session), in seconds or one line
    address = auto_address() if config.address == "auto" else config.address
    if config.address != "auto":
        host, _, port = config.address.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
        except OSError as exc:
            raise BackendUnavailable(f"ray: cannot connect to the cluster at {config.address}: "
                                     f"{exc.strerror or exc}") from None
    _keep_stdout_clean()
    try:
        ray.init(address=address, namespace=config.namespace,
                 logging_level=logging.WARNING, log_to_driver=True)
    except Exception as exc:  # ConnectionError, AuthenticationError, ...
        why = _one_line(exc)
        if exc.__cause__ is not None:
            why += f" ({_last_line(exc.__cause__)})"
        raise BackendUnavailable(f"ray: cannot connect to the cluster at {address}: "
                                 f"{why}") from None
    return ray


def _keep_stdout_clean() -> None:
    """Ray's driver prints the cluster's error messages (a node died, with the tail of its
    raylet's log) and its workers' stdout on our stdout, which is the commands' output (CSV
    lines): they go to stderr instead, each cluster message as one logged line."""
    try:
        from ray._private import worker as ray_worker
        original = ray_worker.print_to_stdstream
    except (ImportError, AttributeError):  # another Ray: its output stays where it goes
        return
    if getattr(original, "inlining_orchestrator", False):
        return

    def to_stderr(data: dict, ignore_prefix: bool) -> None:
        if data.get("pid") == "raylet":  # the cluster's error messages
            for text in data.get("lines", ()):
                log.warning("ray: %s", _one_line(Exception(text)))
            return
        original(dict(data, is_err=True), ignore_prefix)

    to_stderr.inlining_orchestrator = True  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = to_stderr


_LABEL_BAD = re.compile(r"[^A-Za-z0-9._:-]")


def discover_nodes(ray: Any, config: RayConfig) -> list[RayNode]:
    """The live nodes offering per-CPU resources, by name; BackendUnavailable if none."""
    pattern = re.compile(re.escape(config.resource_prefix) + r"(\d+)")
    found = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        cpus = sorted(int(m.group(1)) for key, amount in n.get("Resources", {}).items()
                      if (m := pattern.fullmatch(key)) and amount >= 1)
        if cpus:
            name = _LABEL_BAD.sub("_", str(n.get("NodeName") or n.get("NodeManagerAddress")))
            raylet = (n.get("NodeManagerAddress"), n.get("NodeManagerPort"))
            found.append((name or "node", n["NodeID"], cpus,
                          raylet if isinstance(raylet[0], str) and isinstance(raylet[1], int)
                          and raylet[1] > 0 else None))
    if not found:
        raise BackendUnavailable(
            f"ray: no node of the cluster at {config.address} offers a per-CPU resource "
            f"{config.resource_prefix}<N> (ray start ... --resources="
            f"'{{\"{config.resource_prefix}1\": 1}}')")
    names = [name for name, _, _, _ in found]
    return sorted((RayNode(node_id, name if names.count(name) == 1 else f"{name}-{node_id[:8]}",
                           cpus, raylet) for name, node_id, cpus, raylet in found),
                  key=lambda n: n.name)


# --------------------------------------------------------------------------- configuration

_RESOURCE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
MAX_SLOTS = 100_000


def parse_config(section: dict, r: Reader) -> RayConfig:
    """The ``ray:`` section."""
    d = r.section({"ray": section}, "ray", {"address", "auth", "token_file", "resource_prefix",
                                            "slots", "worker_class", "cache_dir", "namespace",
                                            "start_timeout", "compile_resource"})
    address = d.get("address", RayConfig.address)
    if isinstance(address, str) and address.startswith("ray://"):
        raise r.fail("ray.address", "auto or the head's host:port (the master runs on a node "
                     "of the cluster: Ray Client addresses cannot hold its binaries)", address)
    address, auth, token = parse_connection(d, r, "ray")
    prefix = d.get("resource_prefix", DEFAULT_PREFIX)
    if not isinstance(prefix, str) or not _RESOURCE_RE.match(prefix):
        raise r.fail("ray.resource_prefix", "a resource name prefix of letters, digits and _",
                     prefix)
    slots_raw = d.get("slots", "auto")
    slots = None if slots_raw == "auto" else r.positive_int(d, "slots", "ray.slots", 1,
                                                            most=MAX_SLOTS)
    worker_class = d.get("worker_class", RayConfig.worker_class)
    if not isinstance(worker_class, str) or not worker_class or "\0" in worker_class:
        raise r.fail("ray.worker_class", "a non-empty string", worker_class)
    cache_dir = d.get("cache_dir", DEFAULT_CACHE_DIR)
    if (not isinstance(cache_dir, str) or not cache_dir.strip() or "\0" in cache_dir
            or not (cache_dir.startswith(("/", "~/")))):
        raise r.fail("ray.cache_dir", "an absolute directory on the nodes (or under ~/)",
                     cache_dir)
    namespace = d.get("namespace", RayConfig.namespace)
    if not isinstance(namespace, str) or not _NAMESPACE_RE.match(namespace):
        raise r.fail("ray.namespace", "a name of letters, digits, '.', '_' or '-'", namespace)
    start_timeout = r.positive_number(d, "start_timeout", "ray.start_timeout",
                                      RayConfig.start_timeout, most=3600,
                                      what="a positive number of seconds")
    compile_raw = d.get("compile_resource", RayConfig.compile_resource)
    if compile_raw is not None and (not isinstance(compile_raw, str)
                                    or not _RESOURCE_RE.match(compile_raw)):
        raise r.fail("ray.compile_resource", "a resource name of letters, digits and _, or "
                     "null (compile on the master)", compile_raw)
    return RayConfig(address=address, auth=auth, token_file=token, resource_prefix=prefix,
                     slots=slots, worker_class=worker_class, cache_dir=cache_dir,
                     namespace=namespace, start_timeout=start_timeout,
                     compile_resource=compile_raw)


def _start(config: RayConfig, context: BackendContext) -> RayBackend:
    return RayBackend(config)


BACKEND = BackendSpec(name="ray", parse=parse_config,
                      worker_classes=lambda c: [c.worker_class],
                      master_cpus=lambda c: None, start=_start)
