"""Process plumbing the spawners and the runner share: libc, process groups, affinity, limits.

Kept apart so that neither spawning nor running owns the other's helpers; nothing here knows
about requests or records.
"""
from __future__ import annotations

import math
import os
import resource
import signal
import time
from collections.abc import Iterable
from typing import Any


def load_libc() -> tuple[Any, Any]:
    """-> (ctypes module, libc), or (None, why not): ctypes is optional on odd Pythons."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        libc.prctl.restype = ctypes.c_int
        libc.personality.restype = ctypes.c_int
        libc.personality.argtypes = [ctypes.c_ulong]
        return ctypes, libc
    except (ImportError, OSError, AttributeError) as e:
        return None, "no ctypes/libc (%s)" % e


_PR_SET_CHILD_SUBREAPER = 36


def become_child_subreaper() -> str:
    """Make orphaned descendants our children (prctl), so that the agent, and only the agent,
    reaps a binary whose shell parent has exited; -> "" or why not."""
    ctypes, libc = load_libc()
    if ctypes is None:
        return str(libc)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        return "prctl(PR_SET_CHILD_SUBREAPER): %s" % os.strerror(ctypes.get_errno())
    return ""


ADDR_NO_RANDOMIZE = 0x0040000  # personality(2) flag: no address-space randomisation
_PERSONALITY_QUERY = 0xFFFFFFFF


def set_aslr(enabled: bool) -> str:
    """Address-space randomisation on or off for the calling thread and every process it
    starts from now on (``personality(2)``, inherited across fork and exec); -> "" or why
    not (the setting is then unchanged)."""
    ctypes, libc = load_libc()
    if ctypes is None:
        return str(libc)
    current = libc.personality(_PERSONALITY_QUERY)
    if current == -1:
        return "personality: %s" % os.strerror(ctypes.get_errno())
    wanted = current & ~ADDR_NO_RANDOMIZE if enabled else current | ADDR_NO_RANDOMIZE
    if wanted != current and libc.personality(wanted) == -1:
        return "personality: %s" % os.strerror(ctypes.get_errno())
    return ""


def aslr_of(pid: int) -> bool | None:
    """Whether process ``pid`` runs with address-space randomisation (its
    ``/proc/<pid>/personality``), or None if that cannot be read."""
    try:
        fd = os.open("/proc/%d/personality" % pid, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return not int(os.read(fd, 64), 16) & ADDR_NO_RANDOMIZE
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def killpg_quietly(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def reap_group(pgid: int) -> None:
    """Reap any of our zombie children in process group ``pgid`` (never blocks)."""
    while True:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


class Strays:
    """Processes a run left behind, and orphans of the agent's own helpers.

    As a child subreaper the agent inherits every orphan below it: a benchmark's background
    processes, and a daemon that escaped its process group and session (double fork and
    ``setsid``), once their parents exit.  With ``sweep`` (the agent owns its process: the
    zipapp's main), ``sweep_run`` finds the processes created during a run (their pids lie
    between two readings of the kernel's last pid, ``mark``) that hang below an unknown
    child of the agent, kills each with its descendants and reaps them -> how many were
    running.  In-process hosts (a test, a Ray actor) keep their own children: there only the
    run's process group is killed.

    A dead fork server's orphans are the agent's own: their process groups are remembered
    (the last 16) and reaped every 8th call, and a sweep kills them without counting them.
    """

    def __init__(self, sweep: bool = False) -> None:
        self._recent: list[int] = []
        self._calls = 0
        self.sweep = sweep
        self._unreaped: set[int] = set()  # killed, not reaped yet (a parent still dying)

    def remember(self, pgid: int) -> None:
        if pgid not in self._recent:
            self._recent.append(pgid)
            del self._recent[:-16]
        self._calls += 1
        if self._calls % 8:
            return
        for g in self._recent:
            reap_group(g)

    def mark(self) -> int | None:
        """The kernel's last pid now (None: unknown), where a run's process range starts."""
        return last_pid() if self.sweep else None

    def sweep_run(self, since: int | None, known: Iterable[int]) -> int:
        """Kill what a run left: every live process created after ``since`` (None: any)
        below a child of the agent that is not in ``known`` (the agent's own children: runs
        not finished, the fork server) nor in a remembered helper group.  -> the number of
        processes (not threads) that were still running."""
        known = set(known)
        me = os.getpid()
        killed: dict[int, bool] = {}  # pid -> counted (a process, not a helper's orphan)
        deadline = time.monotonic() + 2.0
        while True:
            procs = _processes(since, last_pid())
            kids: dict[int, list[int]] = {}
            for pid, (_, ppid, _) in procs.items():
                kids.setdefault(ppid, []).append(pid)
            found = []
            for root in kids.get(me, ()):
                state, _, pgid = procs[root]
                if root in known:
                    continue
                if state == "Z" and root not in killed:  # exited by itself: just reap it
                    _reap(root)
                    continue
                ours = pgid in self._recent
                stack = [root]
                while stack:
                    pid = stack.pop()
                    stack.extend(kids.get(pid, ()))
                    if pid not in killed and procs[pid][0] != "Z" and _is_leader(pid):
                        found.append((pid, not ours))
            if not found:
                break
            for pid, counted in found:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    continue
                killed[pid] = counted
            if time.monotonic() > deadline:
                break
        self._reap_all(set(killed) | self._unreaped, deadline + 1.0)
        return sum(killed.values())

    def _reap_all(self, pids: set[int], deadline: float) -> None:
        """Reap the killed processes that are (or become, once their killed parent is gone)
        our children; those still pending at ``deadline`` are tried again next time."""
        while pids:
            for pid in list(pids):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:  # not ours (yet): gone, or its parent is dying
                    done = pid if not os.path.exists("/proc/%d" % pid) else 0
                if done:
                    pids.discard(pid)
            if not pids or time.monotonic() > deadline:
                break
            time.sleep(0.0005)
        self._unreaped = pids


def last_pid() -> int | None:
    """The pid the kernel gave last in this pid namespace (None: unreadable)."""
    for path in ("/proc/sys/kernel/ns_last_pid", "/proc/loadavg"):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            return int(os.read(fd, 128).split()[-1])
        except (OSError, ValueError, IndexError):
            continue
        finally:
            os.close(fd)
    return None


_RANGE_SCAN_MAX = 4096  # more new pids than this: list /proc instead of trying each


def _processes(since: int | None, upto: int | None) -> dict[int, tuple[str, int, int]]:
    """pid -> (state, ppid, pgid) of the tasks with ids in (since, upto], or of every
    process when the range is unknown, wrapped or too wide.  Threads of a process may
    appear too (their ids come from the same counter): see ``_is_leader``."""
    if since is None or upto is None or not 0 <= upto - since <= _RANGE_SCAN_MAX:
        try:
            pids: Iterable[int] = [int(e) for e in os.listdir("/proc") if e.isdigit()]
        except OSError:
            return {}
    else:
        pids = range(since + 1, upto + 1)
    out = {}
    for pid in pids:
        st = _stat(pid)
        if st is not None:
            out[pid] = st
    return out


def _stat(pid: int) -> tuple[str, int, int] | None:
    try:
        fd = os.open("/proc/%d/stat" % pid, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 1024)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        fields = data[data.rindex(b")") + 2:].split()
        return fields[0].decode("ascii", "replace"), int(fields[1]), int(fields[2])
    except (ValueError, IndexError):
        return None


def _is_leader(pid: int) -> bool:
    """Whether ``pid`` is a process (its thread group's leader), not one of its threads."""
    try:
        with open("/proc/%d/status" % pid, "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1]) == pid
    except (OSError, ValueError, IndexError):
        pass
    return True  # gone meanwhile: killing it harms nothing


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def pidfd_open(pid: int) -> int | None:
    """A pidfd for ``pid`` (readable once it exits), or None (Python < 3.9, Linux < 5.3)."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return int(opener(pid))
    except OSError:
        return None


def cpus_allowed_list(pid: int) -> str | None:
    """``pid``'s affinity in /proc's Cpus_allowed_list format ("0", "0-3,6"), or None."""
    try:  # sched_getaffinity is ~10x cheaper than reading /proc/<pid>/status
        cpus = sorted(os.sched_getaffinity(pid))
    except OSError:
        cpus = []
    if cpus:
        ranges: list[list[int]] = []
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


def limit_cpu_time(pid: int, timeout: float) -> None:
    """RLIMIT_CPU = timeout + 2 s: a safety net for a hard-killed agent, so an orphaned
    spinner dies anyway (the binary is pinned to one CPU, so the limit never fires first)."""
    if not hasattr(resource, "prlimit"):
        return
    limit = int(math.ceil(timeout)) + 2
    try:
        resource.prlimit(pid, resource.RLIMIT_CPU, (limit, limit))
    except OSError:
        pass


# Every file a run writes, its stdout and stderr captures included, stops growing here
# (RLIMIT_FSIZE; the write past it gets SIGXFSZ): the captures live on tmpfs, in memory.
FILE_SIZE_LIMIT = 16 << 20


def limit_file_size(pid: int, limit: int = FILE_SIZE_LIMIT) -> None:
    """RLIMIT_FSIZE of ``pid`` (and of what it starts) = ``limit`` bytes (or the hard limit
    if that is lower), soft and hard: the binary cannot raise it."""
    if not hasattr(resource, "prlimit"):
        return
    try:
        _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, limit))
    except OSError:
        pass


def decode_wait_status(status: int) -> tuple[int | None, int | None]:
    """-> (exit_status or None, signal or None)."""
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), None
    return None, None


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "SIG%d" % signum
