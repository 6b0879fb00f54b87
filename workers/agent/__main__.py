"""Entry point: ``python3 agent.pyz --cache-dir DIR [--lock FILE] ...`` (or ``-m workers.agent``),
or ``python3 agent.pyz build [--cpus LIST] [--identity-cache FILE]``: one build for the
master (``build``).

Takes the slot's lock, moves the protocol onto a private copy of stdout, and serves requests
from stdin until EOF or ``shutdown``.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import IO, TYPE_CHECKING, Any

from .protocol import (
    DEFAULT_LOCK_WAIT_S,
    SLOT_LOCK_BUSY_STATUS,
    SLOT_LOCK_LINES,
    decode_request,
    encode_response,
)

if TYPE_CHECKING:
    from .service import Agent


def hold_slot_lock(path: str, wait: float) -> int:
    """Take the lock of a worker slot for this process's life, or exit with status 75
    (``protocol.SLOT_LOCK_BUSY_STATUS``, the master's sign that the slot is someone else's).

    A kernel ``flock``: it dies with the process, so a master that crashed leaves nothing
    behind that blocks the next one (its agent exits on EOF once the connection is gone; a
    run in progress finishes first, hence ``wait``).  Two live masters never share a slot.
    An agent whose own master dies while it waits (EOF on stdin) exits at once, status 0:
    it would otherwise hold up the slot's next agent, its master's resume, for ``wait``.
    """
    import fcntl
    fd, writable = _open_lock_file(path)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if _master_gone(0):
                sys.exit(0)  # nobody is waiting for this agent: leave the slot to the living
            if time.monotonic() >= deadline:
                try:
                    holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
                except OSError:
                    holder = ""
                sys.stderr.write("%s%s is held by another live agent%s\n"
                                 % (SLOT_LOCK_LINES[0], path,
                                    " (%s)" % holder if holder else ""))
                sys.exit(SLOT_LOCK_BUSY_STATUS)
            time.sleep(0.2)
    if writable:
        os.ftruncate(fd, 0)
        os.pwrite(fd, ("pid %d since %s\n" % (os.getpid(), time.strftime("%Y-%m-%dT%H:%M:%S"))
                       ).encode(), 0)
    return fd


def _master_gone(fd: int) -> bool:
    """Whether the master's end of ``fd`` (stdin) is closed: readable with nothing to read
    (EOF), or hung up.  Nothing is read: a request the master sent early stays for serve."""
    import fcntl
    import select
    import termios
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    try:
        events = poller.poll(0)
    except OSError:
        return False
    if not events:
        return False
    if events[0][1] & (select.POLLERR | select.POLLNVAL):
        return True
    try:
        waiting = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return False  # not a pipe or socket (a file, a terminal): cannot tell
    return int.from_bytes(waiting, sys.byteorder) == 0


def _open_lock_file(path: str) -> tuple[int, bool]:
    """-> (fd, writable).  A lock file may be shared by every user of a machine (the local
    backend's, in a sticky world-writable directory): it is created readable and writable by
    all, opened without O_CREAT when it exists (``fs.protected_regular`` refuses O_CREAT on
    another user's file there), and read-only if it may not be written (flock needs no more)."""
    while True:
        try:
            return os.open(path, os.O_RDWR | os.O_CLOEXEC), True
        except PermissionError:
            try:
                return os.open(path, os.O_RDONLY | os.O_CLOEXEC), False
            except PermissionError:
                sys.stderr.write("%s%s: permission denied\n" % (SLOT_LOCK_LINES[1], path))
                sys.exit(SLOT_LOCK_BUSY_STATUS)
        except FileNotFoundError:
            pass
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            continue  # another agent created it meanwhile
        try:
            os.fchmod(fd, 0o666)  # the umask may have taken some bits away
        except OSError:
            pass
        return fd, True


def serve(agent: Agent, infile: Any, outfile: IO[bytes]) -> None:
    """Answer JSON-line requests from ``infile`` (binary) on ``outfile`` (binary) until EOF.

    With a real file descriptor to read from, runs are pipelined (``Agent.serve_fd``);
    otherwise one request is read, answered, then the next."""
    try:
        fd = infile.fileno()
    except (AttributeError, OSError, ValueError):
        fd = None

    def emit(response: dict) -> None:
        outfile.write(encode_response(response))
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
        kind, value = decode_request(line)
        emit(agent.handle(value) if kind == "req" else value)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["build"]:  # a build for the master, not a slot: nothing else applies
        from . import build
        return build.main(argv[1:])
    # not before: a build's process starts once per build, and the slot's modules take
    # most of an agent's start
    from .service import SPAWN_METHODS, Agent
    parser = argparse.ArgumentParser(
        prog="agent", description="Worker agent: runs cached benchmark binaries pinned to one "
        "CPU and reports timings, speaking JSON lines on stdin/stdout.")
    parser.add_argument("--cache-dir", required=True, help="directory of binaries named by sha256")
    parser.add_argument("--worker-class", default=None, help="label reported by hello")
    parser.add_argument("--spawn", choices=SPAWN_METHODS, default="auto",
                        help="how binaries are started (default: through the fork server if "
                             "possible, else gated through sh, else direct)")
    parser.add_argument("--lock", default=None,
                        help="lock file of this worker slot, held while the agent lives")
    parser.add_argument("--lock-wait", type=float, default=DEFAULT_LOCK_WAIT_S,
                        help="seconds to wait for a slot lock held by an exiting agent")
    parser.add_argument("--background", action="store_true",
                        help="run everything at the lowest priority (nice 19): a CPU lent to "
                             "counts, whose compiles go first")
    opts = parser.parse_args(argv)
    if opts.background:  # before any thread or child: they inherit it
        os.nice(19 - os.nice(0))
    if opts.lock:
        hold_slot_lock(opts.lock, opts.lock_wait)

    # The protocol gets a private copy of stdout; fd 1 then points at stderr, so nothing a
    # library (or a bug) prints can corrupt the response stream.
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(0)  # unwinds the runner, which kills the running binary

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)

    agent = Agent(opts.cache_dir, worker_class=opts.worker_class, spawn=opts.spawn,
                  own_process=True)
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
