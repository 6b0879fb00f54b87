"""Builds measured against the heuristic: the procedures of ``run-all-benchmarks`` (each
optimal tree ``assign-rewards`` wrote) and ``run-plugin-benchmark`` (a policy, and with
``--baselines`` the global setting tuned on the training split and the extremes).

Each contender is compiled and compared with its benchmark's heuristic build
(``dispatcher.compare``); each comparison is written to its CSV as soon as it ends
(``analysis.result_files``) and handed to the command as an ``Evaluated`` record, which says
what went wrong in lines of its own.  The commands word the records; bad input is an
``EvaluationError`` of one line.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from analysis.result_files import csv_rows, summary_rows, write_csv
from analysis.results import WITHHELD, Outcome
from analysis.sources import SourcesError, benchmark_of
from dispatcher import baselines as base
from dispatcher.build.manifest import (
    SPLITS,
    Benchmark,
    ManifestError,
    Size,
    bundled_benchmarks,
    resolve_benchmark,
)
from dispatcher.build.policies import PolicySpec, parse_policy
from dispatcher.build.service import CompileError, CompileJob, CompileResult, OverridesMismatch
from dispatcher.compare import (
    Compared,
    Contender,
    Failure,
    compare_with_heuristic,
    pairing_policy,
)
from dispatcher.core.comparison import Comparison
from dispatcher.core.decisions import DecisionFileError, Override, read_overrides
from dispatcher.core.figures import Figure, against
from dispatcher.core.guards import CostGuard
from dispatcher.core.jobs import RunJob
from dispatcher.core.records import RunResult
from dispatcher.running.agent_client import AgentError
from dispatcher.running.backend import EXACT_CLASS
from dispatcher.running.measurement import PairingPolicy, ShareJudge
from dispatcher.running.scheduler import Scheduler
from dispatcher.session import Session
from dispatcher.storage.store import StoreError


class EvaluationError(RuntimeError):
    """Input that cannot be evaluated, or results that cannot be written: one line."""


@dataclass(frozen=True)
class Evaluated:
    """One contender's comparison with the heuristic, judged, its CSV written (``csv``).

    ``outcome``: its figure, with where and why it stopped (None: no comparison); ``figure``:
    the same with the binary size ratio, or why there is none (the baselines' table);
    ``errors``: what failed, each a line (the command exits 1 after the table); ``note``: a
    line to say that is no error (overrides its build did not reach)."""

    tag: Any
    label: str
    outcome: Outcome | None = None
    comparison: Comparison | None = None
    csv: Path | None = None
    figure: Figure = Figure()
    errors: tuple[str, ...] = ()
    note: str | None = None


def _write(path: Path, rows: list[list[str]], results: Path) -> Path:
    try:
        return write_csv(path, rows)
    except OSError as exc:  # the comparison is in the store: a rerun writes it
        raise EvaluationError(f"{results}: cannot write the results: "
                              f"{exc.strerror or exc}") from None


def _candidate_failure(c: Comparison) -> str:
    for r in c.results:
        for rec in r.records:
            if rec.failure:
                return f"{r.worker}: {rec.failure}"
    return "a run failed"


# --------------------------------------------------------------------------- one build's runs

@dataclass
class SlotRuns:
    """A job's runs on every worker slot (``run-benchmark``), each judged for disturbance;
    ``cached``: read back from the store; ``errors``: slots or stores that failed, a line
    each (what was measured elsewhere stands)."""

    results: list[RunResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    cached: bool = False


def compile_build(session: Session, build: CompileJob, decisions: Path | None
                  ) -> CompileResult:
    """``build`` compiled (or from the store), its failure in one line."""
    try:
        return session.builds.compile(build)
    except OverridesMismatch as exc:
        raise EvaluationError(f"{decisions}: {exc}") from None
    except CompileError as exc:
        raise EvaluationError(f"{build.benchmark.name}: compile failed: {exc}") from None
    except StoreError as exc:
        raise EvaluationError(str(exc)) from None


def cached_results(session: Session, job: RunJob) -> list[RunResult]:
    """Per worker, the latest stored result of exactly ``job`` with at least ``job.runs`` runs,
    cut to its first ``job.runs`` runs: what a fresh job of that many runs would have measured
    there (the first runs of a job, after the binary arrived), so ``--runs N`` shows N."""
    latest = {r.worker: r for cls in session.worker_classes
              for r in session.store.job_measurements(job, cls)
              if len(r.records) >= job.runs}
    return [r.model_copy(update={"records": r.records[:job.runs]}) for r in latest.values()]


def run_on_every_slot(session: Session, job: RunJob, judge: ShareJudge,
                      remeasure: bool) -> SlotRuns:
    """``job`` run once on every slot (or its stored runs, unless ``remeasure``), its runs
    lost to disturbance run again once, and what was measured stored."""
    stored = [] if remeasure else cached_results(session, job)
    if stored:
        return SlotRuns([judge(r) for r in stored], cached=True)
    got = SlotRuns()
    scheduler = session.start_workers().scheduler
    futures = [scheduler.submit(job, slot=slot.name) for slot in scheduler.slots
               if slot.worker_class != EXACT_CLASS]  # a CPU lent to exact jobs times nothing
    for f in futures:
        try:
            got.results.append(judge(f.result()))
        except AgentError as exc:
            got.errors.append(str(exc))
    got.results = rerun_disturbed(scheduler, job, got.results, judge, got.errors)
    for r in got.results:  # what was measured is kept, whatever else failed
        try:
            session.store.add_measurement(r, job)
        except StoreError as exc:
            got.errors.append(str(exc))
    return got


def rerun_disturbed(scheduler: Scheduler, job: RunJob, results: list[RunResult],
                    judge: ShareJudge, errors: list[str]) -> list[RunResult]:
    """Each worker's runs with those it lost to disturbance run again, once, on the same
    slot (as many as were lost; the agent made again those that migrated, each job up to 2N
    records, so a worker returns between N and 4N runs); judged the same way.  Runs that
    failed are not run again."""
    out = []
    for r in results:
        missing = job.runs - len(r.times)
        if missing > 0 and not r.failed:
            try:
                extra = judge(scheduler.submit(replace(job, runs=missing),
                                               slot=r.worker).result())
                r = r.model_copy(update={"records": r.records + extra.records})
            except AgentError as exc:
                errors.append(str(exc))
        out.append(r)
    return out


def compare_one(session: Session, contender: Contender[Any], runs: int,
                remeasure: bool) -> Compared[Any] | StoreError:
    """The contender's build against the heuristic build, paired, interleaved, on one slot,
    as the search measures a candidate (docs/measurement.md); a store that failed is handed
    back, not raised (the runs measured before it stand)."""
    pairing = pairing_policy(session.config, runs)
    try:
        with closing(compare_with_heuristic(session, [contender], runs, pairing,
                                            remeasure)) as outcomes:
            return next(iter(outcomes))
    except StoreError as exc:
        return exc


# --------------------------------------------------------------------------- optimal trees

@dataclass(frozen=True)
class OptimalTree:
    """One optimal tree to measure."""

    hyper: str
    path: Path
    overrides: tuple[Override, ...]


@dataclass(frozen=True)
class Target:
    """One benchmark's optimal trees, and where they came from."""

    name: str
    bench: Benchmark
    rundirs: tuple[str, ...]
    trees: tuple[OptimalTree, ...]


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.is_dir()) if directory.is_dir() \
        else []


def _optimal_files(rewards: Path, bench: str, model: str) -> dict[str, Path]:
    model_dir = rewards / bench / model
    return {h: model_dir / h / "optimal.sexp" for h in _names(model_dir)
            if (model_dir / h / "optimal.sexp").is_file()}


def _withheld(rewards: Path, bench: str, model: str) -> dict[str, str]:
    """hyper -> why it has no optimal.sexp (assign-rewards' no-optimal.txt), for each
    hyperparameter directory of ``model`` without one."""
    model_dir = rewards / bench / model
    out = {}
    for h in _names(model_dir):
        d = model_dir / h
        if (d / "optimal.sexp").is_file():
            continue
        try:
            lines = (d / WITHHELD).read_text().splitlines()
        except (OSError, UnicodeDecodeError):
            lines = []
        out[h] = lines[0].strip() if lines and lines[0].strip() else f"no optimal.sexp in {d}"
    return out


def _found(rewards: Path, model: str, benchmarks: tuple[str, ...], hypers: tuple[str, ...]
           ) -> tuple[dict[str, dict[str, Path]], dict[str, dict[str, str]]]:
    """Per benchmark: its optimal trees' files and its withheld settings, checked against
    the benchmarks and hyperparameters asked for."""
    if not rewards.is_dir():
        raise EvaluationError(f"{rewards}: no such rewards directory (assign-rewards --out "
                              "writes one)")
    known = _names(rewards)
    for b in benchmarks:
        if b not in known:
            raise EvaluationError(f"unknown benchmark {b}: no {rewards / b} (benchmarks "
                                  f"there: {', '.join(known) or 'none'})")
    files = {b: _optimal_files(rewards, b, model) for b in benchmarks or known}
    withheld = {b: _withheld(rewards, b, model) for b in files}
    if not any(files.values()) and not any(withheld.values()):
        models = sorted({m for b in files for m in _names(rewards / b)})
        where = rewards / benchmarks[0] if len(benchmarks) == 1 else rewards
        raise EvaluationError(f"no optimal.sexp for model {model} under {where} (models "
                              f"there: {', '.join(models) or 'none'})")
    found = {h for per in files.values() for h in per}
    for h in hypers:
        if h not in found and not any(h in per for per in withheld.values()):
            raise EvaluationError(f"no optimal.sexp for model {model} with hyperparameters "
                                  f"{h} under {rewards} (found: {', '.join(sorted(found))})")
    return files, withheld


def _target(rewards: Path, name: str, chosen: Mapping[str, Path]) -> Target:
    try:
        bench, rundirs = benchmark_of(rewards, name)
        trees = tuple(OptimalTree(h, path, tuple(read_overrides(path)))
                      for h, path in sorted(chosen.items()))
    except (SourcesError, ManifestError, DecisionFileError) as exc:
        raise EvaluationError(str(exc)) from None
    return Target(name, bench, rundirs, trees)


def collect(rewards: Path, model: str, benchmarks: tuple[str, ...],
            hypers: tuple[str, ...]) -> tuple[list[Target], list[Outcome]]:
    """Every optimal tree to measure, read and checked before anything is compiled; and every
    setting skipped for want of one (an outcome without a speedup, its reason as ``stopped``)."""
    files, withheld = _found(rewards, model, benchmarks, hypers)
    skipped = [Outcome(name, h, stopped=reason)
               for name, per in withheld.items() for h, reason in sorted(per.items())
               if not hypers or h in hypers]
    targets = []
    for name, per in files.items():
        chosen = {h: p for h, p in per.items() if not hypers or h in hypers}
        if chosen:
            targets.append(_target(rewards, name, chosen))
        elif name in benchmarks and not any(o.benchmark == name for o in skipped):
            raise EvaluationError(f"no optimal.sexp for model {model} under {rewards / name} "
                                  f"with hyperparameters {', '.join(hypers) or 'any'}")
    return targets, skipped


def sizes_of(benches: Sequence[Benchmark], size: str) -> dict[str, Size]:
    """Each benchmark's size ``size`` from its manifest, by name."""
    try:
        return {b.name: b.size(size) for b in benches}
    except ManifestError as exc:
        raise EvaluationError(str(exc)) from None


def measure_trees(session: Session, targets: Sequence[Target], model: str, results: Path,
                  sizes: Mapping[str, Size], runs: int, pairing: PairingPolicy
                  ) -> Iterator[Evaluated]:
    """Each optimal tree against the heuristic, as each ends, its CSV written to
    ``<results>/<bench>/<model>/<hyper>.csv``.  Every build is asked for at once (each
    benchmark's heuristic first); a comparison starts as soon as its build is done."""
    contenders = [Contender((target, tree), target.bench,
                            CompileJob(target.bench, tree.overrides), sizes[target.name])
                  for target in targets for tree in target.trees]
    with closing(compare_with_heuristic(session, contenders, runs, pairing)) as compared_all:
        for got in compared_all:
            target, tree = got.contender.tag
            label = f"{target.name}/{model}/{tree.hyper}"
            reach = got.override_reach()
            note = (reach.line(tree.path) or None) if reach is not None else None
            if got.failure is Failure.HEURISTIC:
                error = f"{target.name}: the heuristic build failed: {got.error}"
            elif isinstance(got.error, OverridesMismatch):
                error = f"{tree.path}: {got.error}"
            elif got.failure is Failure.COMPILE:
                error = f"{tree.path}: compile failed: {got.error}"
            elif got.failure is Failure.MEASURE:
                error = f"{label}: not measured: {got.error}"
            else:
                c = got.comparison
                assert c is not None
                path = _write(results / target.name / model / f"{tree.hyper}.csv",
                              csv_rows(c, str(tree.path), target.rundirs), results)
                failed = ((f"{label}: the optimal tree's build failed a run "
                           f"({_candidate_failure(c)})",) if c.failed else ())
                yield Evaluated(got.contender.tag, label, Outcome.of(target.name, tree.hyper, c),
                                c, path, errors=failed, note=note)
                continue
            yield Evaluated(got.contender.tag, label, errors=(error,), note=note)


# --------------------------------------------------------------------------- policies

def select(names: Sequence[str]) -> list[Benchmark]:
    """Benchmarks by name or directory, or whole splits (training, test, all; none: all)."""
    chosen: dict[Path, Benchmark] = {}
    for name in names or ("all",):
        try:
            if name == "all":
                found = bundled_benchmarks()
            elif name in SPLITS:
                found = bundled_benchmarks(name)
            else:
                found = [resolve_benchmark(name)]
        except ManifestError as exc:
            raise EvaluationError(str(exc)) from None
        for b in found:
            chosen.setdefault(b.directory.resolve(), b)
    return list(chosen.values())


def tune_global(session: Session, results: Path, benches: list[Benchmark],
                sizes: Mapping[str, Size], size_name: str, runs: int, pairing: PairingPolicy,
                retune: bool, on_each: Callable[[tuple[str, str], Figure], None],
                say: Callable[[str], None]) -> base.Tuning:
    """The global setting (``dispatcher.baselines.tune``), its errors in one line."""
    try:
        return base.tune(session, results, benches, sizes, size_name, runs, pairing, retune,
                         on_each=on_each, say=say, guard=session.config.policy)
    except base.BaselineError as exc:
        raise EvaluationError(str(exc)) from None
    except OSError as exc:
        raise EvaluationError(f"{results / base.RECORD}: cannot write the choice: "
                              f"{exc.strerror or exc}") from None


def policy_contenders(spec: PolicySpec, label: str, benches: Sequence[Benchmark],
                      sizes: Mapping[str, Size], tuning: base.Tuning | None
                      ) -> tuple[list[Contender], list[str]]:
    """The policy's build of each benchmark, then (with a ``tuning``) the baselines' builds:
    the global setting chosen, never-inline and always-inline; and the baselines' names, in
    the tables' order.  A contender's tag is (build name, benchmark)."""
    contenders: list[Contender] = [
        Contender((label, b), b, CompileJob(b, policy=spec), sizes[b.name]) for b in benches]
    others: list[str] = []
    if tuning is None:
        return contenders, others
    extra: list[tuple[str, tuple[str, ...] | None]] = [("never-inline", None),
                                                        ("always-inline", None)]
    if tuning.chosen is not None:
        extra.insert(0, (f"global-{tuning.chosen}", tuning.flags))
    for build, flags in extra:
        if build == label:
            continue
        others.append(build)
        for b in benches:
            job = (CompileJob(b, flags=base.setting_flags(b, flags)) if flags is not None
                   else CompileJob(b, policy=parse_policy(build)))
            contenders.append(Contender((build, b), b, job, sizes[b.name]))
    return contenders, others


def _policy_errors(got: Compared[Any], name: str) -> tuple[str, ...]:
    if got.failure in (Failure.COMPILE, Failure.HEURISTIC):
        return (f"{name}: compile failed: {got.error}",)
    if got.failure is Failure.MEASURE:
        return (f"{name}: not measured: {got.error}",)
    assert got.comparison is not None
    return (f"{name}: a run of the policy's build failed",) if got.comparison.failed else ()


def measure_policy(session: Session, contenders: Sequence[Contender], label: str,
                   spec: PolicySpec, results: Path, runs: int, pairing: PairingPolicy
                   ) -> Iterator[Evaluated]:
    """Each contender against the heuristic, as each ends, its comparison written to
    ``<results>/<bench>/plugins/plugin_<build>.csv``.  A baseline's failure is its figure's
    error, not an error of the run (an extreme that does not compile is a finding)."""
    with closing(compare_with_heuristic(session, contenders, runs, pairing)) as compared_all:
        for got in compared_all:
            build, bench = got.contender.tag
            figure = base.measured_of(session, got)
            c = got.comparison
            path = None
            if c is not None:
                path = _write(results / bench.name / "plugins" / f"plugin_{build}.csv",
                              csv_rows(c, str(spec) if build == label else build, ()), results)
            outcome = Outcome.of(bench.name, build, c) if c is not None else None
            errors = _policy_errors(got, bench.name) if build == label else ()
            yield Evaluated(got.contender.tag, build, outcome, c, path, figure, errors)


def write_summary(results: Path, label: str, others: Sequence[str],
                  benches: Sequence[Benchmark],
                  figures: Mapping[tuple[str, str], Figure], metric: str = "time",
                  guard: CostGuard | None = None) -> Path:
    """``<results>/plugin_<label>.summary.csv``: each build's figure on each benchmark, the
    policy against it, what the means count (a build past the cost ``guard``: the
    heuristic's figure, and why in ``note``) and the oracle's row
    (``analysis.result_files.summary_rows``, ``dispatcher.baselines.table_cells``)."""
    path = results / f"plugin_{label}.summary.csv"
    cells = base.table_cells(figures, label, others, [b.name for b in benches], metric, guard)
    builds = [label, *others, *([base.ORACLE] if any(k[0] == base.ORACLE for k in cells)
                                else [])]
    try:
        write_csv(path, summary_rows(
            (b.name, b.split, build, c.measured,
             None if build == label else against(cells[(label, b.name)].counted, c.counted),
             c.counted, c.note)
            for b in benches for build in builds if (c := cells[(build, b.name)])))
    except OSError as exc:
        raise EvaluationError(f"{path}: cannot write the summary: {exc.strerror or exc}"
                              ) from None
    return path
