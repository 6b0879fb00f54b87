"""A Ray cluster for tests: real nodes (``ray.cluster_utils.Cluster``) in a private network
namespace with loopback only, token authentication on.

Ray advertises the machine's external interface and probes public resolvers unless it has
none: the cluster lives in a namespace made by ``unshare --net`` where only ``lo`` is up, and
every command that talks to it is started in that namespace (``nsenter``).  Nothing listens
outside it and no packet leaves it.

Two nodes, ``n1`` (the head, where the master's driver attaches, which also offers the compile
resource) and ``n2``, each offering one per-CPU resource for the same CPU of this machine (they stand for two machines, so each
has its own CPU lock directory and binary cache: ``root/<node>/locks``, ``root/<node>/cache``).

    with RayLab(tmp_path) as lab:
        subprocess.run(lab.command(["python", "-m", "commands", ...]), env=lab.env())
        lab.remove_node("n2", when_running=True)  # once a binary runs there

Run as a script (``python tests/raylab.py serve ROOT CPU``) it is the helper inside the
namespace: it starts the cluster, prints ``ready ADDRESS``, then obeys one command per line on
stdin (``remove NODE``, ``remove-when-running NODE``, ``kill-actor-when-running NODE``) and
shuts the cluster down on EOF.
"""
from __future__ import annotations

import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

PREFIX = "inlining_cpu_"
COMPILE = "compile"  # the compile resource (ray.compile_resource's default)
NODES = ("n1", "n2")


class LabUnavailable(RuntimeError):
    """This machine cannot host the lab (not root, no unshare, no ray)."""


def lab_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (a private network namespace)"
    for tool in ("unshare", "nsenter", "ip"):
        if not shutil.which(tool):
            return f"needs {tool} (util-linux, iproute2)"
    try:
        import ray  # noqa: F401
    except ImportError:
        return "needs ray (scripts/bootstrap --test installs it)"
    return None


def _netns_inode(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


class RayLab:
    def __init__(self, root: Path, cpu: int | None = None):
        reason = lab_unavailable_reason()
        if reason:
            raise LabUnavailable(reason)
        self.root = Path(root)
        self.cpu = min(os.sched_getaffinity(0)) if cpu is None else cpu
        self.token = secrets.token_hex(16)
        self.address = ""
        self._proc: subprocess.Popen | None = None
        self._netns = ""
        self._log = self.root / "helper.log"

    def cache(self, node: str) -> Path:
        """A node's binary cache (the ray.cache_dir of its ``ray start`` environment)."""
        return self.root / node / "cache"

    def env(self) -> dict:
        """The environment of a master talking to the cluster."""
        return {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token,
                "RAY_USAGE_STATS_ENABLED": "0"}

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the cluster's network namespace."""
        assert self._proc is not None
        return ["nsenter", f"--net=/proc/{self._proc.pid}/ns/net", "--", *argv]

    # ------------------------------------------------------------------ life cycle

    def __enter__(self) -> RayLab:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self, timeout: float = 120) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self._log, "wb")
        try:
            self._proc = subprocess.Popen(
                ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$0" "$@"',
                 sys.executable, __file__, "serve", str(self.root), str(self.cpu)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=self.env(),
                cwd=self.root, start_new_session=True)
        finally:
            log.close()
        line = self._reply(timeout)
        if not line.startswith("ready "):
            raise LabUnavailable(f"the Ray lab did not start: {line or self.log_tail()}")
        self.address = line.split()[1]
        self._netns = _netns_inode(self._proc.pid)

    def _reply(self, timeout: float) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        buf = b""
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return ""
            chunk = os.read(fd, 1)
            if not chunk:
                return ""
            buf += chunk
        return buf.decode().strip()

    def ask(self, request: str, timeout: float = 120) -> str:
        """Send the helper one command -> its one-line answer ("" if none came in time)."""
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write(request.encode() + b"\n")
        self._proc.stdin.flush()
        return self._reply(timeout)

    def send(self, request: str) -> None:
        """Send a command whose answer is read later (``reply``)."""
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write(request.encode() + b"\n")
        self._proc.stdin.flush()

    def reply(self, timeout: float = 120) -> str:
        return self._reply(timeout)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self._log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def leftovers(self) -> list[int]:
        """Processes still in the lab's network namespace."""
        if not self._netns:
            return []
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.readlink(f"/proc/{entry}/ns/net") == self._netns:
                        pids.append(int(entry))
                except OSError:
                    pass
        return pids

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()  # the helper shuts the cluster down
            proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for pid in self.leftovers():  # anything the shutdown missed, the helper included
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if proc.stdout is not None:
            proc.stdout.close()


# --------------------------------------------------------------------------- the helper

def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _running_binary(cache: Path) -> int | None:
    """The pid of a benchmark binary running from ``cache``, if any."""
    prefix = str(cache / "binaries") + "/"
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            argv = _cmdline(int(entry))
            if argv and argv[0].startswith(prefix):
                return int(entry)
    return None


def _wait_for_binary(cache: Path, timeout: float = 120) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = _running_binary(cache)
        if pid is not None:
            return pid
        time.sleep(0.01)
    return None


def serve(root: Path, cpu: int) -> None:
    from ray.cluster_utils import Cluster

    def node_args(name: str) -> dict:
        (root / name / "locks").mkdir(parents=True, exist_ok=True)
        # the head also compiles (one build at a time): n2 is the node tests remove
        compiles = {COMPILE: 1} if name == NODES[0] else {}
        return dict(num_cpus=0, resources={f"{PREFIX}{cpu}": 1, **compiles}, node_name=name,
                    node_ip_address="127.0.0.1", object_store_memory=80 << 20,
                    env_vars={"INLINING_ORCHESTRATOR_LOCK_DIR": str(root / name / "locks"),
                              "INLINING_ORCHESTRATOR_RAY_CACHE": str(root / name / "cache")})

    cluster = Cluster(initialize_head=True,
                      head_node_args=dict(node_args(NODES[0]), include_dashboard=False))
    try:
        nodes = {NODES[0]: cluster.head_node}
        for name in NODES[1:]:
            nodes[name] = cluster.add_node(**node_args(name))
        cluster.wait_for_nodes()
        print("ready", cluster.address, flush=True)
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            op, name = words[0], words[1] if len(words) > 1 else ""
            if name not in nodes:
                print(f"error: no node {name!r}", flush=True)
                continue
            t0 = time.monotonic()
            if op in ("remove-when-running", "kill-actor-when-running"):
                pid = _wait_for_binary(root / name / "cache")
                if pid is None:
                    print(f"error: no binary ran on {name}", flush=True)
                    continue
                if op == "kill-actor-when-running":
                    worker = pid
                    while worker > 1 and not (_cmdline(worker) or [""])[0].startswith("ray::"):
                        worker = _parent(worker)
                    if worker <= 1:
                        print(f"error: no actor above binary {pid}", flush=True)
                        continue
                    os.kill(worker, signal.SIGKILL)
                    print(f"killed {worker} {time.monotonic() - t0:.2f}", flush=True)
                    continue
            if op in ("remove", "remove-when-running"):
                cluster.remove_node(nodes.pop(name), allow_graceful=False)
                print(f"removed {name} {time.monotonic() - t0:.2f}", flush=True)
            else:
                print(f"error: unknown command {op!r}", flush=True)
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "serve":
        serve(Path(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit("usage: raylab.py serve ROOT CPU")
