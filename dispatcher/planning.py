"""Planning the chains of ``run_training_experiments``: which benchmarks, which rundirs, which
worker class each chain measures on, before any chain starts.

A new chain gets a rundir made whole and then listed in the batch log; a resumed one is
checked against what it recorded (its compiler, its worker class, its listing) so that a
chain never continues under conditions it was not searched in.  Every refusal is a one-line
``PlanError``; notes for the user (a rundir listed late) are returned, never printed.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dispatcher.build.manifest import BUNDLED_DIR, Benchmark, load_benchmark, resolve_benchmark
from dispatcher.build.toolchain import PREFIX_ENV, Compiler
from dispatcher.config import Config
from dispatcher.core.records import FORMAT_VERSION, BatchEntry
from dispatcher.core.rundir import (
    Rundir,
    RundirError,
    batch_log_lists,
    check_batch_log,
    check_rundirs_dir,
    list_in_batch_log,
    open_to_resume,
)
from dispatcher.core.site_records import is_sites_rundir
from dispatcher.search.chain import new_experiment


class PlanError(RuntimeError):
    """A plan that cannot be carried out; the message is one line for the user."""


def read_tasks(path: Path) -> list[str]:
    """One benchmark per line (a bundled name, or a directory's path: ./mine); # starts a
    comment."""
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except OSError as exc:
        raise PlanError(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise PlanError(f"{path}: expected UTF-8 text ({exc.reason} at byte "
                        f"{exc.start})") from None
    tasks = [line.split("#", 1)[0].strip() for line in lines]
    return [t for t in tasks if t]


def task_benchmarks(path: Path) -> list[Benchmark]:
    """The tasks file's benchmarks, each once: one listed twice (by name, or by two paths to
    one directory) would run the same chain twice, and its second rundir would collide with
    the first after the first had started.  ManifestError for a benchmark that cannot be
    used."""
    tasks = read_tasks(path)
    benches = [resolve_benchmark(t) for t in tasks]
    first: dict[Path, int] = {}
    for i, bench in enumerate(benches):
        j = first.setdefault(bench.directory.resolve(), i)
        if j != i:
            raise PlanError(
                f"{path}: {tasks[i]}: the same benchmark as {tasks[j]} ({bench.directory}): "
                "list it once (--chains N runs several chains of it)")
    if not benches:
        raise PlanError(f"{path}: no benchmark listed (one name or directory per line; "
                        "# starts a comment)")
    return benches


def rundir_name(bench: Benchmark, algorithm: str, seed: int, stamp: str) -> str:
    """``<benchmark>-<algorithm>-s<seed>-<stamp>``.  A user's benchmark directory has a digest
    of its path after its name, so that it never takes the rundir name of the bundled
    benchmark it is named after (nor of another directory of the same name)."""
    name = bench.name
    if bench.directory.resolve() != (BUNDLED_DIR / bench.name).resolve():
        name += "-" + hashlib.sha256(str(bench.directory.resolve()).encode()).hexdigest()[:8]
    return f"{name}-{algorithm}-s{seed}-{stamp}"


def log_experiment(batch_log: Path, rundir: Rundir) -> None:
    """List a rundir in the batch log; RundirError (one line) if the log cannot be written."""
    exp = rundir.experiment
    list_in_batch_log(batch_log, BatchEntry(
        task=exp.task, rundir=str(exp.rundir or rundir.path.resolve()),
        algorithm=exp.algorithm, steps=exp.steps, version=FORMAT_VERSION),
        f"; {rundir.path} is made but not listed (its --resume lists it)")


@dataclass(frozen=True)
class Overrides:
    """Command-line settings of new chains (None: the config's)."""

    algorithm: str | None = None
    steps: int | None = None
    seed: int | None = None
    size: str | None = None
    runs: int | None = None
    max_pairs: int | None = None
    chains: int | None = None  # per benchmark
    metric: str | None = None  # what candidates are compared in (None: measure.metric)

    def given(self) -> list[str]:
        """The options given, as the command names them."""
        return [f"--{name.replace('_', '-')}" for name, value in vars(self).items()
                if value is not None]


@dataclass(frozen=True)
class Resumes:
    """The rundirs of ``--resume``: those to continue (locked by this master) and those
    already finished (nothing to do)."""

    rundirs: list[tuple[Rundir, Benchmark]]  # each with the benchmark it recorded
    finished: list[Rundir]


def open_resumes(paths: Sequence[Path]) -> Resumes:
    """Open and lock the rundirs to resume (``open_to_resume``); RundirError or ManifestError
    (one line) when one cannot be, PlanError for a labels rundir."""
    for p in paths:
        if is_sites_rundir(p):
            raise PlanError(f"{p}: a labels rundir (measure-sites --resume continues it)")
    rundirs, finished = open_to_resume(paths, lambda p: Rundir.open(p, lock=False))
    return Resumes([(r, load_benchmark(r.experiment.benchmark)) for r in rundirs], finished)


def check_new_outputs(config: Config) -> None:
    """The batch log and the rundirs directory writable, before any rundir is made: none is
    left made but never listed."""
    check_batch_log(config.search.batch_log)
    check_rundirs_dir(config.search.rundirs)


@dataclass(frozen=True)
class PlannedChain:
    rundir: Rundir
    bench: Benchmark
    worker_class: str


@dataclass(frozen=True)
class Plan:
    chains: list[PlannedChain]
    notes: list[str]  # for the user: rundirs listed in the batch log only now


def plan_chains(config: Config, benches: Sequence[Benchmark],
                resumed: Sequence[tuple[Rundir, Benchmark]],
                overrides: Overrides, slots: dict[str, int], compiler: Compiler,
                stamp: str) -> Plan:
    """New chains for ``benches`` (``overrides.chains`` or the config's each), made and
    listed, then the ``resumed`` rundirs checked.  ``slots``: the worker slots of each class,
    in the backend's order.  New chains spread over the classes in turn and each stays on its
    own; an asynchronous chain keeps its share of its class's slots in flight, so how many
    chains share each class is counted first.  RundirError or ManifestError (one line) when a
    chain cannot be made or continued."""
    classes = list(slots)
    s = config.search
    per_bench = overrides.chains or s.chains
    total = per_bench * len(benches) + len(resumed)
    sharing: dict[str, int] = {}
    for i in range(total):
        sharing[classes[i % len(classes)]] = sharing.get(classes[i % len(classes)], 0) + 1
    planned: list[PlannedChain] = []
    notes: list[str] = []
    for bench in benches:
        for k in range(per_bench):
            worker_class = classes[len(planned) % len(classes)]
            exp = new_experiment(bench, k, config, slots[worker_class], worker_class,
                                 algorithm=overrides.algorithm, steps=overrides.steps,
                                 seed=overrides.seed, size=overrides.size, runs=overrides.runs,
                                 max_pairs=overrides.max_pairs, metric=overrides.metric,
                                 chains=sharing.get(worker_class, 1),
                                 compiler=compiler.identity)
            path = s.rundirs / rundir_name(bench, exp.algorithm, exp.seed, stamp)
            exp = exp.model_copy(update={"rundir": str(path.resolve())})
            bench.size(exp.size)  # an unknown size fails before anything starts
            # Made whole, then listed: a kill in between leaves a complete rundir that its
            # --resume lists (below).
            rd = Rundir.create(path, exp, config.raw)
            log_experiment(s.batch_log, rd)
            planned.append(PlannedChain(rd, bench, worker_class))
    for rd, bench in resumed:
        planned.append(PlannedChain(rd, bench, resumed_class(rd, classes, compiler)))
        if (rd.path.resolve().parent == s.rundirs.resolve()
                and not batch_log_lists(s.batch_log, rd.path)):
            # One of this config's rundirs whose master was killed between making it and
            # listing it.
            notes.append(f"{rd.path}: not in the batch log {s.batch_log} (its master stopped "
                         "before listing it): listed now")
            log_experiment(s.batch_log, rd)
    return Plan(planned, notes)


def resumed_class(rd: Rundir, classes: Sequence[str], compiler: Compiler) -> str:
    """The worker class a resumed chain measures on: the one it recorded, which this config
    must have.  RundirError when the chain was compiled by another compiler (its candidates
    would mix two compilers' binaries) or timed on a class this config lacks."""
    experiment = rd.experiment
    if experiment.compiler is not None and experiment.compiler != compiler.identity:
        raise RundirError(
            f"{rd.path}: its candidates were compiled by compiler "
            f"{experiment.compiler[:16]}, not by this one ({compiler.identity[:16]}, "
            f"{compiler.prefix}): resume it with that compiler (${PREFIX_ENV}=<its prefix>)")
    # Version 1 rundirs did not record their class: the first one, as then.
    worker_class = experiment.worker_class or classes[0]
    if worker_class not in classes:
        raise RundirError(f"{rd.path}: its runs were timed on worker class {worker_class!r}, "
                          f"which this config does not have ({', '.join(classes)})")
    return worker_class


__all__ = ["Overrides", "Plan", "PlanError", "PlannedChain", "Resumes",
           "check_new_outputs", "log_experiment", "open_resumes", "plan_chains",
           "read_tasks", "rundir_name", "task_benchmarks"]
