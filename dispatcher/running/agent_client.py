"""The worker contract: typed run requests and results, and a connection to one agent.

The agent (``workers/agent/``, shipped as one zipapp) speaks JSON lines; this module is the
master's side of that protocol.  Every backend hands the scheduler ``Slot`` objects (one per
worker CPU) built on an ``AgentConnection``: over a local pipe, an SSH channel or inside a Ray
actor.
"""
from __future__ import annotations

import collections
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

from dispatcher.core.jobs import RunJob
from dispatcher.core.records import RunRecord, RunResult
from workers.agent.protocol import (
    DEFAULT_LOCK_WAIT_S,
    SLOT_LOCK_BUSY_STATUS,
    slot_lock_message,
)

# The agent's package; what runs is its zipapp (``agent_zipapp``).
AGENT_PATH = Path(__file__).resolve().parents[2] / "workers" / "agent"
# Where the master builds the zipapp (content-addressed: masters of any version share it).
AGENT_BUILD_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) \
    / "inlining-orchestrator" / "agent"

_zipapps: dict[Path, Path] = {}  # package directory -> its zipapp, built by this process
_zipapps_lock = threading.Lock()


def agent_zipapp(source: Path = AGENT_PATH) -> Path:
    """The zipapp of the agent package ``source`` (``agent-<sha256[:16]>.pyz``, its sha256
    the agent's version), built once per master process into AGENT_BUILD_DIR (a private
    temporary directory if that cannot be written), and again only if the file went away."""
    from workers.zipapp import build_agent_zipapp
    with _zipapps_lock:
        built = _zipapps.get(source)
        if built is None or not built.is_file():
            try:
                built = build_agent_zipapp(AGENT_BUILD_DIR, source)
            except OSError:
                built = build_agent_zipapp(tempfile.mkdtemp(prefix="inlining-agent-"), source)
            _zipapps[source] = built
        return built


class AgentError(RuntimeError):
    """The agent refused a request, or the connection to it broke.

    ``code``: the agent's machine-readable reason for a refusal (``not_in_cache``,
    ``checksum_mismatch``, ...: ``workers/agent/protocol.py``); None for a broken connection.
    """

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


class WorkerLost(AgentError):
    """The connection to the agent broke (it died, its host went away, or it stopped answering):
    the job did not fail on its own merits, so the scheduler runs it again on another slot."""


def encode_request(message: dict) -> bytes:
    """A request object as JSON without its closing brace, ready for its id (``send_encoded``);
    ``message`` must not hold "id"."""
    body = json.dumps(message).encode()
    return body[:-1] + (b", " if len(message) else b"")


class AgentConnection:
    """JSON lines to one agent over a pair of byte streams.

    ``request`` sends one request and waits for its reply.  Requests may also be pipelined:
    ``send`` several (from any threads), then ``receive`` each reply by its id; the agent
    answers in request order, so whoever reads a reply meant for another thread keeps it for
    that thread.  Once the stream breaks, every outstanding and later request raises
    ``WorkerLost``.
    """

    def __init__(self, name: str, stdin: IO[bytes], stdout: IO[bytes]):
        self.name = name
        self._stdin, self._stdout = stdin, stdout
        self._ids = itertools.count(1)
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._outstanding: collections.deque[int] = collections.deque()  # ids, in send order
        self._replies: dict[int, dict] = {}  # read, not yet received by their sender
        self._broken: str | None = None

    def request(self, message: dict) -> dict:
        return self.receive(self.send(message))

    def send(self, message: dict) -> int:
        """Write one request -> its id (for ``receive``)."""
        return self.send_encoded(encode_request(message))

    def send_encoded(self, head: bytes) -> int:
        """``send`` for a request already encoded by ``encode_request`` (a job sent many
        times is encoded once)."""
        with self._send_lock:
            if self._broken:
                raise WorkerLost(self._broken)
            rid = next(self._ids)
            line = b'%s"id": %d}\n' % (head, rid)
            self._outstanding.append(rid)
            try:
                self._stdin.write(line)
                self._stdin.flush()
            except (OSError, ValueError) as exc:
                why = self._break(f"{self.name}: connection to the agent lost ({exc})")
                raise WorkerLost(why) from None
            return rid

    def receive(self, rid: int) -> dict:
        """The reply to request ``rid``; AgentError if the agent refused it."""
        with self._recv_lock:
            while rid not in self._replies:
                if self._broken:
                    raise WorkerLost(self._broken)
                try:
                    reply = self._stdout.readline()
                except (OSError, ValueError) as exc:
                    self._break(f"{self.name}: connection to the agent lost ({exc})")
                    continue
                if not reply:
                    self._break(f"{self.name}: the agent exited")
                    continue
                try:
                    response = json.loads(reply)
                except json.JSONDecodeError:
                    self._break(f"{self.name}: unreadable reply {reply[:100]!r}")
                    continue
                expected = self._outstanding[0] if self._outstanding else None
                if (expected is None or not isinstance(response, dict)
                        or response.get("id") != expected):
                    got = response.get("id") if isinstance(response, dict) else response
                    self._break(f"{self.name}: reply to request {got}, expected {expected}")
                    continue
                self._outstanding.popleft()
                self._replies[expected] = response
            response = self._replies.pop(rid)
        if not response.get("ok"):
            raise AgentError(f"{self.name}: {response.get('error', 'request refused')}",
                             code=response.get("code"))
        return response

    def _break(self, why: str) -> str:
        """Mark the stream broken (the first reason sticks) -> the reason."""
        if not self._broken:
            self._broken = why
        return self._broken


class SlotLockBusy(WorkerLost):
    """The agent could not take its slot's lock: another live agent (another master's) holds
    it.  ``holder``: what the lock file says of it (pid and start), or the agent's message."""

    def __init__(self, message: str, holder: str):
        super().__init__(message)
        self.holder = holder


class LocalAgent:
    """The agent as a subprocess of the master, run from its zipapp as on a remote worker."""

    def __init__(self, name: str, cache_dir: Path, worker_class: str,
                 cpus: frozenset[int] | None = None, lock: Path | None = None,
                 lock_wait: float = DEFAULT_LOCK_WAIT_S, background: bool = False):
        """``cpus``: the agent's CPU mask (default: this thread's).  The master may keep its
        own threads off the worker CPUs; the agent must still be allowed to pin runs there.
        ``lock``: the slot's lock file, which the agent holds for its life, waiting up to
        ``lock_wait`` s for another agent to let it go; SlotLockBusy if none does (checked by
        a hello, so the constructor returns once the agent holds it).  ``background``: the
        agent and its runs at the lowest priority (nice 19), on a CPU whose compiles go
        first."""
        zipapp = agent_zipapp()
        command = [sys.executable, str(zipapp), "--cache-dir", str(cache_dir),
                   "--worker-class", worker_class]
        if lock is not None:
            command += ["--lock", str(lock), "--lock-wait", str(lock_wait)]
        if background:
            command.append("--background")
        saved = os.sched_getaffinity(0)
        if cpus:
            os.sched_setaffinity(0, cpus)  # this thread only; the agent inherits it
        try:
            self.process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True)  # Ctrl-C is for the master, which stops cleanly
            # the agent's stderr goes on to ours, but for why it could not take its lock
            self._lock_message = ""
            self._stderr = threading.Thread(target=self._forward_stderr, daemon=True,
                                            name=f"{name}-stderr")
            self._stderr.start()
        finally:
            if cpus:
                os.sched_setaffinity(0, saved)
        assert self.process.stdin is not None and self.process.stdout is not None
        self.connection = AgentConnection(name, self.process.stdin, self.process.stdout)
        if lock is not None:
            try:
                self.connection.request({"op": "hello"})
            except WorkerLost:
                status = self._exit_status()
                self.close()
                if status == SLOT_LOCK_BUSY_STATUS:
                    self._stderr.join(5)
                    holder = self._lock_message or f"lock {lock}"
                    raise SlotLockBusy(f"{name}: {holder}", holder) from None
                raise

    def _forward_stderr(self) -> None:
        stream = self.process.stderr
        assert stream is not None
        try:
            for raw in stream:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                message = slot_lock_message(line)
                if message is not None:
                    self._lock_message = message
                    continue
                sys.stderr.write(line + "\n")
        except (OSError, ValueError):  # the stream was closed under us, or ours is gone
            pass

    def _exit_status(self) -> int | None:
        try:
            return self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        """Stop the agent: EOF on its stdin (it kills a run in progress at once and exits),
        then SIGKILL if it has not exited within 5 s."""
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._stderr.join(1)
        for stream in (self.process.stdout, self.process.stderr):
            if stream:
                stream.close()


def result_from_response(job: RunJob, slot: Any, response: dict) -> RunResult:
    return RunResult(sha256=job.sha256, args=job.args, worker=slot.name,
                     worker_class=slot.worker_class, cpu=response["cpu"],
                     records=tuple(RunRecord.from_json(r) for r in response["runs"]))
