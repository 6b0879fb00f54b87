"""Where a binary spends its time: software ``cpu-clock`` sampling through perf_event_open(2).

The search uses it to put its flips where code runs (``dispatcher.search.focus``).  A timer-driven
software event needs no hardware counters, so it works in virtual machines.  The sampler is
opened like the counters (``perf``): disabled, ``enable_on_exec``, on the task about to exec
the binary, here without ``inherit`` (the kernel refuses to map the buffer of an inherited
per-task event), so only the benchmark's own process is sampled.  Each sample carries only
its instruction pointer; ``mmap`` records say where the binary was mapped, so the pointers
become offsets in the binary's file, whatever the load address (PIE, ASLR).  The ring buffer
is read once, after the run: it holds ~16k samples (the master picks a period that makes
~2k), and the kernel counts what did not fit as lost.
"""
from __future__ import annotations

import mmap
import os
import struct
from typing import Any

from .perf import PerfEvents

# perf_event_attr bits used here (see perf.py for the others).
_DISABLED = 1 << 0
_EXCLUDE_KERNEL = 1 << 5
_EXCLUDE_HV = 1 << 6
_MMAP = 1 << 8
_ENABLE_ON_EXEC = 1 << 12
_SAMPLE_IP = 1 << 0
_ATTR = struct.Struct("=IIQQQQQIIQ")  # PERF_ATTR_SIZE_VER0
_CPU_CLOCK = (1, 0)  # PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK
# Record types in the ring buffer.
_RECORD_MMAP, _RECORD_LOST, _RECORD_SAMPLE = 1, 2, 9
_HEADER = struct.Struct("=IHH")
_DATA_HEAD = 1024  # offset of data_head in struct perf_event_mmap_page
# Data pages of the ring buffer (a power of two, as the kernel requires): 64 pages of 4 KiB
# hold ~16k samples of 16 bytes and stay within an unprivileged user's perf_event_mlock_kb
# (516 KiB by default); fewer are tried when the kernel refuses.
BUFFER_PAGES = (64, 16, 4)


class Sampler:
    """One sampling event on one task, and its ring buffer."""

    def __init__(self, perf: PerfEvents, pid: int, period_ns: int, exclude_kernel: bool):
        self.period_ns = int(period_ns)
        self.fd: int | None = None
        self.buffer: mmap.mmap | None = None
        self.error: str | None = None
        flags = _DISABLED | _ENABLE_ON_EXEC | _MMAP
        if exclude_kernel:
            flags |= _EXCLUDE_KERNEL | _EXCLUDE_HV
        attr = _ATTR.pack(_CPU_CLOCK[0], _ATTR.size, _CPU_CLOCK[1], self.period_ns,
                          _SAMPLE_IP, 0, flags, 0, 0, 0)
        fd = perf.open_raw(pid, attr)
        if fd < 0:
            self.error = "perf_event_open(cpu-clock sampling): %s" % os.strerror(-fd)
            return
        self.fd = fd
        for pages in BUFFER_PAGES:
            try:
                self.buffer = mmap.mmap(fd, (1 + pages) * mmap.PAGESIZE, mmap.MAP_SHARED,
                                        mmap.PROT_READ | mmap.PROT_WRITE)
                return
            except OSError as e:
                self.error = "mapping the sample buffer: %s" % e
        self.close()

    def read_and_close(self, binary: str) -> dict[str, Any]:
        """-> the profile of the run: ``period_ns``; ``samples`` (all of the task's);
        ``lost`` (samples the buffer could not hold); ``offsets``: {file offset in
        ``binary`` (hex): samples}; ``elsewhere``: samples outside the binary (libraries,
        vdso, kernel); or ``{"error": ...}`` when sampling was not possible."""
        if self.buffer is None:
            self.close()
            return {"error": self.error or "sampling unavailable"}
        try:
            return parse_records(self.buffer, os.path.realpath(binary), self.period_ns)
        finally:
            self.close()

    def close(self) -> None:
        if self.buffer is not None:
            self.buffer.close()
            self.buffer = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def parse_records(buffer: mmap.mmap, binary: str, period_ns: int) -> dict[str, Any]:
    """Decode the ring buffer (read once, after the task exited)."""
    page = mmap.PAGESIZE
    size = len(buffer) - page
    head = struct.unpack_from("=Q", buffer, _DATA_HEAD)[0]
    start = max(0, head - size)  # what wrapped over is gone (the kernel does not overwrite
    # unread data while data_tail stays 0, so this only guards a buffer read twice)
    maps: list[tuple[int, int, int]] = []  # (start, end, pgoff) of the binary's mappings
    ips: dict[int, int] = {}
    lost = 0
    pos = start
    while pos + _HEADER.size <= head:
        rec = _ring_bytes(buffer, page, size, pos, _HEADER.size)
        rtype, _misc, rsize = _HEADER.unpack(rec)
        if rsize < _HEADER.size or pos + rsize > head:
            break
        body = _ring_bytes(buffer, page, size, pos + _HEADER.size, rsize - _HEADER.size)
        if rtype == _RECORD_SAMPLE and len(body) >= 8:
            ip = struct.unpack_from("=Q", body)[0]
            ips[ip] = ips.get(ip, 0) + 1
        elif rtype == _RECORD_MMAP and len(body) >= 32:
            _pid, _tid, addr, length, pgoff = struct.unpack_from("=IIQQQ", body)
            name = body[32:].split(b"\0", 1)[0].decode("utf-8", "replace")
            if name == binary:
                maps.append((addr, addr + length, pgoff))
        elif rtype == _RECORD_LOST and len(body) >= 16:
            lost += struct.unpack_from("=QQ", body)[1]
        pos += rsize
    offsets: dict[str, int] = {}
    elsewhere = 0
    for ip, n in ips.items():
        for lo, hi, pgoff in maps:
            if lo <= ip < hi:
                key = "%x" % (ip - lo + pgoff)
                offsets[key] = offsets.get(key, 0) + n
                break
        else:
            elsewhere += n
    return {"period_ns": period_ns, "samples": sum(ips.values()), "lost": lost,
            "mapped": bool(maps), "offsets": offsets, "elsewhere": elsewhere}


def _ring_bytes(buffer: mmap.mmap, page: int, size: int, pos: int, n: int) -> bytes:
    """``n`` bytes at ring position ``pos`` (the data area starts after the first page and
    wraps around at ``size``)."""
    at = pos % size
    if at + n <= size:
        return buffer[page + at:page + at + n]
    return buffer[page + at:page + size] + buffer[page:page + n - (size - at)]
