"""``search-policy``: a policy's parameters searched for the training split's speedup.

Each trial is one point of ``pipeline.policy.searched.Space``: its policy file, compiled into
every training program (the compiler evaluates it, ``-inlining-policy``) and compared with
each program's heuristic build in the session's metric (cycles, to screen), then scored
(``searched.score``: the geometric mean speedup less the penalties for binary size and
compile time).  Every build of a trial is asked for at once and each comparison starts as
its build lands (``dispatcher.compare``), so one trial's programs are spread over every
compile job and every slot of the session's backend, Ray's included.

The study is Optuna's, with its TPE sampler, journaled in SQLite under the output directory:
every trial is written when it is asked for and when it ends, so the same command again
continues it.  A trial cut short (Ctrl-C, a kill, a lost worker) is marked failed and its
point is tried again first, and what it had compiled and measured comes from the store.  The
best trial's policy is ``OUT/searched.policy`` (with ``searched.json``, its provenance), every
trial is a row of ``OUT/trials.csv``; ``confirm`` measures the best again in paired wall time.

Nothing here prints: progress goes through ``say``; bad input is a ``SearchError`` of one line.
"""
from __future__ import annotations

import csv
import fcntl
import io
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dispatcher import baselines as base
from dispatcher.build.manifest import Benchmark, Size
from dispatcher.build.policies import PolicySpec, learned_spec
from dispatcher.build.policy_file import write_policy_bytes
from dispatcher.build.service import CompileError, CompileJob, CompileResult
from dispatcher.compare import (
    Compared,
    Contender,
    Failure,
    compare_with_heuristic,
    pairing_policy,
)
from dispatcher.core.figures import Figure, geomean_figure
from dispatcher.core.files import TextFileError, read_regular_text, write_text_atomic
from dispatcher.running.measurement import PairingPolicy
from dispatcher.session import Session
from pipeline.policy.searched import (
    Penalties,
    ProgramFigure,
    Score,
    SearchSpaceError,
    Space,
    policy_of,
    score,
    seeds,
    start_from,
)

STUDY = "search-policy"
DB = "study.db"
IDENTITY = "search.json"
POLICY = "searched.policy"
SIDECAR = "searched.json"
TRIALS = "trials.csv"
CONFIRMATION = "confirm.csv"
LOCK = ".lock"
IDENTITY_VERSION = 1
SAMPLER = "tpe"
#: Trials drawn at random (after the seeds) before TPE models the objective.
STARTUP_TRIALS = 8


class SearchError(RuntimeError):
    """Input that cannot be searched, a study that cannot be continued, or a trial that
    could not be measured: one line."""


def start_from_file(path: Path, space: Space
                    ) -> tuple[tuple[str, tuple[tuple[str, float], ...]], ...]:
    """An earlier study's best point (its ``searched.json``) as seeds of a study of ``space``
    (``searched.start_from``: each new discount along a ladder of weights, from 0), named
    after the file; SearchError, one line naming the file, where it is not such a file or its
    point is not one of ``space``."""
    try:
        data = json.loads(read_regular_text(path, 16 * 1024 * 1024))
    except FileNotFoundError:
        raise SearchError(f"{path}: no such file (expected a searched.json)") from None
    except (OSError, TextFileError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else \
            str(exc).removeprefix(f"{path}: ")
        raise SearchError(f"{path}: not a searched.json ({why})") from None
    params = data.get("params") if isinstance(data, dict) else None
    if not isinstance(params, dict):
        raise SearchError(f"{path}: expected a searched.json, with the best trial's params")
    try:
        points = start_from(space, params)
    except SearchSpaceError as exc:
        raise SearchError(f"{path}: {exc}") from None
    return tuple((f"start-from {path.name}" + (f" #{i}" if len(points) > 1 else ""),
                  tuple(sorted(point.items()))) for i, point in enumerate(points))


@dataclass(frozen=True)
class SearchSettings:
    """What a study is: its programs, size, metric, space, penalties and seed (its identity:
    a rerun must give the same) and how many complete trials it should have (``trials``:
    raising it continues the study)."""

    benchmarks: tuple[Benchmark, ...]
    sizes: Mapping[str, Size]
    size: str
    metric: str
    trials: int
    seed: int = 0
    space: Space = Space()
    penalties: Penalties = Penalties()
    startup: int = STARTUP_TRIALS
    # points tried right after the heuristic's seed, before the others (name, parameters):
    # select-policy's search started from the classifier
    extra_seeds: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = ()

    def identity(self) -> dict[str, Any]:
        got = {"version": IDENTITY_VERSION, "sampler": SAMPLER,
               "benchmarks": [b.name for b in self.benchmarks], "size": self.size,
               "metric": self.metric, "seed": self.seed, "startup": self.startup,
               "space": self.space.identity(), "penalties": self.penalties.identity()}
        if self.extra_seeds:  # (absent otherwise: the studies made before resume as they were)
            got["extra_seeds"] = [[name, dict(params)] for name, params in self.extra_seeds]
        return got


@dataclass(frozen=True)
class TrialRecord:
    """One trial as the study holds it (``objective`` None: not complete)."""

    number: int
    state: str
    params: dict[str, float]
    objective: float | None = None
    speedup: float | None = None
    size: float | None = None
    compile: float | None = None
    failed: tuple[str, ...] = ()
    fell_back: tuple[str, ...] = ()
    seed: str = ""
    programs: dict[str, list[Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class SearchOutcome:
    """The study after this run: every trial, the best complete one, what this run added."""

    trials: list[TrialRecord]
    best: TrialRecord | None
    added: int
    retried: int
    policy: Path | None


@dataclass(frozen=True)
class Confirmation:
    """The best policy measured again against the heuristic, per program, and the geometric
    mean (None: a program has no figure)."""

    size: str
    metric: str
    figures: dict[str, Figure]
    mean: Figure | None


# --------------------------------------------------------------------------- the directory

@contextmanager
def locked(out: Path) -> Iterator[None]:
    """``out`` made and held by this process: a second search in it is refused (a trial left
    running in the study is then known to be dead)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        handle = open(out / LOCK, "a")
    except OSError as exc:
        raise SearchError(f"{out}: cannot use the directory: {exc.strerror or exc}") from None
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise SearchError(f"{out}: another search-policy is running in it") from None
        yield
    finally:
        handle.close()


def _check_identity(out: Path, settings: SearchSettings) -> bool:
    """True when the study exists (and is this one); SearchError naming the first key that
    differs, or a study without its identity."""
    path, wanted = out / IDENTITY, settings.identity()
    if not path.exists():
        if (out / DB).exists():
            raise SearchError(f"{out / DB}: a study without {IDENTITY}: use another --out")
        return False
    try:
        recorded = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SearchError(f"{path}: not a search record ({exc})") from None
    if not isinstance(recorded, dict):
        raise SearchError(f"{path}: not a search record")
    for key, value in wanted.items():
        if recorded.get(key) != value:
            raise SearchError(f"{path}: the study was started with {key} "
                              f"{json.dumps(recorded.get(key))}, not {json.dumps(value)}: "
                              "use another --out")
    return True


@contextmanager
def _study_file(out: Path) -> Iterator[None]:
    """The study's SQLite file opened through Optuna: one that is not a database, or not
    Optuna's, is a SearchError naming it (not SQLAlchemy's traceback)."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError
    try:
        yield
    except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SearchError(f"{out / DB}: not a study this command can read ({first}): use "
                          "another --out") from None


def _study(out: Path, settings: SearchSettings, exists: bool) -> Any:
    with _study_file(out):
        return _open_study(out, settings, exists)


def _open_study(out: Path, settings: SearchSettings, exists: bool) -> Any:
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{(out / DB).resolve()}"
    probe = optuna.create_study(study_name=STUDY, storage=storage, direction="maximize",
                                load_if_exists=True)
    # seeded by the trials so far: a resumed study does not draw its first points again
    sampler = optuna.samplers.TPESampler(
        seed=settings.seed + len(probe.trials), n_startup_trials=settings.startup,
        multivariate=True)
    study = optuna.load_study(study_name=STUDY, storage=storage, sampler=sampler)
    if not exists:
        known = seeds(settings.space)
        extra = [(name, dict(params)) for name, params in settings.extra_seeds]
        for name, params in known[:1] + extra + known[1:]:
            study.enqueue_trial(params, user_attrs={"seed": name})
        write_text_atomic(out / IDENTITY, json.dumps(settings.identity(), indent=1) + "\n")
    return study


def _fail_running(study: Any) -> None:
    """Trials left running are failed: their process is gone or is this one, stopping (the
    directory is locked), and a Ctrl-C may come between a trial's creation and its ``try``."""
    from optuna.trial import TrialState
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)


def _retry_cut_short(study: Any) -> int:
    """Trials left running (their process is gone: the directory is locked) are marked failed;
    each failed trial's point is asked for again, once.  How many were queued."""
    from optuna.trial import TrialState
    _fail_running(study)
    retried = set(study.user_attrs.get("retried", []))
    queued = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
        if t.number in retried or len(t.params) == 0:
            continue
        attrs = {"retry_of": t.number, **({"seed": t.user_attrs["seed"]}
                                          if "seed" in t.user_attrs else {})}
        study.enqueue_trial(dict(t.params), user_attrs=attrs)
        retried.add(t.number)
        queued += 1
    study.set_user_attr("retried", sorted(retried))
    return queued


# --------------------------------------------------------------------------- one trial

def compile_time(built: CompileResult | None) -> tuple[str, float] | None:
    """A build's compile time and its clock: the CPU time of its compiler processes where the
    build records it (``cpu_s``: kept with the build, so a build from the store has it too),
    else the wall time of a build compiled now; None when neither is known."""
    if built is None:
        return None
    if built.cpu_s is not None and built.cpu_s > 0:
        return "cpu", built.cpu_s
    return ("wall", built.seconds) if not built.cached and built.seconds > 0 else None


def reference_seconds(session: Session, benches: Sequence[Benchmark], study: Any
                      ) -> dict[str, float]:
    """Each program's heuristic build (SearchError naming one that fails), and its compile
    time where known, kept in the study as the compile-time reference (keyed
    ``CLOCK:PROGRAM``: a ratio is taken between times of the same clock only)."""
    known = dict(study.user_attrs.get("reference_seconds", {}))
    futures = [(b, session.builds.submit(CompileJob(b))) for b in benches]
    for b, f in futures:
        try:
            got = f.result()
        except CompileError as exc:
            raise SearchError(f"{b.name}: the heuristic build failed: {_line(exc)}") from None
        timed = compile_time(got)
        if timed is not None and (timed[0] == "cpu" or f"wall:{b.name}" not in known):
            known[f"{timed[0]}:{b.name}"] = timed[1]
    study.set_user_attr("reference_seconds", known)
    return known


def _line(error: object) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _figure(session: Session, got: Compared[Any]) -> ProgramFigure:
    name = got.contender.bench.name
    m = base.measured_of(session, got)
    if got.failure is Failure.COMPILE:
        return ProgramFigure(name, failed=base.failed_build(m) or "does not compile")
    if got.failure is not None or m.error and not (got.comparison and got.comparison.failed):
        raise SearchError(f"{name}: {m.error}")
    timed = compile_time(got.compiled)
    clock, seconds = timed if timed is not None else ("wall", None)
    if m.speedup is None:
        return ProgramFigure(name, seconds=seconds, clock=clock,
                             failed="a run of its build failed")
    return ProgramFigure(name, m.speedup, m.size_ratio, seconds, clock=clock)


def measure_policy(session: Session, spec: PolicySpec, benches: Sequence[Benchmark],
                   sizes: Mapping[str, Size]) -> list[ProgramFigure]:
    """The policy built into every program and compared with each heuristic build in the
    session's metric, every build asked for at once."""
    config = session.config
    contenders = [Contender(b.name, b, CompileJob(b, policy=spec), sizes[b.name])
                  for b in benches]
    pairing = pairing_policy(config, config.run.runs)
    with closing(compare_with_heuristic(session, contenders, config.run.runs, pairing)) as it:
        return [_figure(session, got) for got in it]


def _params(trial: Any, space: Space) -> dict[str, float]:
    return {p.name: (trial.suggest_int(p.name, int(p.low), int(p.high), log=True)
                     if p.integer else trial.suggest_float(p.name, p.low, p.high))
            for p in space.params()}


def _run_trial(session: Session, study: Any, settings: SearchSettings,
               reference: dict[str, float], check: Callable[[], None]) -> TrialRecord:
    """Ask, measure, tell; a trial that raises (Ctrl-C included) is told failed first.
    ``check`` raises a Ctrl-C that was swallowed while the trial ran (``InterruptLatch``)."""
    from optuna.trial import TrialState
    trial = study.ask()
    try:
        params = _params(trial, settings.space)
        names = [b.name for b in settings.benchmarks]
        spec = learned_spec(policy_of(settings.space, params, names),
                            f"search-policy trial {trial.number}")
        figures = measure_policy(session, spec, settings.benchmarks, settings.sizes)
        got = score(figures, settings.penalties, reference)
        check()
    except SearchSpaceError as exc:
        study.tell(trial, state=TrialState.FAIL)
        raise SearchError(f"trial {trial.number}: {exc}") from None
    except BaseException:
        study.tell(trial, state=TrialState.FAIL)
        raise
    _record(trial, got, figures)
    if trial.user_attrs.get("seed") == "heuristic":
        _learn_reference(study, figures, reference)
    study.tell(trial, got.objective)
    return _trial_record(study.trials[trial.number])


def _learn_reference(study: Any, figures: Sequence[ProgramFigure],
                     reference: dict[str, float]) -> None:
    """The heuristic seed's builds (the heuristic's decisions, asked of a policy) as the
    compile-time reference of programs whose heuristic build came from the store."""
    for f in figures:
        if f.seconds and f"{f.clock}:{f.name}" not in reference:
            reference[f"{f.clock}:{f.name}"] = f.seconds
    study.set_user_attr("reference_seconds", reference)


def _record(trial: Any, got: Score, figures: Sequence[ProgramFigure]) -> None:
    trial.set_user_attr("speedup", got.speedup)
    trial.set_user_attr("size", got.size)
    trial.set_user_attr("compile", got.compile)
    trial.set_user_attr("failed", list(got.failed))
    trial.set_user_attr("fell_back", list(got.fell_back))
    trial.set_user_attr("programs", {f.name: [f.speedup, f.size_ratio, f.seconds, f.failed]
                                     for f in figures})


def _trial_record(t: Any) -> TrialRecord:
    u = t.user_attrs
    return TrialRecord(t.number, t.state.name.lower(), dict(t.params), t.value,
                       u.get("speedup"), u.get("size"), u.get("compile"),
                       tuple(u.get("failed", ())), tuple(u.get("fell_back", ())),
                       u.get("seed", ""), u.get("programs", {}))


# --------------------------------------------------------------------------- the study

def records(study: Any) -> list[TrialRecord]:
    return [_trial_record(t) for t in study.get_trials(deepcopy=False)]


def best_of(trials: Sequence[TrialRecord]) -> TrialRecord | None:
    """The complete trial of the highest objective (ties: the first)."""
    done = [t for t in trials if t.state == "complete" and t.objective is not None]
    return max(done, key=lambda t: (t.objective, -t.number)) if done else None


def num(v: float | None) -> str:
    """A figure in the CSVs: six significant digits, empty when there is none."""
    return "" if v is None else f"{v:.6g}"


def trials_csv(trials: Sequence[TrialRecord], space: Space) -> str:
    names = [p.name for p in space.params()]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["trial", "state", "seed", "objective", "speedup", "size", "compile",
                "failed", "fell_back", *names])
    for t in trials:
        w.writerow([t.number, t.state, t.seed, num(t.objective), num(t.speedup),
                    num(t.size), num(t.compile), " ".join(t.failed), " ".join(t.fell_back),
                    *[num(t.params.get(n)) for n in names]])
    return buf.getvalue()


def write_results(out: Path, settings: SearchSettings, trials: Sequence[TrialRecord]
                  ) -> Path | None:
    """``trials.csv``, and the best trial's policy file with its provenance."""
    write_text_atomic(out / TRIALS, trials_csv(trials, settings.space))
    best = best_of(trials)
    if best is None:
        return None
    names = [b.name for b in settings.benchmarks]
    spec = learned_spec(policy_of(settings.space, best.params, names))
    write_policy_bytes(spec.data, out / POLICY)
    previous = _sidecar(out)
    sidecar = {"searched_by": "search-policy", "study": str(out / DB), "trial": best.number,
               "objective": best.objective, "speedup": best.speedup, "size": best.size,
               "compile": best.compile, "failed": list(best.failed),
               "fell_back": list(best.fell_back), "params": best.params,
               "programs": best.programs, **settings.identity(),
               "policy_sha256": spec.digest}
    if previous.get("policy_sha256") == sidecar["policy_sha256"] and "confirmation" in previous:
        sidecar["confirmation"] = previous["confirmation"]
    write_text_atomic(out / SIDECAR, json.dumps(sidecar, indent=1) + "\n")
    return out / POLICY


def _sidecar(out: Path) -> dict[str, Any]:
    try:
        got = json.loads((out / SIDECAR).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


def run_search(session: Session, settings: SearchSettings, out: Path,
               say: Callable[[str], None] = lambda _: None,
               check: Callable[[], None] = lambda: None) -> SearchOutcome:
    """The study in ``out`` continued (or started) until it has ``settings.trials`` complete
    trials; ``out`` must be ``locked`` by the caller.  A Ctrl-C ends the trial in flight
    (failed, tried again by the next run) and is raised on; ``check`` raises one that a
    library swallowed (``pipeline.longrun.InterruptLatch.check``)."""
    if not settings.benchmarks:
        raise SearchError("no benchmark to search on")
    exists = _check_identity(out, settings)
    study = _study(out, settings, exists)
    retried = _retry_cut_short(study)
    if retried:
        say(f"{retried} trial(s) cut short before: their points are tried again first")
    reference = reference_seconds(session, settings.benchmarks, study)
    added = 0
    try:
        trials = records(study)
        while sum(1 for t in trials if t.state == "complete") < settings.trials:
            check()
            t = _run_trial(session, study, settings, reference, check)
            added += 1
            trials = records(study)
            best = best_of(trials)
            say(f"trial {t.number}{f' ({t.seed})' if t.seed else ''}: objective "
                f"{t.objective:.4f}, speedup {t.speedup:.4f}, size {t.size:.3f}x"
                + (f", compile {t.compile:.2f}x" if t.compile is not None else "")
                + (f", counted at the heuristic's figure: {', '.join(t.failed + t.fell_back)}"
                   if t.failed or t.fell_back else "")
                + (f"; best: trial {best.number}, {best.objective:.4f}" if best else ""))
            write_results(out, settings, trials)
    except BaseException:
        _fail_running(study)
        raise
    finally:
        trials = records(study)
        try:
            policy = write_results(out, settings, trials)
        except OSError:
            policy = None
    return SearchOutcome(trials, best_of(trials), added, retried, policy)


# --------------------------------------------------------------------------- confirmation

def confirm(session: Session, out: Path, settings: SearchSettings,
            benches: Sequence[Benchmark], sizes: Mapping[str, Size], size: str,
            pairing: PairingPolicy) -> Confirmation:
    """The best trial's policy (``out/searched.policy``'s point) against the heuristic on
    ``benches`` at ``size`` in the session's metric (paired wall time), written to
    ``confirm.csv`` and to ``searched.json``."""
    best = best_of(_stored_records(out))
    if best is None:
        raise SearchError(f"{out / DB}: no complete trial to confirm")
    names = [b.name for b in settings.benchmarks]
    spec = learned_spec(policy_of(settings.space, best.params, names), str(out / POLICY))
    contenders = [Contender(b.name, b, CompileJob(b, policy=spec), sizes[b.name])
                  for b in benches]
    figures: dict[str, Figure] = {}
    runs = pairing.min_pairs
    with closing(compare_with_heuristic(session, contenders, runs, pairing)) as it:
        for got in it:
            figures[got.contender.bench.name] = base.measured_of(session, got)
    metric = session.config.measure.metric
    mean = geomean_figure(figures[b.name] for b in benches)
    result = Confirmation(size, metric, {b.name: figures[b.name] for b in benches}, mean)
    _write_confirmation(out, best.number, result)
    return result


def _stored_records(out: Path) -> list[TrialRecord]:
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with _study_file(out):
            return records(optuna.load_study(study_name=STUDY,
                                             storage=f"sqlite:///{(out / DB).resolve()}"))
    except KeyError:
        raise SearchError(f"{out / DB}: no study") from None


def _write_confirmation(out: Path, trial: int, c: Confirmation) -> None:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["benchmark", "metric", "size", "speedup", "low", "high", "pairs",
                "size_ratio", "error"])
    for name, f in c.figures.items():
        w.writerow([name, c.metric, c.size, num(f.speedup), num(f.low), num(f.high), f.pairs,
                    num(f.size_ratio), f.error or ""])
    write_text_atomic(out / CONFIRMATION, buf.getvalue())
    sidecar = _sidecar(out)
    sidecar["confirmation"] = {
        "trial": trial, "metric": c.metric, "size": c.size,
        "programs": {n: [f.speedup, f.low, f.high, f.pairs, f.error]
                     for n, f in c.figures.items()},
        "mean": None if c.mean is None else [c.mean.speedup, c.mean.low, c.mean.high]}
    write_text_atomic(out / SIDECAR, json.dumps(sidecar, indent=1) + "\n")

