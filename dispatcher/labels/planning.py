"""Planning ``measure-sites``: a labels rundir per benchmark, before any labeller starts.

The labels twin of ``dispatcher/planning.py`` (a search's chains), sharing its mechanics: a new
rundir is made whole and then listed in the batch log (``list_in_batch_log``), a resumed one is
opened and locked as a search's is (``open_to_resume``), and the search rundirs to attribute are
read from a batch log by the one reader (``rundirs_of_batch_log``).  What a new labels rundir
records (its settings, the winner it attributes, how many hot sites it sweeps) is decided
here.  Refusals are one-line ``RundirError``s; notes for the user are returned, never printed.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from dispatcher.build.manifest import Benchmark, ManifestError, load_benchmark
from dispatcher.core.records import BatchEntry, Metric, RecordError, read_experiment
from dispatcher.core.rundir import (
    EXPERIMENT,
    RundirError,
    SitesRundir,
    list_in_batch_log,
    open_to_resume,
    rundirs_of_batch_log,
)
from dispatcher.core.site_records import (
    SITES_FORMAT_VERSION,
    SITES_KIND,
    SitesExperiment,
    WinnerChoice,
    is_sites_rundir,
)
from dispatcher.labels.reference import REFERENCE_TREE
from dispatcher.labels.winner import confirmed_winner, search_compiler

DEFAULT_SWEEP = 10  # hottest sites of a benchmark no search confirmed a winner for
# Exact labels confirmed in wall time from this |log ratio| up: train-policy's label threshold
# (analysis.label_training.DEFAULT_LABEL_THRESHOLD), below which a label is ``default`` anyway
DEFAULT_CONFIRM_ABOVE = 0.01
CONFIRM_SIZE = "full"  # the size a policy is judged at; a benchmark without it: the labels'

Job = tuple[SitesRundir, Benchmark]  # a labels rundir and the benchmark it measures


@dataclass(frozen=True)
class LabelsSettings:
    """What every new labels rundir records: the command's options over the config's.
    ``size``: the one asked for (None: the searches' own, else ``default_size``);
    ``sweep``: None for the default (DEFAULT_SWEEP without a confirmed winner, else 0)."""

    size: str | None
    default_size: str
    runs: int
    max_pairs: int
    half_width: float
    timeout: float
    perf: bool
    aslr: bool
    sweep: int | None
    keep: float
    max_tests: int
    retest: bool
    rundirs: Path  # where the rundirs are made
    batch_log: Path  # where they are listed
    config_raw: dict[str, Any]  # the config each rundir keeps a copy of
    metric: str = "time"  # what tests are measured in (the retests: in time)
    # labels measured in time also counted in estimated cycles (the workers can count); under
    # an exact metric they always are (the labels' own counts)
    cycles: bool = False
    # under an exact metric: the size the wall-time retest confirms at (None: CONFIRM_SIZE
    # where the benchmark has it, else the labels' size) and the |log effect| from which a
    # label is confirmed (None: DEFAULT_CONFIRM_ABOVE); under time, unused
    confirm_size: str | None = None
    confirm_above: float | None = None
    # the build labels are measured against and flip sites of (dispatcher.labels.reference):
    # None, the heuristic's; ``always-inline``; or a tree, an overrides file's path (its text
    # in ``reference_tree``, copied into each rundir)
    reference: str | None = None
    reference_tree: str | None = None


@dataclass(frozen=True)
class LabelsPlan:
    jobs: list[Job]  # in the order they are measured (``gain_first``)
    notes: list[str]  # for the user: what each benchmark without a confirmed winner gets


@dataclass(frozen=True)
class _Planned:
    bench: Benchmark
    sources: list[Path]  # the search rundirs it attributes
    winner: WinnerChoice | None
    size: str


def search_rundirs(paths: Sequence[Path], batch_log: Path | None) -> list[Path]:
    """The search rundirs named and those the batch log lists (labels rundirs skipped);
    RundirError for a missing batch log, a labels rundir named or a path that is no rundir."""
    out = list(paths)
    if batch_log is not None:
        out += [p for e, p in rundirs_of_batch_log(batch_log)
                if e.algorithm != SITES_KIND and not is_sites_rundir(p)]
    for p in out:
        if is_sites_rundir(p):
            raise RundirError(f"{p}: a labels rundir, not a search's (use --resume to continue "
                              "it)")
        if not (p / EXPERIMENT).is_file():
            raise RundirError(f"{p}: not a rundir (no {EXPERIMENT})")
    return out


def open_label_resumes(paths: Sequence[Path]) -> tuple[list[Job], list[SitesRundir]]:
    """The labels rundirs of ``--resume``: (those to continue, locked, with their benchmark;
    those already finished)."""
    opened, finished = open_to_resume(paths, lambda p: SitesRundir.open(p, lock=False))
    return [(rd, load_benchmark(rd.experiment.benchmark)) for rd in opened], finished


def gain_first(job: Job) -> float:
    """The order benchmarks are labelled in: the largest winner first, sweeps last (stable
    otherwise), so that a budget or a Ctrl-C stopping the stage leaves the labels that would
    teach least: a winner's decisions are where the measured gains are."""
    winner = job[0].experiment.winner
    return -(winner.speedup or 1.0) if winner is not None else 0.0


def plan_labels(settings: LabelsSettings, compiler: str, worker_class: str,
                sources: Sequence[Path], swept: Sequence[Benchmark],
                trees: Sequence[tuple[Benchmark, Path]],
                name: Callable[[Benchmark, int], str]) -> LabelsPlan:
    """A labels rundir per benchmark, made whole and listed in the batch log: one per
    benchmark the ``sources`` searched (their confirmed winner attributed), per ``trees``
    (BENCH, overrides file) and per ``swept`` benchmark not already planned.  ``name``: the
    rundir's name for a benchmark's k-th labels rundir of this plan.  RundirError when a
    search was made by another compiler than ``compiler``; ManifestError for an unknown size,
    before any rundir exists."""
    planned = _planned(settings, compiler, sources, swept, trees)
    notes: list[str] = []
    jobs: list[Job] = []
    made: dict[Path, int] = {}
    for p in planned:
        p.bench.size(p.size)  # an unknown size: ManifestError, before any rundir exists
        if settings.metric != "time" and settings.confirm_size is not None \
                and settings.confirm_size not in p.bench.sizes:  # likewise
            raise ManifestError(p.bench.manifest_path, f"sizes.{settings.confirm_size}",
                                f"--confirm-size {settings.confirm_size}: no such size in "
                                f"benchmark {p.bench.name} (known: {', '.join(p.bench.sizes)})")
        sweep = settings.sweep if settings.sweep is not None else (
            0 if p.winner is not None else DEFAULT_SWEEP)
        notes += _notes(p, sweep, settings.reference)
        k = made[p.bench.directory.resolve()] = made.get(p.bench.directory.resolve(), -1) + 1
        path = settings.rundirs / name(p.bench, k)
        exp = _experiment(settings, p, sweep, compiler, worker_class, path)
        tree = ({REFERENCE_TREE: settings.reference_tree}
                if settings.reference_tree is not None else None)
        rd = SitesRundir.create(path, exp, settings.config_raw, files=tree)
        list_in_batch_log(settings.batch_log, BatchEntry(
            task=p.bench.name, rundir=str(path.resolve()), algorithm=SITES_KIND,
            version=SITES_FORMAT_VERSION))
        jobs.append((rd, p.bench))
    return LabelsPlan(sorted(jobs, key=gain_first), notes)


def _planned(settings: LabelsSettings, compiler: str, sources: Sequence[Path],
             swept: Sequence[Benchmark], trees: Sequence[tuple[Benchmark, Path]]
             ) -> list[_Planned]:
    """What each benchmark gets, searches first, then trees, then sweeps of the others."""
    planned = []
    for directory, group in _by_benchmark(sources).items():
        for r in group:
            theirs = search_compiler(r)
            if theirs is not None and theirs != compiler:
                raise RundirError(f"{r}: searched with another compiler ({theirs[:12]}, this "
                                  f"one is {compiler[:12]}): its trees would not be rebuilt "
                                  "as they were")
        first = _experiment_of(group[0])
        planned.append(_Planned(load_benchmark(directory), group, confirmed_winner(group),
                                settings.size or first.size))
    for bench, file in trees:
        planned.append(_Planned(bench, [], WinnerChoice(overrides=str(file)),
                                settings.size or settings.default_size))
    for bench in swept:
        if not any(p.bench.directory.resolve() == bench.directory.resolve() for p in planned):
            planned.append(_Planned(bench, [], None, settings.size or settings.default_size))
    return planned


def _experiment_of(rundir: Path) -> Any:
    try:
        return read_experiment(rundir / EXPERIMENT)
    except RecordError as exc:
        raise RundirError(str(exc)) from None


def _by_benchmark(rundirs: Iterable[Path]) -> dict[Path, list[Path]]:
    """Search rundirs by the benchmark directory they searched."""
    groups: dict[Path, list[Path]] = {}
    for r in rundirs:
        groups.setdefault(Path(_experiment_of(r).benchmark).resolve(), []).append(r)
    return groups


def _notes(p: _Planned, sweep: int, reference: str | None = None) -> list[str]:
    """What the user is told about a benchmark whose winner is missing or unconfirmed."""
    name, winner = p.bench.name, p.winner
    if reference is not None:
        return [f"{name}: sweeping the {sweep} hottest sites {reference} inlined, each set "
                "back to dont_inline alone, against its build"]
    if winner is None:
        return [f"{name}: no search confirmed a tree faster than the heuristic; sweeping its "
                f"{sweep} hottest sites"]
    if not winner.confirmed and winner.ci95 is not None:
        return [f"{name}: its search stopped before confirming its best; that best "
                f"({winner.speedup:.3f}x [{winner.ci95[0]:.3f}, {winner.ci95[1]:.3f}] on the "
                "search's own pairs) is attributed if fresh pairs confirm it"]
    return []


def _experiment(settings: LabelsSettings, p: _Planned, sweep: int, compiler: str,
                worker_class: str, path: Path) -> SitesExperiment:
    s = settings
    return SitesExperiment(
        task=p.bench.name, benchmark=str(p.bench.directory.resolve()), size=p.size,
        runs=s.runs, max_pairs=max(s.max_pairs, s.runs), half_width=s.half_width,
        timeout=s.timeout, perf=s.perf, aslr=s.aslr, worker_class=worker_class,
        compiler=compiler, sources=[str(r.resolve()) for r in p.sources], winner=p.winner,
        sweep=sweep, keep=s.keep, max_tests=s.max_tests, retest=s.retest,
        rundir=str(path.resolve()), metric=cast(Metric, s.metric),
        cycles_size=cycles_size(s, p.bench, p.size),
        confirm_size=confirm_size(s, p.bench, p.size),
        confirm_above=None if s.metric == "time" else (
            DEFAULT_CONFIRM_ABOVE if s.confirm_above is None else s.confirm_above),
        reference=s.reference)


def confirm_size(settings: LabelsSettings, bench: Benchmark, size: str) -> str | None:
    """The size an exact label is confirmed at in wall time: the one asked for, else ``full``
    (the size a policy is judged at) where the benchmark has it, else the labels' own; None
    under time (a retest there is at the labels' size, as ever)."""
    if settings.metric == "time":
        return None
    if settings.confirm_size is not None:
        return settings.confirm_size
    return CONFIRM_SIZE if CONFIRM_SIZE in bench.sizes else size


def cycles_size(settings: LabelsSettings, bench: Benchmark, size: str) -> str | None:
    """The size a label's binaries are counted at in estimated cycles: the labels' own under
    an exact metric (their counts); under time ``tiny`` (about 10-50 ms natively, a few
    seconds under cachegrind), else ``quick``; None: not counted."""
    if settings.metric != "time":
        return size
    if not settings.cycles:
        return None
    return next(s for s in ("tiny", "quick", size) if s in bench.sizes)
