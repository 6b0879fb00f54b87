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

A job may name a policy (``CompileJob.policy``, ``dispatcher.build.policies``): a learned
policy, whose spec carries its file's bytes (read from a ``.policy`` file, or serialised from
a policy trained in this process), and always-inline as a constant one, are given to the
compiler, which evaluates them itself (``-inlining-policy``, a file written for the build
only: ``compiler_file``); any other policy is served by a policy host
(``dispatcher.build.policy_host``) answering the compiler on its policy channel.  The policy's
identity (for a file, the sha256 of its content) joins the cache keys of that job and its
units; a job without one has the key it always had.

Entries the compiler would pass over silently are refused (``OverridesMismatch``): one for a
unit the benchmark does not have, before compiling, and one for a round the compiler did not
run for its unit, known from the dumps it wrote, before the candidate is stored.  A search's
entries come from the compiler's own dumps, so they always pass.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import operator
import os
import queue
import shutil
import tempfile
import threading
import time
from bisect import bisect_right
from collections.abc import Iterator
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from dispatcher.build.driver import (
    BuildError,
    BuildResult,
    PolicyChannel,
    PolicyFile,
    build_benchmark,
)
from dispatcher.build.manifest import Benchmark
from dispatcher.build.policies import (
    PolicyError,
    PolicySpec,
    compiler_policy_file,
    policy_of_spec,
)
from dispatcher.build.policy_host import PolicyHost
from dispatcher.build.remote import (
    NO_REUSE,
    Builder,
    BuilderLost,
    keep_units,
    reused_units,
)
from dispatcher.build.toolchain import Compiler
from dispatcher.core.decisions import (
    DUMP_NAME,
    Override,
    canonical_lines,
    overrides_file,
    overrides_json,
)
from dispatcher.core.lazy import cached
from dispatcher.core.outputs import COMPILER_OUTPUT, OVERRIDES
from dispatcher.storage.store import (
    Artifact,
    CompileFailure,
    Store,
    StoreError,
    UnitEntry,
    compile_key,
    store_error,
    unit_key,
)

log = logging.getLogger(__name__)


#: What a compile error says for the copy of a policy file the compiler was given (which is
#: removed with its build); ``policy_named`` puts the job's policy in its place, the file a
#: user named.  A failure is remembered with this word, so the store never replays a path.
POLICY_FILE = "<policy file>"


def policy_named(text: str, job: CompileJob) -> str:
    """``text`` with ``POLICY_FILE`` replaced by the policy the job names: its file (as the
    user named it), else its identity."""
    if POLICY_FILE not in text or job.policy is None:
        return text
    return text.replace(POLICY_FILE, job.policy.source or job.policy.identity())


@contextlib.contextmanager
def compiler_file(data: bytes) -> Iterator[Path]:
    """A policy's bytes where the compiler reads them (``-inlining-policy`` takes a path): the
    one write between a spec and the compiler, for one build, removed when it ends.  Exactly
    the bytes that were hashed, never the file a user named (it may have changed since); per
    build, so no compile still running can lose it to another's cleanup."""
    where = Path(tempfile.mkdtemp(prefix="inlining-policy-"))
    try:
        path = where / "policy.policy"
        path.write_bytes(data)
        yield path
    finally:
        shutil.rmtree(where, ignore_errors=True)


@dataclass(frozen=True)
class CompileJob:
    benchmark: Benchmark
    overrides: tuple[Override, ...] = ()
    flags: tuple[str, ...] | None = None  # None: the manifest's flags
    policy: PolicySpec | None = None  # None: no policy channel (overrides and the heuristic)

    @property
    def effective_flags(self) -> tuple[str, ...]:
        return tuple(self.benchmark.flags if self.flags is None else self.flags)

    @cached
    def source_hash(self) -> str:
        """Its benchmark's ``source_hash``, read once per job (its key and its submission)."""
        return self.benchmark.source_hash()

    @cached
    def _keys(self) -> dict[str, str]:
        return {}

    def compile_key(self, compiler_identity: str) -> str:
        """The store's key of this job with the compiler ``compiler_identity``, made once per
        job and compiler: a search asks for it as it launches a proposal, and again as the
        compile service takes the job (hashing the overrides' text, tens of kilobytes)."""
        key = self._keys.get(compiler_identity)
        if key is None:
            key = self._keys[compiler_identity] = compile_key(
                compiler_identity, self.source_hash, self.effective_flags,
                self.canonical_overrides,
                self.policy.identity() if self.policy is not None else None,
                overrides_json(self._canonical[0]))
        return key

    @cached
    def _canonical(self) -> tuple[tuple[Override, ...], tuple[str, ...]]:
        return canonical_lines(self.overrides)

    @cached
    def canonical_overrides(self) -> str:
        """The overrides' canonical text (``overrides_text``), made once per job: its compile
        key, its proposal file and its build's overrides.sexp are this text."""
        return overrides_file(self._canonical[1])

    def unit_overrides(self) -> dict[str, str]:
        """Each unit's own overrides as a file (``overrides_text`` of its entries alone),
        by unit: the lines of the canonical text, which keeps a unit's entries together."""
        overrides, lines = self._canonical
        units = list(map(_UNIT, overrides))  # sorted: a unit's lines are one slice
        out: dict[str, str] = {}
        start = 0
        for unit in dict.fromkeys(units):
            end = bisect_right(units, unit, start)
            out[unit] = overrides_file(lines[start:end])
            start = end
        return out


@dataclass(frozen=True)
class CompileResult:
    artifact: Artifact
    cached: bool
    seconds: float
    units_compiled: int = 0  # by this compile (0 on a whole-candidate cache hit)
    units_reused: int = 0  # taken from the unit cache

    @property
    def cpu_s(self) -> float | None:
        """The CPU seconds of the compiler processes its build is made of, as recorded when it
        was built (``BuildResult.cpu_s``; a cache hit reads them back, so a rerun judges the
        same figure); None when not known (built remotely, or by a version before them)."""
        return self.artifact.cpu_s

    @property
    def binary(self) -> Path:
        return self.artifact.binary

    @property
    def sha256(self) -> str:
        return self.artifact.sha256


_DISK_ERRORS = tuple(os.strerror(e) for e in (errno.ENOSPC, errno.EDQUOT, errno.EROFS))


def _full_disk(output: str) -> bool:
    """A tool's output says the file system is full (or read-only): a build that failed
    for lack of room says nothing about its candidate."""
    return any(text in output for text in _DISK_ERRORS)


_UNIT = operator.attrgetter("unit")
_UNIT_ROUND = operator.attrgetter("unit", "round")

_KEPT_OUTPUT = 200_000  # characters of a failed build's output kept with its failure


class CompileError(RuntimeError):
    """A candidate that does not compile; ``output`` holds the compiler's full output,
    ``remembered`` when it failed (seconds since the epoch) if it was not compiled again."""

    def __init__(self, message: str, output: str, remembered: float | None = None):
        super().__init__(message)
        self.output = output
        self.remembered = remembered


class OverridesMismatch(CompileError):
    """Override entries the compiler would pass over without a word: for a unit the benchmark
    does not have (``main`` for ``Main``) or a round the compiler did not run.  The message
    names the entry by its index in the job's overrides (an overrides file's order)."""


def check_override_units(job: CompileJob) -> None:
    """Every entry names one of the benchmark's compilation units, exactly (each unit is
    given only its own entries, so any other would be dropped)."""
    units = [u.module for u in job.benchmark.units() if u.is_impl]
    known = set(units)
    if known.issuperset(map(_UNIT, job.overrides)):
        return
    for i, o in enumerate(job.overrides):
        if o.unit not in known:
            same = [u for u in units if u.lower() == o.unit.lower()]
            hint = f"did you mean {same[0]}? " if same else ""
            raise OverridesMismatch(f"override {i}: unit {o.unit}: {job.benchmark.name} has no "
                                    f"such unit ({hint}its units: {', '.join(units)})", "")


def check_override_rounds(job: CompileJob, decision_files: list[Path], output: str) -> None:
    """Every entry names a round the compiler ran for its unit: it writes one dump per unit
    and round (``<prefix>.<round>.decisions.sexp``), whatever it decided."""
    stems = {u.source[:-3]: u.module for u in job.benchmark.units() if u.is_impl}
    ran: dict[str, set[int]] = {}
    for f in decision_files:
        m = DUMP_NAME.match(f.name)
        if m and m["prefix"] in stems:
            ran.setdefault(stems[m["prefix"]], set()).add(int(m["round"]))
    ran_pairs = {(unit, r) for unit, rounds in ran.items() for r in rounds}
    if ran_pairs.issuperset(map(_UNIT_ROUND, job.overrides)):
        return
    for i, o in enumerate(job.overrides):
        rounds = ran.get(o.unit, set())
        if o.round not in rounds:
            did = (f"rounds 0 to {max(rounds)}" if len(rounds) > 1 else
                   f"round {min(rounds)}" if rounds else "no round")
            raise OverridesMismatch(
                f"override {i}: unit {o.unit} round {o.round}: the compiler ran {did} of "
                f"{o.unit} (flags: {' '.join(job.effective_flags) or 'none'})", output)


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

    def lookup(self, inputs: dict, outdir: Path) -> UnitEntry | None:
        """The stored unit of ``inputs``, its files copied into ``outdir`` (None: not stored,
        or damaged and dropped)."""
        key = unit_key(self.identity, inputs)
        entry = self.store.unit_entry(key)
        if entry is None:
            return None
        if not entry.restore(outdir):
            self.store.drop_unit(key)  # damaged: compile it again
            return None
        with self._lock:
            self.hits += 1
        return entry

    def record(self, inputs: dict, outdir: Path, names: list[str], output: str,
               cpu_s: float | None = None) -> None:
        """Store the unit of ``inputs`` that another machine compiled: ``names`` in
        ``outdir``."""
        self.store.commit_unit(unit_key(self.identity, inputs), outdir, names, output,
                               {"source": inputs.get("command", [""])[-1],
                                **({"cpu_s": cpu_s} if cpu_s is not None else {})})
        with self._lock:
            self.misses += 1

    def unit(self, inputs: dict, outdir: Path, compile):
        key = unit_key(self.identity, inputs)
        while True:
            entry = self.lookup(inputs, outdir)
            if entry is not None:
                if hasattr(compile, "cpu_s"):  # a UnitCompile: what it took when compiled
                    compile.cpu_s = entry.cpu_s
                return list(entry.files), entry.output, True
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
            cpu = getattr(compile, "cpu_s", None)
            self.store.commit_unit(key, outdir, names, output,
                                   {"source": inputs.get("command", [""])[-1],
                                    **({"cpu_s": cpu} if cpu is not None else {})})
            with self._lock:
                self.misses += 1
            return names, output, False
        finally:
            with self._lock:
                del self._inflight[key]
            done.set()


def _sha_of(done: Future[CompileResult]) -> str | None:
    """A finished compile's binary sha256; None when it failed."""
    if done.cancelled() or done.exception() is not None:
        return None
    return done.result().sha256


def _relay(done: Future[CompileResult], to: Future[CompileResult]) -> None:
    """The pool's future's outcome onto the one the submitters wait on (unless a waiter
    cancelled that one meanwhile)."""
    try:
        if done.cancelled():
            to.cancel()
        elif done.exception() is not None:
            to.set_exception(done.exception())
        else:
            to.set_result(done.result())
    except InvalidStateError:  # cancelled by its waiter: nobody wants the outcome
        pass


class CompileService:
    def __init__(self, store: Store, toolchain: Compiler, jobs: int = 1,
                 cpus: frozenset[int] | None = None):
        """``cpus``: where compiles may run.  On the local backend these are the CPUs not
        given to worker slots: a compile on a worker's CPU would disturb its timings."""
        self.store = store
        self.toolchain = toolchain
        self._pool = ThreadPoolExecutor(
            max_workers=jobs, thread_name_prefix="compile",
            # Linux pins only the calling thread, and ocamlopt inherits that thread's mask.
            initializer=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        self._inflight: dict[str, Future] = {}
        # Every structure below is under this one lock, which every submit and release of
        # every chain takes: few, short sections, no file read under it.  A compile's end
        # takes no lock (its callback queues to ``_ended``; the next section applies it): a
        # thread that waits for a lock holds it, once it has it, until it has the GIL back,
        # so at hundreds of compile threads a lock taken at each compile's end queued them
        # all, and the chains behind them.
        self._lock = threading.Lock()
        self._ended: queue.SimpleQueue[tuple[str, str | None]] = queue.SimpleQueue()
        self.units = StoreUnitCache(store, toolchain.identity)
        # Who may still run each compiled candidate's binary: compile key -> the threads
        # (search chains) that submitted it or took it from the store, until they release
        # it; and each thread's keys (a release looks at its own only).
        self._holders: dict[str, set[int]] = {}
        self._held_by: dict[int, set[str]] = {}
        # The sha256 of each held key's binary, once known (its compile ended, or it was
        # found stored), and how many held keys have each sha256.
        self._held_sha: dict[str, str] = {}
        self._sha_holds: dict[str, int] = {}
        self.binaries_dropped = 0
        self._cpus = cpus
        self._jobs = jobs
        self._master_seats = threading.Semaphore(jobs)
        self._builder: Builder | None = None
        self._builder_seats = threading.Semaphore(0)

    def use_builder(self, builder: Builder) -> None:
        """Compile on ``builder`` as well from now on: its ``jobs`` builds at once beside the
        master's own (compiles already queued keep the master's seats).  A build goes to the
        builder while it has a free seat, else to the master (the master's CPU is the
        scheduler's too: the builder's seats are taken first); a build it cannot do at all
        is done here instead, and so is a build under a policy (the policy is served by a
        host on the master)."""
        old = self._pool
        cpus = self._cpus
        self._pool = ThreadPoolExecutor(
            max_workers=self._jobs + builder.jobs, thread_name_prefix="compile",
            initializer=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        self._builder_seats = threading.Semaphore(builder.jobs)
        self._builder = builder
        old.shutdown(wait=False)

    def key(self, job: CompileJob) -> str:
        return job.compile_key(self.toolchain.identity)

    def submit(self, job: CompileJob) -> Future[CompileResult]:
        """Compile ``job`` (or find it stored); the calling thread holds the result's binary
        until it ``release``s it."""
        source_hash = job.source_hash  # reads every source file: once per job
        key = self.key(job)
        with self._lock:
            self._apply_ended()
            self._hold(key)
            running = self._inflight.get(key)
            if running is not None and not (running.done() and _sha_of(running) is None):
                return running  # (one that failed, its end not applied yet: tried again)
            # Claimed: a submit of the same key from now on waits for this one.
            future: Future[CompileResult] = Future()
            self._inflight[key] = future
        future.add_done_callback(lambda f: self._ended.put((key, _sha_of(f))))
        # A build in the store is answered here, not queued behind the compiles running (one
        # always-inline build can take the 300 s budget: a comparison whose heuristic build
        # was stored long before waited for it, and with it every comparison after it).  A
        # stored key compiled once, so its overrides named the benchmark's units.
        t0 = time.monotonic()
        try:
            cached = self.store.artifact(key)
            if cached is not None:
                future.set_result(CompileResult(cached, True, time.monotonic() - t0))
            else:
                queued = self._pool.submit(self._compile, key, job, source_hash)
                queued.add_done_callback(lambda done: _relay(done, future))
                # a waiter that cancels the build before it starts cancels it in the pool
                future.add_done_callback(lambda f: f.cancelled() and queued.cancel())
        except BaseException as exc:
            if not future.done():
                future.set_exception(exc)
        return future

    def compile(self, job: CompileJob) -> CompileResult:
        return self.submit(job).result()

    def stored(self, key: str) -> Artifact | None:
        """The stored candidate ``key`` with its binary (None: compile it), held by the
        calling thread as ``submit`` holds what it compiles."""
        with self._lock:
            self._apply_ended()
            self._hold(key)
        artifact = self.store.artifact(key)
        if artifact is not None:
            with self._lock:
                self._known_sha(key, artifact.sha256)
        return artifact

    def release(self, keep: set[str | None]) -> None:
        """The calling thread no longer runs the binaries it holds, but those of ``keep``.
        A binary no thread holds any more is dropped from the store (its entry stays, and a
        later compile of it makes the same binary again): a search keeps only the binaries
        a later step may run.  Not while another process has the store open: one of its
        jobs may be about to run one (store-gc collects them later)."""
        me = threading.get_ident()
        with self._lock:
            self._apply_ended()
            mine = self._held_by.get(me, set())
            free: list[tuple[str, str | None]] = []  # no thread holds them now
            for key in [k for k in mine if k not in keep]:
                mine.discard(key)
                threads = self._holders[key]
                threads.discard(me)
                if not threads:
                    del self._holders[key]
                    free.append((key, self._unheld_sha(key)))
            if not mine:
                self._held_by.pop(me, None)
            if not free or self.store.others_open():
                return
            for key, sha in free:
                # an agents' copy of the same content may serve a binary still held
                agent_copy = sha is not None and sha not in self._sha_holds
                if self.store.drop_binary(key, agent_copy=agent_copy, sha=sha):
                    self.binaries_dropped += 1

    # -- the holders' books (under the lock)

    def _hold(self, key: str) -> None:
        me = threading.get_ident()
        self._holders.setdefault(key, set()).add(me)
        self._held_by.setdefault(me, set()).add(key)

    def _known_sha(self, key: str, sha: str) -> None:
        """``key``'s binary is ``sha``: kept while the key is held."""
        if key in self._holders and key not in self._held_sha:
            self._held_sha[key] = sha
            self._sha_holds[sha] = self._sha_holds.get(sha, 0) + 1

    def _unheld_sha(self, key: str) -> str | None:
        """``key`` is held no more -> its binary's sha256, when known."""
        sha = self._held_sha.pop(key, None)
        if sha is not None:
            left = self._sha_holds[sha] - 1
            if left:
                self._sha_holds[sha] = left
            else:
                del self._sha_holds[sha]
        return sha

    def _apply_ended(self) -> None:
        """The compiles ended since the last section: not in flight any more; the sha256
        of each binary kept while it is held."""
        while True:
            try:
                key, sha = self._ended.get_nowait()
            except queue.Empty:
                return
            running = self._inflight.get(key)
            if running is not None and running.done():
                del self._inflight[key]
            if sha is not None:
                self._known_sha(key, sha)

    def _compile(self, key: str, job: CompileJob, source_hash: str) -> CompileResult:
        t0 = time.monotonic()
        check_override_units(job)
        cached = self.store.artifact(key)
        if cached is not None:
            return CompileResult(cached, True, time.monotonic() - t0)
        failed = self.store.failure(key)
        if failed is not None:  # the same error, word for word: tables rerun read the same
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(failed.time))
            log.warning("%s: not compiled again: it failed on %s (store-gc forgets it)",
                        job.benchmark.name, when)
            raise CompileError(policy_named(failed.error, job), policy_named(failed.output, job),
                               remembered=failed.time)
        try:
            staging = self.store.staging_dir(key)
        except OSError as exc:
            raise store_error(exc, f"{job.benchmark.name}: cannot compile in the store") from None
        try:
            # Each unit gets its own entries only, so its cache key does not change when
            # another unit's overrides do.
            per_unit = staging / "unit-overrides"
            per_unit.mkdir()
            overrides = {}
            own = job.unit_overrides()
            for unit in job.benchmark.units():
                module = unit.module
                if module in own and unit.is_impl:
                    overrides[module] = per_unit / f"{module}.sexp"
                    overrides[module].write_text(own[module])
            build = staging / "build"
            try:
                result, built_on = self._build(job, build, overrides)
            except BuildError as exc:
                if _full_disk(exc.output):  # the store's disk, not the candidate: the
                    # search must not go on as if the candidate did not compile
                    raise StoreError(f"{self.store.root}: cannot compile in the store: "
                                     f"{exc}") from None
                if exc.lasting:  # not compiled again to fail again
                    self.store.remember_failure(key, CompileFailure(
                        str(exc), exc.output[-_KEPT_OUTPUT:], time.time()))
                raise CompileError(policy_named(str(exc), job), policy_named(exc.output, job)
                                   ) from None
            check_override_rounds(job, result.decision_files, result.compiler_output)
            # Keep what analysis needs, not the object files: the text outputs read once,
            # packed by the store (never written out plain again).
            outputs = {dump.name: dump.read_bytes() for dump in result.decision_files}
            outputs[COMPILER_OUTPUT] = result.compiler_output.encode()
            if job.overrides:
                outputs[OVERRIDES] = job.canonical_overrides.encode()
            result.binary.rename(staging / "binary")
            shutil.rmtree(build)
            shutil.rmtree(per_unit)
            artifact = self.store.commit_artifact(key, staging, outputs, {
                "benchmark": job.benchmark.name, "flags": list(job.effective_flags),
                "compiler": self.toolchain.identity,
                "source_hash": source_hash,
                "overrides": len(job.overrides), "built_on": built_on,
                **({"policy": job.policy.identity()} if job.policy is not None else {}),
                "units_compiled": result.units_compiled, "units_reused": result.units_reused,
                **({"cpu_s": result.cpu_s} if result.cpu_s is not None else {})})
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise store_error(exc, f"{job.benchmark.name}: cannot compile in the store") from None
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return CompileResult(artifact, False, time.monotonic() - t0,
                             result.units_compiled, result.units_reused)

    def _build(self, job: CompileJob, build: Path,
               overrides: dict[str, Path]) -> tuple[BuildResult, str]:
        """The build -> its result and where it ran: on the remote builder if it has a free
        seat and the job names no policy (the policy host serves the master's compiler only),
        else here, with a policy host serving the job's policy if it names one."""
        builder = self._builder
        if builder is not None and job.policy is None and self._builder_seats.acquire(
                not builder.overflow_to_master):
            try:
                flags = job.effective_flags
                reuse = (reused_units(job.benchmark, flags, overrides, True, self.units)
                         if builder.shares_unit_cache else NO_REUSE)
                result, where = builder.build(job.benchmark, build, self.toolchain, flags,
                                              overrides, True, reuse)
                keep_units(job.benchmark, flags, overrides, True, self.units, result, reuse)
                return result, where
            except BuilderLost as exc:
                log.warning("%s: built on the master instead: %s", job.benchmark.name, exc)
                shutil.rmtree(build, ignore_errors=True)
            finally:
                self._builder_seats.release()
        with self._master_seats:
            return self._build_here(job, build, overrides), "master"

    def _build_here(self, job: CompileJob, build: Path,
                    overrides: dict[str, Path]) -> BuildResult:
        """The build on the master.  What went wrong on the policy host's side (its policy
        failed) comes first in the error: the compiler only says that the host closed the
        channel."""

        def run(policy: PolicyChannel | PolicyFile | None = None) -> BuildResult:
            return build_benchmark(job.benchmark, build, self.toolchain.ocamlopt,
                                   flags=job.effective_flags, overrides=overrides,
                                   dump_decisions=True, unit_cache=self.units, policy=policy)

        if job.policy is None:
            return run()
        data = compiler_policy_file(job.policy)
        if data is not None:
            with compiler_file(data) as path:
                try:
                    return run(PolicyFile(path, job.policy.identity()))
                except BuildError as exc:  # never the copy's name: it is gone when read
                    raise BuildError(str(exc).replace(str(path), POLICY_FILE),
                                     exc.output.replace(str(path), POLICY_FILE),
                                     exc.lasting) from None
        try:
            policy = policy_of_spec(job.policy)
        except PolicyError as exc:
            raise CompileError(str(exc), "") from None
        with PolicyHost(policy) as host:
            try:
                return run(PolicyChannel(host.base, job.policy.identity()))
            except BuildError as exc:
                # not remembered: a host answers in time, or not, as the machine's load says
                if host.errors:
                    raise BuildError(f"{job.benchmark.name}: policy {job.policy}: "
                                     f"{host.errors[0]} ({exc})", exc.output) from None
                raise BuildError(str(exc), exc.output) from None

    def close(self, wait: bool = True) -> None:
        """``wait=False``: queued compiles are cancelled and a running one stops before its
        next unit (the process's exit waits for the unit being compiled, under a second)."""
        if not wait:
            self.units.stopped.set()
        self._pool.shutdown(wait=wait, cancel_futures=not wait)
