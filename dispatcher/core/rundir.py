"""Rundirs: everything needed to inspect or continue one experiment, on disk.

    <rundir>/experiment.json    what was asked (records.Experiment)
    <rundir>/config.yaml        the config used (resolved)
    <rundir>/journal.jsonl      append-only, fsynced, one event per line (records.Event)
    <rundir>/state.json         the search state after the last step (records.SearchState)
    <rundir>/profile.json       where the baseline spent its time (records.HotFunctions), when
                                the search focuses on hot code; written before ``baseline``
    <rundir>/steps/<nnnnn>/c<k>/  per candidate: overrides.sexp (the proposal), the compiler's
                                *.decisions.sexp (what it really did), measurements.json
    <rundir>/proposals/<nnnnn>.sexp  an asynchronous search's proposal, written before its
                                ``propose`` event (records.ProposeEvent)
    <rundir>/plot.png           energy against step (written by analysis.plots)
    <rundir>/master.lock        flock'ed by the master working on it; holds its pid

The journal is the truth: each ``step`` event carries the search state after that step, so
``--resume`` continues from the last complete line and a crash loses only the step in flight.
The records themselves, and their versions, are ``dispatcher.core.records``; this module is the
directory and its files.

Lifecycle (docs/rundir-format.md, "Lifecycle"): a rundir is made whole (experiment, config,
``start`` event, lock) in a staging sibling ``.<name>.<random>.creating`` (born locked: made
as ``.new``, locked, then renamed) and renamed into place, so a kill inside creation leaves no
half rundir (a later creation in the same directory sweeps the dead staging dir); the caller
then lists it in the batch log.  Whoever writes a rundir holds its lock (``flock`` on
``master.lock``) for its life: a second master is refused with one line naming the holder's
pid, and the kernel drops the lock of a killed one.

Test hook: ``$INLINING_TEST_KILL_AFTER`` (``kind:n[,kind:n...]``, e.g. ``step:2,remeasure:1``)
makes this process SIGKILL itself right after journaling its n-th event of that kind; the kill
test (tests/test_kill.py) uses it to stop a master in each crash window.  Unset: no effect.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from dispatcher.core.comparison import Comparison
from dispatcher.core.decisions import Override, read_overrides
from dispatcher.core.files import (
    append_json_line,
    append_json_lines,
    current_umask,
    json_text,
    records_json,
    write_json_atomic,
    write_text_atomic,
)
from dispatcher.core.lazy import cached
from dispatcher.core.records import (
    PROPOSALS_DIR,
    BaselineEvent,
    BatchEntry,
    Event,
    Experiment,
    FinishEvent,
    HotFunctions,
    ProposeEvent,
    RecordError,
    RunResult,
    SearchState,
    StartEvent,
    StepEvent,
    candidate_dir,
    event_from_json,
    read_experiment,
    read_results,
    results_to_json,
)
from dispatcher.core.site_records import (
    SitesExperiment,
    SitesStartEvent,
    read_sites_experiment,
    sites_event_from_json,
)

JOURNAL = "journal.jsonl"
EXPERIMENT = "experiment.json"
MEASUREMENTS = "measurements.json"
PROFILE = "profile.json"
LOCK = "master.lock"
STAGING_SUFFIX = ".creating"  # a rundir being created: .<name>.<random>.creating, locked
NEW_SUFFIX = ".new"  # the same before its creator holds its lock (an instant)
STAGING_GRACE_S = 600  # a .new dir is swept only once this old

KILL_HOOK_ENV = "INLINING_TEST_KILL_AFTER"


class RundirError(RuntimeError):
    """A rundir or batch log that cannot be used; the message is one line naming the file."""


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


class _KillHook:
    """The test hook of the module docstring: SIGKILL after the n-th event of a kind."""

    def __init__(self, spec: str):
        self.targets: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            kind, _, n = part.partition(":")
            self.targets[kind] = int(n or 1)
        self.seen: dict[str, int] = {}
        self.lock = threading.Lock()

    def appended(self, kind: str) -> None:
        if kind not in self.targets:
            return
        with self.lock:
            self.seen[kind] = self.seen.get(kind, 0) + 1
            if self.seen[kind] == self.targets[kind]:
                os.kill(os.getpid(), signal.SIGKILL)


_kill_hook = _KillHook(os.environ[KILL_HOOK_ENV]) if os.environ.get(KILL_HOOK_ENV) else None


E = TypeVar("E")
R = TypeVar("R", bound="Rundir")


def _torn(tail: bytes) -> bool:
    """Whether an unterminated last line can be what an interrupted append left: the start
    of one of our lines (each a JSON object with string keys), or the zeros of a block the
    machine stopped before writing."""
    return b'{"'.startswith(tail.lstrip()[:2]) or not tail.strip(b"\0")


def read_json_lines(path: Path, what: str = "journal line") -> list[dict]:
    """Every complete JSON line of a journal or batch log; a torn last line (a crash
    mid-write: no newline after it, as each line is written with its newline in one write,
    and the start of a line) is ignored; any other line that is not JSON is a RundirError
    naming file and line, the only line of a file included."""
    try:
        lines = path.read_bytes().split(b"\n")
    except FileNotFoundError:
        return []
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1 and _torn(line):
                break  # the torn tail of an interrupted write
            raise RundirError(f"{path}:{i + 1}: corrupt {what}") from None
    return out


def read_journal(path: Path, parse: Callable[[Any, str], Any] = event_from_json) -> list[Any]:
    """The journal's events, typed (``parse``: a search's by default); RundirError (one
    line, file:line) for a bad one."""
    events = []
    for i, data in enumerate(read_json_lines(path)):
        try:
            events.append(parse(data, f"{path}: event {i + 1}"))
        except RecordError as exc:
            raise RundirError(str(exc)) from None
    return events


class JournalReader:
    """A journal's events read incrementally: the lines already read are kept (with the
    offset past them) and only the bytes appended since are read, so a master that asks for
    its journal every few steps (a re-measurement's pooling, a retest's labels) reads it in
    time linear in its length, not quadratic.  What ``read_journal`` gives, line for line:
    a torn last line is left out (and read again next time, once whole), a corrupt one is the
    same RundirError; a journal replaced, shorter than what was read or whose last line read
    is not there any more (a rewrite) is read again whole.  Journals are append-only
    (``_drop_torn_tail`` cuts only a tail not read yet)."""

    def __init__(self, path: Path, parse: Callable[[Any, str], Any] = event_from_json):
        self.path, self.parse = path, parse
        self._lock = threading.Lock()
        self._reset(None)

    def _reset(self, ident: tuple[int, int] | None) -> None:
        self._ident, self._offset, self._lines = ident, 0, 0
        self._last = b""  # the last line read, checked to be there still at the next read
        self._events: list[Any] = []

    def events(self) -> list[Any]:
        with self._lock:
            try:
                f = open(self.path, "rb")
            except FileNotFoundError:
                self._reset(None)
                return []
            with f:
                st = os.fstat(f.fileno())
                ident = (st.st_dev, st.st_ino)
                if ident != self._ident or st.st_size < self._offset:
                    self._reset(ident)
                f.seek(self._offset - len(self._last))
                data = f.read()
                if not data.startswith(self._last):  # rewritten in place: read it again
                    self._reset(ident)
                    f.seek(0)
                    data = f.read()
                data = data[len(self._last):]
            whole = data.rfind(b"\n") + 1  # the complete lines read now end there
            for line in data[:whole].split(b"\n")[:-1]:
                self._take(line, last=False)
                self._offset += len(line) + 1
                self._lines += 1
                self._last = line + b"\n"
            return self._events + self._take(data[whole:], last=True)

    def _take(self, line: bytes, last: bool) -> list[Any]:
        """The event of one line (kept unless ``last``: an unterminated tail), or none."""
        if not line.strip():
            return []
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            if last and _torn(line):
                return []  # the torn tail of an interrupted write
            raise RundirError(f"{self.path}:{self._lines + 1}: corrupt journal line") from None
        try:
            event = self.parse(data, f"{self.path}: event {len(self._events) + 1}")
        except RecordError as exc:
            raise RundirError(str(exc)) from None
        if not last:
            self._events.append(event)
        return [event]


class RundirLock:
    """``flock`` on ``<rundir>/master.lock``, held by the master writing the rundir for its
    life (the kernel drops it when that process dies, however it dies).  The file holds the
    holder's pid, for the message a second master gets."""

    def __init__(self, rundir: Path, patience_s: float = 1.0):
        """``patience_s``: how long a busy lock is tried again before giving up (a reader
        probing it, ``lock_holder``, holds it for a moment; a master, for its life)."""
        path = rundir / LOCK
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise RundirError(f"{rundir}: cannot write in it ({_why(exc)})") from None
        deadline = time.monotonic() + patience_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                busy = exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
                if busy and time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
                holder = _read_pid(fd)
                os.close(fd)
                if busy:
                    raise RundirError(f"{rundir}: in use by another master"
                                      f"{f' (pid {holder})' if holder else ''}; wait for it to "
                                      "end or stop it before resuming") from None
                raise RundirError(f"{rundir}: cannot lock {LOCK} ({_why(exc)})") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            os.close(fd)
            raise RundirError(f"{rundir}: cannot write in it ({_why(exc)})") from None
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)  # no stale pid for the next reader
            except OSError:
                pass
            os.close(self._fd)
            self._fd = None


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip())
    except (OSError, ValueError):
        return None


def lock_holder(rundir: Path) -> int | None:
    """The pid of the master holding the rundir's lock (-1: held, its pid not written yet),
    or None when no live master does."""
    try:
        fd = os.open(rundir / LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _read_pid(fd) or -1
        return None
    finally:
        os.close(fd)


def sweep_staging(directory: Path) -> list[Path]:
    """Remove the staging dirs of rundir creations whose master died -> those removed.  A
    ``.creating`` dir is born locked (it is renamed from a ``.new`` one once its creator holds
    its lock), so a free lock means a dead creator; a ``.new`` dir (a creator killed in the
    instant before it took the lock) goes once older than STAGING_GRACE_S."""
    removed: list[Path] = []
    try:
        entries = list(directory.iterdir())
    except OSError:
        return removed
    for d in entries:
        if not (d.name.startswith(".") and d.is_dir()):
            continue
        if d.name.endswith(STAGING_SUFFIX):
            try:
                lock = RundirLock(d, patience_s=0)
            except RundirError:
                continue  # a live master is creating it
            shutil.rmtree(d, ignore_errors=True)
            lock.release()
        elif d.name.endswith(NEW_SUFFIX):
            try:
                if time.time() - d.stat().st_mtime < STAGING_GRACE_S:
                    continue
            except OSError:
                continue
            shutil.rmtree(d, ignore_errors=True)
        else:
            continue
        removed.append(d)
    return removed


# What a plot.png write killed midway leaves beside it (analysis.plots writes it atomically).
PLOT_TEMPORARIES = ".plot.png.*"


_sealed = threading.Event()


def seal_journals() -> None:
    """A hard stop (a second Ctrl-C): from now on this process journals nothing.  What the
    work's threads would still write is what the abort does to them (their jobs failed under
    them: "scheduler stopped during the job"), not what happened to the experiment; the
    rundirs stay as a kill leaves them, and a --resume continues them.  Until
    ``unseal_journals`` (work started again in this process: a test's, say)."""
    _sealed.set()


def unseal_journals() -> None:
    _sealed.clear()


def check_rundirs_dir(directory: Path) -> None:
    """``search.rundirs`` can hold new rundirs: made if need be, and written to (a staging dir
    made and removed); RundirError otherwise, before any rundir is made."""
    if directory.exists() and not directory.is_dir():
        raise RundirError(f"{directory}: search.rundirs must be a directory, and this is not one")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):  # O_TMPFILE: never a name to leave behind
            pass
    except OSError as exc:
        raise RundirError(f"{directory}: search.rundirs: cannot create rundirs there "
                          f"({_why(exc)})") from None


def check_batch_log(path: Path) -> None:
    """``search.batch_log`` can be appended to (made, empty, if need be); RundirError
    otherwise, before any rundir is made."""
    if path.is_dir():
        raise RundirError(f"{path}: search.batch_log must be a file, and this is a directory")
    if path.parent.exists() and not path.parent.is_dir():
        raise RundirError(f"{path}: search.batch_log: cannot write ({path.parent} is not a "
                          "directory)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab"):
            pass
    except OSError as exc:
        raise RundirError(f"{path}: search.batch_log: cannot write ({_why(exc)})") from None


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Rundir:
    path: Path
    _lock: RundirLock | None = field(default=None, repr=False, compare=False)

    @property
    def journal_path(self) -> Path:
        return self.path / JOURNAL

    @cached
    def experiment(self) -> Experiment:
        """Read once: what was asked of a chain never changes while it runs, and a master
        must not stop over an edit of the file under it."""
        try:
            return read_experiment(self.path / EXPERIMENT)
        except RecordError as exc:
            raise RundirError(str(exc)) from None

    @staticmethod
    def start_event(experiment: Any) -> Any:
        return StartEvent(**experiment.model_dump())

    @classmethod
    def create(cls: type[R], path: Path, experiment: Any, config_raw: dict,
               files: dict[str, str] | None = None) -> R:
        """A new rundir, locked, made whole: experiment, config, ``files`` (name -> text:
        what it must keep a copy of, such as a labels rundir's reference tree) and
        ``start`` event are written in a staging sibling that is renamed to ``path`` only
        when complete."""
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise RundirError(f"{path}: already exists and is not empty (use --resume)")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RundirError(f"{path.parent}: cannot create rundirs there ({_why(exc)})") \
                from None
        sweep_staging(path.parent)
        try:
            new = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.",
                                        suffix=NEW_SUFFIX))
        except OSError as exc:
            raise RundirError(f"{path.parent}: cannot create rundirs there ({_why(exc)})") \
                from None
        rundir = cls(new)
        staging = new
        try:
            os.chmod(new, 0o777 & ~current_umask())  # as mkdir would make it, not 0700
            # Locked, then named for the sweep: the lock follows the inode through renames.
            rundir._lock = RundirLock(new, patience_s=0)
            named = new.with_name(new.name[:-len(NEW_SUFFIX)] + STAGING_SUFFIX)
            os.rename(new, named)
            rundir.path = staging = named
            write_json_atomic(staging / EXPERIMENT, experiment.to_json())
            write_text_atomic(staging / "config.yaml", yaml.safe_dump(config_raw, sort_keys=True))
            for name, text in (files or {}).items():
                write_text_atomic(staging / name, text)
            rundir.append(rundir.start_event(experiment))
            _fsync_dir(staging)
            os.rename(staging, path)  # onto nothing, or onto an empty directory
        except BaseException as exc:
            rundir.close()
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(exc, OSError):
                raise RundirError(f"{path}: cannot create ({_why(exc)})") from None
            raise
        rundir.path = path
        try:
            _fsync_dir(path.parent)  # the rename itself, on disk
        except OSError:
            pass  # made and complete: a later crash may lose it, nothing else
        return rundir

    @classmethod
    def open(cls: type[R], path: Path, lock: bool = True) -> R:
        """An existing rundir to continue: its experiment record is checked now; with ``lock``
        it is locked (RundirError if another master holds it, or it cannot be written) and
        its journal checked against its steps (collected data is never written over)."""
        if not (path / EXPERIMENT).is_file():
            raise RundirError(f"{path}: not a rundir (no {EXPERIMENT})")
        rundir = cls(path)
        rundir.experiment  # noqa: B018 (a bad record fails here, before anything starts)
        if lock:
            rundir.take()
        return rundir

    def take(self) -> None:
        """Lock the rundir for this master, then tidy what a killed one left (a torn journal
        line, temporary files) and check its journal against its steps."""
        if self._lock is not None:
            return
        self._lock = RundirLock(self.path)
        try:
            self._drop_torn_tail()
            self._sweep_temporaries()
            self._check_journal()
        except OSError as exc:
            self.close()
            raise RundirError(f"{self.path}: cannot write in it ({_why(exc)})") from None
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Release the lock (the process's end does too)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _sweep_temporaries(self) -> None:
        """Remove what an atomic write killed midway left (``<name><random>.tmp``, or
        ``.plot.png.<random>.png``, beside the file it was replacing): the files themselves
        are whole, old or new."""
        patterns = [f"{name}*.tmp" for name in (EXPERIMENT, "config.yaml", "state.json")]
        patterns += [f"steps/*/*/{MEASUREMENTS}*.tmp", f"{PROPOSALS_DIR}/*.tmp",
                     PLOT_TEMPORARIES]
        for pattern in patterns:
            for tmp in self.path.glob(pattern):
                tmp.unlink(missing_ok=True)

    def _check_journal(self) -> None:
        """Refuse a journal that lost what ``steps/`` holds: resuming would redo those steps
        and overwrite their data; and steps/ that lost a candidate directory the journal lists
        (``rm -rf steps/00000``): the rundir would finish without that data.  A rundir with
        neither (an old one killed while created) gets its ``start`` event."""
        try:
            on_disk = sorted(int(d.name) for d in (self.path / "steps").iterdir()
                             if d.name.isdigit())
        except FileNotFoundError:
            on_disk = []
        except OSError as exc:
            raise RundirError(f"{self.path / 'steps'}: unreadable ({_why(exc)})") from None
        events = self.events()
        if not events:
            if on_disk:
                raise RundirError(f"{self.path}: has steps (up to steps/{on_disk[-1]:05d}) but "
                                  f"no journal ({JOURNAL} missing or empty); refusing to resume "
                                  "over collected data")
            self.append(StartEvent(**self.experiment.model_dump()))
            return
        steps = [e.step for e in events if isinstance(e, StepEvent)]
        last = max(steps, default=0)
        if on_disk and on_disk[-1] > last + 1:
            raise RundirError(f"{self.journal_path}: ends at step {last} but "
                              f"steps/{on_disk[-1]:05d} exists: journal lines are lost; "
                              "refusing to resume over collected data")
        for event in events:  # and the other way round: data the journal lists is there
            listed = ([(event.dir, "the baseline's")] if isinstance(event, BaselineEvent)
                      else [(c.dir, f"step {event.step}'s") for c in event.candidates]
                      if isinstance(event, StepEvent) else [])
            for directory, whose in listed:
                if not (self.path / directory).is_dir():
                    raise RundirError(f"{self.path}: {directory} is gone ({whose} data, which "
                                      "the journal lists); refusing to resume without it "
                                      "(start a new rundir)")

    def _drop_torn_tail(self) -> None:
        """Cut a half-written last line so the next append starts on a fresh line."""
        try:
            data = self.journal_path.read_bytes()
        except FileNotFoundError:
            return
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            with open(self.journal_path, "r+b") as f:
                f.truncate(cut)
                os.fsync(f.fileno())

    def append(self, event) -> None:
        """Journal one event (stamped with the time now unless it has one); nothing once
        ``seal_journals`` was called."""
        self.append_all([event])

    def append_all(self, events: list) -> None:
        """Journal events in their order, in one write and one sync (``append_json_lines``):
        a chain journals the steps it judged together at once."""
        if _sealed.is_set() or not events:
            return
        now = time.time()
        lines = []
        for event in events:
            data = event.to_json()
            if data.get("time") is None:
                data["time"] = now
            lines.append(data)
        append_json_lines(self.journal_path, lines)
        if _kill_hook is not None:
            for data in lines:
                _kill_hook.appended(data["event"])

    @staticmethod
    def event_parser() -> Callable[[Any, str], Any]:
        """How its journal's lines are read: a search's events (a labels rundir's its own)."""
        return event_from_json

    @cached
    def _journal(self) -> JournalReader:
        return JournalReader(self.journal_path, self.event_parser())

    def events(self) -> list[Event]:
        """Its journal's events (read incrementally: ``JournalReader``)."""
        return self._journal.events()

    def events_of(self, kind: type[E]) -> Iterator[E]:
        return (e for e in self.events() if isinstance(e, kind))

    def last_step(self) -> StepEvent | None:
        steps = list(self.events_of(StepEvent))
        return steps[-1] if steps else None

    def baseline(self) -> BaselineEvent | None:
        return next(self.events_of(BaselineEvent), None)

    def finished_completed(self) -> bool:
        """Its last event is ``finish`` with reason ``completed``: nothing left to do."""
        events = self.events()
        return bool(events) and isinstance(events[-1], FinishEvent) \
            and events[-1].reason == "completed"

    def write_profile(self, hot: HotFunctions) -> None:
        write_json_atomic(self.path / PROFILE, hot.to_json())

    def profile(self) -> HotFunctions | None:
        """The baseline's profile, or None (a rundir that searched every site alike)."""
        path = self.path / PROFILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise RundirError(f"{path}: unreadable profile ({exc})") from None
        try:
            return HotFunctions.from_json(data, str(path))
        except RecordError as exc:
            raise RundirError(str(exc)) from None

    def write_proposal(self, relative: str, text: str) -> None:
        """An asynchronous proposal's overrides file (its canonical text, ``overrides_text``),
        whole before its event is journaled."""
        write_text_atomic(self.path / relative, text)

    def proposal_overrides(self, proposal: ProposeEvent) -> tuple[Override, ...]:
        """What a journaled proposal asks the compiler for (a resume compiles it again)."""
        path = self.path / proposal.overrides
        try:
            return tuple(read_overrides(path))
        except (OSError, ValueError) as exc:
            raise RundirError(f"{path}: proposal {proposal.proposal} unreadable "
                              f"({' '.join(str(exc).split())[:200]})") from None

    def write_state(self, state: SearchState) -> None:
        """A copy of the last step's state (nothing reads it back: the journal is the
        record), so not synced: a crash leaves the last one or one before it."""
        write_text_atomic(self.path / "state.json", json_text(state.to_json()), durable=False)

    def fresh_candidate_dir(self, step: int, candidate: int) -> Path:
        """The candidate's directory, empty: one left by a step in flight at a crash is
        redone cleanly."""
        d = self.path / candidate_dir(step, candidate)
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        return d

    @staticmethod
    def write_measurements(directory: Path, results: list[RunResult] | Comparison) -> Path:
        """The runs of a measurement, or of a comparison (its runs' text, serialised once
        for this file and the store's copy of the comparison)."""
        directory.mkdir(parents=True, exist_ok=True)
        if isinstance(results, Comparison):
            return write_text_atomic(directory / MEASUREMENTS, results.results_text)
        return write_text_atomic(directory / MEASUREMENTS, records_json(results_to_json(results)))

    @staticmethod
    def read_measurements(directory: Path) -> list[RunResult]:
        try:
            return read_results(directory / MEASUREMENTS)
        except RecordError as exc:
            raise RundirError(str(exc)) from None


class SitesRundir(Rundir):
    """A labels rundir (``measure-sites``): the same mechanics (a lock, an append-only
    fsynced journal, atomic writes, a whole rundir or none), with its own records
    (``dispatcher.core.site_records``) and no steps."""

    @cached
    def experiment(self) -> SitesExperiment:  # type: ignore[override]
        try:
            return read_sites_experiment(self.path / EXPERIMENT)
        except RecordError as exc:
            raise RundirError(str(exc)) from None

    @staticmethod
    def start_event(experiment: Any) -> Any:
        return SitesStartEvent(**experiment.model_dump())

    def _check_journal(self) -> None:
        if not self.events():
            self.append(self.start_event(self.experiment))

    @staticmethod
    def event_parser() -> Callable[[Any, str], Any]:
        return sites_event_from_json

    def events(self) -> list[Any]:
        return self._journal.events()


def append_batch_log(path: Path, entry: BatchEntry) -> None:
    """The batch log lists every experiment started: one JSON line each, fsynced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = entry.to_json()
    if data.get("time") is None:
        data["time"] = time.time()
    append_json_line(path, data)


def list_in_batch_log(path: Path, entry: BatchEntry, unlisted: str = "") -> None:
    """``append_batch_log`` for a rundir just made: RundirError (one line, ending with
    ``unlisted``: what becomes of the rundir) when the batch log cannot be written."""
    try:
        append_batch_log(path, entry)
    except OSError as exc:
        raise RundirError(f"{path}: cannot write ({exc.strerror or exc}){unlisted}") from None


def open_to_resume(paths: Iterable[Path], opener: Callable[[Path], R]
                   ) -> tuple[list[R], list[R]]:
    """The rundirs of a ``--resume``: (those to continue, locked by this master; those already
    finished, left as they are).  RundirError (one line) for a rundir given twice, one that
    ``opener`` refuses or one another master holds."""
    seen: set[Path] = set()
    paths = list(paths)
    for p in paths:
        if p.resolve() in seen:
            raise RundirError(f"{p}: given to --resume twice")
        seen.add(p.resolve())
    rundirs = [opener(p) for p in paths]
    finished = [r for r in rundirs if r.finished_completed()]
    rundirs = [r for r in rundirs if r not in finished]
    for r in rundirs:
        r.take()  # locked for this master's life; a second master is refused here
    return rundirs, finished


def read_batch_log(path: Path) -> list[BatchEntry]:
    entries = []
    for i, data in enumerate(read_json_lines(path, "line")):
        try:
            entries.append(BatchEntry.from_json(data, f"{path}: entry {i + 1}"))
        except RecordError as exc:
            raise RundirError(str(exc)) from None
    return entries


def resolve_listed_rundir(batch_log: Path | None, rundir: str) -> Path:
    """Where a batch log's rundir is: an absolute one as is; a relative one beside the batch
    log (the experiments' working directory), or, when nothing is there but the name exists
    from the current directory, that (a batch log copied away from its rundirs)."""
    p = Path(rundir)
    if p.is_absolute() or batch_log is None:
        return p
    beside = batch_log.parent / p
    if beside.exists() or not p.exists():
        return beside
    return p


def rundirs_of_batch_log(path: Path, kinds: Iterable[str] | None = None
                         ) -> list[tuple[BatchEntry, Path]]:
    """The one reader of a batch log's rundirs: each entry (of these algorithms, or all) with
    its rundir resolved by ``resolve_listed_rundir``, in order, once each (a rundir listed twice
    keeps its first line).  RundirError, one line naming the file, for a missing or unreadable
    batch log or an entry without a rundir."""
    if not path.is_file():
        raise RundirError(f"{path}: batch log not found")
    try:
        entries = read_batch_log(path)
    except OSError as exc:
        raise RundirError(f"{path}: cannot read the batch log: {exc.strerror}") from None
    except RundirError as exc:  # a corrupt line: say what kind of file it is in
        raise RundirError(f"{exc} (batch log)") from None
    wanted = None if kinds is None else set(kinds)
    seen: set[Path] = set()
    out = []
    for i, entry in enumerate(entries):
        if not entry.rundir:
            raise RundirError(f"{path}: entry {i + 1} has no rundir")
        rundir = resolve_listed_rundir(path, entry.rundir)
        key = rundir.resolve()
        if key in seen or (wanted is not None and entry.algorithm not in wanted):
            continue
        seen.add(key)
        out.append((entry, rundir))
    return out


def batch_log_lists(path: Path, rundir: Path) -> bool:
    """Whether the batch log has a line for ``rundir`` (a relative one is taken relative to
    the batch log's directory)."""
    target = rundir.resolve()
    return any((path.parent / e.rundir).resolve() == target for e in read_batch_log(path))
