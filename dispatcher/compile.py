"""The compile service: (benchmark, flags, overrides) -> binary + decision dumps, cached.

Compiles run in a thread pool (each is an ``ocamlopt`` subprocess).  Results land in the store
under a key of (compiler identity, benchmark source hash, flags, canonical overrides text), so a
repeated compile is a cache hit and two identical jobs in flight compile once.
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
from dispatcher.store import Artifact, Store, compile_key


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


KEEP = ("binary", "overrides.sexp", "compiler-output.txt")


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

    def key(self, job: CompileJob, source_hash: str | None = None) -> str:
        return compile_key(self.compiler.identity, source_hash or job.benchmark.source_hash(),
                           job.effective_flags, overrides_text(job.overrides))

    def submit(self, job: CompileJob) -> "Future[CompileResult]":
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
            overrides = None
            if job.overrides:
                overrides = staging / "overrides.sexp"
                overrides.write_text(overrides_text(job.overrides))
            build = staging / "build"
            try:
                result = build_benchmark(job.benchmark, build, self.compiler.ocamlopt,
                                         flags=job.effective_flags, overrides=overrides,
                                         dump_decisions=True)
            except BuildError as exc:
                raise CompileError(str(exc), exc.output) from None
            # Keep what analysis needs, not the object files.
            result.binary.rename(staging / "binary")
            for dump in result.decision_files:
                dump.rename(staging / dump.name)
            (staging / "compiler-output.txt").write_text(result.compiler_output)
            shutil.rmtree(build)
            artifact = self.store.commit_artifact(key, staging, {
                "benchmark": job.benchmark.name, "flags": list(job.effective_flags),
                "compiler": self.compiler.identity,
                "source_hash": source_hash,
                "overrides": len(job.overrides)})
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return CompileResult(artifact, False, time.monotonic() - t0)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
