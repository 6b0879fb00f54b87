"""The compile service: (benchmark, flags, overrides) -> binary + decision dumps, cached.

Compiles run in a thread pool (each is an ``ocamlopt`` subprocess).  Results land in the store
under a key of (compiler identity, benchmark source hash, flags, canonical overrides text), so a
repeated compile is a cache hit and two identical jobs in flight compile once.

Beneath that, compiles are incremental by compilation unit: each unit gets only its own
overrides entries (the compiler ignores the others) and its ``ocamlopt -c`` is cached in the
store under its inputs, which include the .cmi/.cmx of the units compiled before it
(``build_benchmark`` with a ``UnitCache``).  A candidate that flips decisions in one unit
compiles that unit, and the later ones only if its .cmi/.cmx changed; the link always runs.
The binary and dumps are byte-identical to a whole build (tested).  Two compiles needing the
same unit at once compile it once.
"""
from __future__ import annotations

import os
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from dispatcher.benchmark import Benchmark, BuildError, build_benchmark
from dispatcher.compiler import Compiler
from dispatcher.decisions import Override, overrides_text
from dispatcher.store import Artifact, Store, compile_key, unit_key


@dataclass(frozen=True)
class CompileJob:
    benchmark: Benchmark
    overrides: tuple[Override, ...] = ()
    flags: tuple[str, ...] | None = None  # None: the manifest's flags

    @property
    def effective_flags(self) -> tuple[str, ...]:
        return tuple(self.benchmark.flags if self.flags is None else self.flags)


@dataclass(frozen=True)
class CompileResult:
    artifact: Artifact
    cached: bool
    seconds: float
    units_compiled: int = 0  # by this compile (0 on a whole-candidate cache hit)
    units_reused: int = 0  # taken from the unit cache

    @property
    def binary(self) -> Path:
        return self.artifact.binary

    @property
    def sha256(self) -> str:
        return self.artifact.sha256


class CompileError(RuntimeError):
    """A candidate that does not compile; ``output`` holds the compiler's full output."""

    def __init__(self, message: str, output: str):
        super().__init__(message)
        self.output = output


class StoreUnitCache:
    """``build_benchmark``'s unit cache, in the store: one entry per unit key.

    Threads of one process needing the same unit wait for the one compiling it; processes
    sharing a store may both compile it, and the first rename wins (identical content).
    ``hits`` and ``misses`` count units served and compiled."""

    def __init__(self, store: Store, compiler_identity: str):
        self.store = store
        self.identity = compiler_identity
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()
        self._inflight: dict[str, threading.Event] = {}
        self.stopped = threading.Event()  # set: no further unit is compiled (Ctrl-C)

    def unit(self, inputs: dict, outdir: Path, compile):
        key = unit_key(self.identity, inputs)
        while True:
            entry = self.store.unit_entry(key)
            if entry is not None:
                if entry.restore(outdir):
                    with self._lock:
                        self.hits += 1
                    return list(entry.files), entry.output, True
                self.store.drop_unit(key)  # damaged: compile it again
            with self._lock:
                done = self._inflight.get(key)
                if done is None:
                    done = self._inflight[key] = threading.Event()
                    break
            done.wait()  # then look again; if that compile failed, this one tries itself
        try:
            if self.stopped.is_set():  # a build in flight at Ctrl-C ends at its next unit
                raise CompileError("compile service stopped", "")
            names, output = compile()
            self.store.commit_unit(key, outdir, names, output,
                                   {"source": inputs.get("command", [""])[-1]})
            with self._lock:
                self.misses += 1
            return names, output, False
        finally:
            with self._lock:
                del self._inflight[key]
            done.set()


class CompileService:
    def __init__(self, store: Store, compiler: Compiler, jobs: int = 1,
                 cpus: frozenset[int] | None = None):
        """``cpus``: where compiles may run.  On the local backend these are the CPUs not
        given to worker slots: a compile on a worker's CPU would disturb its timings."""
        self.store = store
        self.compiler = compiler
        self._pool = ThreadPoolExecutor(
            max_workers=jobs, thread_name_prefix="compile",
            # Linux pins only the calling thread, and ocamlopt inherits that thread's mask.
            initializer=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        self._inflight: dict[str, Future] = {}
        self._lock = threading.Lock()
        self.units = StoreUnitCache(store, compiler.identity)

    def key(self, job: CompileJob, source_hash: str | None = None) -> str:
        return compile_key(self.compiler.identity, source_hash or job.benchmark.source_hash(),
                           job.effective_flags, overrides_text(job.overrides))

    def submit(self, job: CompileJob) -> Future[CompileResult]:
        source_hash = job.benchmark.source_hash()  # reads every source file: once per job
        key = self.key(job, source_hash)
        with self._lock:
            running = self._inflight.get(key)
            if running is not None:
                return running
            future = self._pool.submit(self._compile, key, job, source_hash)
            self._inflight[key] = future
        # Outside the lock: a cache hit can finish before this line, and then the callback
        # runs right here, in this thread, and takes the lock itself.
        future.add_done_callback(lambda _f: self._forget(key))
        return future

    def compile(self, job: CompileJob) -> CompileResult:
        return self.submit(job).result()

    def _forget(self, key: str) -> None:
        with self._lock:
            self._inflight.pop(key, None)

    def _compile(self, key: str, job: CompileJob, source_hash: str) -> CompileResult:
        t0 = time.monotonic()
        cached = self.store.artifact(key)
        if cached is not None:
            return CompileResult(cached, True, time.monotonic() - t0)
        staging = self.store.staging_dir(key)
        try:
            if job.overrides:
                (staging / "overrides.sexp").write_text(overrides_text(job.overrides))
            # Each unit gets its own entries only, so its cache key does not change when
            # another unit's overrides do.
            per_unit = staging / "unit-overrides"
            per_unit.mkdir()
            overrides = {}
            for unit in job.benchmark.units():
                own = [o for o in job.overrides if o.unit == unit.module]
                if own and unit.is_impl:
                    overrides[unit.module] = per_unit / f"{unit.module}.sexp"
                    overrides[unit.module].write_text(overrides_text(own))
            build = staging / "build"
            try:
                result = build_benchmark(job.benchmark, build, self.compiler.ocamlopt,
                                         flags=job.effective_flags, overrides=overrides,
                                         dump_decisions=True, unit_cache=self.units)
            except BuildError as exc:
                raise CompileError(str(exc), exc.output) from None
            # Keep what analysis needs, not the object files.
            result.binary.rename(staging / "binary")
            for dump in result.decision_files:
                dump.rename(staging / dump.name)
            (staging / "compiler-output.txt").write_text(result.compiler_output)
            shutil.rmtree(build)
            shutil.rmtree(per_unit)
            artifact = self.store.commit_artifact(key, staging, {
                "benchmark": job.benchmark.name, "flags": list(job.effective_flags),
                "compiler": self.compiler.identity,
                "source_hash": source_hash,
                "overrides": len(job.overrides),
                "units_compiled": result.units_compiled, "units_reused": result.units_reused})
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return CompileResult(artifact, False, time.monotonic() - t0,
                             result.units_compiled, result.units_reused)

    def close(self, wait: bool = True) -> None:
        """``wait=False``: queued compiles are cancelled and a running one stops before its
        next unit (the process's exit waits for the unit being compiled, under a second)."""
        if not wait:
            self.units.stopped.set()
        self._pool.shutdown(wait=wait, cancel_futures=not wait)
