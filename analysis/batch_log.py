"""The state of every experiment in a batch log, as the ``batch-log`` command shows it
(``commands/batch_log.py``).

The batch log (``batch.log`` in the working directory by default) lists one experiment per line
(docs/rundir-format.md); each rundir's journal is the truth about it.  This is the reading side
only: rundirs are never modified (in particular a torn journal tail is skipped, not truncated,
since the experiment may still be writing it).

Status of an experiment: ``finished`` (last event ``finish``, reason ``completed``), ``failed``
(reason ``failed: ...``), ``interrupted``, ``running`` (no ``finish`` as the last event),
``stale`` (running, but the last event is older than ``--stale-after``, an hour by default: a
crashed or killed master), ``missing`` (the rundir is gone) and ``corrupt`` (a journal line in
the middle does not parse: reported on stderr, and the exit status is 1).

Best speedup: baseline geomean / geomean of the best candidate's times (the journal's ``best``
{step, candidate} -> that step event's candidate ``times``, or the baseline's when the best is
still step 0, plus the new runs of every ``remeasure`` of the same dir or of the same binary).
Its 95% confidence interval is a Welch t-interval for the
difference of the mean log times (baseline minus candidate), exponentiated
(``dispatcher.core.stats.speedup_ci``; the t quantile for the fractional Welch degrees of freedom
comes from scipy).
"""
from __future__ import annotations

import csv
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from analysis.export import experiment_info
from dispatcher.core.figures import format_speedup as speedup_text
from dispatcher.core.records import (
    BaselineEvent,
    BatchEntry,
    CanaryEvent,
    ConfirmEvent,
    Event,
    FinishEvent,
    Pointer,
    RemeasureEvent,
    StepEvent,
    pooled_pairs,
)
from dispatcher.core.rundir import RundirError, SitesRundir, read_journal
from dispatcher.core.site_records import (
    SITES_KIND,
    LabelEvent,
    SitesStartEvent,
    is_sites_rundir,
)
from dispatcher.core.stats import paired_speedup_ci, speedup_ci

STALE_AFTER_S = 3600.0

COLUMNS = ("task", "rundir", "algorithm", "steps_done", "steps_planned", "best_speedup",
           "ci_low", "ci_high", "last_update", "status", "confirmed", "significant",
           "canaries", "canary_alarms", "pairs", "none_better", "unresolved", "metric")
# ``metric`` (last, so that readers by position keep theirs): what best_speedup and its
# interval are in; for a labels rundir, what its labels are measured in


# --------------------------------------------------------------------------- summaries

@dataclass
class Summary:
    task: str | None
    rundir: str
    algorithm: str | None
    steps_done: int | None
    steps_planned: int | None
    best_speedup: float | None
    ci_low: float | None
    ci_high: float | None
    last_update: float | None  # Unix seconds
    status: str
    error: str | None = None  # why the journal could not be read
    best_step: int | None = None
    confirmed: bool = False  # the speedup is the end-of-chain confirmation's
    significant: bool | None = None  # its interval excludes 1 (None: no interval)
    paired: bool = True  # False: a version-1 rundir (Welch interval over unpaired runs)
    canaries: int = 0  # A/A canaries measured (resolved ones)
    canary_alarms: int = 0  # of those, judged faster or slower than the baseline itself
    pairs: int | None = None  # the pairs behind the speedup shown
    # The confirmation found the best not above 1, or its interval holds 1: no candidate
    # beat the heuristic (the speedup shown is that confirmation's).
    none_better: bool = False
    # The best's pairs are fewer than the chain's minimum (run.runs): no speedup is shown
    # (rundirs of versions that used such comparisons); or its confirmation was unresolved.
    unresolved: bool = False
    confirm_unresolved: bool = False
    # What the speedup shown is in: time, or the exact metric an unconfirmed best of a chain
    # searched in one was counted in (its interval low = high); a labels rundir: what its
    # labels are measured in.  The CSV's last column
    metric: str = "time"

    def row(self) -> dict:
        d = asdict(self)
        for internal in ("error", "best_step", "paired", "confirm_unresolved"):
            d.pop(internal)
        return d


def best_times(events: Sequence[Event], best: Pointer) -> list[float] | None:
    """The best candidate's times: its step event's (the baseline's for step 0), plus the times
    of every ``remeasure`` of the same candidate dir or of another dir with the same binary.

    A remeasure's ``times`` are its new runs only, and the energy it reports is over all runs
    of the binary, so pooling them is what "its energy is then the one over all its runs"
    means.  None if the journal does not have the best candidate's step.
    """
    sha_of: dict[str, str] = {}
    times = None
    target_dir, target_sha = best.dir, best.sha256
    for e in events:
        if isinstance(e, BaselineEvent):
            sha_of[e.dir] = e.sha256
            if best.step == 0 and best.candidate == 0:
                times = list(e.times)
                target_sha = target_sha or e.sha256
        elif isinstance(e, StepEvent):
            for c in e.candidates:
                if c.sha256:
                    sha_of[c.dir] = c.sha256
                if e.step == best.step and c.candidate == best.candidate:
                    times = list(c.times)
                    target_sha = target_sha or c.sha256
    if times is None:
        return None
    for e in events:
        if not isinstance(e, RemeasureEvent):
            continue
        if e.dir == target_dir or (target_sha is not None and sha_of.get(e.dir) == target_sha):
            times += e.times
    return times


def status_of(events: Sequence[Event], now: float, stale_after: float = STALE_AFTER_S) -> str:
    last = events[-1] if events else None
    if isinstance(last, FinishEvent):
        if last.reason == "completed":
            return "finished"
        if last.reason == "interrupted":
            return "interrupted"
        if last.reason.startswith("failed"):
            return "failed"
        return last.reason or "finished"
    if last is not None and last.time is not None and now - last.time > stale_after:
        return "stale"
    return "running"


def summarize(rundir: Path, entry: BatchEntry | None = None, now: float | None = None,
              stale_after: float = STALE_AFTER_S, label: str | None = None) -> Summary:
    """One experiment's line of the table; never raises for a missing or corrupt rundir."""
    now = time.time() if now is None else now
    label = label or (entry.rundir if entry else str(rundir))
    summary = Summary(task=entry.task if entry else None, rundir=label,
                      algorithm=entry.algorithm if entry else None, steps_done=None,
                      steps_planned=entry.steps if entry else None, best_speedup=None,
                      ci_low=None, ci_high=None, last_update=None, status="missing")
    if not rundir.is_dir():
        return summary
    if is_sites_rundir(rundir):
        return summarize_labels(rundir, summary, now, stale_after)
    try:
        events = read_journal(rundir / "journal.jsonl")
    except RundirError as exc:
        summary.status, summary.error = "corrupt", str(exc)
        return summary
    except OSError as exc:
        summary.status = "unreadable"
        summary.error = f"{rundir / 'journal.jsonl'}: {exc.strerror}"
        return summary
    experiment = experiment_info(rundir, events)
    if experiment is not None:
        summary.task = summary.task or experiment.task
        summary.algorithm = summary.algorithm or experiment.algorithm
        summary.steps_planned = experiment.steps
    steps = [e for e in events if isinstance(e, StepEvent)]
    summary.steps_done = max((e.step for e in steps), default=0)
    if events:
        summary.last_update = events[-1].time
    elif entry is not None and entry.time is not None:
        summary.last_update = entry.time
    summary.status = status_of(events, now, stale_after) if events else (
        "stale" if summary.last_update is not None and now - summary.last_update > stale_after
        else "running")
    summarize_speedup(summary, events, steps[-1].best if steps else None,
                      min_pairs=experiment.runs if experiment is not None else 0,
                      metric=experiment.metric if experiment is not None else "time")
    return summary


def summarize_labels(rundir: Path, summary: Summary, now: float,
                     stale_after: float = STALE_AFTER_S) -> Summary:
    """A labels rundir's line (``measure-sites``): its labels journaled as its steps, and no
    speedup (its figures are per decision: ``labels/<bench>/report.txt``)."""
    summary.algorithm = SITES_KIND
    try:
        events = SitesRundir(rundir).events()
    except RundirError as exc:
        summary.status, summary.error = "corrupt", str(exc)
        return summary
    except OSError as exc:
        summary.status = "unreadable"
        summary.error = f"{rundir / 'journal.jsonl'}: {exc.strerror}"
        return summary
    summary.steps_done = sum(isinstance(e, LabelEvent) for e in events)
    starts = [e for e in events if isinstance(e, SitesStartEvent)]
    summary.metric = starts[0].metric if starts else "time"
    summary.steps_planned = None
    summary.last_update = events[-1].time if events else summary.last_update
    summary.status = status_of(events, now, stale_after) if events else "running"
    return summary


def summarize_speedup(summary: Summary, events: Sequence[Event], best: Pointer | None,
                      min_pairs: int = 0, metric: str = "time") -> None:
    """The best speedup with its interval, by the one definition (docs/measurement.md): the
    end-of-chain confirmation if there is one; else the paired speedup over every pair of the
    best candidate (its step's and its re-measurements'), none if those are fewer than
    ``min_pairs`` (the chain's run.runs: a comparison short of its minimum is unresolved,
    whatever the version that journaled it); for a version-1 rundir (no pairs), the Welch
    interval of its runs against the baseline's.  A confirmation not above 1, or whose
    interval holds 1, says that no candidate beat the heuristic.  Then the A/A canaries
    (unresolved ones, with no pairs, are not counted).  A chain searched in an exact
    ``metric`` whose best is not confirmed shows that best's counted figure (low = high)."""
    canaries = [e for e in events if isinstance(e, CanaryEvent) and e.speedup is not None]
    summary.canaries = len(canaries)
    summary.canary_alarms = sum(e.significant for e in canaries)
    if best is None:
        return
    summary.best_step = best.step
    if best.step == 0:  # nothing beat the baseline yet
        summary.best_speedup = 1.0
        return
    confirm = next((e for e in reversed(events)
                    if isinstance(e, ConfirmEvent) and e.dir == best.dir), None)
    reference, candidate = pooled_pairs(events, best)
    if confirm is not None and confirm.speedup is not None:
        summary.confirmed = True
        speedup = confirm.speedup
        low, high = confirm.ci95 if confirm.ci95 is not None else (None, None)
        summary.pairs = len(confirm.times)
        summary.none_better = not (speedup > 1.0 and low is not None and low > 1.0)
    elif metric != "time" and best.energy:
        summary.confirm_unresolved = confirm is not None
        summary.metric, summary.pairs = metric, 1
        speedup = low = high = 1.0 / best.energy
    elif candidate:
        summary.confirm_unresolved = confirm is not None
        summary.pairs = len(candidate)
        if len(candidate) < min_pairs:
            summary.unresolved = True
            return
        speedup, low, high = paired_speedup_ci(reference, candidate)
    else:
        summary.paired = False
        baseline = next((e for e in events if isinstance(e, BaselineEvent)), None)
        times = best_times(events, best)
        if times and baseline is not None and baseline.times:
            speedup, low, high = speedup_ci(baseline.times, times)
        elif best.energy:
            speedup, low, high = 1.0 / best.energy, None, None
        else:
            return
    summary.best_speedup, summary.ci_low, summary.ci_high = speedup, low, high
    if low is not None and high is not None:
        summary.significant = low > 1.0 or high < 1.0


def summaries(listed: Sequence[tuple[BatchEntry, Path]], rundirs: list[Path] | None = None,
              now: float | None = None, stale_after: float = STALE_AFTER_S) -> list[Summary]:
    """Summaries of a batch log's experiments (``rundirs_of_batch_log``), or of ``rundirs``
    only if given (labelled as the batch log lists them, when it does)."""
    now = time.time() if now is None else now
    if rundirs is None:
        return [summarize(path, e, now, stale_after) for e, path in listed]
    by_path = {path.resolve(): e for e, path in listed}
    out = []
    for r in rundirs:
        entry = by_path.get(r.resolve())
        out.append(summarize(r, entry, now, stale_after,
                             label=entry.rundir if entry else str(r)))
    return out


# --------------------------------------------------------------------------- output

def format_speedup(s: Summary) -> str:
    if s.unresolved:
        return f"unresolved ({s.pairs} pairs, fewer than the chain's minimum)"
    if s.best_speedup is None:
        return "-"
    if s.best_step == 0:
        return f"{s.best_speedup:.3f} (baseline)"
    if s.ci_low is None:
        return f"{s.best_speedup:.3f}"
    figure = speedup_text(s.best_speedup, s.ci_low, s.ci_high)
    if s.none_better:
        return f"no candidate beat the heuristic (confirmed {figure})"
    marks = [m for m, on in (("confirmed", s.confirmed),
                             ("confirmation unresolved", s.confirm_unresolved),
                             ("not significant", s.significant is False),
                             (f"in {s.metric}", s.metric != "time"),
                             ("unpaired", not s.paired)) if on]
    tail = f" ({', '.join(marks)})" if marks else ""
    return f"{figure}{tail}"


def format_canaries(s: Summary) -> str:
    return f"{s.canary_alarms}/{s.canaries}" if s.canaries else "-"


def format_time(t: float | None) -> str:
    if not isinstance(t, (int, float)):
        return "-"
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _steps(s: Summary) -> str:
    done = "-" if s.steps_done is None else str(s.steps_done)
    planned = "?" if s.steps_planned is None else str(s.steps_planned)
    return f"{done}/{planned}"


def print_table(rows: list[Summary]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    out = sys.stdout
    tty = out.isatty()
    console = Console(file=out, width=None if tty else 10_000, highlight=False,
                      force_terminal=tty, color_system="auto" if tty else None)
    table = Table(box=box.SIMPLE_HEAD, expand=False, show_edge=False)
    right = {"steps", "best speedup [95% CI]", "A/A alarms"}
    for name in ("task", "rundir", "algorithm", "steps", "best speedup [95% CI]",
                 "A/A alarms", "last update", "status"):
        table.add_column(name, justify="right" if name in right else "left", no_wrap=not tty,
                         overflow="fold")
    for s in rows:
        table.add_row(s.task or "-", s.rundir, s.algorithm or "-", _steps(s), format_speedup(s),
                      format_canaries(s), format_time(s.last_update), s.status)
    console.print(table)
    canaries = sum(s.canaries for s in rows)
    if canaries:
        alarms = sum(s.canary_alarms for s in rows)
        console.print(f"A/A canaries (the baseline measured against itself): {alarms} of "
                      f"{canaries} judged different at 95% ({100 * alarms / canaries:.1f}%; "
                      "about 5% is expected)")


def print_csv(rows: list[Summary]) -> None:
    out = sys.stdout
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for s in rows:
        row = s.row()
        row["last_update"] = format_time(s.last_update) if s.last_update is not None else ""
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
