"""The policy host: serves a ``Policy`` to ``ocamlopt -inlining-policy-channel BASE``.

The host makes the two FIFOs of the channel, ``BASE.out`` (the compiler's observations) and
``BASE.in`` (the advice), in a private temporary directory, and serves sessions one after
another in a thread until it is closed: one session per compilation unit, so one host serves a
whole build, whatever number of ``ocamlopt`` processes it runs one after the other (two at once
on one channel is not supported).  The protocol is in compiler/README.md, "Policy channel".

It always holds ``BASE.out`` open for reading, so a compiler's (non-blocking) open of it never
fails while the host lives; between sessions it opens a fresh read end before closing the old
one.  It opens ``BASE.in`` for writing when a session's header arrives (the compiler opened
its read end before writing it) and closes it at the session's ``(end)``: that close is the
compiler's acknowledgement.

A policy that raises, or a compiler that breaks the protocol, ends that session by closing
``BASE.in`` (the compiler stops with a one-line error naming the channel); the host records
the reason in ``errors``, so the caller can say what went wrong on its side.
"""
from __future__ import annotations

import errno
import os
import re
import select
import shutil
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from dispatcher.build.policies import Advice, ObservationError, Policy, parse_observation

PROTOCOL_VERSION = 1
HOST_HEADER = f"(inlining_policy_host (version {PROTOCOL_VERSION}))\n"
_COMPILER_HEADER = re.compile(
    r'^\s*\(inlining_policy_channel\s+\(version\s+(\d+)\)\s+\(unit\s+"((?:[^"\\]|\\.)*)"\)\)\s*$')
_END = re.compile(r"^\s*\(end\s+\(observations\s+(\d+)\)\)\s*$")
_MAX_LINE = 1 << 20  # an observation is a few hundred bytes; a megabyte is not one


@dataclass
class Session:
    """One compilation unit's session, as the host saw it."""

    unit: str
    observations: int = 0
    advice: Counter = field(default_factory=Counter)  # Advice value -> count
    ended: bool = False  # the compiler sent (end)
    error: str | None = None  # why the host cut it short


class PolicyHost:
    """Serve ``policy`` on a fresh channel; a context manager (``with PolicyHost(p) as h``).

    ``base`` is the channel's BASE, ``options`` the ``ocamlopt`` options that name it.
    ``sessions`` and ``errors`` say what happened (read them after ``close``)."""

    def __init__(self, policy: Policy, name: str = "policy"):
        self.policy = policy
        self._name = name
        self.directory: Path | None = None
        self.sessions: list[Session] = []
        self.errors: list[str] = []
        self._thread: threading.Thread | None = None
        self._wake_r = self._wake_w = -1
        self._out_fd = -1
        self._in_fd = -1
        self._lock = threading.Lock()

    @property
    def base(self) -> Path:
        if self.directory is None:
            raise RuntimeError("policy host not started")
        return self.directory / self._name

    @property
    def out_path(self) -> Path:
        return Path(f"{self.base}.out")

    @property
    def in_path(self) -> Path:
        return Path(f"{self.base}.in")

    @property
    def options(self) -> list[str]:
        return ["-inlining-policy-channel", str(self.base)]

    def start(self) -> PolicyHost:
        """Make the FIFOs (in a directory only this user can enter) and start serving."""
        self.directory = Path(tempfile.mkdtemp(prefix="inlining-policy-"))
        try:
            os.mkfifo(self.out_path, 0o600)
            os.mkfifo(self.in_path, 0o600)
            self._out_fd = os.open(self.out_path, os.O_RDONLY | os.O_NONBLOCK)
            self._wake_r, self._wake_w = os.pipe()
        except OSError:
            self._cleanup()
            raise
        self._thread = threading.Thread(target=self._serve, name="policy-host", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving (a session in progress is cut: its compiler stops with an error) and
        remove the FIFOs."""
        if self._thread is not None:
            os.write(self._wake_w, b"x")
            self._thread.join()
            self._thread = None
        self._cleanup()

    def __enter__(self) -> PolicyHost:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ---------------------------------------------------------------- the serving thread

    def _cleanup(self) -> None:
        for fd in (self._in_fd, self._out_fd, self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._in_fd = self._out_fd = self._wake_r = self._wake_w = -1
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _serve(self) -> None:
        try:
            self._serve_sessions()
        except Exception as exc:  # a bug here must not leave compilers waiting: no reader of
            # BASE.out any more, so the next compiler's open fails at once
            self._error(f"policy host stopped: {type(exc).__name__}: {exc}")
            self._close_in()
            if self._out_fd >= 0:
                os.close(self._out_fd)
                self._out_fd = -1

    def _serve_sessions(self) -> None:
        pending = b""
        session: Session | None = None
        # poll, not select: a master's descriptors may be numbered past select's 1024
        poller = select.poll()
        poller.register(self._out_fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._wake_r in ready:
                break
            try:
                chunk = os.read(self._out_fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                # No compiler has BASE.out open any more.  A fresh read end: the old one
                # would report end of file for ever, and the new one is there before the
                # old one goes, so a compiler's open never finds no reader.
                fresh = os.open(self.out_path, os.O_RDONLY | os.O_NONBLOCK)
                poller.unregister(self._out_fd)
                os.close(self._out_fd)
                self._out_fd = fresh
                poller.register(fresh, select.POLLIN)
                if session is not None:
                    self._end(session, "the compiler closed its end without (end)")
                    session = None
                pending = b""
                continue
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                session = self._line(session, line.decode("utf-8", errors="replace"))
            if len(pending) > _MAX_LINE:
                session = self._line(session, pending[:200].decode("utf-8", errors="replace"))
                pending = b""
        if session is not None and not session.ended:
            self._end(session, "the host was closed during the session")

    def _line(self, session: Session | None, line: str) -> Session | None:
        """Handle one line from the compiler; the session after it (None: between sessions)."""
        if session is None:
            m = _COMPILER_HEADER.match(line)
            if m is None:
                self._error(f"{self.base}.out: expected a session header "
                            f"(inlining_policy_channel (version 1) (unit \"U\")), got "
                            f"{line[:80]!r}")
                return None
            session = Session(unit=re.sub(r"\\(.)", r"\1", m.group(2)))
            self.sessions.append(session)
            try:
                self._in_fd = os.open(self.in_path, os.O_WRONLY | os.O_NONBLOCK)
                os.set_blocking(self._in_fd, True)
            except OSError as exc:  # ENXIO: the compiler is already gone
                self._end(session, f"cannot open {self.base}.in ({exc.strerror})")
                return None
            if int(m.group(1)) != PROTOCOL_VERSION:
                # Answer with our header all the same: the compiler names both versions.
                self._write(session, HOST_HEADER)
                self._end(session, f"the compiler speaks version {m.group(1)} of the protocol, "
                                   f"expected {PROTOCOL_VERSION}")
                return None
            return session if self._write(session, HOST_HEADER) else None
        if _END.match(line):
            session.ended = True
            self._close_in()
            return None
        try:
            observation = parse_observation(line)
        except ObservationError as exc:
            self._end(session, f"{self.base}.out: {exc}: {line[:80]!r}")
            return None
        try:
            advice = Advice(self.policy.decide(observation))
        except Exception as exc:  # any failure of the policy ends the session, said once
            self._end(session, f"policy {type(self.policy).__name__} failed on "
                               f"{observation.key}: {type(exc).__name__}: {exc}")
            return None
        session.observations += 1
        session.advice[advice.value] += 1
        return session if self._write(session, advice.value + "\n") else None

    def _write(self, session: Session, text: str) -> bool:
        try:
            os.write(self._in_fd, text.encode())
            return True
        except OSError as exc:
            why = "the compiler is gone" if exc.errno == errno.EPIPE else exc.strerror
            self._end(session, f"cannot write to {self.base}.in ({why})")
            return False

    def _end(self, session: Session, error: str) -> None:
        session.error = error
        self._error(f"unit {session.unit}: {error}")
        self._close_in()

    def _error(self, message: str) -> None:
        with self._lock:
            self.errors.append(message)

    def _close_in(self) -> None:
        if self._in_fd >= 0:
            os.close(self._in_fd)
            self._in_fd = -1
