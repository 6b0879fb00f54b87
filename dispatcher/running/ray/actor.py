"""What runs on a Ray node: the actor of one worker slot, hosting the worker agent.

``AgentHost`` is the body of the Ray backend's actor (``dispatcher.running.ray.cluster``).  Its code
travels to the nodes by value (cloudpickle), so this module uses the standard library only,
and ``ray`` (which every node has) only inside the method that fetches a binary: nothing of
this project is installed on a node.  The agent is the same zipapp every backend runs
(``dispatcher.running.agent_client.agent_zipapp``), written once into the node's cache
directory and started with the node's python; the actor forwards JSON-lines requests to it,
several at a time (the agent answers in request order, so the actor's threads each wait for
their own reply).

On the node (``~`` is the home of the user running ``ray start``):

- ``<cache_dir>/agent-<sha256[:16]>.pyz``: the agent, named by its hash;
- ``<cache_dir>/binaries/<sha256>``: binaries, one file per sha256, written atomically from
  the object store the first time a job on this node needs one; the agent checks the content
  against the name before it runs it;
- ``<lock_dir>/cpu<N>.lock``: the CPU's lock, the local backend's (``$INLINING_ORCHESTRATOR_
  LOCK_DIR`` or ``/tmp/inlining-orchestrator-locks``), held by the agent for its life, so a
  local master and a Ray actor on one machine never time runs on the same CPU at once.

A node may set ``INLINING_ORCHESTRATOR_RAY_CACHE`` in the environment of its ``ray start``
to keep its cache elsewhere than the config says.
"""
from __future__ import annotations

import collections
import hashlib
import itertools
import json
import os
import subprocess
import sys
import threading
from typing import Any

CACHE_ENV = "INLINING_ORCHESTRATOR_RAY_CACHE"
# Copies of workers.agent.protocol's (this module may import nothing of the project; a test
# checks that they are equal): the machine's CPU locks, as the local backend's, and how the
# agent says that it could not take its slot's lock.
LOCK_DIR_ENV = "INLINING_ORCHESTRATOR_LOCK_DIR"
DEFAULT_LOCK_DIR = "/tmp/inlining-orchestrator-locks"
CPU_LOCK_NAME = "cpu%d.lock"
SLOT_LOCK_BUSY_STATUS = 75
STDERR_PREFIX = "agent: "
SLOT_LOCK_LINES = (STDERR_PREFIX + "slot lock ", STDERR_PREFIX + "cannot open the slot lock ")


def _write_atomically(path: str, data: bytes, mode: int) -> None:
    tmp = "%s.%d.%d.tmp" % (path, os.getpid(), threading.get_ident())
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class _Lines:
    """JSON lines to the agent, pipelined: replies come in request order, and each caller
    waits for the reply to its own id.  Once the stream breaks every caller gets ``None``."""

    def __init__(self, proc: subprocess.Popen):
        self._proc = proc
        self._ids = itertools.count(1)
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._outstanding: collections.deque = collections.deque()
        self._replies: dict = {}
        self.broken: str | None = None
        threading.Thread(target=self._read, daemon=True, name="agent-replies").start()

    def request(self, message: dict) -> dict | None:
        with self._send_lock:
            rid = next(self._ids)
            line = json.dumps(dict(message, id=rid)).encode() + b"\n"
            with self._cond:
                if self.broken:
                    return None
                self._outstanding.append(rid)
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.write(line)
                self._proc.stdin.flush()
            except (OSError, ValueError) as exc:
                self._break("cannot write to the agent (%s)" % exc)
        with self._cond:
            while rid not in self._replies and not self.broken:
                self._cond.wait()
            return self._replies.pop(rid, None)

    def _read(self) -> None:
        stream = self._proc.stdout
        assert stream is not None
        try:
            for raw in stream:
                try:
                    reply = json.loads(raw)
                except ValueError:
                    self._break("unreadable reply from the agent: %r" % raw[:100])
                    return
                with self._cond:
                    expected = self._outstanding[0] if self._outstanding else None
                    if not isinstance(reply, dict) or reply.get("id") != expected:
                        self.broken = self.broken or "reply out of order from the agent"
                        self._cond.notify_all()
                        return
                    self._outstanding.popleft()
                    self._replies[expected] = reply
                    self._cond.notify_all()
        except (OSError, ValueError):
            pass
        self._break("the agent exited")

    def _break(self, why: str) -> None:
        with self._cond:
            if not self.broken:
                self.broken = why
            self._cond.notify_all()


class AgentHost:
    """One worker slot on a Ray node: the agent for CPU ``cpu`` as a subprocess."""

    def __init__(self, slot: str, cpu: int, worker_class: str, cache_dir: str,
                 agent_name: str, agent_zipapp: bytes, lock_wait: float):
        self.slot, self.cpu, self.worker_class = slot, cpu, worker_class
        self.root = os.path.expanduser(os.environ.get(CACHE_ENV) or cache_dir)
        self.binaries = os.path.join(self.root, "binaries")
        self.agent_path = os.path.join(self.root, agent_name)
        self._agent_zipapp: bytes | None = agent_zipapp  # written by the first start
        self.lock_dir = os.environ.get(LOCK_DIR_ENV) or DEFAULT_LOCK_DIR
        self.lock_wait = lock_wait
        self.fetched = 0  # binaries this actor took from the object store
        self._proc: subprocess.Popen | None = None
        self._lines: _Lines | None = None
        self._lock_message = ""
        self._start_lock = threading.Lock()

    # ------------------------------------------------------------------ the agent

    def _lock_file(self) -> str:
        if not os.path.isdir(self.lock_dir):
            try:
                os.makedirs(self.lock_dir)
            except FileExistsError:
                pass
            else:
                os.chmod(self.lock_dir, 0o1777)  # shared by every user, as /tmp
        return os.path.join(self.lock_dir, CPU_LOCK_NAME % self.cpu)

    def _prepare_cache(self) -> None:
        os.makedirs(self.binaries, exist_ok=True)
        if self._agent_zipapp is None:
            return
        try:
            with open(self.agent_path, "rb") as f:
                present = f.read() == self._agent_zipapp
        except OSError:
            present = False
        if not present:
            _write_atomically(self.agent_path, self._agent_zipapp, 0o644)
        self._agent_zipapp = None

    def start(self) -> dict:
        """Start the agent (if it is not running) -> ``{"ok": true, "hello": ...,
        "cached": [sha256, ...]}``, or ``{"ok": false, "lock_busy"|"error": why}`` (with
        ``"permanent": true`` when trying again cannot help)."""
        with self._start_lock:
            try:
                self._prepare_cache()
            except OSError as exc:
                return {"ok": False, "permanent": True, "error": "cannot write the cache %s on "
                        "this node: %s" % (self.root, exc.strerror or exc)}
            if self._lines is None or self._lines.broken:
                self._stop()
                try:
                    lock = self._lock_file()
                except OSError as exc:
                    return {"ok": False, "permanent": True, "error": "cannot make the CPU lock "
                            "directory %s: %s" % (self.lock_dir, exc.strerror or exc)}
                self._lock_message = ""
                self._proc = subprocess.Popen(
                    [sys.executable, self.agent_path, "--cache-dir", self.binaries,
                     "--worker-class", self.worker_class, "--lock", lock,
                     "--lock-wait", str(self.lock_wait)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    start_new_session=True)
                threading.Thread(target=self._forward_stderr, args=(self._proc,), daemon=True,
                                 name="agent-stderr").start()
                self._lines = _Lines(self._proc)
            hello = self._lines.request({"op": "hello"})
            if hello is None:
                status = self._exit_status()
                self._stop()
                if status == SLOT_LOCK_BUSY_STATUS:
                    return {"ok": False, "lock_busy": self._lock_message
                            or "the lock of CPU %d is held by another agent" % self.cpu}
                return {"ok": False, "error": "the agent exited at start (status %s)%s"
                        % (status, ": " + self._lock_message if self._lock_message else "")}
        cached = sorted(n for n in os.listdir(self.binaries) if len(n) == 64)
        return {"ok": True, "hello": hello, "cached": cached}

    def _forward_stderr(self, proc: subprocess.Popen) -> None:
        stream = proc.stderr
        assert stream is not None
        try:
            for raw in stream:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                if line.startswith(SLOT_LOCK_LINES):
                    self._lock_message = line[len(STDERR_PREFIX):]
                    continue
                sys.stderr.write("%s: %s\n" % (self.slot, line))
                sys.stderr.flush()
        except (OSError, ValueError):
            pass

    def _exit_status(self) -> int | None:
        if self._proc is None:
            return None
        try:
            return self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return None

    def _stop(self) -> None:
        proc, self._proc, self._lines = self._proc, None, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()  # EOF: the agent kills a run in progress and exits
        except OSError:
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    # ------------------------------------------------------------------ jobs

    def run(self, request: dict, binary: Any = None) -> dict:
        """Forward one run request -> the agent's reply, or ``{"lost": why}`` if the agent is
        gone.  ``binary``: None, or ``[ObjectRef]`` of the binary's bytes (nested, so Ray
        fetches it only when this node's cache lacks it)."""
        lines = self._lines
        if lines is None or lines.broken:
            return {"lost": lines.broken if lines is not None else "no agent running"}
        if binary:
            self._install(request["sha256"], binary[0])
        reply = lines.request(request)
        if reply is None:
            return {"lost": lines.broken or "the agent exited"}
        return reply

    def _install(self, sha256: str, ref: Any) -> None:
        if len(sha256) != 64 or not all(c in "0123456789abcdef" for c in sha256):
            raise ValueError("not a sha256: %r" % sha256)
        path = os.path.join(self.binaries, sha256)
        if os.path.exists(path):
            return
        import ray
        data = ray.get(ref)
        if hashlib.sha256(data).hexdigest() != sha256:
            raise ValueError("binary %s arrived damaged from the object store" % sha256[:12])
        _write_atomically(path, data, 0o755)
        self.fetched += 1

    def stats(self) -> dict:
        return {"fetched": self.fetched, "pid": os.getpid(),
                "agent_pid": self._proc.pid if self._proc is not None else None}

    def close(self) -> bool:
        with self._start_lock:
            self._stop()
        return True
