"""The simulated backend: worker slots that sleep model time, and a builder that compiles a
real decision tree without a compiler (config section ``simulated:``; docs/simulation.md).

A slot runs no process and takes no CPU lock: it draws each run's record from the performance
model (``model``) and sleeps the run's modelled wall time times ``time_scale`` (0.01: a 2 s
run sleeps 20 ms), one job at a time per slot, so hundreds of slots fit on 2 CPUs.  Its
records are shaped as the real agent's: wall, user and sys time, CPU share, output check.
The builder (``Backend.remote_builder``, the compile service's seam) applies a candidate's
overrides to its program's real tree (``programs``), writes the dumps the real compiler
would have written and a small "binary" (an ELF file with a symbol per function, ``elf``)
that says what it is, and sleeps the modelled compile time times ``time_scale``.  A profile
job gets samples of the model's heat at the binary's function offsets, which the master
names through the symbol table as it names a real binary's.  An exact job (``measure.metric``
instructions or cycles) gets the agent's counted record: counts that follow from the binary's
modelled time alone, after ``count_s`` of slot time; in an exact session the CPUs the
simulated compiles use are lent to exact jobs as the local backend lends its compile CPUs
(``LentSlot``: a count there waits for a CPU no build holds).  The "compiler" is a file whose
content is the model's identity, so a store never mixes simulated candidates of two models
with each other or with real ones.  With ``simulated.ray`` the slots live in the actors of a
Ray cluster instead (``ray_hosts``), the builder still here.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from dispatcher.build.driver import BuildError, BuildResult
from dispatcher.build.manifest import Benchmark
from dispatcher.build.remote import NO_REUSE, UnitReuse
from dispatcher.build.toolchain import Compiler
from dispatcher.core.decisions import read_overrides
from dispatcher.core.files import read_utf8, write_text_atomic
from dispatcher.core.jobs import RunJob
from dispatcher.core.records import RunResult, SampleProfile
from dispatcher.core.validation import MAX_PARALLEL, KeyPathError, Reader, load_strict
from dispatcher.running.agent_client import AgentError, WorkerLost
from dispatcher.running.backend import EXACT_CLASS, Answer
from dispatcher.running.exact import IDENTITY
from dispatcher.running.simulated.build_processes import BuildProcesses
from dispatcher.running.simulated.elf import ElfError, Layout, elf_bytes, layout, read_note
from dispatcher.running.simulated.model import (
    ELSEWHERE_SHARE,
    RUNTIME_SHARE,
    Model,
    count_run,
    draw_run,
    parse_model,
)
from dispatcher.running.simulated.programs import (
    DUMPS_DIR,
    Program,
    SimulationError,
    compile_tree,
    dump_texts,
    function_heat,
    functions_of,
    load_program,
    read_bundle,
    unknown_sites,
)
from dispatcher.running.simulated.ray_settings import RayHosts, parse_section
from dispatcher.running.simulated.timers import Timers

CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) \
    / "inlining-orchestrator" / "simulated"
MAX_SLOTS = 100_000
MAX_SAMPLES = 100_000  # of one simulated profile run (the agent's buffer holds ~16k)
BINARY_FORMAT = "inlining-orchestrator simulated binary 2"
# What a simulated slot says of its "valgrind" (``exact.check_workers``): its counts are the
# model's, stored apart from any real worker's (the version joins every exact key).
EXACT_INFO = {"available": True, "version": "simulated", "identity": IDENTITY, "reason": None}


@dataclass(frozen=True)
class SimulatedConfig:
    slots: int = 16
    worker_class: str = "simulated"
    time_scale: float = 0.01  # real seconds slept per modelled second
    compile_jobs: int = 4  # simulated builds at once
    model: Model = field(default_factory=Model)
    cache_dir: Path = CACHE_DIR  # dumps made for benchmarks of one's own; the "compiler"
    # Jobs a slot holds at once: 2 as the real slots; 1 runs them in the order they were
    # submitted, so a chain alone on its slot draws the same noise every time.
    depth: int = 2
    # None: the slots live in this process; else in the actors of a Ray cluster (ray_hosts)
    ray: Optional[RayHosts] = None
    # In an exact session, lend the compile CPUs (``compile_jobs`` of them) to exact jobs, as
    # the local backend does (local slots only: the Ray backend lends none)
    lend: bool = True
    # The CPUs of the processes that do the simulated builds' own work (one process each,
    # pinned there); empty: the master's compile threads do it (``build_processes``)
    build_cpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class SimulatedBinary:
    """What a simulated binary's file says: its program, the identity of its decisions, the
    mean modelled time of its runs and where that time goes (file offsets, hex, with their
    share of the samples).  The file is a small ELF (``elf``): a symbol per function of its
    program, this record in its ``.simulated`` section."""

    program: str
    decisions: str
    run_s: float
    profile: tuple[tuple[str, float], ...] = ()

    def text(self) -> str:
        return json.dumps({"format": BINARY_FORMAT, "program": self.program,
                           "decisions": self.decisions, "run_s": self.run_s,
                           "profile": [list(x) for x in self.profile]},
                          sort_keys=True) + "\n"

    def file_bytes(self, lay: Layout) -> bytes:
        return elf_bytes(lay, self.text().encode())

    @classmethod
    def read(cls, path: Path) -> SimulatedBinary:
        try:
            data = json.loads(read_note(path.read_bytes()))
        except ElfError as exc:
            raise ValueError(f"{path}: not a simulated binary ({exc})") from None
        if data.get("format") != BINARY_FORMAT:
            raise ValueError(f"{path}: not a simulated binary")
        return cls(data["program"], data["decisions"], float(data["run_s"]),
                   tuple((str(o), float(w)) for o, w in data.get("profile", [])))

    def sampled(self, rng: random.Random, wall_s: float, period_ns: int) -> SampleProfile:
        """One run's profile, as the agent samples it: about ``wall_s / period`` samples
        drawn over the binary's offsets by their shares, a few outside the binary."""
        if not self.profile:
            return SampleProfile(period_ns=period_ns,
                                 error="simulated binary: no function of its program runs")
        n = min(int(wall_s * 1e9 / max(period_ns, 1)), MAX_SAMPLES)
        elsewhere = sum(rng.random() < ELSEWHERE_SHARE for _ in range(n))
        offsets: dict[str, int] = {}
        for o in rng.choices([o for o, _ in self.profile], [w for _, w in self.profile],
                             k=n - elsewhere):
            offsets[o] = offsets.get(o, 0) + 1
        return SampleProfile(period_ns=period_ns, samples=n, mapped=True,
                             offsets=dict(sorted(offsets.items())), elsewhere=elsewhere)


# A lent count takes a compile CPU for this much model time at once, then lets a waiting
# build have it: the compiles go first, as they do over the local backend's counts at nice 19.
COUNT_SLICE_S = 0.1


class CompileCpus:
    """The compile CPUs where they are lent to counts: a build takes a free one at once; a
    count takes one only while no build waits, a slice at a time (``COUNT_SLICE_S``), so a
    build never waits longer than a slice behind the counts.  Each ``hold`` -> the wall
    seconds it waited."""

    def __init__(self, cpus: int):
        self._lock = threading.Lock()
        self._for_builds = threading.Condition(self._lock)
        self._for_counts = threading.Condition(self._lock)
        self._free = cpus
        self._builds_waiting = 0

    @contextlib.contextmanager
    def hold(self, build: bool) -> Iterator[float]:
        t0 = time.monotonic()
        with self._lock:
            if build:
                self._builds_waiting += 1
                while self._free == 0:
                    self._for_builds.wait()
                self._builds_waiting -= 1
            else:
                while self._free == 0 or self._builds_waiting:
                    self._for_counts.wait()
            self._free -= 1
        try:
            yield time.monotonic() - t0
        finally:
            with self._lock:
                self._free += 1
                if self._builds_waiting:
                    self._for_builds.notify()
                else:
                    self._for_counts.notify()


class World:
    """What the slots and the builder of one simulated backend share: the model, the programs
    (read once each) and the binaries seen (by sha256, as an agent's cache)."""

    def __init__(self, config: SimulatedConfig):
        self.config = config
        self.model = config.model
        self._lock = threading.Lock()
        self._programs: dict[Path, Program] = {}
        self._shapes: dict[Path, tuple[Layout, tuple[tuple[str, float], ...]]] = {}
        self._binaries: dict[str, SimulatedBinary] = {}
        # What the simulation itself costs the process (benches subtract it from the master's
        # CPU: real workers and compilers spend it elsewhere), and its builds.
        self.cpu_s = 0.0  # CPU seconds of the simulated slots' and builder's own work
        self.offloaded_s = 0.0  # CPU seconds of its builds in processes of their own
        self.builds = 0
        self.build_s = 0.0  # wall seconds of the builds, their sleeps included (a build in a
        # build process: its sleep and its own CPU, not its wait for the process)
        # The compile CPUs, where they are lent to exact jobs (``LentSlot``): a build or a
        # count holds one while it takes model time, the builds first, so the two share them
        # as on the real master; None: the builds have them to themselves.
        self.compile_cpus: Optional[CompileCpus] = None
        self.waited_s = 0.0  # wall seconds lent slots' jobs waited for a compile CPU
        self.timers = Timers()  # when the slots' jobs answer

    def spent(self, cpu_s: float, build_s: float | None = None, waited_s: float = 0.0,
              offloaded_s: float = 0.0) -> None:
        with self._lock:
            self.cpu_s += cpu_s
            self.offloaded_s += offloaded_s
            self.waited_s += waited_s
            if build_s is not None:
                self.builds += 1
                self.build_s += build_s

    def compile_cpu(self, build: bool = True) -> contextlib.AbstractContextManager[float]:
        """Hold one of the compile CPUs (where they are shared with lent slots; ``build``:
        for a build, which goes first, else for a slice of a count) -> the wall seconds
        waited for it."""
        cpus = self.compile_cpus
        return contextlib.nullcontext(0.0) if cpus is None else cpus.hold(build)

    def program(self, bench: Benchmark) -> Program:
        where = bench.directory.resolve()
        with self._lock:
            found = self._programs.get(where)
        if found is None:
            found = load_program(bench, self.config.cache_dir / "dumps")
            bad = unknown_sites(found, self.model.program(bench.name))
            if bad:  # a program of one's own, its dumps made only now
                effect, c = bad[0]
                raise SimulationError(
                    f"simulated.model.programs.{bench.name}.{effect}: {bench.name} has no "
                    f"call {c.key!r} in unit {c.unit} round {c.round} (nor one that "
                    "inlining brings in): the effect would never hold")
            with self._lock:
                found = self._programs.setdefault(where, found)
        return found

    def shape(self, bench: Benchmark, program: Program
              ) -> tuple[Layout, tuple[tuple[str, float], ...]]:
        """The layout of ``bench``'s binaries (a symbol per function) and where their time
        goes (offset -> share of the samples: the runtime's, then the model's heat)."""
        where = bench.directory.resolve()
        with self._lock:
            found = self._shapes.get(where)
        if found is None:
            functions = functions_of(program)
            lay = layout(functions)
            heat = function_heat(program, self.model.program(bench.name), self.model.seed)
            index = {f: i for i, f in enumerate(functions)}
            profile = [(f"{lay.offset(index[f]):x}", (1 - RUNTIME_SHARE) * share)
                       for f, share in heat.items() if f in index]
            if profile:
                profile.insert(0, (f"{lay.runtime:x}", RUNTIME_SHARE))
            found = (lay, tuple(profile))
            with self._lock:
                found = self._shapes.setdefault(where, found)
        return found

    def binary(self, job: RunJob) -> SimulatedBinary:
        """The binary a job runs (read from the master's store the first time; an agent
        checks and caches binaries the same way); AgentError if it is not a simulated one."""
        with self._lock:
            found = self._binaries.get(job.sha256)
        if found is None:
            try:
                found = SimulatedBinary.read(job.binary)
            except (OSError, ValueError, KeyError) as exc:
                raise AgentError(f"simulated: {job.binary}: cannot run it ({exc})",
                                 code="not_in_cache") from None
            with self._lock:
                self._binaries[job.sha256] = found
        return found

    def sleep(self, model_s: float) -> None:
        if model_s > 0:
            time.sleep(model_s * self.config.time_scale)


class SimulatedCpu:
    """One simulated worker CPU, run by the scheduler's runner threads.  ``depth`` 2 as the
    real slots (the second job waits on the slot, as in an agent's queue); one job runs at a
    time.  At depth 2 the slot's two runner threads may take a round's two runs of one binary
    in either order, which changes the pairs a comparison makes of the same draws; at depth 1
    jobs run in the order they came."""

    def __init__(self, index: int, world: World, worker_class: str, depth: int = 2):
        self.cpu = index
        self.name = f"sim/cpu{index}"
        self.worker_class = worker_class
        self.depth = depth
        self._world = world
        self._lock = threading.Lock()  # the draws
        self._busy = threading.Lock()  # held while a job takes its time (run)
        self._closed = False
        self._jobs: dict[str, int] = {}  # jobs of each binary (and kind) run here so far

    def _rng(self, sha256: str, profile: bool = False, exact: bool = False) -> random.Random:
        """The draws of this slot's next job of binary ``sha256``: the same, whichever order
        the slot's runner threads take their jobs in (a comparison on a slot replays).
        Profile jobs are counted apart from timing jobs: a profile's samples must not depend
        on how many timing jobs of the binary this process ran before it, or a chain
        resumed after a kill that found the baseline's runs in the store (and so ran none)
        would draw another profile than the uninterrupted chain, and propose other flips.
        Exact jobs likewise (a count draws only its loss)."""
        key = f"{sha256}/profile" if profile else f"{sha256}/exact" if exact else sha256
        n = self._jobs.get(key, 0)
        self._jobs[key] = n + 1
        return random.Random(f"{self._world.model.seed}/{self.name}/{key}/{n}")

    def _draw(self, job: RunJob) -> tuple[RunResult | WorkerLost, float]:
        """The job's outcome (its result, or the loss of its worker) and the model seconds
        it takes; AgentError if its binary cannot run, WorkerLost if the slot is closed."""
        cpu0 = time.thread_time()
        world, noise = self._world, self._world.model.noise
        binary = world.binary(job)
        program = world.model.program(binary.program)
        with self._lock:
            if self._closed:
                raise WorkerLost(f"{self.name}: closed")
            rng = self._rng(job.sha256, bool(job.profile_period_ns), job.exact)
            if rng.random() < noise.lost:
                return (WorkerLost(f"{self.name}: simulated loss of the worker"),
                        binary.run_s * job.runs * rng.random())
            if job.exact:  # the same counts each time, after their modelled cost
                records = tuple(count_run(binary.run_s, program, self.cpu,
                                          job.expected_output is not None)
                                for _ in range(job.runs))
            else:
                drawn = []
                for _ in range(job.runs):
                    rec = draw_run(rng, binary.run_s, program, noise, self.cpu, job.aslr,
                                   job.expected_output is not None)
                    if job.profile_period_ns:
                        rec = rec.model_copy(update={"profile": binary.sampled(
                            rng, rec.wall_s, job.profile_period_ns)})
                    drawn.append(rec)
                records = tuple(drawn)
        result = RunResult(sha256=job.sha256, args=job.args, worker=self.name,
                           worker_class=self.worker_class, cpu=self.cpu, records=records)
        world.spent(time.thread_time() - cpu0)
        return result, noise.job_overhead_s + sum(r.wall_s for r in records)

    def run(self, job: RunJob) -> RunResult:
        outcome, model_s = self._draw(job)
        with self._busy:
            if isinstance(outcome, WorkerLost):
                self._world.sleep(model_s)
                raise outcome
            self._take_time(model_s)
        return outcome

    def _take_time(self, model_s: float) -> None:
        """A job's time, on its own CPU (the lent slots: on a compile CPU's)."""
        self._world.sleep(model_s)

    def exact_info(self) -> tuple[dict, str]:
        """As an agent answers ``hello`` with ``exact: true``: it counts (the model's
        counts), on no host."""
        if self._closed:
            raise WorkerLost(f"{self.name}: closed")
        return dict(EXACT_INFO), ""

    def probe(self) -> None:
        """A simulated worker always answers again (a loss is never for good)."""
        if self._closed:
            raise WorkerLost(f"{self.name}: closed")

    def close(self) -> None:
        self._closed = True


class SimulatedSlot(SimulatedCpu):
    """A simulated worker CPU that answers by itself (``AnsweringSlot``): a job's outcome is
    drawn when it starts, and answered on the world's timer thread once its modelled time
    has passed after the slot's previous job, so the scheduler keeps no thread for it.  Jobs
    run in the order they started, at any depth (as ``SimulatedCpu`` at depth 1)."""

    def __init__(self, index: int, world: World, worker_class: str, depth: int = 2):
        super().__init__(index, world, worker_class, depth)
        self._free_at = 0.0  # time.monotonic() when its last job started ends

    def start(self, job: RunJob, answer: Answer) -> None:
        outcome, model_s = self._draw(job)
        with self._lock:
            began = max(time.monotonic(), self._free_at)
            self._free_at = began + max(model_s, 0.0) * self._world.config.time_scale
            ends = self._free_at
        self._world.timers.at(ends, self, answer, outcome)

    def close(self) -> None:
        super().close()
        self._world.timers.flush(self, WorkerLost(f"{self.name}: closed"))


class LentSlot(SimulatedCpu):
    """A compile CPU lent to exact jobs (``EXACT_CLASS``), as the local backend's
    ``ExactSlot``: it refuses a timed job, and its counts take a compile CPU while they take
    model time, a slice at a time and only while no build waits, so builds and counts share
    the ``compile_jobs`` CPUs with the builds first (waits for a CPU: which is why its runners
    are threads)."""

    def __init__(self, index: int, world: World, depth: int = 2):
        super().__init__(index, world, EXACT_CLASS, depth)
        self.name = f"sim/cpu{index}/exact"

    def run(self, job: RunJob) -> RunResult:
        if not job.exact:
            raise ValueError(f"{self.name}: a timed job on a CPU lent to exact jobs only")
        return super().run(job)

    def _take_time(self, model_s: float) -> None:
        """A slice at a time on a compile CPU, each slice once no build waits for one."""
        while model_s > 0:
            piece = min(model_s, COUNT_SLICE_S)
            with self._world.compile_cpu(build=False) as waited:
                if waited:
                    self._world.spent(0.0, waited_s=waited)
                self._world.sleep(piece)
            model_s -= piece


@dataclass(frozen=True)
class MadeBuild:
    """What a simulated build wrote (its dumps and binary) and what the master's thread needs
    to finish it: the identity its compile time is drawn from, the CPU it took."""

    files: tuple[Path, ...]
    binary: Path
    identity: str
    run_s: float
    pins: int
    units: int
    cpu_s: float  # the thread's (in a build process: that process's thread's)


def make_build(world: World, bench: Benchmark, outdir: Path, overrides: dict[str, Path]
               ) -> MadeBuild:
    """A build's own work, without its modelled time: the overrides applied to the program's
    tree, its dumps and binary written into ``outdir``.  SimulationError for a program the
    world cannot build."""
    cpu0 = time.thread_time()
    program = world.program(bench)
    pins = [o for path in overrides.values() for o in read_overrides(path)]
    compiled = compile_tree(program, pins)
    identity = compiled.identity()
    model = world.model.program(bench.name)
    lay, profile = world.shape(bench, program)
    binary = SimulatedBinary(bench.name, identity,
                             model.mean_run_s(compiled.taken(), identity), profile)
    outdir.mkdir(parents=True, exist_ok=True)
    files = []
    for fname, text in dump_texts(program, compiled).items():
        (outdir / fname).write_text(text)
        files.append(outdir / fname)
    path = outdir / bench.binary_name()
    path.write_bytes(binary.file_bytes(lay))
    return MadeBuild(files=tuple(sorted(files)), binary=path, identity=identity,
                     run_s=binary.run_s, pins=len(pins),
                     units=sum(u.is_impl for u in bench.units()),
                     cpu_s=time.thread_time() - cpu0)


_process_world: World | None = None  # a build process's own (``build_processes``)


def _start_build_process(config: SimulatedConfig) -> None:
    global _process_world
    _process_world = World(config)


def _build_in_process(bench: Benchmark, outdir: Path, overrides: dict[str, Path]
                      ) -> MadeBuild:
    assert _process_world is not None, "a build process without its world"
    return make_build(_process_world, bench, outdir, overrides)


class SimulatedBuilder:
    """The compile service's builder (``dispatcher.build.remote.Builder``): a candidate's
    overrides applied to its program's real tree, its dumps and binary written, then its
    modelled compile time slept.  With ``simulated.build_cpus`` the tree work runs in
    processes of their own (``build_processes``), as a real build's runs in ocamlopt's: the
    master's process keeps only what a real master does around a build."""

    name = "simulated"
    overflow_to_master = False  # the world's compile CPUs are all there is
    shares_unit_cache = False  # its builds compile no real unit

    def __init__(self, world: World, jobs: int):
        self._world = world
        self.jobs = jobs
        cpus = world.config.build_cpus
        self._processes = (BuildProcesses(cpus, _start_build_process, world.config)
                           if cpus else None)

    def build(self, bench: Benchmark, outdir: Path, compiler: Compiler, flags: tuple[str, ...],
              overrides: dict[str, Path], dump_decisions: bool,
              reuse: UnitReuse = NO_REUSE) -> tuple[BuildResult, str]:
        with self._world.compile_cpu():
            return self._build(bench, outdir, overrides), self.name

    def _build(self, bench: Benchmark, outdir: Path, overrides: dict[str, Path]
               ) -> BuildResult:
        t0 = time.monotonic()
        try:
            if self._processes is None:
                made = make_build(self._world, bench, outdir, overrides)
            else:
                made = self._processes.run(_build_in_process, bench, outdir, overrides)
        except SimulationError as exc:  # a build of it fails, here as on the master
            raise BuildError(str(exc), "") from None
        model = self._world.model.program(bench.name)
        t_sleep = time.monotonic()
        self._world.sleep(model.compile_s.draw(made.identity))
        if self._processes is None:
            self._world.spent(made.cpu_s, time.monotonic() - t0)
        else:
            # Not this process's CPU: the benches subtract only what it spent.  The build
            # took its modelled time and its own work, not its wait for a build process
            # (the simulation's queue, which a real build's ocamlopt does not have).
            self._world.spent(0.0, time.monotonic() - t_sleep + made.cpu_s,
                              offloaded_s=made.cpu_s)
        return BuildResult(binary=made.binary, decision_files=list(made.files),
                           compiler_output=(f"# simulated build of {bench.name}: "
                                            f"{made.pins} overrides, decisions "
                                            f"{made.identity[:16]}, {made.run_s:.6f} s per "
                                            "run\n"),
                           units_compiled=made.units)

    def close(self) -> None:
        if self._processes is not None:
            self._processes.close()


class SimulatedBackend:
    def __init__(self, config: SimulatedConfig, exact: bool = False):
        """``exact``: the session measures in an exact metric; with ``config.lend`` the
        compile CPUs are lent to its exact jobs (``LentSlot``), as the local backend's."""
        self.world = World(config)
        self.slots: list[SimulatedCpu] = [
            SimulatedSlot(i, self.world, config.worker_class, config.depth)
            for i in range(config.slots)]
        if exact and config.lend:
            self.world.compile_cpus = CompileCpus(config.compile_jobs)
            self.slots += [LentSlot(config.slots + i, self.world, config.depth)
                           for i in range(config.compile_jobs)]
        self.builder = SimulatedBuilder(self.world, config.compile_jobs)

    def remote_builder(self) -> SimulatedBuilder:
        """Every compile is simulated."""
        return self.builder

    def close(self) -> None:
        for slot in self.slots:
            slot.close()
        self.world.timers.stop()
        self.builder.close()


def simulated_compiler(config: SimulatedConfig) -> Compiler:
    """The "compiler" of the simulation: a file naming the model, whose sha256 is the
    compiler identity in every compile key (``cache_dir``/compiler-<model>/bin/ocamlopt.opt)."""
    identity = config.model.identity()
    compiler = Compiler(config.cache_dir / f"compiler-{identity[:16]}")
    text = f"inlining-orchestrator simulated compiler, model {identity}\n"
    if not compiler.ocamlopt.is_file() or read_utf8(compiler.ocamlopt) != text:
        compiler.bin_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(compiler.ocamlopt, text)
    return compiler


# --------------------------------------------------------------------------- configuration

KEYS = ("slots", "worker_class", "time_scale", "compile_jobs", "model", "cache_dir", "depth",
        "ray", "lend", "build_cpus")
MAX_DEPTH = 2


def check_sites(model: Model, r: Reader, name: str, cache_dir: Path) -> None:
    """Every effect of ``model`` on a decision its program's tree can take, for each program
    whose dumps are at hand (bundled, or made before in ``cache_dir``; the others are checked
    when first built: ``World.program``); one line naming the key otherwise."""
    prefix = f"{name}." if name else ""
    for bench_name, program_model in model.programs.items():
        if not program_model.effects:
            continue
        path = DUMPS_DIR / f"{bench_name}.tar.gz"
        if not path.is_file():
            made = sorted(cache_dir.glob(f"dumps/{bench_name}-*.tar.gz"))
            if len(made) != 1:  # none, or sources of several versions: when it is built
                continue
            path = made[0]
        try:
            program = read_bundle(path)
        except (OSError, ValueError, SimulationError, tarfile.TarError):
            continue  # a broken cache is made again when it is built, and checked then
        bad = unknown_sites(program, program_model)
        if bad:
            where, c = bad[0]
            raise r.error(f"{prefix}programs.{bench_name}.{where}",
                          f"{bench_name} has no call {c.key!r} in unit {c.unit} round "
                          f"{c.round} (nor one that inlining brings in): the effect would "
                          "never hold")


def _model_file(value: str, r: Reader, cache_dir: Path) -> Model:
    """A model in its own YAML (or JSON) file; its errors name the config's key and the
    file's."""
    path = r.local_path(value, "simulated.model", "a model file or a mapping")
    try:
        data = load_strict(read_utf8(path))
    except KeyPathError as exc:
        raise r.error("simulated.model", f"{path}: {exc.key}: {exc.message}") from None
    except Exception as exc:  # unreadable, not YAML: one line either way
        raise r.error("simulated.model", f"{path}: {' '.join(str(exc).split())}") from None
    inner = Reader(path, lambda file, key, message: r.error("simulated.model",
                                                           f"{file}: {key}: {message}"))
    model = parse_model(data, inner, name="")
    check_sites(model, inner, "", cache_dir)
    return model


def parse_config(section: dict, r: Reader) -> SimulatedConfig:
    """The ``simulated:`` section."""
    unknown = sorted(set(section) - set(KEYS))
    if unknown:
        raise r.fail(f"simulated.{unknown[0]}", f"one of {', '.join(KEYS)}")
    slots = r.positive_int(section, "slots", "simulated.slots", SimulatedConfig.slots,
                           most=MAX_SLOTS)
    worker_class = section.get("worker_class", SimulatedConfig.worker_class)
    if not isinstance(worker_class, str) or not worker_class:
        raise r.fail("simulated.worker_class", "a non-empty string", worker_class)
    time_scale = r.positive_number(section, "time_scale", "simulated.time_scale",
                                   SimulatedConfig.time_scale, most=1.0,
                                   what="real seconds per modelled second")
    jobs = r.positive_int(section, "compile_jobs", "simulated.compile_jobs",
                          SimulatedConfig.compile_jobs, most=MAX_PARALLEL)
    cache_raw = section.get("cache_dir")
    cache = CACHE_DIR if cache_raw is None else r.local_path(cache_raw, "simulated.cache_dir",
                                                             "a directory path")
    raw = section.get("model")
    if isinstance(raw, str):
        model = _model_file(raw, r, cache)
    elif raw is None or isinstance(raw, dict):
        model = parse_model(raw, r, name="simulated.model")
        check_sites(model, r, "simulated.model", cache)
    else:
        raise r.fail_kind("simulated.model", "a model file or a mapping", raw)
    depth = r.positive_int(section, "depth", "simulated.depth", SimulatedConfig.depth,
                           most=MAX_DEPTH)
    hosts = None
    if section.get("ray") is not None:
        hosts = parse_section(section["ray"], r, slots)
    lend = r.boolean(section, "lend", "simulated.lend", SimulatedConfig.lend)
    return SimulatedConfig(slots=slots, worker_class=worker_class, time_scale=time_scale,
                           compile_jobs=jobs, model=model, cache_dir=cache, depth=depth,
                           ray=hosts, lend=lend, build_cpus=build_cpus_of(section, r))


def build_cpus_of(section: dict, r: Reader) -> tuple[int, ...]:
    """``simulated.build_cpus``: distinct CPUs of this machine."""
    raw = section.get("build_cpus", [])
    count = os.cpu_count() or 1
    want = f"a list of distinct CPU numbers of this machine (0 to {count - 1})"
    if not isinstance(raw, list) or not all(isinstance(c, int) and not isinstance(c, bool)
                                            and 0 <= c < count for c in raw) \
            or len(set(raw)) != len(raw):
        raise r.fail("simulated.build_cpus", want, raw)
    return tuple(raw)


__all__ = ["LentSlot", "SimulatedBackend", "SimulatedBinary", "SimulatedBuilder",
           "SimulatedConfig", "SimulatedSlot", "World", "simulated_compiler"]
