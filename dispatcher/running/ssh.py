"""The SSH backend: worker slots on benchmark machines reached with paramiko.

One persistent connection per host.  Over it the master keeps the worker's rundir in order by
SFTP (the agent, named by its hash; a bounded cache of binaries, named by sha256; the slots'
lock files) and runs one agent per CPU slot, each in its own channel on the worker's python3.
Nothing is installed on the worker and nothing listens there.  Host keys are checked against a
known_hosts file; authentication is by key only.

Every remote command is built from ``shlex.quote``d words, and every remote path is the rundir
joined with a name this module makes (``cache``, ``locks``, a sha256, ``cpuN.lock``): no name
from a config or sexp file reaches a path or a shell unchecked.
"""
from __future__ import annotations

import base64
import hashlib
import logging
import os
import posixpath
import re
import shlex
import socket
import stat
import threading
import time
import uuid
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path

import paramiko

from dispatcher.build.driver import BuildResult
from dispatcher.build.manifest import Benchmark
from dispatcher.build.remote import NO_REUSE, BuilderLost, UnitReuse, build_request, build_result
from dispatcher.build.toolchain import Compiler
from dispatcher.core.files import sha256_file
from dispatcher.core.jobs import RunJob
from dispatcher.core.validation import MAX_BACKOFF_S, Reader
from dispatcher.running.agent_client import (
    AGENT_PATH,
    AgentConnection,
    AgentError,
    RunResult,
    WorkerLost,
    agent_zipapp,
    result_from_response,
)
from dispatcher.running.backend import BackendContext, BackendSpec, PermanentLoss
from workers.agent.build import reply_of as build_reply_of
from workers.agent.build import request_json as build_request_json
from workers.agent.protocol import (
    CHECKSUM_MISMATCH,
    CPU_LOCK_NAME,
    DEFAULT_LOCK_WAIT_S,
    NOT_IN_CACHE,
)

log = logging.getLogger(__name__)

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
JOB_SLACK_S = 30.0  # beyond 1.5 x the runs' own timeouts, before a silent agent is presumed hung
STALE_UPLOAD_S = 3600.0  # partial uploads older than this are removed on connect
HOST_RETRY_S = 1.0  # after a failed connect, the host's other slots fail fast this long
MAX_CACHE_MB = 1 << 20  # ssh.hosts[].cache_limit_mb: at most 1 TiB of binaries on a worker
BUILD_RETRY_S = 60.0  # a host that could not answer a build is left out of builds this long


@dataclass(frozen=True)
class SshHost:
    """One benchmark machine reached over SSH: one worker slot per CPU listed."""

    name: str  # label in slot names and messages (default host, or host:port)
    host: str
    port: int
    user: str
    key_file: Path
    rundir: str  # on the worker; relative paths are relative to the user's home
    cpus: tuple[int, ...]
    python: str = "python3"
    cache_limit_bytes: int = 2 << 30
    worker_class: str = "ssh"
    compile_cpus: tuple[int, ...] = ()  # CPUs for the master's builds (one build per CPU)
    ocamlopt: str | None = None  # the patched compiler there (None: the master's path)


@dataclass(frozen=True)
class SshConfig:
    known_hosts: Path
    trust_on_first_use: bool
    connect_timeout: float
    hosts: tuple[SshHost, ...]


class HostError(WorkerLost):
    """A worker host cannot serve now (unreachable, dropped, an agent that would not start):
    the scheduler backs off and probes it again."""


class UnusableHost(HostError, PermanentLoss):
    """A worker host that trying again will not cure (a wrong host key, a refused key, a
    missing python3): the scheduler takes its slots out of service at once."""


def host_error(message: str, permanent: bool) -> HostError:
    return UnusableHost(message) if permanent else HostError(message)


def fingerprint(key: paramiko.PKey) -> str:
    """The key's fingerprint as OpenSSH prints it (``ssh-keygen -lf``)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class _RefuseUnknownKey(paramiko.MissingHostKeyPolicy):
    def __init__(self, host: SshHost, known_hosts: Path):
        self.host, self.known_hosts = host, known_hosts

    def missing_host_key(self, client, hostname, key):
        raise UnusableHost(f"{self.host.name}: unknown host key {key.get_name()} "
                           f"{fingerprint(key)} for {hostname}: not in {self.known_hosts} (add "
                           "it, or set ssh.trust_on_first_use to record it)")


_known_hosts_lock = threading.Lock()


class _TrustOnFirstUse(paramiko.MissingHostKeyPolicy):
    """Accept a host seen for the first time and record its key: from then on it is pinned."""

    def __init__(self, host: SshHost, known_hosts: Path):
        self.host, self.known_hosts = host, known_hosts

    def missing_host_key(self, client, hostname, key):
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with _known_hosts_lock:
            self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        client.get_host_keys().add(hostname, key.get_name(), key)
        log.warning("%s: trusted on first use: host key %s %s recorded in %s", self.host.name,
                    key.get_name(), fingerprint(key), self.known_hosts)


def remote_path(rundir: str, *names: str) -> str:
    """A path inside the worker's rundir ("~/" and relative rundirs are relative to the
    login's home, which is where both SFTP and the login shell start)."""
    base = rundir[2:] if rundir.startswith("~/") else rundir
    for name in names:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"not a plain file name: {name!r}")
    return posixpath.join(base, *names)


class WorkerHost:
    """One worker machine: its connection, SFTP session, rundir and binary cache.

    Shared by the host's slots; every method is safe to call from their threads."""

    def __init__(self, host: SshHost, ssh: SshConfig, agent_path: Path = AGENT_PATH):
        """``agent_path``: the agent's package (uploaded as its zipapp) or a zipapp file."""
        self.config = host
        self.name = host.name
        self._ssh = ssh
        self._agent_source = agent_zipapp(agent_path) if agent_path.is_dir() else agent_path
        self.agent_sha256 = sha256_file(self._agent_source)  # what its hello must report
        self.agent_remote = remote_path(host.rundir, f"agent-{self.agent_sha256[:16]}.pyz")
        self.cache_dir = remote_path(host.rundir, "cache")
        self._lock = threading.RLock()
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._cache: OrderedDict[str, int] = OrderedDict()  # sha256 -> size, least recent first
        self._in_use: Counter = Counter()  # sha256 -> jobs about to run or running it
        self._down_until = 0.0  # after a failed connect, others fail fast until then
        self._down_error: HostError | None = None

    # ------------------------------------------------------------------ connection

    def transport(self) -> paramiko.Transport:
        """The live connection, made (or remade) if needed."""
        with self._lock:
            if self._client is not None:
                t = self._client.get_transport()
                if t is not None and t.is_active():
                    return t
                self._disconnect()
            if self._down_error is not None and time.monotonic() < self._down_until:
                raise self._down_error
            try:
                self._connect()
            except HostError as exc:
                self._down_error = exc
                # Sibling slots probing at the same moment share this attempt; the
                # scheduler's back-off decides when the host is tried again.
                self._down_until = time.monotonic() + HOST_RETRY_S
                raise
            self._down_error = None
            assert self._client is not None  # _connect made it
            return self._client.get_transport()

    def _connect(self) -> None:
        h, ssh = self.config, self._ssh
        client = paramiko.SSHClient()
        if ssh.known_hosts.exists():
            try:
                client.load_host_keys(str(ssh.known_hosts))
            except (OSError, paramiko.SSHException) as exc:
                raise UnusableHost(f"{h.name}: cannot read known hosts {ssh.known_hosts}: "
                                   f"{exc}") from None
        policy = _TrustOnFirstUse if ssh.trust_on_first_use else _RefuseUnknownKey
        client.set_missing_host_key_policy(policy(h, ssh.known_hosts))
        t = ssh.connect_timeout
        try:
            client.connect(h.host, port=h.port, username=h.user, key_filename=str(h.key_file),
                           look_for_keys=False, allow_agent=False, timeout=t, banner_timeout=t,
                           auth_timeout=t, channel_timeout=t)
        except HostError:
            client.close()
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise UnusableHost(
                f"{h.name}: host key CHANGED for {exc.hostname}: the server offers "
                f"{exc.key.get_name()} {fingerprint(exc.key)}, {ssh.known_hosts} has "
                f"{fingerprint(exc.expected_key)}; refusing to connect") from None
        except paramiko.PasswordRequiredException:
            client.close()
            raise UnusableHost(f"{h.name}: key file {h.key_file} is encrypted; use a key "
                               "without a passphrase for benchmark workers") from None
        except paramiko.AuthenticationException as exc:
            client.close()
            raise UnusableHost(f"{h.name}: key authentication as {h.user} failed with "
                               f"{h.key_file} ({exc})") from None
        except FileNotFoundError:
            client.close()
            raise UnusableHost(f"{h.name}: key file {h.key_file} does not exist") from None
        except paramiko.ssh_exception.NoValidConnectionsError as exc:
            client.close()
            why = sorted({os.strerror(e.errno) if getattr(e, "errno", None) else str(e)
                          for e in exc.errors.values()})
            raise HostError(f"{h.name}: cannot connect to {h.host} port {h.port}: "
                            f"{'; '.join(why)}") from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            client.close()
            raise HostError(f"{h.name}: cannot connect to {h.host} port {h.port}: "
                            f"{exc or type(exc).__name__}") from None
        client.get_transport().set_keepalive(5)
        try:
            sftp = client.open_sftp()
            sftp.get_channel().settimeout(max(t, 30.0))
            self._prepare_rundir(sftp)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            client.close()
            raise HostError(f"{h.name}: cannot prepare the rundir {h.rundir!r} over SFTP: "
                            f"{exc or type(exc).__name__}") from None
        self._client, self._sftp = client, sftp

    def _prepare_rundir(self, sftp: paramiko.SFTPClient) -> None:
        base = remote_path(self.config.rundir)
        parts, path = [p for p in base.split("/") if p], "/" if base.startswith("/") else ""
        for part in parts:  # mkdir -p, without a shell
            path = posixpath.join(path, part) if path else part
            _sftp_mkdir(sftp, path)
        for sub in ("cache", "locks"):
            _sftp_mkdir(sftp, remote_path(self.config.rundir, sub))
        try:
            present = sftp.stat(self.agent_remote).st_size == self._agent_source.stat().st_size
        except FileNotFoundError:
            present = False
        if not present:
            self._put(sftp, self._agent_source, self.agent_remote, mode=0o644)
        self._cache.clear()
        now = time.time()
        entries = sorted(sftp.listdir_attr(self.cache_dir), key=lambda a: a.st_mtime or 0)
        for attr in entries:
            if SHA256_RE.match(attr.filename) and stat.S_ISREG(attr.st_mode or 0):
                self._cache[attr.filename] = attr.st_size or 0
            elif attr.filename.endswith(".tmp") and now - (attr.st_mtime or now) > STALE_UPLOAD_S:
                _sftp_remove(sftp, posixpath.join(self.cache_dir, attr.filename))

    def _put(self, sftp: paramiko.SFTPClient, local: Path, dest: str, mode: int) -> None:
        """Upload under a temporary name, then rename: a reader never sees half a file."""
        tmp = posixpath.join(posixpath.dirname(dest),
                             f".{posixpath.basename(dest)}.{uuid.uuid4().hex}.tmp")
        sftp.put(str(local), tmp, confirm=True)
        sftp.chmod(tmp, mode)
        sftp.posix_rename(tmp, dest)

    def _disconnect(self) -> None:
        client, self._client, self._sftp = self._client, None, None
        if client is not None:
            client.close()

    def close(self) -> None:
        with self._lock:
            self._disconnect()

    # ------------------------------------------------------------------ agents

    def start_agent(self, slot_name: str, cpu: int) -> tuple[paramiko.Channel, AgentConnection]:
        """Start the agent of one CPU slot in a new channel, checked by its hello."""
        h = self.config
        transport = self.transport()
        words = [h.python, self.agent_remote, "--cache-dir", self.cache_dir,
                 "--worker-class", h.worker_class,
                 "--lock", remote_path(h.rundir, "locks", CPU_LOCK_NAME % int(cpu)),
                 "--lock-wait", str(DEFAULT_LOCK_WAIT_S)]
        command = "exec " + " ".join(shlex.quote(w) for w in words)
        try:
            channel = transport.open_session(timeout=self._ssh.connect_timeout)
            channel.settimeout(self._ssh.connect_timeout + DEFAULT_LOCK_WAIT_S + 30)
            channel.exec_command(command)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise HostError(f"{h.name}: cannot start the agent: {exc or type(exc).__name__}"
                            ) from None
        connection = AgentConnection(slot_name, channel.makefile("wb"), channel.makefile("rb"))
        try:
            hello = connection.request({"op": "hello"})
        except WorkerLost:
            raise self._start_failure(channel) from None
        if hello.get("agent_version") != self.agent_sha256:
            channel.close()
            with self._lock:  # a corrupt or foreign file under our name: replace it
                if self._sftp is not None:
                    _sftp_remove(self._sftp, self.agent_remote)
                    self._disconnect()
            raise HostError(f"{h.name}: the agent in {self.agent_remote} is not the master's "
                            f"(hash {str(hello.get('agent_version'))[:16]}); it will be "
                            "uploaded again")
        if cpu not in hello.get("cpus", []):
            channel.close()
            raise UnusableHost(f"{h.name}: CPU {cpu} is not available to the agent (it may "
                               f"use {hello.get('cpus')})")
        return channel, connection

    def _start_failure(self, channel: paramiko.Channel) -> HostError:
        """Why an agent died before answering hello, from its exit status and stderr."""
        h = self.config
        status = None
        if channel.status_event.wait(5):
            status = channel.recv_exit_status()
        err = b""
        try:
            while channel.recv_stderr_ready():
                err += channel.recv_stderr(4096)
        except OSError:
            pass
        channel.close()
        lines = [ln for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
        detail = lines[-1].strip() if lines else "no message"
        if status == 127:
            return UnusableHost(f"{h.name}: cannot run python3 as {h.python!r} on the worker "
                                f"({detail}); install python3 there or set its path as "
                                "python in the config")
        if status == 75:
            return HostError(f"{h.name}: {detail}")
        if status is None:
            return HostError(f"{h.name}: the agent did not answer ({detail})")
        return host_error(f"{h.name}: the agent exited with status {status} before answering "
                          f"({detail})", permanent=status in (1, 2))

    # ------------------------------------------------------------------ builds

    def run_build(self, request: bytes, timeout: float) -> dict:
        """One build for the master by the agent's build mode, in a channel of its own,
        pinned to the host's compile CPUs -> ``workers.agent.build``'s reply; HostError if
        the host cannot answer."""
        h = self.config
        transport = self.transport()  # connected, the agent uploaded
        words = [h.python, self.agent_remote, "build",
                 "--cpus", ",".join(str(c) for c in h.compile_cpus),
                 "--identity-cache", remote_path(h.rundir, "compiler-identity.json")]
        channel = None
        try:
            channel = transport.open_session(timeout=self._ssh.connect_timeout)
            channel.settimeout(timeout + JOB_SLACK_S)
            channel.exec_command("exec " + shlex.join(words))
            channel.sendall(request)
            channel.shutdown_write()
            data = channel.makefile("rb").read()
            status = channel.recv_exit_status()
            err = b""
            while channel.recv_stderr_ready():
                err += channel.recv_stderr(4096)
        except socket.timeout:
            raise HostError(f"{h.name}: no build reply within {timeout + JOB_SLACK_S:.0f} s"
                            ) from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise HostError(f"{h.name}: build channel lost: {exc or type(exc).__name__}"
                            ) from None
        finally:
            if channel is not None:
                channel.close()
        lines = [ln for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
        if status != 0:
            detail = lines[-1].strip() if lines else "no message"
            raise HostError(f"{h.name}: the build agent exited with status {status} ({detail})")
        try:
            return build_reply_of(data)
        except ValueError as exc:
            raise HostError(f"{h.name}: the build agent's reply is not one ({exc})") from None

    # ------------------------------------------------------------------ binaries

    def acquire_binary(self, sha256: str, local: Path) -> None:
        """Make the binary present in the worker's cache and protect it from eviction until
        ``release_binary``.  Uploads once per sha256; the agent checks it before running."""
        if not SHA256_RE.match(sha256):
            raise ValueError(f"not a sha256: {sha256!r}")
        with self._lock:
            self._in_use[sha256] += 1
            try:
                if sha256 in self._cache:
                    self._cache.move_to_end(sha256)
                    return
                self.transport()
                dest = posixpath.join(self.cache_dir, sha256)
                try:
                    self._put(self._sftp, local, dest, mode=0o755)
                except (OSError, EOFError, paramiko.SSHException) as exc:
                    self._disconnect()
                    raise HostError(f"{self.name}: upload of {sha256[:12]} failed: "
                                    f"{exc or type(exc).__name__}") from None
                self._cache[sha256] = local.stat().st_size
                self._evict()
            except BaseException:
                self._release(sha256)
                raise

    def release_binary(self, sha256: str) -> None:
        with self._lock:
            self._release(sha256)

    def forget_binary(self, sha256: str) -> None:
        """The agent found it missing or corrupt: upload it again next time."""
        with self._lock:
            self._cache.pop(sha256, None)

    def _release(self, sha256: str) -> None:
        self._in_use[sha256] -= 1
        if self._in_use[sha256] <= 0:
            del self._in_use[sha256]

    def _evict(self) -> None:
        """Remove least recently used binaries not in use until the cache fits its bound."""
        total = sum(self._cache.values())
        for sha in list(self._cache):
            if total <= self.config.cache_limit_bytes:
                break
            if self._in_use[sha] > 0:
                continue
            try:
                _sftp_remove(self._sftp, posixpath.join(self.cache_dir, sha))
            except (OSError, EOFError, paramiko.SSHException) as exc:
                log.warning("%s: cannot evict %s from the binary cache: %s", self.name,
                            sha[:12], exc or type(exc).__name__)
                return  # tried again after the next upload
            total -= self._cache.pop(sha)

    def cached(self) -> list[str]:
        with self._lock:
            return list(self._cache)


def _sftp_mkdir(sftp: paramiko.SFTPClient, path: str) -> None:
    try:
        sftp.mkdir(path, 0o755)
    except OSError:
        try:
            if not stat.S_ISDIR(sftp.stat(path).st_mode or 0):
                raise OSError(f"{path} exists and is not a directory") from None
        except FileNotFoundError:
            raise OSError(f"cannot create {path}") from None


def _sftp_remove(sftp: paramiko.SFTPClient, path: str) -> None:
    try:
        sftp.remove(path)
    except FileNotFoundError:
        pass


class SshSlot:
    """One CPU of one worker host: an agent in its own channel, started on first use.

    ``depth`` = 2, as local slots: the scheduler may have two jobs on the slot at once; the
    second is already in the agent's queue when the first run ends (the agent prepares it
    while that run goes on), so the network round trip overlaps a run instead of separating
    two.  The agent still runs one binary at a time on the CPU.  If the channel breaks, every
    job outstanding on it gets ``WorkerLost`` and the scheduler runs it again.
    """

    depth = 2

    def __init__(self, host: WorkerHost, cpu: int):
        self.host = host
        self.cpu = cpu
        self.name = f"ssh/{host.name}/cpu{cpu}"
        self.worker_class = host.config.worker_class
        self._channel: paramiko.Channel | None = None
        self._connection: AgentConnection | None = None
        self._lock = threading.Lock()  # the channel, and the deadlines of the jobs on it
        self._deadlines: dict[int, float] = {}  # request id -> its run budget (s)

    def probe(self) -> None:
        """Make sure the agent is up (connecting to the host if needed); HostError if not."""
        with self._lock:
            self._ensure()

    def _ensure(self) -> tuple[paramiko.Channel, AgentConnection]:
        channel = self._channel
        if channel is None or channel.closed or channel.exit_status_ready():
            self._drop(channel)
            self._channel, self._connection = self.host.start_agent(self.name, self.cpu)
            self._deadlines = {}
        assert self._channel is not None and self._connection is not None
        return self._channel, self._connection

    def exact_info(self) -> tuple[dict, str]:
        """The agent's ``exact`` (whether it can count under cachegrind) and its host."""
        hello = self._exchange({"op": "hello", "exact": True}, JOB_SLACK_S + 60)
        return hello.get("exact") or {}, self.host.name

    def run(self, job: RunJob) -> RunResult:
        request = job.request(self.cpu)
        self.probe()  # connected first: the host then knows what its cache already holds
        for attempt in (1, 2):
            self.host.acquire_binary(job.sha256, job.binary)
            try:
                response = self._exchange(request, job.runs * job.timeout * 1.5 + JOB_SLACK_S)
            except AgentError as exc:
                if attempt == 1 and exc.code in (NOT_IN_CACHE, CHECKSUM_MISMATCH):
                    self.host.forget_binary(job.sha256)  # removed or damaged on the worker
                    continue
                raise
            finally:
                self.host.release_binary(job.sha256)
            return result_from_response(job, self, response)
        raise AssertionError("unreachable")

    def _exchange(self, request: dict, budget: float) -> dict:
        """Send ``request`` and wait for its reply.  A reply is due within the budgets of the
        jobs ahead of it on the channel plus its own: the channel's read timeout is set to
        that sum while they are outstanding."""
        with self._lock:
            channel, connection = self._ensure()
            try:
                rid = connection.send(request)
            except WorkerLost:
                self._drop(channel)
                raise
            self._deadlines[rid] = budget
            channel.settimeout(sum(self._deadlines.values()))
        t0 = time.monotonic()
        try:
            return connection.receive(rid)
        except WorkerLost:
            with self._lock:
                waited = sum(self._deadlines.values())
                self._drop(channel)  # hung or gone: a fresh agent (or another slot) takes over
            if time.monotonic() - t0 >= waited:
                raise WorkerLost(f"{self.name}: no answer within {waited:.0f} s; the agent is "
                                 "presumed hung") from None
            raise
        finally:
            with self._lock:
                if self._channel is channel:
                    self._deadlines.pop(rid, None)

    def _drop(self, channel: paramiko.Channel | None) -> None:
        """Forget a broken channel (once, whichever of its jobs notices first); with the
        lock held."""
        if channel is not None and self._channel is channel:
            self._channel, self._connection = None, None
            self._deadlines = {}
        if channel is not None:
            channel.close()

    def close(self) -> None:
        with self._lock:
            channel, connection = self._channel, self._connection
            if connection is not None and channel is not None:
                try:
                    channel.settimeout(5)
                    connection.request({"op": "shutdown"})
                except (AgentError, OSError):
                    pass
            self._drop(channel)


class SshBuilder:
    """Builds on the SSH hosts that give CPUs to compiles (``ssh.hosts[].compile_cpus``): one
    build per such CPU at once, each in a channel of its own running the agent's build mode,
    sent to the host with the most free seats.  A host that cannot answer is left out for
    ``BUILD_RETRY_S``; one that cannot build (no compiler at its path, or another compiler)
    for the rest of the session, said once.  Meanwhile the master builds instead."""

    name = "ssh"
    overflow_to_master = True
    shares_unit_cache = True

    def __init__(self, hosts: list[WorkerHost]):
        self.hosts = hosts
        self.jobs = sum(len(h.config.compile_cpus) for h in hosts)
        self._busy: Counter = Counter()  # host name -> builds running there
        self._down_until: dict[str, float] = {}
        self._refused: dict[str, str] = {}  # host name -> why it builds nothing
        self._lock = threading.Lock()

    def _take(self) -> WorkerHost | None:
        now = time.monotonic()
        with self._lock:
            free = [(len(h.config.compile_cpus) - self._busy[h.name], i, h)
                    for i, h in enumerate(self.hosts)
                    if h.name not in self._refused and self._down_until.get(h.name, 0) <= now]
            free = [f for f in free if f[0] > 0]
            if not free:
                return None
            host = max(free, key=lambda f: (f[0], -f[1]))[2]
            self._busy[host.name] += 1
            return host

    def build(self, bench: Benchmark, outdir: Path, compiler: Compiler,
              flags: tuple[str, ...], overrides: dict[str, Path],
              dump_decisions: bool, reuse: UnitReuse = NO_REUSE) -> tuple[BuildResult, str]:
        host = self._take()
        if host is None:
            raise BuilderLost("ssh: no compiling host can build now")
        where = f"ssh/{host.name}"
        try:
            request = build_request(bench, compiler, flags, overrides, dump_decisions,
                                    ocamlopt=host.config.ocamlopt, reuse=reuse)
            try:
                reply = host.run_build(build_request_json(**request.arguments()),
                                       request.timeout)
            except HostError as exc:
                with self._lock:
                    self._down_until[host.name] = time.monotonic() + BUILD_RETRY_S
                raise BuilderLost(str(exc)) from None
            if "lost" in reply:
                with self._lock:
                    first = host.name not in self._refused
                    self._refused[host.name] = str(reply["lost"])
                if first:
                    log.warning("%s: builds nothing for the rest of this run: %s", where,
                                reply["lost"])
            return build_result(bench, outdir, reply, where, request.timeout, reuse), where
        finally:
            with self._lock:
                self._busy[host.name] -= 1


class SshBackend:
    """Slots for every CPU of every configured host, interleaved across hosts so that a queue
    of jobs spreads over the machines."""

    def __init__(self, config: SshConfig, agent_path: Path = AGENT_PATH):
        self.hosts = [WorkerHost(h, config, agent_path) for h in config.hosts]
        width = max(len(h.config.cpus) for h in self.hosts)
        self.slots = [SshSlot(host, host.config.cpus[i]) for i in range(width)
                      for host in self.hosts if i < len(host.config.cpus)]

    def remote_builder(self) -> SshBuilder | None:
        """Builds on the hosts that give CPUs to compiles (None: none does; compiles stay on
        the master)."""
        hosts = [h for h in self.hosts if h.config.compile_cpus]
        return SshBuilder(hosts) if hosts else None

    def close(self) -> None:
        for slot in self.slots:
            slot.close()
        for host in self.hosts:
            host.close()


# --------------------------------------------------------------------------- configuration

# A host name or address: letters, digits and the punctuation of names, IPv4 and IPv6.
_HOST_RE = re.compile(r"^[A-Za-z0-9._:%\[\]-]+$")


def parse_config(section: dict, r: Reader) -> SshConfig:
    """The ``ssh:`` section."""
    d = r.section({"ssh": section}, "ssh", {"known_hosts", "trust_on_first_use", "key_file", "user",
                                "connect_timeout", "hosts"})
    known_hosts = r.local_path(d.get("known_hosts", "~/.ssh/known_hosts"), "ssh.known_hosts")
    tofu = d.get("trust_on_first_use", False)
    if not isinstance(tofu, bool):
        raise r.fail("ssh.trust_on_first_use", "true or false", tofu)
    timeout = r.positive_number(d, "connect_timeout", "ssh.connect_timeout", 10.0,
                                most=MAX_BACKOFF_S, what="a positive number of seconds")
    hosts_raw = d.get("hosts")
    if not isinstance(hosts_raw, list) or not hosts_raw:
        raise r.fail("ssh.hosts", "a non-empty list of hosts", hosts_raw)
    hosts, names = [], set()
    for i, h in enumerate(hosts_raw):
        where = f"ssh.hosts[{i}]"
        if not isinstance(h, dict):
            raise r.fail(where, "a mapping with host, user, rundir and cpus", h)
        allowed = {"name", "host", "port", "user", "key_file", "rundir", "cpus", "python",
                   "cache_limit_mb", "worker_class", "compile_cpus", "ocamlopt"}
        unknown = sorted(set(h) - allowed)
        if unknown:
            raise r.fail(f"{where}.{unknown[0]}", f"one of {', '.join(sorted(allowed))}")
        host = h.get("host")
        if not isinstance(host, str) or not _HOST_RE.match(host):
            raise r.fail(f"{where}.host", "a host name or address", host)
        port = h.get("port", 22)
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise r.fail(f"{where}.port", "a TCP port number", port)
        name = h.get("name", host if port == 22 else f"{host}:{port}")
        if not isinstance(name, str) or not _HOST_RE.match(name):
            raise r.fail(f"{where}.name", "a label of letters, digits, '.', '_', ':' or '-'",
                         name)
        if name in names:
            raise r.fail(f"{where}.name", "a name no other host has", name)
        names.add(name)
        user = h.get("user", d.get("user"))
        if not isinstance(user, str) or not user or any(c in user for c in "\0\n@"):
            raise r.fail(f"{where}.user", "a user name (here or as ssh.user)", user)
        key_file = r.local_path(h.get("key_file", d.get("key_file", "~/.ssh/id_ed25519")),
                                f"{where}.key_file")
        rundir = h.get("rundir")
        if (not isinstance(rundir, str) or not rundir.strip() or any(c in rundir for c in "\0\n")
                or ".." in rundir.split("/")):
            raise r.fail(f"{where}.rundir", "a directory on the worker (absolute, or relative "
                         "to the user's home; no '..')", rundir)
        cpus = h.get("cpus")
        if (not isinstance(cpus, list) or not cpus or len(set(cpus)) != len(cpus)
                or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                           for c in cpus)):
            raise r.fail(f"{where}.cpus", "a list of distinct CPU numbers", cpus)
        python = h.get("python", "python3")
        if not isinstance(python, str) or not python or any(c in python for c in "\0\n"):
            raise r.fail(f"{where}.python", "the worker's python3 (a command or path)", python)
        limit_mb = r.positive_int(h, "cache_limit_mb", f"{where}.cache_limit_mb", 2048,
                                  most=MAX_CACHE_MB)
        worker_class = h.get("worker_class", "ssh")
        if not isinstance(worker_class, str) or not worker_class or "\0" in worker_class:
            raise r.fail(f"{where}.worker_class", "a non-empty string", worker_class)
        compile_cpus = h.get("compile_cpus", [])
        if (not isinstance(compile_cpus, list) or len(set(compile_cpus)) != len(compile_cpus)
                or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                           for c in compile_cpus)):
            raise r.fail(f"{where}.compile_cpus", "a list of distinct CPU numbers", compile_cpus)
        if set(compile_cpus) & set(cpus):
            raise r.fail(f"{where}.compile_cpus", "CPUs none of which is in cpus (a build "
                         "beside a measured run would disturb it)", compile_cpus)
        ocamlopt = h.get("ocamlopt")
        if ocamlopt is not None and (not isinstance(ocamlopt, str)
                                     or not ocamlopt.startswith("/") or "\0" in ocamlopt
                                     or "\n" in ocamlopt):
            raise r.fail(f"{where}.ocamlopt", "the absolute path of the patched ocamlopt.opt "
                         "on the worker", ocamlopt)
        hosts.append(SshHost(name=name, host=host, port=port, user=user, key_file=key_file,
                             rundir=rundir, cpus=tuple(cpus), python=python,
                             cache_limit_bytes=limit_mb << 20, worker_class=worker_class,
                             compile_cpus=tuple(compile_cpus), ocamlopt=ocamlopt))
    return SshConfig(known_hosts=known_hosts, trust_on_first_use=tofu, connect_timeout=timeout,
                     hosts=tuple(hosts))


def _start(config: SshConfig, context: BackendContext) -> SshBackend:
    return SshBackend(config)


BACKEND = BackendSpec(
    name="ssh", parse=parse_config,
    worker_classes=lambda c: list(dict.fromkeys(h.worker_class for h in c.hosts)),
    master_cpus=lambda c: None, start=_start)
