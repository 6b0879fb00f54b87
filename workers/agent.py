#!/usr/bin/env python3
"""Worker agent: runs cached benchmark binaries pinned to one CPU and reports timings.

One agent is started per CPU slot of a worker machine (as a local subprocess, over SSH, or
imported by a Ray actor).  It is a single stdlib-only file that must run on any Linux host
with ``python3`` >= 3.7: no third-party imports and no imports from the project.

Protocol: JSON lines.  Each line on stdin is one request object; each request gets exactly
one response object on one line of stdout, flushed at once.  Nothing else is ever written
to stdout (the protocol uses a private duplicate of fd 1; fd 1 itself is pointed at stderr
so a stray print cannot corrupt the stream).  A request may carry ``"id"``, which is
echoed.  Bad requests, unknown ops and failing binaries never kill the agent; a refused
request gets ``{"id": ..., "ok": false, "error": "<one line>"}``, a failing binary gives
failed run records.  EOF on stdin ends the agent with status 0.

Ops:

``hello``
    agent_version (sha256 of this file), python, hostname, cpus (this process's affinity),
    perf (availability and per-event support, probed once and cached), spawn (method:
    "forkserver", "gated" or "direct"; maxrss_exact), worker_class.
``has``  (``sha256``)
    present: the binary ``<cache-dir>/<sha256>`` exists and its content hash was verified.
``run``  (``sha256``, ``args``, ``runs``, ``cpu``, ``timeout``, ``expected_output``,
``env``, ``perf``)
    Runs the binary ``runs`` times in sequence, each pinned to ``cpu``, and returns one
    record per run (see ``Agent._run_once``).  Failed runs are reported, never raised.
``shutdown``
    ``{"ok": true}``, then the agent exits 0.

Design notes
------------
* Spawning ("forkserver", the default): one long-lived ``sh`` (dash when installed) per
  agent, started lazily with an empty environment in the agent's private scratch directory
  and replaced (the spawn retried once) whenever it is found dead or hung.  Per run the
  agent makes the run's gate (a FIFO it holds open read-write) and sends the server a
  token; the server forks an intermediate subshell (a command substitution) that forks the
  run's child, prints the child's pid into the substitution and exits, so the child is the
  agent's (subreaper) child.  The child sources the run script (one for every run of the
  same binary, arguments and environment, the token in ``$t``): it redirects stdin, stdout
  and stderr, opens its gate, cds to the run's fresh directory, sets the environment,
  closes its end of the substitution and blocks on the gate, then execs the binary once the
  agent writes to it.  The server reports the child's pid once the substitution has ended
  and the intermediate is reaped: the child is then ready, and the agent hears from the
  server once per run.  When the child is ready the agent pins it (``sched_setaffinity``), puts it in a process group of its own (``setpgid``; a
  process group in the agent's session, not a new session: sh cannot call setsid), attaches
  counters and RLIMIT_CPU; to launch it, it arms the watchdog, starts the clock and writes
  to the gate.  No quoting
  risk: every argv word, environment value and path is written single-quoted ('\'' for a
  quote), which sh takes literally for every byte but NUL, and names sh cannot hold are
  dropped, as gated sh drops them.  The binary gets what gated sh gives it (environment,
  signal dispositions, fds 0-2 only), except that gated sh resets an inherited IFS, OPTIND
  or PPID and the fork server passes them as asked.  Why: starting sh costs ~1 ms a run
  (an exec), forking the idle server twice about half that.
* Pipelining (fork server, requests read from a pipe: ``serve``/``Agent.serve_fd``): the
  master may send the next run request before the current one is answered.  While a run is
  in progress the agent finishes the previous run (counters, output check, response) and
  prepares the next queued run (all of the above up to the gate), on a CPU of its own mask
  other than the run's: during runs the agent's threads and the fork server keep off the
  run's CPU, and the prepared child is moved there only once it sleeps on its gate.  Between
  two runs on a CPU there is then only: reap, arm the watchdog, start the clock, write the
  gate.  Still one binary at a time per agent; responses in request order; a request that
  is not a run waits until no run is in progress.  With no other CPU in the agent's mask,
  nothing overlaps a run (every step happens between runs).
* Spawning ("gated", the fallback when the fork server cannot start): the binary is
  started by ``sh`` (dash when installed):
  sh forks a subshell that blocks reading a gate pipe, prints the subshell's pid and exits.
  The agent is a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``), so after it reaps sh
  the waiting subshell is its child; it attaches the counters to it, sets its RLIMIT_CPU,
  starts the clock and opens the gate, and the subshell execs the binary.  Why not Popen
  the binary directly: Linux folds the high-water RSS of the address space a process had
  before ``exec`` into its ``ru_maxrss``, and a child of the agent starts from the agent's
  own ~15-20 MB, so every binary would report at least that (a trivial OCaml program
  really peaks at ~1.8 MB, as measured from a small spawner).  The gated binary starts from
  sh's small address space and reports its real peak.  Only the agent can reap it (sh is
  gone before it runs), so no shell can swallow its exit status.  Side effect: as the
  binary is an asynchronous command of a non-interactive shell, SIGINT and SIGQUIT are
  ignored in it.  Without ctypes/prctl or sh the agent falls back to "direct" spawning
  (Popen; maxrss then includes the agent's RSS; hello says which).
* Pinning (gated, direct; the fork server pins itself and its child to the run's CPU
  instead): the spawning thread pins *itself* to the requested CPU for the duration of the
  spawn (on Linux ``sched_setaffinity(0, ...)`` affects only the calling thread, and a child
  inherits the mask of the thread that forked it), then restores its mask.  sh, the
  subshell and the binary are on the CPU from their first instruction, without a
  ``preexec_fn`` (which would force a slow ``fork()`` instead of ``vfork()`` and is unsafe
  in a multi-threaded host such as a Ray actor).
* Each run gets its own session (fork server: its own process group), so a timeout kills
  the whole process tree with one ``killpg``; a fresh empty temporary cwd (removed
  afterwards), stdin from /dev/null and stdout/stderr in scratch files (not pipes; with the
  fork server, files of its own, removed once its record is made).
* Timing: ``wall_ns`` runs from opening the gate (direct: from Popen) to the exit seen by
  ``waitid``; user_s, sys_s and maxrss_kb are the binary's own rusage from ``wait4``.  The
  agent waits with ``waitid(WNOWAIT)`` first so the exited child stays a zombie (keeping
  its process-group id reserved) while the watchdog is disarmed and stray group members are
  killed; only then is it reaped.  The watchdog is one long-lived thread per agent that
  SIGKILLs the group at the deadline.
* Each binary gets RLIMIT_CPU = timeout + 2 s (it is pinned to one CPU, so its CPU time
  cannot exceed its wall time and the limit never fires first), so a spinning benchmark
  cannot outlive an agent that was SIGKILLed.  SIGTERM / SIGHUP make the agent kill the
  running child's process group before it exits.
* Counters use the ``perf_event_open`` system call (through ctypes) the way ``perf stat``
  does: opened disabled, with ``inherit`` and ``enable_on_exec``, on the task that is
  about to exec the binary; they count from its ``exec`` (the binary and any children it
  forks) and are read after it exits.  Wrapping the binary in ``perf stat`` was tried and
  rejected: perf 6.1 loses the child's exit status (reports 0, and zero rusage) whenever
  the child exits before perf reaches its ``wait4`` (its SIGCHLD handler clears the pid),
  which happened in ~5% of short runs pinned to perf's CPU; it also adds ~10 ms of
  start-up to the wall time and its own ~20 MB to maxrss.  No ``perf`` binary is needed.
  With kernel.perf_event_paranoid >= 2 and no privileges only user space is counted
  (hello: ``perf.user_only``); hardware events a VM does not expose are "unsupported".
* The verification of a cached binary is remembered by (device, inode, size, mtime_ns), so
  repeated jobs do not rehash; a file rewritten in place with the same size within one
  filesystem timestamp tick would not be noticed, so the master should upload to a
  temporary name and rename.
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
import math
import os
import platform
import re
import resource
import select
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time

SHA256_RE = re.compile(r"\A[0-9a-f]{64}\Z")
MAX_RUNS = 10000
MAX_TIMEOUT_S = 7 * 24 * 3600.0
DEFAULT_TIMEOUT_S = 600.0
SH_START_TIMEOUT_S = 30.0
STDERR_TAIL_BYTES = 2000
STDERR_SCAN_BYTES = 64 * 1024

DEFAULT_PERF_EVENTS = (
    "task-clock",
    "page-faults",
    "context-switches",
    "cpu-migrations",
    "cycles",
    "instructions",
    "branches",
    "branch-misses",
    "cache-misses",
)

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


class RequestError(Exception):
    """A request the agent refuses; the message becomes the one-line error."""


def _one_line(text) -> str:
    return " ".join(str(text).split()) or "error"


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "SIG%d" % signum


def _decode_wait_status(status: int):
    """-> (exit_status or None, signal or None)."""
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), None
    return None, None


def parse_gc_stats(stderr: bytes):
    """Split the OCaml runtime's exit-time GC report off stderr -> (gc dict, rest bytes)."""
    gc = {}
    kept = []
    for line in stderr.splitlines(True):
        m = GC_LINE_RE.match(line)
        if m and m.group(1).decode() in GC_KEYS:
            value = float(m.group(2).decode())
            gc[m.group(1).decode()] = int(value) if value.is_integer() else value
        else:
            kept.append(line)
    return gc, b"".join(kept)


def _read_tail(fd: int, limit: int) -> bytes:
    size = os.fstat(fd).st_size
    start = max(0, size - limit)
    return os.pread(fd, size - start, start) if size > start else b""


def _cpus_allowed_list(pid: int):
    """``pid``'s affinity in /proc's Cpus_allowed_list format ("0", "0-3,6"), or None."""
    try:  # sched_getaffinity is ~10x cheaper than reading /proc/<pid>/status
        cpus = sorted(os.sched_getaffinity(pid))
    except OSError:
        cpus = None
    if cpus:
        ranges = []
        for cpu in cpus:
            if ranges and ranges[-1][1] == cpu - 1:
                ranges[-1][1] = cpu
            else:
                ranges.append([cpu, cpu])
        return ",".join("%d" % a if a == b else "%d-%d" % (a, b) for a, b in ranges)
    try:
        with open("/proc/%d/status" % pid, "rb") as f:
            for line in f:
                if line.startswith(b"Cpus_allowed_list:"):
                    return line.split(b":", 1)[1].strip().decode()
    except OSError:
        pass
    return None


def _limit_cpu_time(pid: int, timeout: float) -> None:
    """Safety net for a hard-killed agent: RLIMIT_CPU, so an orphaned spinner dies anyway."""
    if not hasattr(resource, "prlimit"):
        return
    limit = int(math.ceil(timeout)) + 2
    try:
        resource.prlimit(pid, resource.RLIMIT_CPU, (limit, limit))
    except OSError:
        pass


def _killpg_quietly(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# --------------------------------------------------------------------------- libc access

def _load_libc():
    """(ctypes module, libc) or (None, reason)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        libc.prctl.restype = ctypes.c_int
        return ctypes, libc
    except (ImportError, OSError, AttributeError) as e:
        return None, "no ctypes/libc (%s)" % e


_PR_SET_CHILD_SUBREAPER = 36


def _become_child_subreaper() -> str:
    """Make orphaned descendants our children (prctl); -> "" or why not."""
    ctypes, libc = _load_libc()
    if ctypes is None:
        return libc
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        return "prctl(PR_SET_CHILD_SUBREAPER): %s" % os.strerror(ctypes.get_errno())
    return ""


# --------------------------------------------------------------------------- perf events

# perf_event_open(2) syscall numbers.
_PERF_EVENT_OPEN_NR = {
    "x86_64": 298, "amd64": 298, "i386": 336, "i686": 336, "aarch64": 241, "arm64": 241,
    "riscv64": 241, "loongarch64": 241, "ppc64": 319, "ppc64le": 319, "s390x": 331,
    "armv7l": 364, "armv6l": 364,
}
# perf-tool event name -> (type, config): type 0 = PERF_TYPE_HARDWARE, 1 = SOFTWARE.
PERF_EVENT_CODES = {
    "cycles": (0, 0), "cpu-cycles": (0, 0),
    "instructions": (0, 1),
    "cache-references": (0, 2),
    "cache-misses": (0, 3),
    "branches": (0, 4), "branch-instructions": (0, 4),
    "branch-misses": (0, 5),
    "bus-cycles": (0, 6),
    "stalled-cycles-frontend": (0, 7),
    "stalled-cycles-backend": (0, 8),
    "ref-cycles": (0, 9),
    "cpu-clock": (1, 0),
    "task-clock": (1, 1),
    "page-faults": (1, 2), "faults": (1, 2),
    "context-switches": (1, 3), "cs": (1, 3),
    "cpu-migrations": (1, 4), "migrations": (1, 4),
    "minor-faults": (1, 5),
    "major-faults": (1, 6),
    "alignment-faults": (1, 7),
    "emulation-faults": (1, 8),
}
_CLOCK_EVENTS = frozenset(("task-clock", "cpu-clock"))  # counted in ns, reported in msec
# perf_event_attr bits (first 64 bytes, PERF_ATTR_SIZE_VER0).
_ATTR_DISABLED = 1 << 0
_ATTR_INHERIT = 1 << 1
_ATTR_EXCLUDE_KERNEL = 1 << 5
_ATTR_EXCLUDE_HV = 1 << 6
_ATTR_ENABLE_ON_EXEC = 1 << 12
_READ_FORMAT = 1 | 2  # PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING
_FORMAT_GROUP = 8  # PERF_FORMAT_GROUP: one read returns every member of the group
_PERF_FLAG_FD_CLOEXEC = 8
_ATTR_STRUCT = struct.Struct("=IIQQQQQIIQ")  # 64 bytes


class PerfEvents:
    """Counting with perf_event_open(2), as ``perf stat -e ... -- cmd`` does.

    ``open(pid, names)`` opens disabled counters with ``inherit`` and ``enable_on_exec`` on
    task ``pid`` (0: the calling thread): they start counting when that task (or a child
    it forks afterwards) execs, and children's counts are added in when they exit.
    """

    def __init__(self):
        self.exclude_kernel = False
        self._nr = _PERF_EVENT_OPEN_NR.get(platform.machine())
        self._ctypes, self._libc = _load_libc()
        if self._nr is None:
            self.reason = "unknown perf_event_open syscall number for %s" % platform.machine()
        elif self._ctypes is None:
            self.reason = self._libc
        else:
            self.reason = None
            self._attrs = {}
            self._c_nr = self._ctypes.c_long(self._nr)
            self._c_any_cpu = self._ctypes.c_long(-1)
            self._c_flags = self._ctypes.c_ulong(_PERF_FLAG_FD_CLOEXEC)

    def _open(self, pid: int, name: str, exclude_kernel: bool, group_fd: int = -1,
              read_format: int = _READ_FORMAT) -> int:
        """-> fd, or -errno."""
        ctypes = self._ctypes
        key = (name, exclude_kernel, read_format)
        attr = self._attrs.get(key)
        if attr is None:  # the syscall only reads it: built once per event and format
            ev_type, config = PERF_EVENT_CODES[name]
            flags = _ATTR_DISABLED | _ATTR_INHERIT | _ATTR_ENABLE_ON_EXEC
            if exclude_kernel:
                flags |= _ATTR_EXCLUDE_KERNEL | _ATTR_EXCLUDE_HV
            attr = self._attrs[key] = ctypes.create_string_buffer(
                _ATTR_STRUCT.pack(ev_type, _ATTR_STRUCT.size, config, 0, 0, read_format,
                                  flags, 0, 0, 0), _ATTR_STRUCT.size)
        fd = self._libc.syscall(self._c_nr, attr, ctypes.c_long(pid), self._c_any_cpu,
                                ctypes.c_long(group_fd), self._c_flags)
        return fd if fd >= 0 else -ctypes.get_errno()

    def probe(self, names) -> dict:
        """-> {"available", "events": {name: "supported"|"unsupported"}, ...}."""
        info = {"available": False, "events": {}, "method": "perf_event_open"}
        if self.reason is not None:
            info["events"] = {name: "unsupported" for name in names}
            info["reason"] = self.reason
            return info
        errors = set()
        for exclude_kernel in (False, True):
            info["events"] = {}
            denied = False
            for name in names:
                if name not in PERF_EVENT_CODES:
                    info["events"][name] = "unsupported"
                    errors.add("unknown event %s" % name)
                    continue
                fd = self._open(0, name, exclude_kernel)
                if fd >= 0:
                    os.close(fd)
                    info["events"][name] = "supported"
                else:
                    info["events"][name] = "unsupported"
                    errors.add(os.strerror(-fd))
                    denied = denied or -fd in (1, 13)  # EPERM, EACCES: perf_event_paranoid
            if not denied:
                break
        info["available"] = any(s == "supported" for s in info["events"].values())
        # perf_event_paranoid >= 2 lets unprivileged users count user space only.
        self.exclude_kernel = exclude_kernel and info["available"]
        info["user_only"] = self.exclude_kernel
        if not info["available"]:
            info["reason"] = _one_line("perf_event_open: " + "; ".join(sorted(errors)))
        return info

    def open(self, pid: int, names):
        """-> a list of ``(names, fds, grouped)`` (fds: None for an event that could not be
        opened; a group is read through its leader, the first); read with
        ``read_and_close``.

        Software events (never multiplexed) are opened as one group, read with one
        ``read``; hardware events each on their own, so that more of them than the PMU has
        counters are multiplexed and scaled as ``perf stat`` does, never left uncounted.
        A software event the group refuses is opened on its own."""
        out = []
        group = []  # (name, fd) of the software group; the first is the leader
        fmt = _READ_FORMAT | _FORMAT_GROUP
        for name in names:
            if PERF_EVENT_CODES[name][0] == 1:
                leader = group[0][1] if group else -1
                fd = self._open(pid, name, self.exclude_kernel, leader, fmt)
                if fd >= 0:
                    group.append((name, fd))
                    continue
            fd = self._open(pid, name, self.exclude_kernel)
            out.append(((name,), (fd if fd >= 0 else None,), False))
        if group:
            names_, fds = zip(*group)
            out.append((names_, fds, True))  # a member stays in the group while its fd is open
        return out

    @staticmethod
    def _entry(name, value, enabled, running) -> dict:
        if running == 0:
            return {"not_counted": True}
        scaled = float(value) * enabled / running if running < enabled else float(value)
        if name in _CLOCK_EVENTS:
            entry = {"value": scaled / 1e6, "unit": "msec"}
        else:
            entry = {"value": scaled, "unit": ""}
        if running < enabled:  # multiplexed: scaled the way perf stat does
            entry["running_pct"] = round(100.0 * running / enabled, 2)
        return entry

    @staticmethod
    def read_and_close(opened) -> dict:
        out = {}
        for names, fds, grouped in opened:
            size = 8 * (3 + len(names)) if grouped else 24
            data = b""
            try:
                if fds[0] is not None:
                    data = os.read(fds[0], size)
            except OSError:
                pass
            finally:
                for fd in fds:
                    if fd is not None:
                        os.close(fd)
            if len(data) != size:
                for name in names:
                    out[name] = {"not_counted": True}
            elif grouped:
                values = struct.unpack("=%dQ" % (3 + len(names)), data)
                if values[0] != len(names):
                    for name in names:
                        out[name] = {"not_counted": True}
                    continue
                enabled, running = values[1], values[2]
                for name, value in zip(names, values[3:]):
                    out[name] = PerfEvents._entry(name, value, enabled, running)
            else:
                value, enabled, running = struct.unpack("=QQQ", data)
                out[names[0]] = PerfEvents._entry(names[0], value, enabled, running)
        return out


# --------------------------------------------------------------------------- watchdog

class _Watchdog:
    """One long-lived thread that SIGKILLs the armed process group at its deadline.

    Arming and disarming do not wake the thread unless the new deadline comes before the
    end of its current wait: with runs of similar timeouts it wakes about once per timeout,
    not twice per run (each wake-up is a context switch and a GIL hand-over on the agent's
    CPU)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._target = None  # (pgid, deadline)
        self._fired = False
        self._wake_at = None  # when the thread's current wait ends (None: at a notify)
        self._thread = threading.Thread(target=self._loop, name="agent-watchdog", daemon=True)
        self._thread.start()

    def arm(self, pgid: int, timeout: float) -> None:
        with self._cond:
            deadline = time.monotonic() + timeout
            self._target = (pgid, deadline)
            self._fired = False
            if self._wake_at is None or deadline < self._wake_at:
                self._cond.notify()

    def disarm(self) -> bool:
        """Stop watching; -> whether it fired.  Once this returns it cannot fire."""
        with self._cond:
            self._target = None  # the thread finds nothing to do when it next wakes
            return self._fired

    def _loop(self) -> None:
        with self._cond:
            while True:
                if self._target is None:
                    self._wake_at = None
                    self._cond.wait()
                    continue
                pgid, deadline = self._target
                remaining = deadline - time.monotonic()
                if remaining > 0:
                    self._wake_at = deadline
                    self._cond.wait(remaining)
                    continue
                self._fired = True
                self._target = None
                _killpg_quietly(pgid)


# --------------------------------------------------------------------------- spawning

# Run by ``sh -c SCRIPT sh OUT BINARY ARGS...``: fork a subshell that waits on the gate
# (the shell's stdin) and then execs the binary, print its pid, exit.  The agent (child
# subreaper) inherits the waiting subshell, attaches counters and opens the gate.
# PWD, which sh exports, is unset: the binary's environment is exactly the one asked for
# (its size shifts the initial stack, which can shift timings).
_GATE_SCRIPT = ('out=$1; shift; exec 3<&0; '
                '{ read _ <&3 || exit 1; unset PWD; exec "$@" </dev/null 3<&-; } >"$out" '
                '& echo $!')


class _SpawnError(Exception):
    pass


def _read_line(fd: int, limit: int = 64) -> bytes:
    data = b""
    while len(data) < limit and not data.endswith(b"\n"):
        chunk = os.read(fd, limit - len(data))
        if not chunk:
            break
        data += chunk
    return data


_SH_NAME_RE = re.compile(rb"\A[A-Za-z_][A-Za-z0-9_]*\Z")


def _sh_quote(word: bytes) -> bytes:
    """``word`` as one single-quoted sh word: literal for every byte but NUL (never in argv)."""
    return b"'" + word.replace(b"'", b"'\\''") + b"'"


# The fork server, started once per agent by ``sh -c BOOT`` with the request pipe as stdin
# and the response pipe as stdout (sh only takes fd numbers 0-9 in redirections, so the
# pipes come in on fixed fds): sh moves the request pipe to fd 4 (stdin, stderr: /dev/null),
# forks the server loop in the background, prints its pid and exits (the agent, a child
# subreaper, inherits the loop and gives it its own process group).  Per request (a line
# holding a run token) the loop runs a command substitution: its subshell (the intermediate)
# forks the run's child, prints the child's pid into the substitution's pipe and exits.  The
# child sources ./script (in the agent's private scratch directory, the server's cwd; see
# ``_forkserver_script``), which keeps that pipe on fd 5 until it has redirected, cd'd and
# set the environment, closes it and blocks on its gate, a FIFO of its own.  The loop reads
# the pipe to its end and reaps the intermediate, so when it prints "p<child pid>" the child
# is the agent's child (reparented) and sleeps on its gate (or has exited): one message, one
# wake-up of the agent per run.
_FORKSERVER_BOOT = (
    ": inlining-agent fork server; exec 4<&0 </dev/null 2>/dev/null; "
    '{ while IFS= read -r t <&4; do p=$({ . ./script; } & echo $!); echo "p$p"; done; } & '
    "echo $!")


class _ServerError(Exception):
    """The fork server died or misbehaved (the request may be retried with a fresh one)."""


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


class _ForkServer:
    """One long-lived ``sh`` that forks gated run children on request (see _FORKSERVER_BOOT).

    Its process group (``pid``) holds it, its short-lived intermediates and a run child until
    the agent moves that child to a group of its own, so ``stop`` leaves nothing behind.
    """

    def __init__(self, sh: str, cwd: str, timeout: float = SH_START_TIMEOUT_S):
        self.sh = sh
        self.timeout = timeout
        self.pid = None
        self.cpu = None
        self._buf = b""  # what was read from the server's stdout beyond the last line
        self.req_w = self.resp_r = None
        req_r, self.req_w = os.pipe()
        self.resp_r, resp_w = os.pipe()
        boot = None
        try:
            try:
                boot = subprocess.Popen([sh, "-c", _FORKSERVER_BOOT], stdin=req_r,
                                        stdout=resp_w, stderr=subprocess.DEVNULL,
                                        cwd=cwd, env={})
            except OSError as e:
                raise _ServerError("could not start %s: %s" % (sh, e))
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
                raise _ServerError("%s did not start the fork server (wait status %s)"
                                   % (sh, boot.returncode))
            self.pid = pid
            os.setpgid(pid, pid)  # fails unless it is our (subreaper-inherited) child
        except BaseException as e:
            self.stop()
            if isinstance(e, OSError):
                raise _ServerError("fork server setup: %s" % e)
            raise

    def alive(self) -> bool:
        return self.pid is not None

    def _read_message(self, deadline: float):
        """The next line from the server's stdout (without its newline); None at the
        deadline; _ServerError at EOF."""
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            if not select.select([self.resp_r], [], [], remaining)[0]:
                continue
            chunk = os.read(self.resp_r, 4096)
            if not chunk:
                raise _ServerError("fork server died")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def spawn(self, token: int, cpus) -> int:
        """Fork a child that sources ./script for run ``token`` -> its pid, once it is a
        child of the agent and sleeps on its gate (or has exited: its wait status tells
        why).  The server and its intermediates run on ``cpus``.  _ServerError if the server
        is gone, misbehaves, or gives no answer within ``timeout`` (a child hanging before
        its gate hangs the server too; the caller replaces it)."""
        cpus = frozenset(cpus)
        if self.cpu != cpus:
            try:
                os.sched_setaffinity(self.pid, cpus)
            except OSError as e:  # ESRCH: the server is gone
                raise _ServerError("could not pin the fork server: %s" % e)
            self.cpu = cpus
        try:
            os.write(self.req_w, b"%d\n" % token)
        except OSError as e:  # EPIPE: the server is gone
            raise _ServerError("fork server gone (%s)" % e)
        line = self._read_message(time.monotonic() + self.timeout)
        if line is None:
            raise _ServerError("fork server hung (run %d)" % token)
        if not line.startswith(b"p"):
            raise _ServerError("fork server misbehaved (got %r)" % line[:64])
        try:
            return int(line[1:])
        except ValueError:
            raise _ServerError("fork server could not fork (got %r)" % line[:64])

    def stop(self) -> None:
        """Kill the server's process group, reap the server, close the pipes."""
        if self.pid is not None:
            _killpg_quietly(self.pid)
            try:
                os.kill(self.pid, signal.SIGKILL)  # in case it never got its own group
            except OSError:
                pass
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pid = None
        for name in ("req_w", "resp_r"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)


def _forkserver_script_parts(argv, env):
    """-> (exports, exec line): the per-request constant parts of a run script (see
    ``_forkserver_script``).  Every word is single-quoted (``_sh_quote``), so any argv,
    environment value or path is taken literally.

    The environment is the one asked for, less PWD and names sh cannot hold (exactly as
    gated sh passes it on, except that sh resets an inherited IFS, OPTIND or PPID, which the
    fork server passes unchanged): the server runs with an empty environment, the child
    unsets what sh exported itself (PWD, and OLDPWD after its cd) and exports the rest.
    """
    exports = [b"unset PWD OLDPWD\n"]
    for name, value in env.items():
        name = os.fsencode(name)
        if name != b"PWD" and _SH_NAME_RE.match(name):
            exports.append(b"export %s=%s\n" % (name, _sh_quote(os.fsencode(value))))
    tail = b"exec %s 3<&-\n" % b" ".join(_sh_quote(os.fsencode(a)) for a in argv)
    return b"".join(exports), tail


def _forkserver_script(parts) -> bytes:
    """The script every run's child sources (./script in the scratch directory, the server's
    cwd), the run's token in ``$t`` (read by the server): stdout/stderr to the scratch files
    o<token>/e<token>, stdin from /dev/null, its gate (the FIFO g<token>, held open
    read-write by the agent) on fd 3, the server's command-substitution pipe kept on fd 5
    until it is ready (closing it tells the server), cd to the run's fresh directory
    run-<token>, the environment, then block on the gate until the agent writes a line (or exit 125 at EOF: the agent is
    gone) and exec the binary with fds 0-2 only.  A gate per run: with a shared one, the
    next run's child could take a line meant for the run before it.  One script for every
    run of the same binary, arguments and environment: it is rewritten (replaced by rename,
    so a child still reading the old one is not disturbed) only when they change."""
    exports, tail = parts
    return b"".join((
        b'exec 5>&1 2>"e$t" >"o$t" </dev/null 4<&- 3<"g$t"\n',
        b'cd "run-$t" || exit 126\n',
        exports,
        b"exec 5>&-\n",
        b"IFS= read -r t <&3 || exit 125\n", tail))


def _check_output(record: dict, out_fd, expected) -> None:
    """stdout_sha256, stdout_bytes and output_ok of ``record`` from the captured stdout."""
    h = hashlib.sha256()
    size = os.fstat(out_fd).st_size if out_fd is not None else 0
    offset = 0
    while offset < size:
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
            record["output_ok"] = size == len(want) and os.pread(out_fd, size, 0) == want
        else:
            record["output_ok"] = digest == expected["sha256"]


def _pidfd_open(pid: int):
    """A pidfd for ``pid`` (readable once it exits), or None (Python < 3.9, Linux < 5.3)."""
    if not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def _reap_group(pgid: int) -> None:
    """Reap any of our zombie children in process group ``pgid`` (never blocks)."""
    while True:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


# --------------------------------------------------------------------------- agent

def _scratch_base():
    """Where per-run scratch files go: a RAM-backed tmpfs when one is writable.

    Every run creates and removes a working directory and rewrites two capture files; on a
    disk filesystem that metadata traffic costs milliseconds per run (measured: 0.54 ms on
    ext4 against 0.03 ms on tmpfs for one directory and one file), on tmpfs almost nothing.
    """
    for candidate in (os.environ.get("XDG_RUNTIME_DIR"), "/dev/shm"):
        if candidate and os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK):
            return candidate
    return None  # the default temporary directory


class _Plan:
    """A checked run request: what its runs share, and their records so far."""
    __slots__ = ("req_id", "sha", "argv", "runs", "cpu", "timeout", "expected", "env",
                 "perf_events", "spawn", "parts", "records", "started", "entry")

    def copy(self, req_id) -> "_Plan":
        """A fresh plan of the same request (id ``req_id``), no run started."""
        plan = _Plan()
        for name in ("sha", "argv", "runs", "cpu", "timeout", "expected", "env",
                     "perf_events", "spawn", "parts"):
            setattr(plan, name, getattr(self, name))
        plan.req_id = req_id
        plan.records = []
        plan.started = 0
        plan.entry = None
        return plan


class _Unit:
    """One run of a plan through the fork server: prepared, launched, waited for, finished."""
    __slots__ = ("plan", "token", "workdir", "server", "pid", "pidfd", "gate", "counters",
                 "cpus_allowed", "t0", "t1", "status", "ru", "timed_out", "failure")

    def __init__(self, plan, token, workdir):
        self.plan, self.token, self.workdir = plan, token, workdir
        self.server = self.pid = self.pidfd = self.gate = self.cpus_allowed = None
        self.t0 = self.t1 = self.status = self.ru = self.failure = None
        self.counters = []
        self.timed_out = False


class Agent:
    """The request handler; usable in-process (e.g. by a Ray actor) or via ``main``.

    ``spawn``: "auto" (the fork server when possible, else gated sh, else direct),
    "forkserver", "gated" or "direct" (see ``_start``).
    """

    def __init__(self, cache_dir, worker_class=None, perf_events=DEFAULT_PERF_EVENTS,
                 spawn="auto"):
        if spawn not in ("auto", "forkserver", "gated", "direct"):
            raise ValueError("spawn must be auto, forkserver, gated or direct")
        self.cache_dir = os.path.abspath(str(cache_dir))
        os.makedirs(self.cache_dir, exist_ok=True)
        self.worker_class = worker_class
        self.perf_events = tuple(perf_events)
        self._spawn_request = spawn
        self._spawn = None  # ("forkserver" | "gated", sh path) or ("direct", reason)
        self._spawn_note = None  # why auto fell back from the fork server to gated
        self._server = None  # the _ForkServer (forkserver spawning)
        self._token = 0  # run tokens, unique over the agent's life
        self._workdirs = 0  # run working directories made
        self._cpus = frozenset(os.sched_getaffinity(0))  # as started (the loop may pin itself)
        self._live = {}  # pid -> _Unit: fork-server children started and not yet reaped
        self._parts = self._parts_key = None  # the last run script parts, and for what
        self._script_parts = None  # the parts ./script was written from
        self._base_env = None  # os.environ less PWD, copied once
        self._last_plan = None  # (request less its id, _Plan): the last run request checked
        self._perf = None
        self._perf_info = None
        self._verified = {}  # sha256 -> (st_dev, st_ino, st_size, st_mtime_ns)
        self._scratch = tempfile.mkdtemp(prefix="inlining-agent-", dir=_scratch_base())
        self._lock = threading.Lock()  # one request at a time per Agent
        self._watchdog = None
        self._recent_pgids = []
        self._remembered = 0  # calls of _remember_pgid
        self._version = None
        self.closed = False

    # ----------------------------------------------------------------- plumbing

    def close(self) -> None:
        self.closed = True
        for unit in list(self._live.values()):
            self._fs_abort(unit)
        self._stop_server()
        shutil.rmtree(self._scratch, ignore_errors=True)

    def _stop_server(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            pgid = server.pid
            server.stop()
            if pgid is not None:  # orphaned intermediates / children: reaped later
                self._remember_pgid(pgid)

    def handle(self, request) -> dict:
        """Answer one request (a decoded JSON value); never raises for a bad request."""
        req_id = request.get("id") if isinstance(request, dict) else None
        try:
            if not isinstance(request, dict):
                raise RequestError("request must be a JSON object")
            op = request.get("op")
            handler = {
                "hello": self._op_hello,
                "has": self._op_has,
                "run": self._op_run,
                "shutdown": self._op_shutdown,
            }.get(op) if isinstance(op, str) else None
            if handler is None:
                raise RequestError("unknown op %s" % json.dumps(op))
            with self._lock:
                response = handler(request)
        except RequestError as e:
            response = {"ok": False, "error": _one_line(e)}
        except Exception as e:  # never die from a request
            sys.stderr.write("agent: internal error: %s: %s\n" % (type(e).__name__, e))
            response = {"ok": False,
                        "error": _one_line("internal error: %s: %s" % (type(e).__name__, e))}
        out = {"id": req_id}
        out.update(response)
        return out

    def _pipelinable(self, item) -> bool:
        """Whether queued ``item`` is a run request the fork-server pipeline can take."""
        if item[0] != "req" or not isinstance(item[1], dict) or item[1].get("op") != "run":
            return False
        try:
            return self.spawn_info()["method"] == "forkserver"
        except RequestError:
            return False  # handle() reports it

    def serve_fd(self, fd: int, emit) -> None:
        """Answer the requests read from ``fd`` through ``emit(response)``, in order, until
        EOF or shutdown, pipelining fork-server runs.

        While a run is in progress the agent finishes the previous run (counters, output
        check, response) and prepares the next queued one (script, fork, process group,
        readiness, pinning, counters), so between two runs on a CPU there is only: reap,
        arm the watchdog, start the clock, open the gate.  Overlapping needs a CPU besides
        the run's among the agent's: the agent's threads, the fork server and the next
        child's start-up stay there, never on the run's CPU.  With no such CPU every step
        happens between runs, as in ``handle``.  Other requests wait until no run is in
        progress; responses always come in request order.
        """
        reqs = _Requests(fd)
        outq = collections.deque()  # [response dict, done] in request order
        state = {"plan": None}

        def flush():
            while outq and outq[0][1]:
                emit(outq.popleft()[0])

        def next_plan():
            """The plan of the next run to start, or None (nothing queued that can run)."""
            plan = state["plan"]
            while plan is None or plan.started >= plan.runs:
                state["plan"] = plan = None
                if not reqs.items or not self._pipelinable(reqs.items[0]):
                    return None
                request = reqs.items.popleft()[1]
                entry = [{"id": request.get("id")}, False]
                outq.append(entry)
                try:
                    with self._lock:
                        plan = self._plan_run(request)
                except RequestError as e:
                    entry[0].update(ok=False, error=_one_line(e))
                    entry[1] = True
                    plan = None
                    continue
                except Exception as e:  # never die from a request
                    sys.stderr.write("agent: internal error: %s: %s\n" % (type(e).__name__, e))
                    entry[0].update(ok=False, error=_one_line(
                        "internal error: %s: %s" % (type(e).__name__, e)))
                    entry[1] = True
                    plan = None
                    continue
                plan.entry = entry
                state["plan"] = plan
            plan.started += 1
            return plan

        finished = []  # units waiting for their records, in start order

        def finish_all():
            while finished:
                unit = finished.pop(0)
                self._fs_finish(unit)
                plan = unit.plan
                if len(plan.records) == plan.runs:
                    plan.entry[0].update(self._plan_response(plan))
                    plan.entry[1] = True

        def spare(plan):
            return self._cpus - {plan.cpu}

        pinned = None
        prepared = running = None
        try:
            while True:
                if running is None:
                    plan = prepared.plan if prepared is not None else next_plan()
                    if plan is None:  # nothing to run now
                        finish_all()
                        flush()
                        if reqs.items:  # a request that is not a pipelined run
                            kind, value = reqs.items.popleft()
                            emit(self.handle(value) if kind == "req" else value)
                            if self.closed:
                                return
                            continue
                        if reqs.eof or self.closed:
                            return
                        reqs.fill(None)
                        continue
                    overlap = spare(plan)
                    if overlap and pinned != overlap:  # the agent keeps off the run's CPU
                        os.sched_setaffinity(0, overlap)
                        tid = getattr(self._watchdog._thread, "native_id", None)
                        if tid is not None:
                            try:
                                os.sched_setaffinity(tid, overlap)
                            except OSError:
                                pass
                        pinned = overlap
                    unit, prepared = prepared, None
                    if unit is None:
                        unit = self._fs_prepare(plan, overlap or {plan.cpu})
                    if not overlap:  # nothing else may happen during the run
                        finish_all()
                        flush()
                    if unit.failure is not None:
                        finished.append(unit)
                        continue
                    unit.pidfd = _pidfd_open(unit.pid)
                    self._fs_launch(unit)
                    running = unit
                    continue
                overlap = spare(running.plan)
                if overlap:
                    finish_all()
                    flush()
                    if prepared is None:
                        reqs.fill(0)
                        plan = next_plan()
                        if plan is not None:
                            prepared = self._fs_prepare(plan, overlap)
                    if prepared is None and not reqs.eof and running.pidfd is not None:
                        ready = select.select([running.pidfd, fd], [], [])[0]
                        if running.pidfd not in ready:
                            continue  # a request came: prepare it while the run goes on
                self._fs_wait(running)
                finished.append(running)
                running = None
        finally:
            for unit in (running, prepared):
                if unit is not None:
                    self._watchdog.disarm()
                    self._fs_abort(unit)

    def perf_info(self) -> dict:
        """Which counters this machine supports (probed once)."""
        if self._perf_info is None:
            self._perf = PerfEvents()
            self._perf_info = self._perf.probe(self.perf_events)
        return self._perf_info

    def spawn_info(self) -> dict:
        """How binaries are started (decided once; may make this process a subreaper)."""
        if self._spawn is None:
            sh = shutil.which("dash") or ("/bin/sh" if os.access("/bin/sh", os.X_OK) else None)
            why = ""
            if self._spawn_request == "direct":
                why = "requested"
            elif sh is None:
                why = "no /bin/sh"
            else:
                why = _become_child_subreaper()
            if why:
                if self._spawn_request in ("gated", "forkserver"):
                    raise RequestError("cannot spawn through sh: %s" % why)
                self._spawn = ("direct", why)
            elif self._spawn_request == "gated":
                self._spawn = ("gated", sh)
            else:
                try:
                    self._server = _ForkServer(sh, self._scratch)
                except _ServerError as e:
                    if self._spawn_request == "forkserver":
                        raise RequestError("cannot start the fork server: %s" % e)
                    self._spawn_note = _one_line(e)
                    self._spawn = ("gated", sh)
                else:
                    self._spawn = ("forkserver", sh)
        if self._spawn[0] != "direct":
            info = {"method": self._spawn[0], "shell": self._spawn[1], "maxrss_exact": True}
            if self._spawn_note:
                info["forkserver_error"] = self._spawn_note
            return info
        return {"method": "direct", "reason": self._spawn[1], "maxrss_exact": False}

    # ----------------------------------------------------------------- ops

    def _op_hello(self, request) -> dict:
        if self._version is None:
            try:
                self._version = _sha256_file(os.path.abspath(__file__))
            except OSError:
                self._version = "unknown"
        return {
            "ok": True,
            "agent_version": self._version,
            "python": platform.python_version(),
            "hostname": socket.gethostname(),
            "cpus": sorted(self._cpus),
            "perf": self.perf_info(),
            "spawn": self.spawn_info(),
            "worker_class": self.worker_class,
        }

    def _op_has(self, request) -> dict:
        sha = self._check_sha(request.get("sha256"))
        try:
            self._verify(sha)
        except RequestError:
            return {"ok": True, "present": False}
        return {"ok": True, "present": True}

    def _op_shutdown(self, request) -> dict:
        self.closed = True
        return {"ok": True}

    def _op_run(self, request) -> dict:
        plan = self._plan_run(request)
        if plan.spawn == "forkserver":
            while len(plan.records) < plan.runs:
                unit = self._fs_prepare(plan, {plan.cpu})
                if unit.failure is None:
                    self._fs_launch(unit)
                    self._fs_wait(unit)
                self._fs_finish(unit)
            return self._plan_response(plan)
        # stdout/stderr go to two scratch files, opened once per request, emptied per run.
        out_path = os.path.join(self._scratch, "stdout")
        out_fd = os.open(out_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            err_fd = os.open(os.path.join(self._scratch, "stderr"),
                             os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                plan.records = [self._run_once(plan.argv, plan.cpu, plan.timeout,
                                               plan.expected, plan.env, plan.perf_events,
                                               out_path, out_fd, err_fd)
                                for _ in range(plan.runs)]
            finally:
                os.close(err_fd)
        finally:
            os.close(out_fd)
        return self._plan_response(plan)

    @staticmethod
    def _plan_response(plan) -> dict:
        return {
            "ok": True,
            "sha256": plan.sha,
            "cpu": plan.cpu,
            "spawn": plan.spawn,
            "runs": plan.records,
            "failed": sum(1 for r in plan.records if r["failure"] is not None),
        }

    # Fields whose JSON type equality alone does not pin down (1 == 1.0 == true in Python).
    _TYPED_FIELDS = ("runs", "cpu", "timeout", "perf")

    def _plan_run(self, request) -> "_Plan":
        """Check a run request and get everything its runs share -> _Plan (RequestError).

        A request equal to the last one checked (ids aside; the same JSON types) reuses its
        checks and its environment: only the binary is verified again (a stat, and a rehash
        if the file changed)."""
        key = dict(request)
        key.pop("id", None)
        last = self._last_plan
        if last is not None and key == last[0] and all(
                type(key.get(f)) is type(last[0].get(f)) for f in self._TYPED_FIELDS):
            proto = last[1]
            if self._verify(proto.sha) == proto.argv[0]:
                return proto.copy(request.get("id"))
        self._last_plan = None
        plan = self._check_run(request)
        self._last_plan = (key, plan.copy(None))
        return plan

    def _check_run(self, request) -> "_Plan":
        """``_plan_run`` without the cache."""
        sha = self._check_sha(request.get("sha256"))
        args = request.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise RequestError("args must be a list of strings")
        if any("\0" in a for a in args):
            raise RequestError("args must not contain NUL characters")
        runs = request.get("runs", 1)
        if not isinstance(runs, int) or isinstance(runs, bool) or not 1 <= runs <= MAX_RUNS:
            raise RequestError("runs must be an integer in 1..%d" % MAX_RUNS)
        cpu = request.get("cpu")
        allowed = self._cpus
        if not isinstance(cpu, int) or isinstance(cpu, bool) or cpu not in allowed:
            raise RequestError("cpu must be one of this agent's CPUs %s, got %s"
                               % (sorted(allowed), json.dumps(cpu)))
        timeout = request.get("timeout", DEFAULT_TIMEOUT_S)
        if (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
                or not 0 < timeout <= MAX_TIMEOUT_S):
            raise RequestError("timeout must be a number of seconds in (0, %g]" % MAX_TIMEOUT_S)
        expected = request.get("expected_output")
        bad_expected = 'expected_output must be null, {"sha256": hex} or {"text": str}'
        if expected is not None:
            if not isinstance(expected, dict) or len(expected) != 1:
                raise RequestError(bad_expected)
            if "sha256" in expected:
                if not isinstance(expected["sha256"], str) or not SHA256_RE.match(
                        expected["sha256"]):
                    raise RequestError("expected_output.sha256 must be 64 lowercase hex digits")
            elif "text" in expected:
                if not isinstance(expected["text"], str):
                    raise RequestError("expected_output.text must be a string")
                expected = {"text": expected["text"].encode("utf-8")}
            else:
                raise RequestError(bad_expected)
        extra_env = request.get("env") or {}
        if not isinstance(extra_env, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and k and "=" not in k
                and "\0" not in k + v for k, v in extra_env.items()):
            raise RequestError("env must be an object of string names (no '=') to strings")
        try:
            for text in args + list(extra_env) + list(extra_env.values()):
                os.fsencode(text)
        except UnicodeEncodeError:
            raise RequestError("args and env must be encodable file-system strings")
        use_perf = request.get("perf", True)
        if not isinstance(use_perf, bool):
            raise RequestError("perf must be true or false")

        binary = self._verify(sha)

        if self._base_env is None:
            self._base_env = dict(os.environ)
            self._base_env.pop("PWD", None)  # stale (the agent's); sh would set it
        env = dict(self._base_env)
        env.update(extra_env)
        runparam = env.get("OCAMLRUNPARAM")
        if not runparam:
            env["OCAMLRUNPARAM"] = "v=0x400"
        elif not any(p.strip().startswith("v=") for p in runparam.split(",")):
            env["OCAMLRUNPARAM"] = runparam + ",v=0x400"

        perf_events = None
        if use_perf:
            info = self.perf_info()
            if info["available"]:
                perf_events = [e for e, s in info["events"].items() if s == "supported"]
        spawn = self.spawn_info()
        if self._watchdog is None:
            self._watchdog = _Watchdog()  # before any counter is opened on this thread
        plan = _Plan()
        plan.req_id = request.get("id")
        plan.sha = sha
        plan.argv = [binary] + args
        plan.runs = runs
        plan.cpu = cpu
        plan.timeout = float(timeout)
        plan.expected = expected
        plan.env = env
        plan.perf_events = perf_events
        plan.spawn = spawn["method"]
        plan.parts = None
        if plan.spawn == "forkserver":
            key = (plan.argv, env)
            if self._parts_key != key:  # the same binary, args and env as last time: reuse
                self._parts = _forkserver_script_parts(plan.argv, env)
                self._parts_key = key
            plan.parts = self._parts
        plan.records = []
        plan.started = 0
        return plan

    # ----------------------------------------------------------------- cache

    @staticmethod
    def _check_sha(sha) -> str:
        if not isinstance(sha, str) or not SHA256_RE.match(sha):
            raise RequestError("invalid sha256 %s: need 64 lowercase hex digits"
                               % json.dumps(sha)[:80])
        return sha

    def _verify(self, sha: str) -> str:
        """Path of the verified binary ``sha``; RequestError if missing or corrupt."""
        path = os.path.join(self.cache_dir, sha)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._verified.pop(sha, None)
            raise RequestError("binary %s not in cache" % sha)
        if not stat.S_ISREG(st.st_mode):
            raise RequestError("binary %s in cache is not a regular file" % sha)
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if self._verified.get(sha) != key:
            self._verified.pop(sha, None)
            actual = _sha256_file(path)
            if actual != sha:
                try:
                    os.unlink(path)
                    what = "removed from cache"
                except OSError as e:
                    what = "could not remove it: %s" % e
                raise RequestError("checksum mismatch for binary %s: content hashes to %s; %s"
                                   % (sha, actual, what))
            if not os.access(path, os.X_OK):  # e.g. uploaded over SFTP without mode bits
                os.chmod(path, (st.st_mode & 0o7777) | 0o500)
                st = os.stat(path)
                key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            self._verified[sha] = key
        return path

    # ----------------------------------------------------------------- running

    def _start(self, argv, cpu, workdir, env, out_path, out_fd, err_fd, perf_events, timeout):
        """Start ``argv`` pinned to ``cpu`` in a new session.

        -> (pid, pgid, t0_ns, counters, cpus_allowed); the watchdog is armed and the wall
        clock started (t0) as the binary is let go.

        gated: ``sh`` forks a subshell that blocks on a gate pipe, prints its pid and
        exits; the agent, a child subreaper, reaps sh and so inherits the subshell, opens
        the counters on it, then opens the gate and the subshell execs the binary.  The
        binary's rusage is then its own: started from sh's small address space, not the
        agent's, its ru_maxrss is not inflated to the agent's RSS (Linux folds the
        pre-exec address space's high-water mark into ru_maxrss), and only the agent can
        reap it (no shell can swallow its exit status).
        direct: Popen the binary (ru_maxrss >= the agent's RSS, ~15-20 MB).
        """
        saved_mask = os.sched_getaffinity(0)
        if self._spawn[0] == "direct":
            counters = []
            os.sched_setaffinity(0, {cpu})  # this thread only; the child inherits it
            try:
                if perf_events:  # inherited by the child, enabled at its exec
                    counters = self._perf.open(0, perf_events)
                t0 = time.monotonic_ns()
                proc = subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                                        stdout=out_fd, stderr=err_fd, start_new_session=True)
            except OSError as e:
                PerfEvents.read_and_close(counters)
                raise _SpawnError(_one_line("exec failed: %s" % e))
            finally:
                os.sched_setaffinity(0, saved_mask)
            proc.returncode = 0  # reaped by the agent with wait4, not by Popen
            self._watchdog.arm(proc.pid, timeout)
            _limit_cpu_time(proc.pid, timeout)
            return proc.pid, proc.pid, t0, counters, _cpus_allowed_list(proc.pid)

        gate_r, gate_w = os.pipe()
        pid_r, pid_w = os.pipe()
        pgid = None
        try:
            os.sched_setaffinity(0, {cpu})
            try:
                sh = subprocess.Popen([self._spawn[1], "-c", _GATE_SCRIPT, "sh", out_path] + argv,
                                      cwd=workdir, env=env, stdin=gate_r, stdout=pid_w,
                                      stderr=err_fd, start_new_session=True)
            except OSError as e:
                raise _SpawnError(_one_line("could not start %s: %s" % (self._spawn[1], e)))
            finally:
                os.sched_setaffinity(0, saved_mask)
                os.close(gate_r)
                os.close(pid_w)
            pgid = sh.pid
            self._watchdog.arm(pgid, SH_START_TIMEOUT_S)  # sh must not hang the agent
            line = _read_line(pid_r)
            _, status, _ = os.wait4(sh.pid, 0)
            sh.returncode = status
            if self._watchdog.disarm():
                raise _SpawnError("%s did not start the binary within %gs"
                                  % (self._spawn[1], SH_START_TIMEOUT_S))
            try:
                pid = int(line)
            except ValueError:
                raise _SpawnError("%s did not start the binary (wait status %d)"
                                  % (self._spawn[1], status))
            cpus_allowed = _cpus_allowed_list(pid)
            counters = self._perf.open(pid, perf_events) if perf_events else []
            _limit_cpu_time(pid, timeout)
            self._watchdog.arm(pgid, timeout)
            t0 = time.monotonic_ns()
            try:
                os.write(gate_w, b"\n")
            except BrokenPipeError:  # the subshell is gone; waiting for it will tell
                pass
            pgid_ok = pgid
            pgid = None
            return pid, pgid_ok, t0, counters, cpus_allowed
        finally:
            os.close(gate_w)
            os.close(pid_r)
            if pgid is not None:  # failed half-way: leave nothing behind
                _killpg_quietly(pgid)
                self._remember_pgid(pgid)

    # ----------------------------------------------------------------- fork-server runs

    def _fs_prepare(self, plan, server_cpus) -> _Unit:
        """Get a run of ``plan`` ready to go: write its script, have the fork server (on
        ``server_cpus``) fork its child, give the child its own process group, wait until it
        blocks on the gate, then pin it to the run's CPU, attach counters and RLIMIT_CPU.
        A server found dead (or hung for SH_START_TIMEOUT_S) is replaced and the spawn retried
        once.  A run that cannot be prepared comes back with ``failure`` set.
        """
        self._token += 1
        token = self._token
        workdir = os.path.join(self._scratch, "run-%d" % token)
        unit = _Unit(plan, token, workdir)
        try:
            os.mkdir(workdir, 0o700)
            gate = os.path.join(self._scratch, "g%d" % token)
            os.mkfifo(gate, 0o600)
            # read-write: opening it never blocks, and the child's read-only open finds a
            # writer; the child sees EOF (exit 125) if the agent dies first
            unit.gate = os.open(gate, os.O_RDWR | os.O_CLOEXEC)
            if self._script_parts is not plan.parts:
                self._write_script(plan.parts)
        except OSError as e:
            unit.failure = _one_line("could not prepare the run: %s" % e)
            return unit
        for attempt in (1, 2):
            try:
                if self._server is None:
                    self._server = _ForkServer(self._spawn[1], self._scratch)
                unit.pid = self._server.spawn(token, server_cpus)
                break
            except _ServerError as e:
                self._stop_server()
                if attempt == 2:
                    unit.failure = _one_line("fork server failed twice: %s" % e)
                    return unit
        pid = unit.pid
        unit.server = self._server
        self._live[pid] = unit
        try:
            try:
                os.setpgid(pid, pid)  # its own group: killpg gets the benchmark's whole tree
            except ProcessLookupError:  # already exited (its wait status tells why)
                pass
            try:  # it sleeps on the gate: moving it disturbs nothing on ``cpu``
                os.sched_setaffinity(pid, {plan.cpu})
            except ProcessLookupError:  # it exited (a zombie)
                pass
            unit.cpus_allowed = _cpus_allowed_list(pid)
            if plan.perf_events:
                unit.counters = self._perf.open(pid, plan.perf_events)
            _limit_cpu_time(pid, plan.timeout)
        except (OSError, _ServerError) as e:
            self._fs_abort(unit)
            unit.failure = _one_line("could not prepare the run: %s" % e)
        except BaseException:
            self._fs_abort(unit)
            raise
        return unit

    def _write_script(self, parts) -> None:
        """(Re)write ./script, the script every fork-server child sources, by rename."""
        tmp = os.path.join(self._scratch, "script.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, _forkserver_script(parts))
        finally:
            os.close(fd)
        os.rename(tmp, os.path.join(self._scratch, "script"))
        self._script_parts = parts

    def _fs_launch(self, unit) -> None:
        """Start the clock and let the prepared child exec the binary."""
        self._watchdog.arm(unit.pid, unit.plan.timeout)
        gate, unit.gate = unit.gate, None
        unit.t0 = time.monotonic_ns()
        try:
            os.write(gate, b"\n")
        finally:
            os.close(gate)

    def _fs_wait(self, unit) -> None:
        """Wait for the launched child to exit (a zombie keeps its process-group id reserved
        while the watchdog is disarmed and stray group members are killed), then reap it."""
        pid = unit.pid
        reaped = False
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            unit.t1 = time.monotonic_ns()
            unit.timed_out = self._watchdog.disarm()
            _killpg_quietly(pid)  # stray background processes of the benchmark
            _, unit.status, unit.ru = os.wait4(pid, 0)
            reaped = True
        finally:
            if not reaped:  # interrupted (e.g. SIGTERM to the agent): leave no orphan
                self._watchdog.disarm()
                self._fs_abort(unit)
            self._live.pop(pid, None)
            if unit.pidfd is not None:
                os.close(unit.pidfd)
                unit.pidfd = None
            self._remember_pgid(pid)

    def _fs_abort(self, unit) -> None:
        """Kill and reap a child that will not (or did not) run to its end."""
        if unit.gate is not None:
            os.close(unit.gate)
            unit.gate = None
        if unit.pid is None:
            return
        _killpg_quietly(unit.pid)
        try:
            os.kill(unit.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.waitpid(unit.pid, 0)
        except OSError:
            pass
        self._live.pop(unit.pid, None)
        if unit.pidfd is not None:
            os.close(unit.pidfd)
            unit.pidfd = None

    def _fs_finish(self, unit) -> dict:
        """The record of a finished (or failed to prepare) run, appended to its plan's; its
        counters, files and directory are released."""
        plan = unit.plan
        record = {
            "wall_ns": None, "user_s": None, "sys_s": None, "maxrss_kb": None,
            "exit_status": None, "signal": None, "output_ok": None,
            "stdout_sha256": None, "stdout_bytes": None, "gc": {}, "perf": None,
            "cpus_allowed": unit.cpus_allowed, "stderr_tail": "", "failure": None,
        }
        plan.records.append(record)
        if unit.counters:
            perf = PerfEvents.read_and_close(unit.counters)
            unit.counters = []
            for name, state in self._perf_info["events"].items():
                if state != "supported":
                    perf[name] = {"unsupported": True}
            if unit.failure is None:
                record["perf"] = perf
        try:
            os.rmdir(unit.workdir)  # the common case: the binary left nothing behind
        except FileNotFoundError:
            pass
        except OSError:
            shutil.rmtree(unit.workdir, ignore_errors=True)
        scratch = self._scratch
        token = unit.token
        out_path = os.path.join(scratch, "o%d" % token)
        err_path = os.path.join(scratch, "e%d" % token)
        try:
            err_fd = os.open(err_path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            err_fd = None
        try:
            tail = _read_tail(err_fd, STDERR_SCAN_BYTES) if err_fd is not None else b""
        finally:
            if err_fd is not None:
                os.close(err_fd)
        try:
            out_fd = os.open(out_path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            out_fd = None
        try:
            if unit.failure is not None:
                record["failure"] = unit.failure
                record["stderr_tail"] = tail[-STDERR_TAIL_BYTES:].decode("utf-8", "replace")
                return record
            ru = unit.ru
            record["wall_ns"] = unit.t1 - unit.t0
            record["user_s"] = round(ru.ru_utime, 6)
            record["sys_s"] = round(ru.ru_stime, 6)
            record["maxrss_kb"] = ru.ru_maxrss
            exit_status, sig = _decode_wait_status(unit.status)
            record["exit_status"] = exit_status
            record["signal"] = sig
            gc, tail = parse_gc_stats(tail)
            record["gc"] = gc
            record["stderr_tail"] = tail[-STDERR_TAIL_BYTES:].decode("utf-8", "replace")
            _check_output(record, out_fd, plan.expected)
            if unit.timed_out:
                record["failure"] = "timeout after %gs" % plan.timeout
            elif sig is not None:
                record["failure"] = "killed by signal %d (%s)" % (sig, signal_name(sig))
            elif exit_status != 0:
                record["failure"] = "exit status %s" % exit_status
            elif record["output_ok"] is False:
                record["failure"] = "wrong output (sha256 %s...)" % record["stdout_sha256"][:12]
            return record
        finally:
            if out_fd is not None:
                os.close(out_fd)
            if unit.gate is not None:  # never launched
                os.close(unit.gate)
                unit.gate = None
            for path in (os.path.join(scratch, "g%d" % token), out_path, err_path):
                try:
                    os.unlink(path)
                except OSError:
                    pass

    def _remember_pgid(self, pgid: int) -> None:
        """Orphans of recent runs are our children (subreaper): reaped every 8th call, by
        process group (the last 16), so a zombie stray waits a few runs at most."""
        if pgid not in self._recent_pgids:
            self._recent_pgids.append(pgid)
            del self._recent_pgids[:-16]
        self._remembered += 1
        if self._remembered % 8:  # strays are rare, and a killed one may still be dying
            return
        for g in self._recent_pgids:
            _reap_group(g)

    def _run_once(self, argv, cpu, timeout, expected, env, perf_events, out_path,
                  out_fd, err_fd) -> dict:
        """Run the binary once -> record.

        wall_ns (from letting the binary go to its exit, agent's monotonic clock), user_s,
        sys_s, maxrss_kb (KiB): the binary's rusage from wait4; exit_status / signal;
        output_ok (null without expected output); stdout_sha256 and stdout_bytes; gc (the
        OCaml runtime's exit statistics); perf (counters or null); cpus_allowed (the
        child's Cpus_allowed_list in /proc); stderr_tail (last 2000 bytes, GC lines
        removed); failure (null or a reason).
        """
        record = {
            "wall_ns": None, "user_s": None, "sys_s": None, "maxrss_kb": None,
            "exit_status": None, "signal": None, "output_ok": None,
            "stdout_sha256": None, "stdout_bytes": None, "gc": {}, "perf": None,
            "cpus_allowed": None, "stderr_tail": "", "failure": None,
        }
        for fd in (out_fd, err_fd):
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)  # a directly spawned child shares this offset
        self._workdirs += 1  # the scratch directory is private: a counter names it
        workdir = os.path.join(self._scratch, "run-%d" % self._workdirs)
        try:
            os.mkdir(workdir, 0o700)
        except FileExistsError:
            workdir = tempfile.mkdtemp(prefix="run-", dir=self._scratch)
        counters = []
        try:
            try:
                pid, pgid, t0, counters, cpus_allowed = self._start(
                    argv, cpu, workdir, env, out_path, out_fd, err_fd, perf_events, timeout)
            except _SpawnError as e:
                record["failure"] = str(e)
                record["stderr_tail"] = _read_tail(err_fd, STDERR_TAIL_BYTES).decode(
                    "utf-8", "replace")
                return record
            record["cpus_allowed"] = cpus_allowed
            reaped = False
            try:
                # Wait without reaping: the zombie keeps the process group id reserved.
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
                t1 = time.monotonic_ns()
                timed_out = self._watchdog.disarm()
                _killpg_quietly(pgid)  # stray background processes of the benchmark
                _, status, ru = os.wait4(pid, 0)
                reaped = True
            finally:
                if not reaped:  # interrupted (e.g. SIGTERM to the agent): leave no orphan
                    self._watchdog.disarm()
                    _killpg_quietly(pgid)
                    try:
                        os.wait4(pid, 0)
                    except OSError:
                        pass
                self._remember_pgid(pgid)
        finally:
            if counters:
                perf = PerfEvents.read_and_close(counters)
                for name, state in self._perf_info["events"].items():
                    if state != "supported":
                        perf[name] = {"unsupported": True}
                record["perf"] = perf
            try:
                os.rmdir(workdir)  # the common case: the binary left nothing behind
            except OSError:
                shutil.rmtree(workdir, ignore_errors=True)

        record["wall_ns"] = t1 - t0
        record["user_s"] = round(ru.ru_utime, 6)
        record["sys_s"] = round(ru.ru_stime, 6)
        record["maxrss_kb"] = ru.ru_maxrss
        exit_status, sig = _decode_wait_status(status)
        record["exit_status"] = exit_status
        record["signal"] = sig

        gc, tail = parse_gc_stats(_read_tail(err_fd, STDERR_SCAN_BYTES))
        record["gc"] = gc
        record["stderr_tail"] = tail[-STDERR_TAIL_BYTES:].decode("utf-8", "replace")

        _check_output(record, out_fd, expected)
        digest = record["stdout_sha256"]

        if timed_out:
            record["failure"] = "timeout after %gs" % timeout
        elif sig is not None:
            record["failure"] = "killed by signal %d (%s)" % (sig, signal_name(sig))
        elif exit_status != 0:
            record["failure"] = "exit status %s" % exit_status
        elif record["output_ok"] is False:
            record["failure"] = "wrong output (sha256 %s...)" % digest[:12]
        return record


# --------------------------------------------------------------------------- main

class _Requests:
    """Request lines read from a file descriptor as they come, decoded, in order.

    ``items`` holds ("req", value) for a decoded line and ("bad", response) for a malformed
    one; ``eof`` is set once the stream has ended."""

    def __init__(self, fd: int):
        self.fd = fd
        self.items = collections.deque()
        self.eof = False
        self._buf = b""

    def fill(self, timeout) -> None:
        """Read what is available (waiting up to ``timeout`` s, None: until something is)."""
        if self.eof or (timeout is not None and not select.select([self.fd], [], [], timeout)[0]):
            return
        data = os.read(self.fd, 1 << 16)
        if not data:
            self.eof = True
            data = b"\n"  # a last line without its newline still counts
        lines = (self._buf + data).split(b"\n")
        self._buf = lines.pop()
        for line in lines:
            if line.strip():
                self.items.append(_decode_request(line))


def _decode_request(line: bytes):
    try:
        return ("req", json.loads(line.decode("utf-8")))
    except ValueError as e:  # includes UnicodeDecodeError
        return ("bad", {"id": None, "ok": False,
                        "error": _one_line("malformed request: %s" % e)})


def _encode_response(response: dict) -> bytes:
    try:
        data = json.dumps(response, allow_nan=False)
    except (TypeError, ValueError) as e:
        req_id = response.get("id")
        data = json.dumps({
            "id": req_id if isinstance(req_id, (str, int, float, type(None))) else None,
            "ok": False, "error": _one_line("unencodable response: %s" % e)})
    return data.encode("utf-8") + b"\n"


def serve(agent: Agent, infile, outfile) -> None:
    """Answer JSON-line requests from ``infile`` (binary) on ``outfile`` (binary) until EOF.

    With a real file descriptor to read from, run requests are pipelined (``Agent.serve_fd``);
    otherwise one request is read, answered, then the next."""
    try:
        fd = infile.fileno()
    except (AttributeError, OSError, ValueError):
        fd = None

    def emit(response):
        outfile.write(_encode_response(response))
        outfile.flush()

    if fd is not None:  # nothing may have been read through ``infile`` yet
        agent.serve_fd(fd, emit)
        return
    while not agent.closed:
        line = infile.readline()
        if not line:
            break
        if not line.strip():
            continue
        kind, value = _decode_request(line)
        emit(agent.handle(value) if kind == "req" else value)


def hold_slot_lock(path: str, wait: float):
    """Take the lock of a worker slot for this process's life, or exit with status 75.

    A kernel ``flock``: it dies with the process, so a master that crashed leaves nothing
    behind that blocks the next one (its agent exits on EOF once the connection is gone; a
    run in progress finishes first, hence ``wait``).  Two live masters never share a slot.
    """
    import fcntl
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                try:
                    holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
                except OSError:
                    holder = ""
                sys.stderr.write("agent: slot lock %s is held by another live agent%s\n"
                                 % (path, " (%s)" % holder if holder else ""))
                sys.exit(75)
            time.sleep(0.2)
    os.ftruncate(fd, 0)
    os.pwrite(fd, ("pid %d since %s\n" % (os.getpid(), time.strftime("%Y-%m-%dT%H:%M:%S"))
                   ).encode(), 0)
    return fd


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", required=True, help="directory of binaries named by sha256")
    parser.add_argument("--worker-class", default=None, help="label reported by hello")
    parser.add_argument("--spawn", choices=("auto", "forkserver", "gated", "direct"),
                        default="auto",
                        help="how binaries are started (default: through the fork server if "
                             "possible, else gated through sh, else direct)")
    parser.add_argument("--lock", default=None,
                        help="lock file of this worker slot, held while the agent lives")
    parser.add_argument("--lock-wait", type=float, default=30.0,
                        help="seconds to wait for a slot lock held by an exiting agent")
    opts = parser.parse_args(argv)
    if opts.lock:
        hold_slot_lock(opts.lock, opts.lock_wait)

    # The protocol gets a private copy of stdout; fd 1 then points at stderr, so nothing a
    # library (or a bug) prints can corrupt the response stream.
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def on_term(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)

    agent = Agent(opts.cache_dir, worker_class=opts.worker_class, spawn=opts.spawn)
    try:
        serve(agent, sys.stdin.buffer, proto_out)
    except BrokenPipeError:
        pass
    finally:
        agent.close()
        try:
            proto_out.close()
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
