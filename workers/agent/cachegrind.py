"""The exact metric: a run under Valgrind's cachegrind, counting what the binary executes.

Cachegrind counts every instruction and simulates the caches and the branch predictor, so its
counts depend on the binary, its arguments and environment, not on the machine's load or
speed.  Three things keep them the same on every worker:

- the simulated cache geometry is fixed (``GEOMETRY``), never the host's (cachegrind would
  otherwise size its last-level cache after the host's L3);
- the binary runs in a fixed environment (``exact_env``): the variables a timed run inherits
  from the agent (its user, host name, working directory) change how much the C runtime's
  start-up executes, by tens of instructions;
- address-space randomisation is off, as for every run.

The counters are cachegrind's own names (``EVENTS``: I refs and I1/LL instruction misses,
data reads and writes with their misses, conditional and indirect branches with their
mispredictions); combining them into estimated cycles is the master's business
(``dispatcher.core.cycles``), so a record keeps every raw count.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

from .protocol import one_line

#: Cachegrind's events, in the order of its ``events:`` line with cache and branch simulation.
EVENTS = ("Ir", "I1mr", "ILmr", "Dr", "D1mr", "DLmr", "Dw", "D1mw", "DLmw",
          "Bc", "Bcm", "Bi", "Bim")
#: The simulated caches (size in bytes, associativity, line size): a common x86-64 core's L1s
#: and an 8 MiB last level.  Part of a measurement's identity: changing it changes every count.
GEOMETRY = {"I1": (32768, 8, 64), "D1": (32768, 8, 64), "LL": (8388608, 16, 64)}
#: The environment of an exact run, besides the request's own variables.
BASE_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}

_VERSION = re.compile(r"valgrind-(\d+\.\d+(?:\.\d+)?)")


def identity() -> str:
    """What an exact count depends on besides binary, arguments and environment: the tool
    and its cache geometry (the master keys stored measurements by it)."""
    geometry = ",".join(f"{k}={s}:{a}:{b}" for k, (s, a, b) in sorted(GEOMETRY.items()))
    return f"cachegrind[{geometry}]"


def probe() -> dict:
    """Whether this machine can run exact measurements: {"available", "version", "reason"}."""
    path = shutil.which("valgrind")
    if path is None:
        return {"available": False, "version": None,
                "reason": "valgrind is not installed (Debian package valgrind)"}
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return {"available": False, "version": None,
                "reason": one_line("valgrind --version failed: %s" % e)}
    m = _VERSION.search(out.stdout)
    if out.returncode != 0 or m is None:
        return {"available": False, "version": None,
                "reason": one_line("valgrind --version said: %r" % out.stdout[:80])}
    return {"available": True, "version": m.group(1), "path": path, "reason": None}


def _files(scratch: str, pid: int | str) -> tuple[str, str]:
    """The run's counts file and valgrind's own log (valgrind replaces %p by the pid)."""
    return (os.path.join(scratch, "cachegrind.%s" % pid),
            os.path.join(scratch, "valgrind.%s" % pid))


def wrap(valgrind: str, argv: list[str], scratch: str) -> list[str]:
    """``argv`` run under cachegrind with the fixed geometry; valgrind's own messages go to a
    log file of their own, so the binary's stderr (its GC report) is its own."""
    geometry = [f"--{k}={s},{a},{b}" for k, (s, a, b) in GEOMETRY.items()]
    counts, log = _files(scratch, "%p")
    return [valgrind, "--tool=cachegrind", "--cache-sim=yes", "--branch-sim=yes", *geometry,
            f"--cachegrind-out-file={counts}", f"--log-file={log}", "--", *argv]


def exact_env(request_env: dict[str, str], gc_env: dict[str, str]) -> dict[str, str]:
    """The fixed environment of an exact run: ``BASE_ENV``, the request's variables, and the
    GC report's (``gc_env``: what ``with_gc_report`` set)."""
    env = dict(BASE_ENV)
    env.update(request_env)
    env.update(gc_env)
    return env


def parse_counts(text: str) -> dict[str, int]:
    """The ``summary:`` totals of a cachegrind output, by event name; ValueError (one line)
    for an output without both lines or with other events."""
    events = summary = None
    for line in text.splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("summary:"):
            summary = line.split()[1:]
    if events is None or summary is None:
        raise ValueError("no events/summary lines in cachegrind's output")
    if tuple(events) != EVENTS or len(summary) != len(events):
        raise ValueError(one_line("cachegrind counted %s, expected %s"
                                  % (" ".join(events), " ".join(EVENTS))))
    try:
        return {e: int(v) for e, v in zip(events, summary)}
    except ValueError:
        raise ValueError(one_line("cachegrind's summary is not integers: %s"
                                  % " ".join(summary))) from None


def collect(scratch: str, pid: int | None) -> tuple[dict[str, int] | None, str | None]:
    """The counts of the run whose pid was ``pid``, and its file removed: (counts, None) or
    (None, why not)."""
    if pid is None:
        return None, "the run did not start"
    path, log = _files(scratch, pid)
    said = _last_line(log)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except FileNotFoundError:
        return None, one_line("cachegrind wrote no counts" + (": %s" % said if said else ""))
    except OSError as e:
        return None, one_line("cannot read cachegrind's counts: %s" % e)
    finally:
        for p in (path, log):
            try:
                os.unlink(p)
            except OSError:
                pass
    try:
        return parse_counts(text), None
    except ValueError as e:
        return None, str(e)


def _last_line(log: str) -> str:
    """Valgrind's last message that is not a warning about the host's caches."""
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            lines = [ln.split("--", 2)[-1].strip() for ln in f if ln.strip()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln and "cache" not in ln.split(":", 1)[-1][:40]]
    return lines[-1] if lines else ""
