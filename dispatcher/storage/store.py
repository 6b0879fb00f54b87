"""Content-addressed store of compiled artifacts and measurements.

Layout (every write is a temporary name, then a rename, so a crash never leaves a half entry):

    <root>/lock                      flock'd: shared by every open Store, exclusive by a sweep
    <root>/users/<pid>-<random>      one per open Store, flock'd by it (``others_open``)
    <root>/compiled/<kk>/<key>/      meta.json, binary, outputs.tar.gz (the decision dumps,
                                     overrides.sexp, compiler-output.txt)
    <root>/units/<uu>/<ukey>/        meta.json (file names and sha256s, compiler output),
                                     files.tar.gz (the unit's .cmi/.cmx/.o/*.decisions.sexp)
    <root>/measurements/<bb>/<bkey>.<mkey>.json   one job's results on one worker class
    <root>/comparisons/<cc>/<key>.json             paired comparisons (running.measurement)
    <root>/worker-cache/<sha256>     binaries handed to local agents
    <root>/failures/<kk>/<key>.json  candidates that failed to compile in a way that lasts
                                     (the compiler's error, a build past its budget)

A compile key hashes (compiler identity, benchmark sources, flags, canonical overrides): one
whole candidate.  Beneath it, a unit key hashes (compiler identity, one unit's compile inputs as
``build_benchmark`` names them: command with flags and its own overrides' content, its source,
the .cmi/.cmx of the units before it), so candidates that differ in one unit's overrides share
the others' compiles.

What a candidate leaves is compressed: its text outputs in one gzip'd tar, a unit's files in
another (about 6x smaller, and two files instead of a dozen, each taking a disk block).  Entries
written before that hold the same files uncompressed, side by side, and are read as they are.
The binary is the bulk (about 2 MB): it stays only while a search may still run it (the
compile service drops it when no chain holds it any more, ``CompileService.release``) or a
rundir may (``store-gc``, ``dispatcher.storage.gc``).  An entry without its binary is compiled again
when a binary is needed; the build is reproducible, so it is the same binary.

A measurement key hashes everything a run's verdict and times depend on: the job's
``RunJob.measurement_identity()`` (binary sha256, arguments, environment, expected output,
timeout, perf, and every run option the job has; not the run count, not the CPU) and the worker
class.  So two decision files that give the same binary share their measurements, and a
changed expected output, environment or setting is measured afresh.  A measurement file is
named ``<binary key>.<measurement key>.json``, the binary key hashing (sha256, arguments,
worker class), so every stored measurement of one binary can be listed too.  Entries written
before keys covered the settings (``<binary key>.json``) are never read.

Staging directories (``.<key>.*`` beside where an entry goes) of a master that was killed are
swept when a store is opened by a process that finds no other holder of ``<root>/lock`` (so no
other process can be writing one), and by ``store-gc``.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dispatcher.core.decisions import DUMP_NAME, DecisionDump, parse_dump
from dispatcher.core.files import (
    json_text_with,
    json_with,
    records_json,
    sha256_file,
    write_json_atomic,
    write_text_atomic,
)
from dispatcher.core.jobs import RunJob
from dispatcher.core.outputs import (
    COMPILER_OUTPUT,
    OUTPUTS,
    OVERRIDES,
    is_output,
    pack,
    read_outputs,
    unpack,
)
from dispatcher.core.records import RunResult

UNIT_FILES = "files.tar.gz"  # a unit entry's files
LOCK = "lock"
USERS = "users"
AREAS = ("compiled", "units", "measurements", "comparisons", "worker-cache", "failures", USERS)
_LOCK_STRIPES = 64  # locks of the measurement files (``Store.add_measurement``)


class StoreError(RuntimeError):
    """The store cannot be used or written; the message is one line naming the path."""


def store_error(exc: OSError, what: str) -> StoreError:
    """``exc`` as one line: the path it names, ``what`` was being done, and why."""
    path = exc.filename if exc.filename is not None else "?"
    reason = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC:
        reason += " (the store's file system is full)"
    elif exc.errno == errno.EROFS:
        reason += " (the store must be writable)"
    return StoreError(f"{path}: {what}: {reason}")


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def compile_key(compiler_identity: str, source_hash: str, flags: tuple[str, ...],
                overrides_text: str, policy: str | None = None,
                overrides_json: str | None = None) -> str:
    """``policy`` (a policy's identity) joins the key only when a compile has one, so the keys
    of every other compile are those they always were.  ``overrides_json``:
    ``json.dumps(overrides_text)``, when the caller has it (``decisions.overrides_json``,
    made from pieces): the same key, without escaping the whole text again."""
    identity = {"compiler": compiler_identity, "sources": source_hash, "flags": list(flags),
                "overrides": overrides_text}
    if policy is not None:
        identity["policy"] = policy
    if overrides_json is None:
        return _hash(identity)
    return hashlib.sha256(json_with(identity, "overrides", overrides_json).encode()).hexdigest()


def unit_key(compiler_identity: str, inputs: dict) -> str:
    return _hash({"compiler": compiler_identity, "unit": inputs})


def measurement_key(job: RunJob, worker_class: str) -> str:
    """The store's key for the results of ``job`` on ``worker_class``: everything measured.
    An exact job's counts are the same on every class: its key names no class (its identity
    holds the exact metric's, ``RunJob.exact_identity``); a timed job's key is what it was."""
    if job.exact:
        return _hash({"job": job.measurement_identity()})
    return _hash({"job": job.measurement_identity(), "worker_class": worker_class})


def binary_key(sha256: str, args: tuple[str, ...], worker_class: str,
               exact_identity: str | None = None) -> str:
    """The key of every measurement of one binary with these arguments on one class; with
    ``exact_identity``, of every exact one (on any class)."""
    if exact_identity is not None:
        return _hash({"binary": sha256, "args": list(args), "exact": exact_identity})
    return _hash({"binary": sha256, "args": list(args), "worker_class": worker_class})


@dataclass(frozen=True)
class Artifact:
    """A compiled candidate as stored."""

    key: str
    directory: Path
    sha256: str
    # the CPU seconds of the compiler processes the build is made of (``BuildResult.cpu_s``),
    # as recorded when it was built: a cached build keeps its compile time (None: not known)
    cpu_s: float | None = None
    # its outputs as they were packed, on the entry this master just stored: the candidate's
    # dumps are read next (its tree, its rundir), and are not unpacked again for it
    packed: Mapping[str, bytes] | None = field(default=None, compare=False, repr=False)

    @property
    def binary(self) -> Path:
        return self.directory / "binary"

    def outputs(self) -> dict[str, bytes]:
        """name -> content of its decision dumps, overrides.sexp (if any) and compiler
        output, from the packed file or (an entry of an earlier version) the plain files
        (``read_outputs``: a damaged pack is a ValueError naming it)."""
        return dict(self.packed) if self.packed is not None else read_outputs(self.directory)

    def decision_texts(self) -> dict[str, str]:
        """Dump file name -> text, sorted by name."""
        return {name: data.decode() for name, data in sorted(self.outputs().items())
                if DUMP_NAME.match(name)}

    def dumps(self) -> list[DecisionDump]:
        """Its decision dumps, sorted by (unit, round)."""
        return sorted((parse_dump(text, f"{self.directory}/{name}")
                       for name, text in self.decision_texts().items()),
                      key=lambda d: (d.unit, d.round))

    @property
    def overrides_text(self) -> str | None:
        data = self.outputs().get(OVERRIDES)
        return None if data is None else data.decode()

    @property
    def compiler_output(self) -> str:
        return self.outputs().get(COMPILER_OUTPUT, b"").decode()

    def keep_packed(self, dest: Path, outputs: Mapping[str, bytes] | None = None,
                    same_overrides: Path | None = None) -> list[Path]:
        """Copy its packed outputs, and its overrides.sexp uncompressed (a resume and a reader
        of the rundir want the proposal as text), into ``dest`` (what a search's rundir keeps
        of a candidate) -> the files written.  The copy is the store's own pack: no
        compression more (an entry of an earlier version, without one, is packed here).
        ``outputs``: its ``outputs()``, when the caller has read them already;
        ``same_overrides``: a file that may hold its overrides.sexp's very bytes (an
        asynchronous proposal's, in the same rundir): hard-linked instead of written again
        when it does and the file system has hard links."""
        outputs = self.outputs() if outputs is None else outputs
        try:
            shutil.copyfile(self.directory / OUTPUTS, dest / OUTPUTS)
        except FileNotFoundError:
            pack(dest / OUTPUTS, outputs)
        written = [dest / OUTPUTS]
        if OVERRIDES in outputs:
            data = outputs[OVERRIDES]
            if not (same_overrides is not None and _linked_same(same_overrides,
                                                                 dest / OVERRIDES, data)):
                (dest / OVERRIDES).write_bytes(data)
            written.append(dest / OVERRIDES)
        return written

    def export(self, dest: Path, outputs: dict[str, bytes] | None = None) -> list[Path]:
        """Write its decision dumps and overrides.sexp, uncompressed, into ``dest`` (what a
        labels rundir keeps of a build, and a search's rundir begun before version 6 of a
        candidate) -> the files written.  ``outputs``: its ``outputs()``,
        when the caller has read them already."""
        written = []
        for name, data in sorted((self.outputs() if outputs is None else outputs).items()):
            if name != COMPILER_OUTPUT:
                (dest / name).write_bytes(data)
                written.append(dest / name)
        return written


def _linked_same(source: Path, link: Path, data: bytes) -> bool:
    """Whether ``link`` now names the file ``source`` and it holds ``data``: made a hard link
    when ``source``'s bytes are ``data`` (False, nothing made: not the same bytes, no such
    file, or no hard links on this file system)."""
    try:
        if source.stat().st_size != len(data) or source.read_bytes() != data:
            return False
        os.link(source, link)
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class CompileFailure:
    """Why a candidate did not compile: the one-line error, the compiler's whole output, and
    when (seconds since the epoch)."""

    error: str
    output: str
    time: float

    def to_json(self) -> dict:
        return {"version": 1, "error": self.error, "output": self.output, "time": self.time}

    @classmethod
    def from_json(cls, data: dict) -> CompileFailure:
        """KeyError, TypeError or ValueError for a record that is not one."""
        return cls(str(data["error"]), str(data["output"]), float(data["time"]))


@dataclass(frozen=True)
class UnitEntry:
    """One compiled unit as stored: ``files`` maps each file name to its sha256."""

    key: str
    directory: Path
    files: dict
    output: str
    cpu_s: float | None = None  # its compile's CPU seconds (None: not recorded)

    def restore(self, outdir: Path) -> bool:
        """Copy the unit's files into ``outdir``; False (nothing usable) if one of them is not
        what was stored, e.g. cut short by a crash before it reached the disk."""
        try:
            packed = self.directory / UNIT_FILES
            if packed.exists():
                contents = unpack(packed)
            else:  # an entry of an earlier version: the files side by side
                contents = {name: (self.directory / name).read_bytes() for name in self.files}
        except (OSError, tarfile.TarError, EOFError):
            return False
        for name, digest in self.files.items():
            data = contents.get(name)
            if data is None or hashlib.sha256(data).hexdigest() != digest:
                return False
        for name in self.files:
            (outdir / name).write_bytes(contents[name])
        return True


class Store:
    # What ``close`` releases, None until taken: a Ctrl-C inside ``__init__`` leaves a Store
    # that ``__del__`` closes without an error
    _lock_fd: int | None = None
    _user: tuple[Path, int] | None = None

    def __init__(self, root: Path):
        """Open (creating it if need be) the store at ``root``: StoreError if it cannot be
        used (not a directory, not writable, a full disk).  Holds a shared lock on it until
        ``close``; sweeps killed writers' staging files first when no one else holds it."""
        self.root = Path(root)
        self.compiled = self.root / "compiled"
        self.measurements = self.root / "measurements"
        self.worker_cache = self.root / "worker-cache"
        self.units = self.root / "units"
        self.failures = self.root / "failures"
        # A measurement file is read, extended and rewritten under the lock of its stripe:
        # two results of one job never race, and results of different jobs are written (and
        # fsynced) side by side instead of one after the other.
        self._locks = tuple(threading.Lock() for _ in range(_LOCK_STRIPES))
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"{self.root}: the store must be a directory; this is not one")
        try:
            for d in (self.compiled, self.measurements, self.worker_cache, self.units):
                d.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.root / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                                    0o644)
        except OSError as exc:
            raise store_error(exc, "cannot open the store") from None
        if self.try_exclusive():
            self.sweep()
        self.share()
        try:
            (self.root / USERS).mkdir(exist_ok=True)
            fd, name = tempfile.mkstemp(dir=self.root / USERS, prefix=f"{os.getpid()}-")
        except OSError as exc:
            self.close()
            raise store_error(exc, "cannot open the store") from None
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._user = (Path(name), fd)

    # -- the store's lock

    def try_exclusive(self) -> bool:
        """Hold the store's lock alone (no other open Store anywhere), if no one else holds it."""
        assert self._lock_fd is not None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def share(self) -> None:
        """Hold the store's lock shared (waits while a sweep or a gc holds it alone)."""
        assert self._lock_fd is not None
        fcntl.flock(self._lock_fd, fcntl.LOCK_SH)

    def others_open(self) -> bool:
        """Whether another Store has this store open now (in any process; a Store of a
        process that died is forgotten here)."""
        own = self._user[0].name if self._user is not None else None
        try:
            names = os.listdir(self.root / USERS)
        except OSError:
            return True  # cannot tell: assume so
        for name in names:
            if name == own:
                continue
            path = self.root / USERS / name
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            except OSError:
                return True
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True  # held: its Store is open
            finally:
                os.close(fd)
            path.unlink(missing_ok=True)  # its process died without closing it
        return False

    def close(self) -> None:
        user, self._user = self._user, None
        if user is not None:
            user[0].unlink(missing_ok=True)
            os.close(user[1])
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def sweep(self) -> tuple[int, int]:
        """Remove what killed writers left: staging directories and entries moved aside
        (``.<key>.*``) and temporary files (``.*.tmp``, ``*.tmp``) -> (count, bytes).  Only
        with the store's lock held alone: then no one can be writing them."""
        count = size = 0
        for area in AREAS:
            base = self.root / area
            for parent in [base, *_subdirs(base)]:
                try:
                    names = os.listdir(parent)
                except OSError:
                    continue
                own = self._user[0].name if self._user is not None else None
                for name in names:
                    if name == own:
                        continue
                    if name.startswith(".") or name.endswith(".tmp") or area == USERS:
                        path = parent / name
                        size += disk_usage(path)
                        count += 1
                        if path.is_dir() and not path.is_symlink():
                            shutil.rmtree(path, ignore_errors=True)
                        else:
                            path.unlink(missing_ok=True)
        return count, size

    # -- compiled artifacts

    def _artifact_dir(self, key: str) -> Path:
        return self.compiled / key[:2] / key

    def artifact(self, key: str) -> Artifact | None:
        """The stored candidate ``key`` with its binary; None if absent, unreadable or its
        binary was dropped (compile it again)."""
        d = self._artifact_dir(key)
        meta = _read_meta(d)
        if meta is None or not (d / "binary").is_file():
            return None
        return Artifact(key, d, meta["sha256"], _seconds(meta.get("cpu_s")))

    def staging_dir(self, key: str) -> Path:
        """A private directory to build in; ``commit_artifact`` publishes it."""
        return _staging(self.compiled, key)

    def commit_artifact(self, key: str, staging: Path, outputs: dict[str, bytes],
                        meta: dict) -> Artifact:
        """Publish ``staging`` (holding the binary) as entry ``key``, with ``outputs`` (its
        decision dumps, overrides.sexp if any and compiler-output.txt, name -> content, read
        once where the build left them) packed beside it, then a rename.  An entry already
        there is kept if it is whole, replaced if its binary was dropped."""
        try:
            pack(staging / OUTPUTS, outputs)
            meta = {**meta, "sha256": sha256_file(staging / "binary")}
            write_json_atomic(staging / "meta.json", meta)
        except OSError as exc:
            raise store_error(exc, "cannot write a compiled candidate") from None
        final = self._artifact_dir(key)
        ours = False
        for attempt in range(2):
            try:
                os.rename(staging, final)
                ours = True
                break
            except OSError:
                if attempt == 0 and self.artifact(key) is None:
                    self._drop_dir(final)  # no binary (dropped) or unreadable: replace it
                    continue
                shutil.rmtree(staging, ignore_errors=True)  # an identical entry won a race
                break
        if ours:  # what it just wrote, not read back
            return Artifact(key, final, meta["sha256"], _seconds(meta.get("cpu_s")),
                            packed=outputs)
        artifact = self.artifact(key)
        if artifact is None:
            raise StoreError(f"{final}: the compiled candidate vanished as it was stored")
        return artifact

    def artifact_sha(self, key: str) -> str | None:
        """The sha256 of entry ``key``'s binary, as its meta records it (None: no entry)."""
        meta = _read_meta(self._artifact_dir(key))
        return None if meta is None else meta.get("sha256")

    def has_binary(self, key: str) -> bool:
        return (self._artifact_dir(key) / "binary").is_file()

    def repack_artifact(self, key: str) -> None:
        """Pack the plain outputs of an entry written before compression, as
        ``commit_artifact`` packs them now (a crash midway leaves both: the pack is read)."""
        d = self._artifact_dir(key)
        plain = {p.name: p for p in d.iterdir() if is_output(p.name)}
        if not plain:
            return
        if not (d / OUTPUTS).exists():
            tmp = d / f".{OUTPUTS}.tmp"
            pack(tmp, {name: p.read_bytes() for name, p in plain.items()})
            os.rename(tmp, d / OUTPUTS)
        for p in plain.values():
            p.unlink()

    def drop_binary(self, key: str, agent_copy: bool = False, sha: str | None = None) -> int:
        """Remove the binary of entry ``key`` (its outputs and measurements stay); the next
        compile of it makes it again.  ``agent_copy``: remove the local agents' copy too if
        it is a link of this very file (no agent may be about to run it); ``sha``: its
        sha256 if known (else read from its meta).  -> bytes freed (0 while another link
        keeps them)."""
        binary = self._artifact_dir(key) / "binary"
        try:
            st = binary.stat()
            copy = self.worker_cache / str(sha if sha is not None else self.artifact_sha(key))
            if agent_copy and copy.exists() and os.path.samefile(copy, binary):
                copy.unlink()
                st = binary.stat()
            binary.unlink()
        except FileNotFoundError:
            return 0
        return st.st_blocks * 512 if st.st_nlink == 1 else 0

    def drop_artifact(self, key: str) -> None:
        """Remove entry ``key`` whole (moved aside first: readers never see half of one)."""
        self._drop_dir(self._artifact_dir(key))

    def artifact_keys(self) -> list[str]:
        return [d.name for d in _entries(self.compiled)]

    # -- compiled units (beneath artifacts: a build takes its units from here)

    def _unit_dir(self, key: str) -> Path:
        return self.units / key[:2] / key

    def unit_entry(self, key: str) -> UnitEntry | None:
        d = self._unit_dir(key)
        meta = _read_meta(d)
        if meta is None:
            return None
        return UnitEntry(key, d, meta["files"], meta["output"], _seconds(meta.get("cpu_s")))

    def commit_unit(self, key: str, source: Path, names: list[str], output: str,
                    meta: dict | None = None) -> None:
        """Store ``names`` (files in ``source``) as unit ``key``, packed, atomically: a
        private directory, then a rename; an identical entry that won a race is kept.

        Nothing is fsynced: every file's sha256 is checked when the entry is used, so an entry
        a crash cut short is found and compiled again (``UnitEntry.restore``)."""
        try:
            staging = _staging(self.units, key)
        except OSError as exc:
            raise store_error(exc, "cannot store a compiled unit") from None
        try:
            contents = {name: (source / name).read_bytes() for name in names}
            pack(staging / UNIT_FILES, contents)
            files = {name: hashlib.sha256(data).hexdigest() for name, data in contents.items()}
            (staging / "meta.json").write_text(json.dumps(
                {**(meta or {}), "files": files, "output": output}, indent=1, sort_keys=True))
            for attempt in range(2):
                try:
                    os.rename(staging, self._unit_dir(key))
                    return
                except OSError:
                    if attempt == 0 and self.unit_entry(key) is None:
                        self.drop_unit(key)  # unreadable, e.g. after a crash: replace it
                        continue
                    break  # an identical entry won the race: keep it
        except OSError as exc:
            raise store_error(exc, "cannot store a compiled unit") from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def drop_unit(self, key: str) -> None:
        """Remove a damaged entry (moved aside first, so readers never see half of one)."""
        self._drop_dir(self._unit_dir(key))

    def repack_unit(self, key: str) -> None:
        """Pack the plain files of a unit entry written before compression."""
        entry = self.unit_entry(key)
        if entry is None or not entry.files or not all(
                (entry.directory / name).exists() for name in entry.files):
            return
        if not (entry.directory / UNIT_FILES).exists():
            tmp = entry.directory / f".{UNIT_FILES}.tmp"
            pack(tmp, {name: (entry.directory / name).read_bytes() for name in entry.files})
            os.rename(tmp, entry.directory / UNIT_FILES)
        for name in entry.files:
            (entry.directory / name).unlink()

    def unit_keys(self) -> list[str]:
        return [d.name for d in _entries(self.units)]

    def _drop_dir(self, d: Path) -> None:
        aside = d.parent / f".{d.name}.dropped.{os.getpid()}.{threading.get_ident()}"
        try:
            os.rename(d, aside)
        except OSError:
            return
        shutil.rmtree(aside, ignore_errors=True)

    # -- compiles that failed

    def _failure_path(self, key: str) -> Path:
        return self.failures / key[:2] / f"{key}.json"

    def remember_failure(self, key: str, failure: CompileFailure) -> None:
        """Keep why candidate ``key`` did not compile, so the same inputs are not compiled
        again to fail again (a build past its budget costs the whole budget each time).
        Best effort: a failure that cannot be written is compiled again next time."""
        try:
            write_json_atomic(self._failure_path(key), failure.to_json())
        except OSError:
            pass

    def failure(self, key: str) -> CompileFailure | None:
        try:
            return CompileFailure.from_json(
                json.loads(self._failure_path(key).read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError):
            return None  # none, or unreadable: compiled again

    def failure_keys(self) -> list[str]:
        return [p.stem for fan in _subdirs(self.failures) for p in fan.glob("*.json")]

    def drop_failure(self, key: str) -> None:
        self._failure_path(key).unlink(missing_ok=True)

    # -- measurements

    def _measurement_path(self, job: RunJob, worker_class: str) -> Path:
        bkey = binary_key(job.sha256, job.args, worker_class,
                          job.exact_identity if job.exact else None)
        return self.measurements / bkey[:2] / f"{bkey}.{measurement_key(job, worker_class)}.json"

    def job_measurements(self, job: RunJob, worker_class: str) -> list[RunResult]:
        """The stored results of exactly this job (any run count) on ``worker_class``, oldest
        first."""
        return _read_results(self._measurement_path(job, worker_class))

    def measurements_for(self, sha256: str, args: tuple[str, ...],
                         worker_class: str) -> list[RunResult]:
        """Every stored result of this binary with these arguments on ``worker_class``,
        whatever the expected output, environment or settings it was measured with; for a
        verdict use ``job_measurements``."""
        bkey = binary_key(sha256, args, worker_class)
        return [r for path in sorted((self.measurements / bkey[:2]).glob(f"{bkey}.*.json"))
                for r in _read_results(path)]

    def add_measurement(self, result: RunResult, job: RunJob) -> None:
        """Store ``result``, measured for ``job`` (on ``result.worker_class``); StoreError
        (one line) if it cannot be written."""
        path = self._measurement_path(job, result.worker_class)
        with self._locks[hash(path.name) % _LOCK_STRIPES]:
            existing = _read_results(path)
            try:
                write_text_atomic(path, json_text_with(
                    {"job": job.measurement_identity(), "worker_class": result.worker_class},
                    "results", records_json([r.to_json() for r in [*existing, result]])))
            except OSError as exc:
                raise store_error(exc, "cannot store a measurement") from None


def disk_usage(path: Path) -> int:
    """Bytes ``path`` takes on disk (allocated blocks, as ``du`` counts them: a file with
    several links once), a directory with all it holds."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    seen = {(st.st_dev, st.st_ino)}
    total = st.st_blocks * 512
    if os.path.isdir(path) and not os.path.islink(path):
        for dirpath, dirnames, filenames in os.walk(path):
            for name in dirnames + filenames:
                try:
                    st = os.lstat(os.path.join(dirpath, name))
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
    return total


def _subdirs(base: Path) -> list[Path]:
    try:
        return [p for p in base.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []


def _entries(base: Path) -> list[Path]:
    """The entry directories of an area laid out as <kk>/<key>/."""
    return [e for fan in _subdirs(base) for e in _subdirs(fan)]


def _read_results(path: Path) -> list[RunResult]:
    """The results in one measurement file; none if it is absent or unreadable."""
    try:
        return [RunResult.from_json(r) for r in json.loads(path.read_text())["results"]]
    except (OSError, ValueError, KeyError, TypeError):  # RecordError is a ValueError
        return []


def _seconds(value: object) -> float | None:
    """A recorded number of seconds, or None (absent, or not a finite number from 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0 <= value < float("inf") else None


def _read_meta(entry: Path) -> dict | None:
    """An entry's meta.json; None if the entry is absent or unreadable."""
    try:
        return json.loads((entry / "meta.json").read_text())
    except (OSError, ValueError):
        return None


def _staging(root: Path, key: str) -> Path:
    """A private directory beside where entry ``key`` of ``root`` goes, renamed into place."""
    parent = root / key[:2]
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=parent, prefix=f".{key}."))
