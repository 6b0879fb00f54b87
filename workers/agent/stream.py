"""A run's stdout hashed as it streams, nothing of it kept: for a request whose expected
output is a sha256.  Captured in a file, stdout is capped (``proc.FILE_SIZE_LIMIT``: the
captures live in memory, on tmpfs); an output that is only hashed needs no cap, so it goes
through a FIFO at the capture's path (every spawner opens that path for the child's stdout)
and a thread off the run's CPU reads and hashes it.  RLIMIT_FSIZE does not apply to a FIFO.
"""
from __future__ import annotations

import hashlib
import os
import select
import threading

CHUNK = 1 << 20
POLL_MS = 200


class StreamedStdout:
    """The FIFO at ``path``, its reader thread and what it read: ``sha256`` and ``size``."""

    def __init__(self, path: str, run_cpu: int):
        os.mkfifo(path, 0o600)
        self.path = path
        self._read_fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        # the agent holds a write end until the child has exited: the reader sees EOF only
        # then, never before the child has opened its own
        self._hold_fd: int | None = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._hash = hashlib.sha256()
        self.size = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._eof = threading.Event()
        self._cpu = run_cpu
        self._thread = threading.Thread(target=self._read, name="agent-stdout", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            others = os.sched_getaffinity(0) - {self._cpu}
            if others:  # never on the CPU the binary is timed on
                os.sched_setaffinity(0, others)
        except OSError:
            pass
        poller = select.poll()
        poller.register(self._read_fd, select.POLLIN | select.POLLHUP)
        try:
            while not self._stop.is_set():
                if not poller.poll(POLL_MS):
                    continue
                try:
                    chunk = os.read(self._read_fd, CHUNK)
                except BlockingIOError:
                    continue
                if not chunk:
                    self._eof.set()
                    return
                self._hash.update(chunk)
                self.size += len(chunk)
        except OSError as e:
            self.error = "reading its stdout: %s" % e

    def writers_done(self) -> None:
        """The child has exited: drop the agent's write end, so EOF comes once its own (and
        those of what it left running, killed by then) are closed."""
        if self._hold_fd is not None:
            os.close(self._hold_fd)
            self._hold_fd = None

    def finish(self, patience_s: float = 10.0) -> bool:
        """Wait for EOF (at most ``patience_s``) -> whether the whole output was read."""
        self.writers_done()
        self._thread.join(patience_s)
        return self._eof.is_set() and self.error is None

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    def close(self) -> None:
        """Stop the reader and release the FIFO (idempotent)."""
        self.writers_done()
        self._stop.set()
        self._thread.join()
        if self._read_fd >= 0:
            os.close(self._read_fd)
            self._read_fd = -1
        try:
            os.unlink(self.path)
        except OSError:
            pass
