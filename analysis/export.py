"""Every measured run of some rundirs as one table (pandas), for CSV or Parquet export.

One row per run, from each candidate dir's ``measurements.json`` (a list of run results, each
with its ``records``; docs/rundir-format.md) joined with the journal's ``baseline`` and ``step``
events.  The baseline is step 0, candidate 0, energy 1.0, accepted False.  A candidate whose
compile failed (``sha256`` null) has no runs and so no rows; a candidate that should have
measurements but whose file is missing or unreadable is skipped with a ``MeasurementWarning``.
Each (step, candidate) carries its one figure (docs/measurement.md), the one ``batch-log``
shows: ``speedup``, ``ci_low``, ``ci_high`` and ``pairs`` are its end-of-chain confirmation's
when it has one (``confirmed`` true), else those of every pair measured for it (its step's
and its re-measurements'); none when those pairs are fewer than the chain's minimum
(``unresolved`` true: ``run.runs``, whatever the version that journaled them).  ``energy`` is
1 / that speedup; ``search_energy`` is the step event's, the figure the search decided with
(its first pairs; a later ``remeasure`` or the confirmation does not change it).  A
version-1 rundir has no pairs: its figure is the step's, with no interval.  A canary's
rows carry the canary's figure.  ``stopped`` is why the step's comparison stopped.  Each
run's ``cpu_share`` and ``disturbed`` (why it was never used, or empty) come from its record.
``kind`` says what
measured the run: ``baseline`` (its own runs), ``candidate`` (its step's comparison),
``remeasure``, ``confirm`` (rows of the candidate re-measured or confirmed, ``remeasured_at``
the step a re-measurement was done at) or ``canary`` (rows of the baseline, ``remeasured_at``
the step it followed).  A comparison holds both binaries' runs: ``role`` is ``reference`` for
the baseline's runs paired with the candidate's, ``candidate`` for the candidate's.

Columns: benchmark, rundir, step, candidate, dir, mutation, accepted, energy, inlined,
not_inlined, prevented, kind, remeasured_at, role, sha256, worker, worker_class, cpu, run
(index of the record within its measurements.json, over all its results), wall_s, user_s,
sys_s, maxrss_kb,
exit_status, signal, failure, output_ok, then ``gc_<name>`` for every GC statistic and
``perf_<event>`` for every perf counter seen (NaN when absent, unsupported or not counted).
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from dispatcher.core.files import atomic_output
from dispatcher.core.records import (
    BaselineEvent,
    CanaryEvent,
    ConfirmEvent,
    DecisionCounts,
    Event,
    Experiment,
    PerfCount,
    Pointer,
    RecordError,
    RemeasureEvent,
    RunResult,
    StartEvent,
    StepEvent,
    canary_dir,
    confirm_dir,
    pooled_pairs,
    read_experiment,
    read_results,
)
from dispatcher.core.rundir import read_journal
from dispatcher.core.stats import paired_speedup_ci

BASE_COLUMNS = ("benchmark", "rundir", "step", "candidate", "dir", "mutation", "accepted",
                "energy", "speedup", "ci_low", "ci_high", "pairs", "confirmed", "unresolved",
                "stopped", "search_energy", "inlined", "not_inlined", "prevented", "kind",
                "remeasured_at", "role", "sha256", "worker", "worker_class", "cpu", "run",
                "wall_s", "user_s", "sys_s", "maxrss_kb", "exit_status", "signal", "failure",
                "output_ok", "cpu_share", "disturbed")

PARQUET_MISSING = "parquet export needs pyarrow: pip install pyarrow"


class ExportError(RuntimeError):
    """A fatal export problem; the message is one line."""


class MeasurementWarning(UserWarning):
    """A candidate's measurements could not be read; its runs are left out."""


def experiment_info(rundir: Path, events: Sequence[Event]) -> Experiment | None:
    """The experiment: the journal's start event, else ``experiment.json``, else None (an
    unreadable one included: the table still shows the rundir)."""
    start = next((e for e in events if isinstance(e, StartEvent)), None)
    if start is not None:
        return start
    try:
        return read_experiment(rundir / "experiment.json")
    except RecordError:
        return None


@dataclass(frozen=True)
class _Entry:
    """One (step, candidate) of the table: the baseline, or a proposal of a step."""

    step: int
    candidate: int
    dir: str
    mutation: str | None
    accepted: bool
    energy: float | None
    decisions: DecisionCounts | None
    expect_runs: bool  # measurements.json should exist: a missing one is worth a warning
    measurements: str = ""  # rundir-relative; default: the dir's measurements.json
    remeasured_at: int | None = None  # the step of a re-measurement of this candidate
    kind: str = "candidate"  # baseline | candidate | remeasure | canary | confirm
    sha256: str | None = None
    stopped: str | None = None


def _candidates(events: Sequence[Event]) -> list[_Entry]:
    """The baseline and every step's candidates, in order."""
    out = []
    baseline = next((e for e in events if isinstance(e, BaselineEvent)), None)
    if baseline is not None:
        out.append(_Entry(step=0, candidate=0, dir=baseline.dir, mutation=None, accepted=False,
                          energy=1.0, decisions=baseline.decisions, expect_runs=True,
                          kind="baseline"))
    # A step journaled twice (should not happen) counts once: the last one.
    steps = {e.step: e for e in events if isinstance(e, StepEvent)}
    for n in sorted(steps):
        e = steps[n]
        for c in e.candidates:
            out.append(_Entry(step=n, candidate=c.candidate, dir=c.dir, mutation=c.mutation,
                              accepted=e.accepted and e.chosen == c.candidate, energy=c.energy,
                              decisions=c.decisions, sha256=c.sha256, stopped=c.stopped,
                              expect_runs=c.sha256 is not None
                              and bool(c.times or c.failed or c.stopped)))
    # Re-measurements: the incumbent's new runs, under its own (step, candidate).
    where = {entry.dir: entry for entry in out}
    for again in events:
        if isinstance(again, RemeasureEvent) and again.dir in where:
            out.append(dataclasses.replace(where[again.dir], measurements=again.measurements,
                                           remeasured_at=again.step, expect_runs=True,
                                           kind="remeasure"))
        elif isinstance(again, ConfirmEvent) and again.dir in where:
            out.append(dataclasses.replace(where[again.dir], kind="confirm", expect_runs=True,
                                           measurements=f"{confirm_dir(again.step)}/"
                                                        "measurements.json"))
        elif isinstance(again, CanaryEvent) and baseline is not None:
            out.append(_Entry(step=0, candidate=0, dir=baseline.dir, mutation=None,
                              accepted=False, energy=None, decisions=baseline.decisions,
                              expect_runs=True, remeasured_at=again.step, kind="canary",
                              measurements=f"{canary_dir(again.step)}/measurements.json"))
    return out


def _read_measurements(path: Path, expect: bool) -> list[RunResult]:
    if not path.exists():
        if expect:
            warnings.warn(f"{path}: missing, its runs are left out", MeasurementWarning,
                          stacklevel=2)
        return []
    try:
        return read_results(path)
    except RecordError as exc:
        warnings.warn(f"{exc}; its runs are left out", MeasurementWarning, stacklevel=2)
        return []


def figure(events: Sequence[Event], entry: _Entry, min_pairs: int,
           metric: str = "time") -> dict[str, Any]:
    """The entry's one figure (the module's docstring): speedup, interval, pairs, whether
    confirmed or unresolved, and energy = 1 / speedup.  A candidate of a chain that searched
    in an exact ``metric`` and was not confirmed: its counted figure, low = high."""
    none = {"speedup": math.nan, "ci_low": math.nan, "ci_high": math.nan, "pairs": 0,
            "confirmed": False, "unresolved": entry.stopped == "unresolved",
            "energy": math.nan}
    if entry.kind == "baseline" or (entry.step == 0 and entry.kind != "canary"):
        return {**none, "speedup": 1.0, "energy": 1.0}
    if entry.kind == "canary":
        canary = next((e for e in events if isinstance(e, CanaryEvent)
                       and e.step == entry.remeasured_at), None)
        reference, times = (canary.reference_times, canary.times) if canary else ([], [])
        confirmed = False
    else:
        confirm = next((e for e in reversed(events) if isinstance(e, ConfirmEvent)
                        and e.dir == entry.dir and e.times), None)
        confirmed = confirm is not None
        if confirm is not None:
            reference, times = confirm.reference_times, confirm.times
        elif metric != "time":
            exact = entry.energy  # the counted figure's energy, as the search judged it
            if not exact:
                return none
            return {**none, "speedup": 1.0 / exact, "ci_low": 1.0 / exact,
                    "ci_high": 1.0 / exact, "pairs": 1, "energy": exact}
        else:
            reference, times = pooled_pairs(events, Pointer(
                step=entry.step, candidate=entry.candidate, dir=entry.dir,
                energy=entry.energy or 1.0, sha256=entry.sha256))
    if not reference and entry.kind != "canary" and entry.energy:
        # a version-1 rundir: no pairs, the step's figure over unpaired runs
        return {**none, "speedup": 1.0 / entry.energy, "energy": entry.energy}
    if not times or len(times) != len(reference):
        return none
    if len(times) < min_pairs:
        return {**none, "pairs": len(times), "unresolved": True}
    speedup, low, high = paired_speedup_ci(reference, times)
    return {"speedup": speedup, "ci_low": math.nan if low is None else low,
            "ci_high": math.nan if high is None else high, "pairs": len(times),
            "confirmed": confirmed, "unresolved": False, "energy": 1.0 / speedup}


def _perf_value(count: PerfCount) -> float:
    if count.value is not None and not count.unsupported and not count.not_counted:
        return float(count.value)
    return math.nan


def rundir_rows(rundir: Path) -> list[dict[str, Any]]:
    """The rows of one rundir (raises RundirError for a corrupt journal)."""
    rundir = Path(rundir)
    events = read_journal(rundir / "journal.jsonl")
    experiment = experiment_info(rundir, events)
    task = experiment.task if experiment else None
    baseline = next((e for e in events if isinstance(e, BaselineEvent)), None)
    base_sha = baseline.sha256 if baseline is not None else None
    min_pairs = experiment.runs if experiment is not None else 0
    rows = []
    for c in _candidates(events):
        d = c.decisions
        head = {"benchmark": task, "rundir": str(rundir), "step": c.step,
                "candidate": c.candidate, "dir": c.dir, "mutation": c.mutation,
                "accepted": c.accepted,
                **figure(events, c, min_pairs, experiment.metric if experiment else "time"),
                "stopped": c.stopped,
                "search_energy": c.energy,
                "inlined": d.inlined if d else None, "not_inlined": d.not_inlined if d else None,
                "prevented": d.prevented if d else None, "remeasured_at": c.remeasured_at,
                "kind": c.kind}
        run = 0
        path = rundir / (c.measurements or f"{c.dir}/measurements.json")
        for i, result in enumerate(_read_measurements(path, c.expect_runs)):
            # A comparison's runs alternate in ABBA rounds; a canary's two sides are one binary.
            if c.kind == "canary":
                role = "reference" if i % 4 in (0, 3) else "candidate"
            elif c.kind != "baseline" and result.sha256 == base_sha:
                role = "reference"
            else:
                role = "candidate" if c.kind != "baseline" else "baseline"
            for rec in result.records:
                row = {**head, "role": role, "sha256": result.sha256, "worker": result.worker,
                       "worker_class": result.worker_class, "cpu": result.cpu, "run": run,
                       "wall_s": rec.wall_ns / 1e9 if rec.wall_ns is not None else math.nan,
                       "user_s": rec.user_s, "sys_s": rec.sys_s, "maxrss_kb": rec.maxrss_kb,
                       "exit_status": rec.exit_status, "signal": rec.signal,
                       "failure": rec.failure, "output_ok": rec.output_ok,
                       "cpu_share": rec.cpu_share, "disturbed": rec.disturbed}
                for name, value in rec.gc.items():
                    row[f"gc_{name}"] = value
                for event, count in (rec.perf or {}).items():
                    row[f"perf_{event}"] = _perf_value(count)
                rows.append(row)
                run += 1
    return rows


def measurements_table(rundirs: Iterable[Path]) -> pd.DataFrame:
    """One row per run of every candidate (baseline included) of ``rundirs``."""
    rows = [row for r in rundirs for row in rundir_rows(Path(r))]
    extra = sorted({k for row in rows for k in row if k not in BASE_COLUMNS},
                   key=lambda k: (not k.startswith("gc_"), k))
    columns = list(BASE_COLUMNS) + extra
    df = pd.DataFrame(rows, columns=columns)
    for col in extra:
        df[col] = pd.to_numeric(df[col], errors="coerce")
    for col in ("energy", "search_energy", "speedup", "ci_low", "ci_high", "wall_s", "user_s",
                "sys_s", "cpu_share"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    # Counts stay integers (nullable: no 3.0 in the CSV because one row lacks the value).
    for col in ("step", "candidate", "inlined", "not_inlined", "prevented", "remeasured_at",
                "cpu", "run", "pairs",
                "maxrss_kb", "exit_status", "signal", *(c for c in extra if c.startswith("gc_"))):
        values = pd.to_numeric(df[col], errors="coerce")
        present = values.dropna()
        if len(df) and (present == present.round()).all():
            df[col] = values.astype("Int64")
    for col in ("accepted", "confirmed", "unresolved"):
        df[col] = df[col].astype(bool)
    return df


def export_format(out: Path) -> str:
    """"csv" or "parquet" from the file name; raises ExportError if it cannot be written."""
    suffix = out.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".parquet", ".pq"):
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ExportError(PARQUET_MISSING) from None
        return "parquet"
    raise ExportError(f"{out}: unknown export format {suffix or '(no extension)'!r} "
                      "(use .csv or .parquet)")


def write_table(df: pd.DataFrame, out: Path) -> Path:
    """Write ``df`` as CSV or Parquet by ``out``'s extension, atomically."""
    out = Path(out)
    fmt = export_format(out)
    directory = out.parent if str(out.parent) else Path(".")
    if not directory.is_dir():
        raise ExportError(f"{out}: directory {directory} does not exist")
    with atomic_output(out, suffix=".tmp") as tmp:
        if fmt == "csv":
            df.to_csv(tmp, index=False)
        else:
            df.to_parquet(tmp, index=False, engine="pyarrow")
    return out
