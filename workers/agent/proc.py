"""Process plumbing the spawners and the runner share: libc, process groups, affinity, limits.

Kept apart so that neither spawning nor running owns the other's helpers; nothing here knows
about requests or records.
"""
from __future__ import annotations

import math
import os
import resource
import signal
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
    """Orphans of recent runs (stray background processes, a dead fork server's children)
    become our children as we are a subreaper: their process groups are remembered (the last
    16) and reaped every 8th call, so a zombie stray waits a few runs at most.  Strays are
    rare, and a killed one may still be dying, hence not every call."""

    def __init__(self) -> None:
        self._recent: list[int] = []
        self._calls = 0

    def remember(self, pgid: int) -> None:
        if pgid not in self._recent:
            self._recent.append(pgid)
            del self._recent[:-16]
        self._calls += 1
        if self._calls % 8:
            return
        for g in self._recent:
            reap_group(g)


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
