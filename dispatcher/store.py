"""Content-addressed store of compiled artifacts and measurements.

Layout (every write is a temporary name, then a rename, so a crash never leaves a half entry):

    <root>/compiled/<kk>/<key>/      binary, *.decisions.sexp, overrides.sexp,
                                     compiler-output.txt, meta.json
    <root>/units/<uu>/<ukey>/        one compilation unit's .cmi/.cmx/.o/*.decisions.sexp,
                                     meta.json (file names and sha256s, compiler output)
    <root>/measurements/<bb>/<bkey>.<mkey>.json   one job's results on one worker class
    <root>/worker-cache/<sha256>     binaries handed to local agents

A compile key hashes (compiler identity, benchmark sources, flags, canonical overrides): one
whole candidate.  Beneath it, a unit key hashes (compiler identity, one unit's compile inputs as
``build_benchmark`` names them: command with flags and its own overrides' content, its source,
the .cmi/.cmx of the units before it), so candidates that differ in one unit's overrides share
the others' compiles.

A measurement key hashes everything a run's verdict and times depend on: the job's
``RunJob.measurement_identity()`` (binary sha256, arguments, environment, expected output,
timeout, perf, and every run option the job has; not the run count, not the CPU) and the worker
class.  So two decision files that give the same binary share their measurements, and a
changed expected output, environment or setting is measured afresh.  A measurement file is
named ``<binary key>.<measurement key>.json``, the binary key hashing (sha256, arguments,
worker class), so every stored measurement of one binary can be listed too.  Entries written
before keys covered the settings (``<binary key>.json``) are never read.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from dispatcher.files import sha256_file, write_json_atomic
from dispatcher.worker import RunJob, RunResult


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def compile_key(compiler_identity: str, source_hash: str, flags: tuple[str, ...],
                overrides_text: str) -> str:
    return _hash({"compiler": compiler_identity, "sources": source_hash, "flags": list(flags),
                  "overrides": overrides_text})


def unit_key(compiler_identity: str, inputs: dict) -> str:
    return _hash({"compiler": compiler_identity, "unit": inputs})


def measurement_key(job: RunJob, worker_class: str) -> str:
    """The store's key for the results of ``job`` on ``worker_class``: everything measured."""
    return _hash({"job": job.measurement_identity(), "worker_class": worker_class})


def binary_key(sha256: str, args: tuple[str, ...], worker_class: str) -> str:
    """The key of every measurement of one binary with these arguments on one class."""
    return _hash({"binary": sha256, "args": list(args), "worker_class": worker_class})


@dataclass(frozen=True)
class Artifact:
    """A compiled candidate as stored."""

    key: str
    directory: Path
    sha256: str

    @property
    def binary(self) -> Path:
        return self.directory / "binary"

    @property
    def decision_files(self) -> list[Path]:
        return sorted(self.directory.glob("*.decisions.sexp"))

    @property
    def compiler_output(self) -> str:
        return (self.directory / "compiler-output.txt").read_text()


@dataclass(frozen=True)
class UnitEntry:
    """One compiled unit as stored: ``files`` maps each file name to its sha256."""

    key: str
    directory: Path
    files: dict
    output: str

    def restore(self, outdir: Path) -> bool:
        """Copy the unit's files into ``outdir``; False (nothing usable) if one of them is not
        what was stored, e.g. cut short by a crash before it reached the disk."""
        for name, digest in self.files.items():
            try:
                data = (self.directory / name).read_bytes()
            except OSError:
                return False
            if hashlib.sha256(data).hexdigest() != digest:
                return False
            (outdir / name).write_bytes(data)
        return True


class Store:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.compiled = self.root / "compiled"
        self.measurements = self.root / "measurements"
        self.worker_cache = self.root / "worker-cache"
        self.units = self.root / "units"
        for d in (self.compiled, self.measurements, self.worker_cache, self.units):
            d.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    # -- compiled artifacts

    def _artifact_dir(self, key: str) -> Path:
        return self.compiled / key[:2] / key

    def artifact(self, key: str) -> Artifact | None:
        d = self._artifact_dir(key)
        meta = _read_meta(d)
        return None if meta is None else Artifact(key, d, meta["sha256"])

    def staging_dir(self, key: str) -> Path:
        """A private directory to build in; ``commit_artifact`` publishes it."""
        return _staging(self.compiled, key)

    def commit_artifact(self, key: str, staging: Path, meta: dict) -> Artifact:
        meta = {**meta, "sha256": sha256_file(staging / "binary")}
        write_json_atomic(staging / "meta.json", meta)
        final = self._artifact_dir(key)
        try:
            os.rename(staging, final)
        except OSError:  # an identical artifact won the race: keep it
            shutil.rmtree(staging, ignore_errors=True)
        artifact = self.artifact(key)
        assert artifact is not None
        return artifact

    # -- compiled units (beneath artifacts: a build takes its units from here)

    def _unit_dir(self, key: str) -> Path:
        return self.units / key[:2] / key

    def unit_entry(self, key: str) -> UnitEntry | None:
        d = self._unit_dir(key)
        meta = _read_meta(d)
        return None if meta is None else UnitEntry(key, d, meta["files"], meta["output"])

    def commit_unit(self, key: str, source: Path, names: list[str], output: str,
                    meta: dict | None = None) -> None:
        """Store copies of ``names`` (files in ``source``) as unit ``key``, atomically: a
        private directory, then a rename; an identical entry that won a race is kept.

        Nothing is fsynced: every file's sha256 is checked when the entry is used, so an entry
        a crash cut short is found and compiled again (``UnitEntry.restore``)."""
        staging = _staging(self.units, key)
        try:
            files = {}
            for name in names:
                shutil.copyfile(source / name, staging / name)
                files[name] = sha256_file(staging / name)
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
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def drop_unit(self, key: str) -> None:
        """Remove a damaged entry (moved aside first, so readers never see half of one)."""
        d = self._unit_dir(key)
        aside = d.parent / f".{key}.dropped.{os.getpid()}.{threading.get_ident()}"
        try:
            os.rename(d, aside)
        except OSError:
            return
        shutil.rmtree(aside, ignore_errors=True)

    # -- measurements

    def _measurement_path(self, job: RunJob, worker_class: str) -> Path:
        bkey = binary_key(job.sha256, job.args, worker_class)
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
        """Store ``result``, measured for ``job`` (on ``result.worker_class``)."""
        path = self._measurement_path(job, result.worker_class)
        with self._lock:
            existing = _read_results(path)
            write_json_atomic(path, {"job": job.measurement_identity(),
                                     "worker_class": result.worker_class,
                                     "results": [r.to_json() for r in [*existing, result]]})


def _read_results(path: Path) -> list[RunResult]:
    """The results in one measurement file; none if it is absent or unreadable."""
    try:
        return [RunResult.from_json(r) for r in json.loads(path.read_text())["results"]]
    except (OSError, ValueError, KeyError, TypeError):  # RecordError is a ValueError
        return []


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
