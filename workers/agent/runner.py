"""The run pipeline: every run, however spawned, goes prepare -> launch -> wait -> finish.

``prepare`` makes the run's directory and has the spawner start its child up to the gate,
then pins it, attaches counters and RLIMIT_CPU; ``launch`` arms the watchdog, starts the
clock and opens the gate; ``wait`` waits for the exit without reaping (the zombie keeps its
process-group id reserved while the watchdog is disarmed and stray group members are
killed), then reaps it with its rusage; ``finish`` builds the record.  The stages are apart so
that the agent can finish one run and prepare the next while a run goes on (``service``);
``run_all`` chains them for one request.

The record (``new_record``), the failure classification, the perf fill and the GC stats are
made in ``finish`` alone, for every spawn method.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Iterable
from typing import Any

from . import cachegrind
from .perf import PerfEvents
from .proc import (
    FILE_SIZE_LIMIT,
    Strays,
    aslr_of,
    become_child_subreaper,
    cpus_allowed_list,
    decode_wait_status,
    killpg_quietly,
    limit_cpu_time,
    limit_file_size,
    set_aslr,
    signal_name,
)
from .protocol import EXACT_UNAVAILABLE, RequestError, RunRequest, one_line
from .sampling import Sampler
from .spawn import Plan, Run, Spawner, SpawnError, choose
from .stream import StreamedStdout
from .watchdog import Watchdog

STDERR_TAIL_BYTES = 2000
STDERR_SCAN_BYTES = 64 * 1024
TOKEN_BASE = 10 ** 9  # run tokens count up from here: ten digits for 9e9 runs

# Names printed by the OCaml runtime at exit under OCAMLRUNPARAM=v=0x400 (4.x and 5.x).
GC_KEYS = frozenset((
    "allocated_words",
    "minor_words",
    "promoted_words",
    "major_words",
    "minor_collections",
    "major_collections",
    "heap_words",
    "heap_chunks",
    "top_heap_words",
    "compactions",
    "forced_major_collections",
    "mean_space_overhead",
))
GC_LINE_RE = re.compile(rb"\A([a-z_]+): ([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*\Z")


def new_record(cpus_allowed: str | None) -> dict:
    """A run record, every field unset.

    wall_ns (from letting the binary go to its exit, the agent's monotonic clock), user_s,
    sys_s, maxrss_kb (KiB): the binary's rusage from wait4; exit_status / signal; output_ok
    (null without an expected output); stdout_sha256 and stdout_bytes; gc (the OCaml
    runtime's exit statistics); perf (counters, or null); cpus_allowed (the child's affinity,
    as /proc's Cpus_allowed_list); stderr_tail (its last 2000 bytes, GC lines removed);
    failure (null, or why the run does not count).  Disturbance evidence: cpu_share (the
    binary's CPU time over wall time, from cpu_share_source: "task-clock" when perf counted
    it, else "rusage", user + sys), nivcsw (its involuntary context switches), migrations
    (perf's cpu-migrations, null without perf), disturbed (null, or why the run must not be
    used: it migrated).  Layout: aslr (whether its address space was randomised, as its
    /proc personality says), env_pad (the length of the random environment pad; null: none).
    A run of a request with ``profile_period_ns`` also has ``profile`` (``sampling``).
    strays: how many processes the binary left running after it exited, killed by the agent
    (null: not looked for, e.g. the agent runs inside another program); more than 0 fails
    the run.  A run of the exact metric also has counts (cachegrind's totals by event,
    ``cachegrind.EVENTS``; null when it wrote none, and the run failed) and is never
    disturbed.
    """
    return {
        "wall_ns": None, "user_s": None, "sys_s": None, "maxrss_kb": None,
        "exit_status": None, "signal": None, "output_ok": None,
        "stdout_sha256": None, "stdout_bytes": None, "gc": {}, "perf": None,
        "cpus_allowed": cpus_allowed, "stderr_tail": "", "failure": None,
        "cpu_share": None, "cpu_share_source": None, "nivcsw": None, "migrations": None,
        "disturbed": None, "aslr": None, "env_pad": None, "strays": None,
    }


def with_gc_report(env: dict[str, str]) -> dict[str, str]:
    """``env`` asking the OCaml runtime for its exit statistics (v=0x400) on stderr."""
    runparam = env.get("OCAMLRUNPARAM")
    if not runparam:
        env["OCAMLRUNPARAM"] = "v=0x400"
    elif not any(p.strip().startswith("v=") for p in runparam.split(",")):
        env["OCAMLRUNPARAM"] = runparam + ",v=0x400"
    return env


def parse_gc_stats(stderr: bytes) -> tuple[dict, bytes]:
    """Split the OCaml runtime's exit-time GC report off stderr -> (gc dict, rest bytes)."""
    gc: dict[str, Any] = {}
    kept = []
    for line in stderr.splitlines(True):
        m = GC_LINE_RE.match(line)
        if m is not None:
            name, number = m.groups()
            key = name.decode()
            if key in GC_KEYS:
                value = float(number)
                gc[key] = int(value) if value.is_integer() else value
                continue
        kept.append(line)
    return gc, b"".join(kept)


def _read_file_tail(path: str, limit: int) -> tuple[bytes, int]:
    """-> (the last ``limit`` bytes of the file, its size); empty if it does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return b"", 0
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - limit)
        return (os.pread(fd, size - start, start) if size > start else b""), size
    finally:
        os.close(fd)


def check_output(record: dict, out_fd: int | None, expected: dict | None) -> None:
    """stdout_sha256, stdout_bytes and output_ok of ``record`` from the captured stdout."""
    h = hashlib.sha256()
    size = os.fstat(out_fd).st_size if out_fd is not None else 0
    offset = 0
    while offset < size:
        assert out_fd is not None
        chunk = os.pread(out_fd, min(1 << 20, size - offset), offset)
        if not chunk:
            break
        h.update(chunk)
        offset += len(chunk)
    digest = h.hexdigest()
    record["stdout_sha256"] = digest
    record["stdout_bytes"] = size
    if expected is not None:
        if "text" in expected:
            want = expected["text"]
            record["output_ok"] = (size == len(want) and out_fd is not None
                                   and os.pread(out_fd, size, 0) == want)
        else:
            record["output_ok"] = digest == expected["sha256"]


def classify(record: dict, timed_out: bool, timeout: float, err_bytes: int = 0,
             stdout_kept: bool = True) -> str | None:
    """Why a run that ran to its end does not count, or None.  ``err_bytes``: the size of
    its stderr capture; ``stdout_kept``: whether its stdout was captured in a file (capped)
    rather than hashed as it streamed (``stream``: any size)."""
    if timed_out:
        return "timeout after %gs" % timeout
    kept = [("stdout", record["stdout_bytes"] or 0)] if stdout_kept else []
    for name, size in kept + [("stderr", err_bytes)]:
        if size >= FILE_SIZE_LIMIT:  # cut there: the binary got SIGXFSZ or EFBIG
            return "%s over %d MiB (the agent keeps at most that)" % (name, FILE_SIZE_LIMIT >> 20)
    sig = record["signal"]
    if sig is not None:
        if sig == signal.SIGXFSZ:
            return "a file over %d MiB (killed by SIGXFSZ)" % (FILE_SIZE_LIMIT >> 20)
        return "killed by signal %d (%s)" % (sig, signal_name(sig))
    if record["exit_status"] != 0:
        return "exit status %s" % record["exit_status"]
    if record["strays"]:
        return "left %d process%s running after it exited (killed)" % (
            record["strays"], "" if record["strays"] == 1 else "es")
    if record["output_ok"] is False:
        return "wrong output (sha256 %s...)" % record["stdout_sha256"][:12]
    return None


def binary_gone(path: str) -> str:
    """The failure of a run whose binary no longer exists: the program never ran (an exit
    status of 127 from the shell would say it failed)."""
    return ("the binary is gone: %s no longer exists (did the program delete it?); "
            "the run did not start" % path)


def disturbance(record: dict, wall_ns: int, ru: Any, perf: dict | None) -> None:
    """cpu_share, cpu_share_source, nivcsw, migrations and disturbed of a run's ``record``."""
    record["nivcsw"] = ru.ru_nivcsw
    clock = perf.get("task-clock") if perf else None
    if clock is not None and "value" in clock and wall_ns > 0:
        record["cpu_share"] = round(clock["value"] * 1e6 / wall_ns, 4)
        record["cpu_share_source"] = "task-clock"
    elif wall_ns > 0:
        record["cpu_share"] = round((ru.ru_utime + ru.ru_stime) * 1e9 / wall_ns, 4)
        record["cpu_share_source"] = "rusage"
    moves = perf.get("cpu-migrations") if perf else None
    if moves is not None and "value" in moves:
        record["migrations"] = int(moves["value"])
        if record["migrations"] > 0 and record["failure"] is None:
            record["disturbed"] = "migrated between CPUs %d time(s)" % record["migrations"]


def _scratch_base() -> str | None:
    """Where per-run scratch files go: a RAM-backed tmpfs when one is writable.

    Every run creates and removes a working directory and two capture files; on a disk
    filesystem that metadata traffic costs milliseconds per run (measured: 0.54 ms on ext4
    against 0.03 ms on tmpfs for one directory and one file), on tmpfs almost nothing.
    """
    for candidate in (os.environ.get("XDG_RUNTIME_DIR"), "/dev/shm"):
        if candidate and os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK):
            return candidate
    return None  # the default temporary directory


SCRATCH_PREFIX = "inlining-agent-"
SCRATCH_LOCK = "lock"


def make_scratch() -> tuple[str, int]:
    """-> (a fresh scratch directory, the fd of its lock), after removing the scratch
    directories that dead agents left in the same place (``sweep_scratch``).

    The lock is a kernel ``flock`` on ``<scratch>/lock``, held for the agent's life, so it
    dies with the agent however the agent dies.  The file is locked under a temporary name
    and then renamed: no one ever sees an unlocked ``lock`` of a live agent."""
    base = _scratch_base() or tempfile.gettempdir()
    sweep_scratch(base)
    scratch = tempfile.mkdtemp(prefix="%s%d-" % (SCRATCH_PREFIX, os.getpid()), dir=base)
    tmp = os.path.join(scratch, ".lock")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(tmp, os.path.join(scratch, SCRATCH_LOCK))
    except BaseException:
        os.close(fd)
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return scratch, fd


def sweep_scratch(base: str) -> list[str]:
    """Remove this user's agent scratch directories in ``base`` whose lock no live agent
    holds (their agent was killed) -> the ones removed.  A directory without a lock file
    (an agent of an older version) is left alone: nothing tells whether its agent lives."""
    removed: list[str] = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(SCRATCH_PREFIX):
            continue
        path = os.path.join(base, name)
        try:
            st = os.lstat(path)
            fd = os.open(os.path.join(path, SCRATCH_LOCK),
                         os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held: its agent is alive
                continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        finally:
            os.close(fd)
    return removed


class Runner:
    """Runs binaries on this machine: the scratch directory, the spawner, the counters, the
    watchdog, and the children not reaped yet.

    ``spawn``: "auto" (the fork server when possible, else gated sh, else direct),
    "forkserver", "gated" or "direct".  ``own_process``: this process is the agent's alone
    (the zipapp's main), so every orphan it inherits comes from a run: what a run leaves
    running is killed when it ends (``Strays``); ``strays_error`` says why not, if not."""

    def __init__(self, perf_events: Iterable[str], spawn: str = "auto",
                 own_process: bool = False):
        self.perf_events = tuple(perf_events)
        self.cpus = frozenset(os.sched_getaffinity(0))  # as started (the agent may pin itself)
        self.scratch, self._scratch_lock = make_scratch()
        self.strays_error: str | None = "the agent runs inside another program"
        if own_process:
            self.strays_error = become_child_subreaper() or None
        self._spawn_request = spawn
        self._spawner: Spawner | None = None
        self._perf: PerfEvents | None = None
        self._perf_info: dict | None = None
        self._watchdog: Watchdog | None = None
        self._strays = Strays(sweep=own_process and self.strays_error is None)
        self._live: dict[int, Run] = {}  # pid -> run: children started and not yet reaped
        # Run tokens, unique over the agent's life, all of one width: a run's working
        # directory (run-<token>, its $PWD) is then as long for every run, and so is its
        # environment; a count under cachegrind otherwise moved with the token's digits
        # (14 instructions between run-9 and run-10: "not deterministic").
        self._token = TOKEN_BASE
        self._base_env: dict[str, str] | None = None
        self._exact_info: dict | None = None
        # Runs start without address-space randomisation: set on this thread before any
        # spawner exists, inherited by the fork server, sh and every binary (fork, exec).
        self.aslr = False
        self.aslr_error = set_aslr(False) or None

    # ----------------------------------------------------------------- what this host has

    def perf_info(self) -> dict:
        """Which counters this machine supports (probed once)."""
        if self._perf_info is None:
            self._perf = PerfEvents()
            self._perf_info = self._perf.probe(self.perf_events)
        return self._perf_info

    def exact_info(self) -> dict:
        """Whether cachegrind runs here (probed once), with the identity of its counts."""
        if self._exact_info is None:
            self._exact_info = dict(cachegrind.probe(), identity=cachegrind.identity())
        return self._exact_info

    @property
    def spawner(self) -> Spawner:
        """How binaries are started (decided once; may make this process a subreaper).
        RequestError spawn_unavailable if the method asked for cannot work here."""
        if self._spawner is None:
            self._spawner = choose(self._spawn_request, self.scratch, self._strays)
            if self._watchdog is None:  # before any counter is opened on this thread
                self._watchdog = Watchdog()
        return self._spawner

    def overlap_cpus(self, plan: Plan) -> frozenset[int]:
        """The CPUs the agent may work on while a run of ``plan`` goes on: none unless the
        spawner can prepare runs meanwhile and the agent has a CPU besides the run's."""
        return self.cpus - {plan.cpu} if self.spawner.overlaps else frozenset()

    @property
    def watchdog_thread(self) -> Any:
        return self._watchdog.thread if self._watchdog is not None else None

    def disarm(self) -> None:
        """No run is to be killed at its deadline any more (the agent is stopping)."""
        if self._watchdog is not None:
            self._watchdog.disarm()

    # ----------------------------------------------------------------- plans

    def plan(self, req_id: Any, request: RunRequest, binary: str) -> Plan:
        """Everything the runs of a checked request share."""
        if self._base_env is None:
            self._base_env = dict(os.environ)
            self._base_env.pop("PWD", None)  # stale (the agent's); sh would set it
        env = dict(self._base_env)
        env.update(request.env)
        with_gc_report(env)
        perf_events = None
        if request.perf and request.metric == "time":
            info = self.perf_info()
            if info["available"]:
                perf_events = [e for e, s in info["events"].items() if s == "supported"]
        spawner = self.spawner
        argv = [binary] + request.args
        if request.metric == "cachegrind":
            exact = self.exact_info()
            if not exact["available"]:
                raise RequestError(exact["reason"], EXACT_UNAVAILABLE)
            argv = cachegrind.wrap(exact["path"], argv, self.scratch)
            env = cachegrind.exact_env(
                request.env, {"OCAMLRUNPARAM": env["OCAMLRUNPARAM"]})
        return Plan(req_id, request.sha, argv, request.runs, request.cpu, request.timeout,
                    request.expected, env, perf_events, spawner.method,
                    spawner.script_for(argv, env, request.aslr), request.aslr,
                    request.profile_period_ns, binary=binary, metric=request.metric)

    def run_all(self, plan: Plan) -> dict:
        """Every run of ``plan``, one after the other -> the response."""
        while not plan.done:
            run = self.prepare(plan, {plan.cpu})
            if run.failure is None and self.launch(run):
                self.wait(run)
            self.finish(run)
        return plan.response()

    # ----------------------------------------------------------------- the stages

    def prepare(self, plan: Plan, server_cpus: Iterable[int]) -> Run:
        """A run of ``plan`` ready to launch, or with ``failure`` set.  Helpers (the fork
        server) work on ``server_cpus``."""
        self._token += 1
        run = Run(plan, self._token, self.scratch)
        if plan.aslr != self.aslr:
            self._switch_aslr(plan.aslr)
        if not os.path.exists(plan.binary):
            run.failure = binary_gone(plan.binary)
            return run
        try:
            os.mkdir(run.workdir, 0o700)
            if plan.expected is not None and "sha256" in plan.expected:
                run.stream = StreamedStdout(run.out_path, plan.cpu)
        except OSError as e:
            run.failure = one_line("could not prepare the run: %s" % e)
            return run
        assert self._watchdog is not None
        try:
            self.spawner.prepare(run, server_cpus, self._watchdog)
            pid = run.pid
            if pid is not None:  # waiting on its gate
                self._live[pid] = run
                run.cpus_allowed = cpus_allowed_list(pid)
                run.aslr = aslr_of(pid)
                if plan.perf_events:
                    assert self._perf is not None
                    run.counters = self._perf.open(pid, plan.perf_events)
                if plan.profile_period_ns:
                    self.perf_info()
                    assert self._perf is not None
                    run.sampler = Sampler(self._perf, pid, plan.profile_period_ns,
                                          self._perf.exclude_kernel)
                limit_cpu_time(pid, plan.timeout)
                limit_file_size(pid)
        except SpawnError as e:
            self.abort(run)
            run.failure = str(e)
        except OSError as e:
            self.abort(run)
            run.failure = one_line("could not prepare the run: %s" % e)
        except BaseException:
            self.abort(run)
            raise
        return run

    def _switch_aslr(self, enabled: bool) -> None:
        """This thread's (and so the next children's) address-space randomisation; a fork
        server started with the other setting is replaced (a run child already forked, in
        its own process group, is not touched)."""
        why = set_aslr(enabled)
        if why:
            self.aslr_error = why
            return
        self.aslr = enabled
        if self._spawner is not None:
            self._spawner.restart()

    def launch(self, run: Run) -> bool:
        """Start the clock and let the binary go; False (``failure`` set) if it cannot."""
        assert self._watchdog is not None
        run.since = self._strays.mark()
        try:
            self.spawner.launch(run, self._watchdog, self._perf)
        except SpawnError as e:
            run.failure = str(e)
            return False
        if run.pid is not None:
            self._live[run.pid] = run
            if run.aslr is None:  # direct: the child exists only now
                run.aslr = aslr_of(run.pid)
        return True

    def wait(self, run: Run) -> None:
        """Wait for the launched child to exit, then reap it."""
        assert self._watchdog is not None and run.pid is not None and run.pgid is not None
        pid, pgid = run.pid, run.pgid
        reaped = False
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            run.t1 = time.monotonic_ns()
            run.timed_out = self._watchdog.disarm()
            if self._strays.sweep:  # whatever it left running, in its group or not
                run.strays = self._strays.sweep_run(run.since, self._known())
            killpg_quietly(pgid)  # stray background processes of the benchmark
            _, run.status, run.ru = os.wait4(pid, 0)
            reaped = True
        finally:
            if not reaped:  # interrupted (e.g. SIGTERM to the agent): leave no orphan
                self._watchdog.disarm()
                self.abort(run)
            else:
                run.reaped_pid = pid
                run.pid = run.pgid = None  # reaped: nothing of it may be killed any more
                self._live.pop(pid, None)
                self._strays.remember(pgid)
                if run.stream is not None:
                    run.stream.writers_done()
            if run.pidfd is not None:
                os.close(run.pidfd)
                run.pidfd = None

    def _known(self) -> set[int]:
        """The agent's own children: runs not reaped yet, and its spawner's helpers."""
        known = set(self._live)
        if self._spawner is not None:
            known.update(self._spawner.helpers())
        return known

    def abort(self, run: Run) -> None:
        """Kill and reap a child that will not (or did not) run to its end; once only (its
        pid is forgotten, so a recycled pid is never killed)."""
        if run.gate is not None:
            os.close(run.gate)
            run.gate = None
        pid, pgid = run.pid, run.pgid
        run.pid = run.pgid = None
        if pgid is not None:
            killpg_quietly(pgid)
            self._strays.remember(pgid)
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                os.waitpid(pid, 0)
            except OSError:
                pass
            self._live.pop(pid, None)
        if run.pidfd is not None:
            os.close(run.pidfd)
            run.pidfd = None
        if run.stream is not None:
            run.stream.close()

    def finish(self, run: Run) -> dict:
        """The record of a finished (or failed) run, appended to its plan's; its counters,
        files and directory are released."""
        plan = run.plan
        record = new_record(run.cpus_allowed)
        record["aslr"] = run.aslr if run.aslr is not None else self.aslr
        record["env_pad"] = run.pad
        record["strays"] = run.strays
        plan.records.append(record)
        if run.counters:
            perf = PerfEvents.read_and_close(run.counters)
            run.counters = []
            assert self._perf_info is not None
            for name, state in self._perf_info["events"].items():
                if state != "supported":
                    perf[name] = {"unsupported": True}
            if run.failure is None:
                record["perf"] = perf
        if plan.profile_period_ns:
            if run.sampler is not None:
                record["profile"] = run.sampler.read_and_close(plan.binary)
                run.sampler = None
            else:
                record["profile"] = {"error": "sampling needs the forkserver or gated spawner"
                                     if run.failure is None else "the run did not start"}
        if run.gate is not None:  # never launched
            os.close(run.gate)
            run.gate = None
        try:
            os.rmdir(run.workdir)  # the common case: the binary left nothing behind
        except FileNotFoundError:
            pass
        except OSError:
            shutil.rmtree(run.workdir, ignore_errors=True)
        tail, err_bytes = _read_file_tail(run.err_path, STDERR_SCAN_BYTES)
        out_fd: int | None = None
        if run.stream is None:  # (a streamed stdout's FIFO: opening it would block)
            try:
                out_fd = os.open(run.out_path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                pass
        try:
            if run.failure is not None:
                record["failure"] = run.failure
                record["stderr_tail"] = tail[-STDERR_TAIL_BYTES:].decode("utf-8", "replace")
                if plan.metric == "cachegrind":
                    record["counts"] = cachegrind.collect(self.scratch, run.reaped_pid)[0]
                return record
            ru = run.ru
            record["wall_ns"] = run.t1 - run.t0
            record["user_s"] = round(ru.ru_utime, 6)
            record["sys_s"] = round(ru.ru_stime, 6)
            record["maxrss_kb"] = ru.ru_maxrss
            record["exit_status"], record["signal"] = decode_wait_status(run.status)
            record["gc"], tail = parse_gc_stats(tail)
            record["stderr_tail"] = tail[-STDERR_TAIL_BYTES:].decode("utf-8", "replace")
            stream_error = None
            if run.stream is not None:
                if not run.stream.finish():
                    stream_error = run.stream.error or (
                        "its stdout was still open after it exited (a process it started "
                        "kept it)")
                record["stdout_sha256"] = run.stream.sha256
                record["stdout_bytes"] = run.stream.size
                record["output_ok"] = run.stream.sha256 == (plan.expected or {}).get("sha256")
            else:
                check_output(record, out_fd, plan.expected)
            record["failure"] = stream_error or classify(
                record, run.timed_out, plan.timeout, err_bytes, stdout_kept=run.stream is None)
            if (record["exit_status"] in (126, 127) and record["failure"] is not None
                    and not os.path.exists(plan.binary)):
                record["failure"] = binary_gone(plan.binary)
            if plan.metric == "cachegrind":
                record["counts"], why = cachegrind.collect(self.scratch, run.reaped_pid)
                if why is not None and record["failure"] is None:
                    record["failure"] = why
                return record  # counts do not depend on the CPU's other work: never disturbed
            disturbance(record, record["wall_ns"], ru, record["perf"])
            if record["disturbed"] is not None:
                plan.disturbed += 1
            return record
        finally:
            if out_fd is not None:
                os.close(out_fd)
            if run.stream is not None:
                run.stream.close()
            for path in (run.out_path, run.err_path):
                try:
                    os.unlink(path)
                except OSError:
                    pass

    def close(self) -> None:
        for run in list(self._live.values()):
            self.abort(run)
        if self._spawner is not None:
            self._spawner.close()
        if self._strays.sweep:  # the agent is going: nothing it started may stay
            self._strays.sweep_run(None, ())
        shutil.rmtree(self.scratch, ignore_errors=True)
        os.close(self._scratch_lock)

