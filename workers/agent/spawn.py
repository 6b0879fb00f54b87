"""Starting a binary so that its measurements are its own: the fork server, gated sh, direct.

Why not just Popen the binary: Linux folds the high-water RSS of the address space a process
had before ``exec`` into its ``ru_maxrss``, and a child of the agent starts from the agent's
~15-20 MB, so every binary would report at least that (a trivial OCaml program really peaks
at ~1.8 MB).  A binary forked from a small ``sh`` (dash when installed) reports its real peak.
The agent is a child subreaper, so once that sh's intermediate process exits the binary is
the agent's child: only the agent reaps it, and no shell can swallow its exit status.

Every method leaves the run's child waiting on a gate (or, direct, not yet started) so the
runner can pin it, give it a process group of its own, attach counters and RLIMIT_CPU before
the clock starts; ``launch`` then arms the watchdog, starts the clock and lets it go.

``forkserver`` (default)
    One long-lived sh per agent (``ForkServer``), started with an empty environment in the
    agent's scratch directory and replaced, the spawn retried once, when found dead or hung.
    Per run it forks a child that sources ./script (shared by every run of the same binary,
    arguments and environment; the run's token in ``$t``), which redirects stdio, opens its
    gate (a FIFO per run, held open read-write by the agent), cds to the run's directory,
    sets the environment, tells the server it is ready and blocks on the gate.  Forking the
    idle server twice costs about half of starting sh (an exec, ~1 ms).  It is the only
    method whose next run can be prepared while a run goes on (``overlaps``).
``gated`` (when the fork server cannot start)
    Per run ``sh -c`` forks a subshell that blocks reading a gate pipe, prints its pid and
    exits.  As an asynchronous command of a non-interactive shell the binary ignores SIGINT
    and SIGQUIT.
``direct`` (without ctypes/prctl or sh)
    Popen; ``maxrss_kb`` then includes the agent's RSS (hello says so).

A request's ``Plan`` and each ``Run`` of it are defined here, with the run's paths and
environment pad that the spawners use: the runner drives them through this module, never the
other way round.

No quoting risk: every argv word, environment value and path reaches sh single-quoted
('\\'' for a quote), which sh takes literally for every byte but NUL; environment names sh
cannot hold are dropped, as gated sh drops them.  gated and direct pin the spawning thread
itself for the spawn (a child inherits the mask of the thread that forked it), so no
``preexec_fn`` is needed (it would force a slow fork() and is unsafe in a threaded host such
as a Ray actor).
"""
from __future__ import annotations

import os
import random
import re
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .perf import PerfEvents
from .proc import (
    Strays,
    become_child_subreaper,
    cpus_allowed_list,
    killpg_quietly,
    limit_cpu_time,
    limit_file_size,
)
from .protocol import SPAWN_UNAVAILABLE, RequestError, one_line

ENV_PAD_NAME = "INLINING_ENV_PAD"  # aslr runs: a variable of random length shifts the stack
ENV_PAD_MAX = 4096  # its length is uniform in [0, ENV_PAD_MAX), as hyperfine's

if TYPE_CHECKING:
    from .sampling import Sampler
    from .watchdog import Watchdog

SH_START_TIMEOUT_S = 30.0


class SpawnError(Exception):
    """The run could not be started; the message is the run's ``failure``."""


class ServerError(Exception):
    """The fork server died or misbehaved (the request may be retried with a fresh one)."""


def run_paths(scratch: str, token: int) -> tuple[str, str, str]:
    """(working directory, stdout capture, stderr capture) of run ``token`` in the scratch
    directory; the fork server's run script uses the same names."""
    return (os.path.join(scratch, "run-%d" % token), os.path.join(scratch, "o%d" % token),
            os.path.join(scratch, "e%d" % token))


class Plan:
    """A checked run request: what its runs share, and their records so far."""
    __slots__ = ("req_id", "sha", "argv", "runs", "cpu", "timeout", "expected", "env",
                 "perf_events", "spawn", "script", "aslr", "profile_period_ns", "records",
                 "started", "disturbed", "entry", "binary", "metric")

    def __init__(self, req_id: Any, sha: str, argv: list[str], runs: int, cpu: int,
                 timeout: float, expected: dict | None, env: dict[str, str],
                 perf_events: list[str] | None, spawn: str, script: Any, aslr: bool = False,
                 profile_period_ns: int = 0, binary: str | None = None, metric: str = "time"):
        self.req_id, self.sha, self.argv, self.runs, self.cpu = req_id, sha, argv, runs, cpu
        self.timeout, self.expected, self.env = timeout, expected, env
        self.perf_events, self.spawn, self.script = perf_events, spawn, script
        self.aslr = aslr
        self.profile_period_ns = profile_period_ns
        # the binary measured (argv[0] but for a wrapped run: cachegrind's) and the metric
        self.binary = binary if binary is not None else argv[0]
        self.metric = metric
        self.records: list[dict] = []
        self.started = 0  # runs prepared so far (the serve loop's count)
        self.disturbed = 0  # disturbed records so far
        self.entry: list[Any] | None = None  # the serve loop's [response, done]

    def copy(self, req_id: Any) -> Plan:
        """A fresh plan of the same request (id ``req_id``), no run started."""
        return Plan(req_id, self.sha, self.argv, self.runs, self.cpu, self.timeout,
                    self.expected, self.env, self.perf_events, self.spawn, self.script,
                    self.aslr, self.profile_period_ns, self.binary, self.metric)

    @property
    def target(self) -> int:
        """Runs to make: those asked, plus one for each disturbed run, at most ``runs`` more."""
        return self.runs + min(self.disturbed, self.runs)

    @property
    def done(self) -> bool:
        return len(self.records) >= self.target

    def response(self) -> dict:
        return {
            "ok": True,
            "sha256": self.sha,
            "cpu": self.cpu,
            "spawn": self.spawn,
            "runs": self.records,
            "failed": sum(1 for r in self.records if r["failure"] is not None),
            "disturbed": self.disturbed,
        }


class Run:
    """One run of a plan, from its preparation to its record."""
    __slots__ = ("plan", "token", "workdir", "out_path", "err_path", "pid", "pgid", "pidfd",
                 "gate", "counters", "sampler", "cpus_allowed", "t0", "t1", "status", "ru",
                 "timed_out", "failure", "pad", "aslr", "since", "strays", "stream",
                 "reaped_pid")

    def __init__(self, plan: Plan, token: int, scratch: str):
        self.plan, self.token = plan, token
        self.workdir, self.out_path, self.err_path = run_paths(scratch, token)
        self.pid: int | None = None
        self.pgid: int | None = None  # the group a timeout kills (the pid but for gated)
        self.pidfd: int | None = None
        self.gate: int | None = None  # written to let the binary go
        self.counters: Any = []
        self.sampler: Sampler | None = None
        self.cpus_allowed: str | None = None
        self.t0 = self.t1 = self.status = 0
        self.ru: Any = None
        self.timed_out = False
        self.failure: str | None = None  # set: the run could not start
        # aslr plans: the environment pad's length, drawn per run
        self.pad: int | None = random.randrange(ENV_PAD_MAX) if plan.aslr else None
        self.aslr: bool | None = None  # the child's personality, read before it runs
        self.since: int | None = None  # the kernel's last pid when it was let go
        self.strays: int | None = None  # processes it left running (None: not looked for)
        self.stream: Any = None  # its stdout hashed as it streams (stream.StreamedStdout)
        self.reaped_pid: int | None = None  # the pid it had (files named after it: cachegrind)

    def env(self) -> dict[str, str]:
        """The run's environment: its plan's, plus the pad of an aslr run."""
        if self.pad is None:
            return self.plan.env
        return dict(self.plan.env, **{ENV_PAD_NAME: "X" * self.pad})


def _open_capture(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)


def choose(requested: str, scratch: str, strays: Strays) -> Spawner:
    """The spawner for ``requested`` ("auto": the fork server, else gated, else direct); may
    make this process a subreaper.  RequestError spawn_unavailable if a method asked for by
    name cannot work here."""
    sh = shutil.which("dash") or ("/bin/sh" if os.access("/bin/sh", os.X_OK) else None)
    if requested == "direct":
        why = "requested"
    elif sh is None:
        why = "no /bin/sh"
    else:
        why = become_child_subreaper()
    if why or sh is None:
        if requested in ("gated", "forkserver"):
            raise RequestError("cannot spawn through sh: %s" % why, SPAWN_UNAVAILABLE)
        return DirectSpawner(why)
    if requested == "gated":
        return GatedSpawner(sh)
    try:
        return ForkServerSpawner(sh, scratch, strays)
    except ServerError as e:
        if requested == "forkserver":
            raise RequestError("cannot start the fork server: %s" % e,
                               SPAWN_UNAVAILABLE) from None
        return GatedSpawner(sh, note=one_line(e))


class Spawner:
    """How a run's child comes to exist.  ``prepare`` leaves it waiting on ``run.gate`` with
    ``run.pid``/``run.pgid`` set (or, direct, does nothing); ``launch`` starts the clock."""

    method = ""
    overlaps = False  # may prepare a run while another runs (on the agent's other CPUs)

    def info(self) -> dict:
        raise NotImplementedError

    def script_for(self, argv: list[str], env: dict[str, str], pad: bool = False) -> Any:
        """Whatever the spawner prepares once per request (kept in the plan); ``pad``: each
        run adds its environment pad (``Run.env``)."""
        return None

    def restart(self) -> None:
        """Children forked from now on must inherit this thread's current personality."""

    def helpers(self) -> tuple[int, ...]:
        """The pids of the agent's children that serve the spawner (not runs)."""
        return ()

    def prepare(self, run: Run, server_cpus: Iterable[int], watchdog: Watchdog) -> None:
        """SpawnError: the run cannot start (``run.pid`` set if a child exists)."""

    def launch(self, run: Run, watchdog: Watchdog, perf: PerfEvents | None) -> None:
        """Start the clock (``run.t0``), arm the watchdog and let the binary go: the clock
        first, so a run the watchdog kills has run at least its timeout by that clock (armed
        first, a preempted agent measured 499.86 ms of a 500 ms timeout)."""
        gate, pgid = run.gate, run.pgid
        assert gate is not None and pgid is not None
        run.t0 = time.monotonic_ns()
        watchdog.arm(pgid, run.plan.timeout)
        run.gate = None
        try:
            os.write(gate, b"\n")
        except BrokenPipeError:  # gated: the subshell is gone; waiting for it will tell
            pass
        finally:
            os.close(gate)

    def close(self) -> None:
        pass


class GatedSpawner(Spawner):
    method = "gated"

    # Run by ``sh -c SCRIPT sh OUT BINARY ARGS...``: fork a subshell that waits on the gate
    # (the shell's stdin) and then execs the binary, print its pid, exit.  PWD, which sh
    # exports, is unset: the environment is exactly the one asked for (its size shifts the
    # initial stack, which can shift timings).
    SCRIPT = ('out=$1; shift; exec 3<&0; '
              '{ read _ <&3 || exit 1; unset PWD; exec "$@" </dev/null 3<&-; } >"$out" '
              '& echo $!')

    def __init__(self, sh: str, note: str | None = None):
        self.sh = sh
        self.note = note  # why the fork server could not start

    def info(self) -> dict:
        info = {"method": self.method, "shell": self.sh, "maxrss_exact": True}
        if self.note:
            info["forkserver_error"] = self.note
        return info

    def prepare(self, run: Run, server_cpus: Iterable[int], watchdog: Watchdog) -> None:
        plan = run.plan
        err_fd = _open_capture(run.err_path)
        gate_r, gate_w = os.pipe()
        pid_r, pid_w = os.pipe()
        saved_mask = os.sched_getaffinity(0)
        ok = False
        try:
            os.sched_setaffinity(0, {plan.cpu})  # this thread only; sh inherits it
            try:
                sh = subprocess.Popen(
                    [self.sh, "-c", self.SCRIPT, "sh", run.out_path] + plan.argv,
                    cwd=run.workdir, env=run.env(), stdin=gate_r, stdout=pid_w, stderr=err_fd,
                    start_new_session=True)
            except OSError as e:
                raise SpawnError(one_line("could not start %s: %s" % (self.sh, e))) from None
            finally:
                os.sched_setaffinity(0, saved_mask)
                for fd in (gate_r, pid_w, err_fd):
                    os.close(fd)
            run.pgid = sh.pid
            watchdog.arm(sh.pid, SH_START_TIMEOUT_S)  # sh must not hang the agent
            line = _read_line(pid_r)
            _, status, _ = os.wait4(sh.pid, 0)
            sh.returncode = status
            if watchdog.disarm():
                raise SpawnError("%s did not start the binary within %gs"
                                 % (self.sh, SH_START_TIMEOUT_S))
            try:
                run.pid = int(line)
            except ValueError:
                raise SpawnError("%s did not start the binary (wait status %d)"
                                 % (self.sh, status)) from None
            run.gate = gate_w
            ok = True
        finally:
            os.close(pid_r)
            if not ok:
                os.close(gate_w)


class DirectSpawner(Spawner):
    method = "direct"

    def __init__(self, reason: str):
        self.reason = reason

    def info(self) -> dict:
        return {"method": "direct", "reason": self.reason, "maxrss_exact": False}

    def launch(self, run: Run, watchdog: Watchdog, perf: PerfEvents | None) -> None:
        """Popen pinned through this thread; counters opened on this thread are inherited by
        the child and enabled at its exec.  SpawnError if it cannot exec."""
        plan = run.plan
        saved_mask = os.sched_getaffinity(0)
        counters = []
        out_fd = _open_capture(run.out_path)
        try:
            err_fd = _open_capture(run.err_path)
        except OSError:
            os.close(out_fd)
            raise
        os.sched_setaffinity(0, {plan.cpu})  # this thread only; the child inherits it
        try:
            if plan.perf_events and perf is not None:
                counters = perf.open(0, plan.perf_events)
            run.t0 = time.monotonic_ns()
            proc = subprocess.Popen(plan.argv, cwd=run.workdir, env=run.env(),
                                    stdin=subprocess.DEVNULL, stdout=out_fd, stderr=err_fd,
                                    start_new_session=True)
        except OSError as e:
            if counters:
                PerfEvents.read_and_close(counters)
            raise SpawnError(one_line("exec failed: %s" % e)) from None
        finally:
            os.sched_setaffinity(0, saved_mask)
            os.close(out_fd)
            os.close(err_fd)
        proc.returncode = 0  # reaped by the runner with wait4, not by Popen
        run.pid = run.pgid = proc.pid
        run.counters = counters
        watchdog.arm(proc.pid, plan.timeout)
        limit_cpu_time(proc.pid, plan.timeout)
        limit_file_size(proc.pid)  # direct: the binary runs already (it may write first)
        run.cpus_allowed = cpus_allowed_list(proc.pid)


def _read_line(fd: int, limit: int = 64) -> bytes:
    data = b""
    while len(data) < limit and not data.endswith(b"\n"):
        chunk = os.read(fd, limit - len(data))
        if not chunk:
            break
        data += chunk
    return data


# ---------------------------------------------------------------------------- fork server

_SH_NAME_RE = re.compile(rb"\A[A-Za-z_][A-Za-z0-9_]*\Z")


def sh_quote(word: bytes) -> bytes:
    """``word`` as one single-quoted sh word: literal for every byte but NUL (never in argv)."""
    return b"'" + word.replace(b"'", b"'\\''") + b"'"


def script_parts(argv: list[str], env: dict[str, str], pad: bool = False
                 ) -> tuple[bytes, bytes]:
    """-> (exports, exec line): the parts of a run script that depend on the request.
    ``pad``: the child also sources ../p$t, the run's environment pad (written by the agent).

    The environment is the one asked for, less PWD and names sh cannot hold (exactly as
    gated sh passes it on, except that sh resets an inherited IFS, OPTIND or PPID, which the
    fork server passes unchanged): the server runs with an empty environment, the child
    unsets what sh exported itself (PWD, and OLDPWD after its cd) and exports the rest.
    """
    exports = [b"unset PWD OLDPWD\n"]
    if pad:
        exports.append(b'. "../p$t"\n')
    for name, value in env.items():
        bname = os.fsencode(name)
        if bname != b"PWD" and _SH_NAME_RE.match(bname):
            exports.append(b"export %s=%s\n" % (bname, sh_quote(os.fsencode(value))))
    tail = b"exec %s 3<&-\n" % b" ".join(sh_quote(os.fsencode(a)) for a in argv)
    return b"".join(exports), tail


def run_script(parts: tuple[bytes, bytes]) -> bytes:
    """The script every run's child sources, its token in ``$t``: stdout/stderr to o$t/e$t,
    stdin from /dev/null, its gate g$t on fd 3, the server's command-substitution pipe kept
    on fd 5 until it is ready (closing it tells the server), cd to run-$t, the environment,
    then block on the gate until the agent writes a line (exit 125 at EOF: the agent is
    gone) and exec the binary with fds 0-2 only.  A gate per run: with a shared one, the
    next run's child could take a line meant for the run before it."""
    exports, tail = parts
    return b"".join((
        b'exec 5>&1 2>"e$t" >"o$t" </dev/null 4<&- 3<"g$t"\n',
        b'cd "run-$t" || exit 126\n',
        exports,
        b"exec 5>&-\n",
        b"IFS= read -r t <&3 || exit 125\n", tail))


# Started once per agent by ``sh -c BOOT`` with the request pipe as stdin and the response
# pipe as stdout (sh only takes fd numbers 0-9 in redirections, so the pipes come in on
# fixed fds): sh moves the request pipe to fd 4, forks the server loop in the background,
# prints its pid and exits (the agent, a subreaper, inherits the loop and gives it its own
# process group).  Per request (a line holding a token) the loop runs a command
# substitution whose subshell forks the run's child, prints the child's pid and exits; the
# loop reads the substitution to its end (the child closes fd 5 once ready) and reaps the
# intermediate, so when it prints "p<pid>" the child is the agent's and sleeps on its gate
# (or has exited): one message, one wake-up of the agent per run.
_FORKSERVER_BOOT = (
    ": inlining-agent fork server; exec 4<&0 </dev/null 2>/dev/null; "
    '{ while IFS= read -r t <&4; do p=$({ . ./script; } & echo $!); echo "p$p"; done; } & '
    "echo $!")


def _read_line_timeout(fd: int, timeout: float, limit: int = 64) -> bytes:
    """A line from ``fd`` (up to ``limit`` bytes); b"" or a partial line at EOF or timeout."""
    deadline = time.monotonic() + timeout
    data = b""
    while len(data) < limit and not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            break
        chunk = os.read(fd, limit - len(data))
        if not chunk:
            break
        data += chunk
    return data


class ForkServer:
    """One long-lived ``sh`` that forks gated run children on request (see _FORKSERVER_BOOT).

    Its process group (``pid``) holds it, its short-lived intermediates and a run child until
    the agent moves that child to a group of its own, so ``stop`` leaves nothing behind.
    """

    def __init__(self, sh: str, cwd: str, timeout: float = SH_START_TIMEOUT_S):
        self.timeout = timeout
        self.pid: int | None = None
        self.cpus: frozenset[int] | None = None
        self._buf = b""  # what was read from the server's stdout beyond the last line
        self.req_w: int | None = None
        self.resp_r: int | None = None
        req_r, self.req_w = os.pipe()
        self.resp_r, resp_w = os.pipe()
        try:
            try:
                boot = subprocess.Popen([sh, "-c", _FORKSERVER_BOOT], stdin=req_r,
                                        stdout=resp_w, stderr=subprocess.DEVNULL,
                                        cwd=cwd, env={})
            except OSError as e:
                raise ServerError("could not start %s: %s" % (sh, e)) from None
            finally:
                for fd in (req_r, resp_w):
                    os.close(fd)
            line = _read_line_timeout(self.resp_r, timeout)
            if not line.endswith(b"\n"):
                boot.kill()
            boot.wait()
            try:
                pid = int(line)
            except ValueError:
                raise ServerError("%s did not start the fork server (wait status %s)"
                                  % (sh, boot.returncode)) from None
            self.pid = pid
            os.setpgid(pid, pid)  # fails unless it is our (subreaper-inherited) child
        except BaseException as e:
            self.stop()
            if isinstance(e, OSError):
                raise ServerError("fork server setup: %s" % e) from None
            raise

    def _read_message(self, deadline: float) -> bytes | None:
        """The next line from the server's stdout (without its newline); None at the
        deadline; ServerError at EOF."""
        assert self.resp_r is not None
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            if not select.select([self.resp_r], [], [], remaining)[0]:
                continue
            chunk = os.read(self.resp_r, 4096)
            if not chunk:
                raise ServerError("fork server died")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def spawn(self, token: int, cpus: Iterable[int]) -> int:
        """Fork a child that sources ./script for run ``token`` -> its pid, once it is a
        child of the agent and sleeps on its gate (or has exited: its wait status tells
        why).  The server and its intermediates run on ``cpus``.  ServerError if the server
        is gone, misbehaves, or gives no answer within ``timeout`` (a child hanging before
        its gate hangs the server too; the caller replaces it)."""
        assert self.pid is not None and self.req_w is not None
        cpus = frozenset(cpus)
        if self.cpus != cpus:
            try:
                os.sched_setaffinity(self.pid, cpus)
            except OSError as e:  # ESRCH: the server is gone
                raise ServerError("could not pin the fork server: %s" % e) from None
            self.cpus = cpus
        try:
            os.write(self.req_w, b"%d\n" % token)
        except OSError as e:  # EPIPE: the server is gone
            raise ServerError("fork server gone (%s)" % e) from None
        line = self._read_message(time.monotonic() + self.timeout)
        if line is None:
            raise ServerError("fork server hung (run %d)" % token)
        if not line.startswith(b"p"):
            raise ServerError("fork server misbehaved (got %r)" % line[:64])
        try:
            return int(line[1:])
        except ValueError:
            raise ServerError("fork server could not fork (got %r)" % line[:64]) from None

    def stop(self) -> None:
        """Kill the server's process group, reap the server, close the pipes."""
        if self.pid is not None:
            killpg_quietly(self.pid)
            try:
                os.kill(self.pid, signal.SIGKILL)  # in case it never got its own group
            except OSError:
                pass
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pid = None
        for fd in (self.req_w, self.resp_r):
            if fd is not None:
                os.close(fd)
        self.req_w = self.resp_r = None


def _write_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


class ForkServerSpawner(Spawner):
    method = "forkserver"
    overlaps = True

    def __init__(self, sh: str, scratch: str, strays: Strays):
        self.sh, self.scratch, self.strays = sh, scratch, strays
        self.server: ForkServer | None = ForkServer(sh, scratch)
        self._parts: tuple[bytes, bytes] | None = None  # the last script parts made...
        self._parts_key: tuple[list[str], dict[str, str], bool] | None = None  # ...for what
        self._written: tuple[bytes, bytes] | None = None  # the parts ./script holds

    def info(self) -> dict:
        return {"method": self.method, "shell": self.sh, "maxrss_exact": True}

    def script_for(self, argv: list[str], env: dict[str, str], pad: bool = False
                   ) -> tuple[bytes, bytes]:
        key = (argv, env, pad)
        if self._parts is None or self._parts_key != key:  # the same request: reuse
            self._parts = script_parts(argv, env, pad)
            self._parts_key = key
        return self._parts

    def prepare(self, run: Run, server_cpus: Iterable[int], watchdog: Watchdog) -> None:
        """Have the server (on ``server_cpus``) fork the child, give it its own process
        group (killpg then gets the benchmark's whole tree) and pin it to the run's CPU
        while it sleeps on its gate (moving it there disturbs nothing)."""
        plan = run.plan
        token = run.token
        gate = os.path.join(self.scratch, "g%d" % token)
        pad = os.path.join(self.scratch, "p%d" % token) if run.pad is not None else None
        try:
            os.mkfifo(gate, 0o600)
            if pad is not None:
                _write_file(pad, b"export %s=%s\n"
                            % (ENV_PAD_NAME.encode(), b"X" * (run.pad or 0) or b"''"))
        except OSError as e:
            raise SpawnError(one_line("could not prepare the run: %s" % e)) from None
        try:
            # read-write: opening it never blocks, and the child's read-only open finds a
            # writer; the child sees EOF (exit 125) if the agent dies first
            run.gate = os.open(gate, os.O_RDWR | os.O_CLOEXEC)
            if self._written is not plan.script:
                self._write_script(plan.script)
            for attempt in (1, 2):
                try:
                    if self.server is None:
                        self.server = ForkServer(self.sh, self.scratch)
                    pid = run.pid = run.pgid = self.server.spawn(token, server_cpus)
                    break
                except ServerError as e:
                    self._stop_server()
                    if attempt == 2:
                        raise SpawnError(one_line("fork server failed twice: %s" % e)) from None
        except OSError as e:
            raise SpawnError(one_line("could not prepare the run: %s" % e)) from None
        finally:  # the child has its gate open (or is gone): the names are no longer needed
            for path in (gate, pad):
                if path is not None:
                    try:
                        os.unlink(path)
                    except OSError:
                        pass
        try:
            os.setpgid(pid, pid)
        except ProcessLookupError:  # already exited (its wait status tells why)
            pass
        try:
            os.sched_setaffinity(pid, {plan.cpu})
        except ProcessLookupError:  # it exited (a zombie)
            pass

    def _write_script(self, parts: tuple[bytes, bytes]) -> None:
        """(Re)write ./script by rename, so a child still reading the old one is undisturbed."""
        tmp = os.path.join(self.scratch, "script.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, run_script(parts))
        finally:
            os.close(fd)
        os.rename(tmp, os.path.join(self.scratch, "script"))
        self._written = parts

    def restart(self) -> None:
        self._stop_server()  # the next prepare starts a fresh one

    def helpers(self) -> tuple[int, ...]:
        server = self.server
        return (server.pid,) if server is not None and server.pid is not None else ()

    def _stop_server(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            pgid = server.pid
            server.stop()
            if pgid is not None:  # orphaned intermediates / children: reaped later
                self.strays.remember(pgid)

    def close(self) -> None:
        self._stop_server()
