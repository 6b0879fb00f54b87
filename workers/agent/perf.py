"""Hardware and software counters through perf_event_open(2), as ``perf stat`` counts them.

Counters are opened disabled, with ``inherit`` and ``enable_on_exec``, on the task that is
about to exec the binary: they count from its ``exec`` (the binary and any children it
forks) and are read after it exits.  No ``perf`` binary is needed.  Wrapping the binary in
``perf stat`` was tried and rejected: perf 6.1 loses the child's exit status (reports 0, and
zero rusage) whenever the child exits before perf reaches its ``wait4``, which happened in ~5%
of short runs pinned to perf's CPU; it also adds ~10 ms of start-up to the wall time and its
own ~20 MB to maxrss.  With kernel.perf_event_paranoid >= 2 and no privileges only user space
is counted (hello: ``perf.user_only``); events a VM does not expose are "unsupported", never
a failure.
"""
from __future__ import annotations

import os
import platform
import struct
from collections.abc import Iterable
from typing import Any, Optional

from .proc import load_libc
from .protocol import one_line

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

# What ``PerfEvents.open`` returns: (names, fds, grouped) per read; a None fd: not opened.
Opened = list[tuple[tuple[str, ...], tuple[Optional[int], ...], bool]]


class PerfEvents:
    """Counting with perf_event_open(2), as ``perf stat -e ... -- cmd`` does.

    ``open(pid, names)`` opens disabled counters with ``inherit`` and ``enable_on_exec`` on
    task ``pid`` (0: the calling thread): they start counting when that task (or a child
    it forks afterwards) execs, and children's counts are added in when they exit.
    """

    def __init__(self) -> None:
        self.exclude_kernel = False
        self._nr = _PERF_EVENT_OPEN_NR.get(platform.machine())
        self._ctypes, self._libc = load_libc()
        self._attrs: dict[tuple[str, bool, int], Any] = {}
        self.reason: str | None = None
        if self._nr is None:
            self.reason = "unknown perf_event_open syscall number for %s" % platform.machine()
        elif self._ctypes is None:
            self.reason = str(self._libc)
        else:
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
        return int(fd) if fd >= 0 else -int(ctypes.get_errno())

    def open_raw(self, pid: int, attr: bytes) -> int:
        """perf_event_open(2) of a packed ``attr`` on task ``pid``, any CPU -> fd, or -errno
        (-ENOSYS where the syscall is unknown here)."""
        if self.reason is not None:
            return -38
        ctypes = self._ctypes
        buf = ctypes.create_string_buffer(attr, len(attr))
        fd = self._libc.syscall(self._c_nr, buf, ctypes.c_long(pid), self._c_any_cpu,
                                ctypes.c_long(-1), self._c_flags)
        return int(fd) if fd >= 0 else -int(ctypes.get_errno())

    def probe(self, names: Iterable[str]) -> dict:
        """-> {"available", "events": {name: "supported"|"unsupported"}, ...}."""
        names = list(names)
        events: dict[str, str] = {}
        info: dict[str, Any] = {"available": False, "events": events, "method": "perf_event_open"}
        if self.reason is not None:
            info["events"] = {name: "unsupported" for name in names}
            info["reason"] = self.reason
            return info
        errors = set()
        exclude_kernel = False
        for exclude_kernel in (False, True):
            events = info["events"] = {}
            denied = False
            for name in names:
                if name not in PERF_EVENT_CODES:
                    events[name] = "unsupported"
                    errors.add("unknown event %s" % name)
                    continue
                fd = self._open(0, name, exclude_kernel)
                if fd >= 0:
                    os.close(fd)
                    events[name] = "supported"
                else:
                    events[name] = "unsupported"
                    errors.add(os.strerror(-fd))
                    denied = denied or -fd in (1, 13)  # EPERM, EACCES: perf_event_paranoid
            if not denied:
                break
        info["available"] = any(s == "supported" for s in events.values())
        # perf_event_paranoid >= 2 lets unprivileged users count user space only.
        self.exclude_kernel = exclude_kernel and info["available"]
        info["user_only"] = self.exclude_kernel
        if not info["available"]:
            info["reason"] = one_line("perf_event_open: " + "; ".join(sorted(errors)))
        return info

    def open(self, pid: int, names: Iterable[str]) -> Opened:
        """-> a list of ``(names, fds, grouped)`` (fds: None for an event that could not be
        opened; a group is read through its leader, the first); read with
        ``read_and_close``.

        Software events (never multiplexed) are opened as one group, read with one
        ``read``; hardware events each on their own, so that more of them than the PMU has
        counters are multiplexed and scaled as ``perf stat`` does, never left uncounted.
        A software event the group refuses is opened on its own."""
        out: Opened = []
        group: list[tuple[str, int]] = []  # the software group; the first is the leader
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
        if group:  # a member stays in the group while its fd is open
            group_names, group_fds = zip(*group)
            out.append((group_names, group_fds, True))
        return out

    @staticmethod
    def _entry(name: str, value: int, enabled: int, running: int) -> dict:
        if running == 0:
            return {"not_counted": True}
        scaled = float(value) * enabled / running if running < enabled else float(value)
        entry: dict[str, Any]
        if name in _CLOCK_EVENTS:
            entry = {"value": scaled / 1e6, "unit": "msec"}
        else:
            entry = {"value": scaled, "unit": ""}
        if running < enabled:  # multiplexed: scaled the way perf stat does
            entry["running_pct"] = round(100.0 * running / enabled, 2)
        return entry

    @staticmethod
    def read_and_close(opened: Opened) -> dict:
        out: dict[str, dict] = {}
        for names, fds, grouped in opened:
            size = 8 * (3 + len(names)) if grouped else 24
            data = b""
            try:
                leader = fds[0]
                if leader is not None:
                    data = os.read(leader, size)
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
