"""Reward assignment, step 1: the measured candidates of a benchmark's rundirs as one table.

One row per candidate that a step measured (and the baseline, step 0, speedup 1 by definition),
read through the typed experiment record.  A candidate's speedup is the one definition of
docs/measurement.md: its end-of-chain confirmation when it has one, else the paired speedup
over every pair measured for it (its step's and its re-measurements'), with the 95% interval.
Failed candidates are kept and flagged (``failed``, ``error``; no speedup), and so are
unresolved ones: measured with fewer undisturbed pairs than the chain's minimum (``run.runs``;
``unresolved`` true, whatever the version that journaled them), whose few pairs are no
figure.  Rows of several rundirs (chains, campaigns) of one benchmark are merged; each keeps
its ``chain`` (the rundir), so models can be validated across chains.

A chain searched in an exact metric (``instructions``, ``cycles``) gives its unconfirmed
candidates their counted figure (low = high, one "pair", ``metric`` that metric) and its
confirmed best its wall-time pairs; with ``counted`` (``assign-rewards``: one fit, one metric)
every candidate of such a chain its counted figure, the confirmed one included (``confirmed``
false then: the figure is the count, not the confirmation).

The trees the compiler really produced are returned beside the table, once per distinct tree
(``tree`` column: a digest of its decisions), for ``analysis.expanded``.
"""
from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dispatcher.core.records import (
    BaselineEvent,
    ConfirmEvent,
    Event,
    Experiment,
    Pointer,
    RecordError,
    StepEvent,
    pooled_pairs,
    read_experiment,
    read_results,
)
from dispatcher.core.rundir import MEASUREMENTS, RundirError, read_journal
from dispatcher.core.stats import paired_speedup_ci
from dispatcher.core.tree import Tree, TreeError

COLUMNS = ("benchmark", "chain", "step", "candidate", "dir", "tree", "sha256", "mutation",
           "failed", "error", "speedup", "ci_low", "ci_high", "pairs", "confirmed",
           "candidate_median_s", "reference_median_s", "task_clock_ms", "unresolved")


class ExtractError(RuntimeError):
    """A rundir that cannot be used; one line naming the file and what was expected."""


@dataclass
class Candidates:
    """The measured candidates of one benchmark: ``table`` (``COLUMNS`` plus ``gc_<stat>``
    columns), and ``trees`` by digest."""

    benchmark: str
    table: pd.DataFrame
    trees: dict[str, Tree] = field(default_factory=dict)
    directory: str | None = None  # the benchmark's directory, as the rundirs recorded it

    @property
    def measured(self) -> pd.DataFrame:
        """The rows with a speedup (a model is fitted to these)."""
        return self.table[~self.table["failed"]].reset_index(drop=True)


def tree_digest(tree: Tree) -> str:
    """A short name for the decisions of a tree (equal trees, equal digests)."""
    text = "\n".join(f"{u}\t{r}\t{k}\t{a}" for u, r, k, a in sorted(tree.decisions()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _read(rundir: Path) -> tuple[Experiment, list[Event]]:
    try:
        experiment = read_experiment(rundir / "experiment.json")
        events = read_journal(rundir / "journal.jsonl")
    except (RecordError, RundirError) as exc:
        raise ExtractError(str(exc)) from None
    if not any(isinstance(e, BaselineEvent) for e in events):
        raise ExtractError(f"{rundir}/journal.jsonl: no baseline measured yet")
    return experiment, events


def _gc_and_clock(directory: Path, sha256: str | None) -> dict[str, float]:
    """Medians over the candidate's own successful runs: task-clock (ms) and GC statistics."""
    try:
        results = read_results(directory / MEASUREMENTS)
    except (RecordError, OSError):
        return {}
    runs = [rec for r in results if sha256 is None or r.sha256 == sha256
            for rec in r.records if rec.usable]
    out: dict[str, float] = {}
    clocks = [rec.perf["task-clock"].value for rec in runs if rec.perf
              and "task-clock" in rec.perf and rec.perf["task-clock"].value is not None]
    if clocks:
        out["task_clock_ms"] = statistics.median(clocks)
    names = sorted({k for rec in runs for k in rec.gc})
    for name in names:
        values = [float(rec.gc[name]) for rec in runs if name in rec.gc]
        if values:
            out[f"gc_{name}"] = statistics.median(values)
    return out


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def rundir_rows(rundir: Path, trees: dict[str, Tree], counted: bool = False
                ) -> tuple[Experiment, list[dict]]:
    """(experiment, rows) of one rundir; its trees are added to ``trees``; ``counted``: a
    chain searched in an exact metric gives every candidate its counted figure."""
    experiment, events = _read(rundir)
    chain = str(rundir)
    baseline = next(e for e in events if isinstance(e, BaselineEvent))
    confirms = {e.dir: e for e in events if isinstance(e, ConfirmEvent)}
    rows: list[dict] = []

    def tree_of(d: str) -> str | None:
        try:
            tree = Tree.from_dir(rundir / d)
        except (TreeError, ValueError, OSError) as exc:
            raise ExtractError(f"{rundir / d}: unreadable decision dumps: {exc}") from None
        if not len(tree):
            return None
        digest = tree_digest(tree)
        trees.setdefault(digest, tree)
        return digest

    base = {"benchmark": experiment.task, "chain": chain, "step": 0, "candidate": 0,
            "dir": baseline.dir, "tree": tree_of(baseline.dir), "sha256": baseline.sha256,
            "mutation": "baseline", "failed": False, "error": None, "speedup": 1.0,
            "ci_low": 1.0, "ci_high": 1.0, "pairs": 0, "confirmed": False,
            "unresolved": False,
            "candidate_median_s": _median(baseline.times),
            "reference_median_s": _median(baseline.times), "metric": "time"}
    base.update(_gc_and_clock(rundir / baseline.dir, baseline.sha256))
    rows.append(base)
    for e in events:
        if not isinstance(e, StepEvent):
            continue
        for c in e.candidates:
            row = {"benchmark": experiment.task, "chain": chain, "step": e.step,
                   "candidate": c.candidate, "dir": c.dir, "tree": None, "sha256": c.sha256,
                   "mutation": c.mutation, "failed": True, "error": c.error,
                   "speedup": math.nan, "ci_low": math.nan, "ci_high": math.nan, "pairs": 0,
                   "confirmed": False, "unresolved": c.stopped == "unresolved",
                   "candidate_median_s": math.nan,
                   "reference_median_s": math.nan, "metric": "time"}
            if c.sha256 is not None:
                row["tree"] = tree_of(c.dir)
                pointer = Pointer(step=e.step, candidate=c.candidate, dir=c.dir,
                                  energy=c.energy or math.nan, sha256=c.sha256)
                reference, times = pooled_pairs(events, pointer)
                confirm = confirms.get(c.dir)
                if confirm is not None and confirm.times:
                    reference, times = list(confirm.reference_times), list(confirm.times)
                    row["confirmed"] = True
                if experiment.metric != "time" and (counted or not row["confirmed"]):
                    if c.speedup is not None:  # counted: its exact figure, low = high
                        row.update(speedup=c.speedup, ci_low=c.speedup, ci_high=c.speedup,
                                   confirmed=False,
                                   pairs=1, failed=row["tree"] is None or c.failed > 0,
                                   metric=experiment.metric)
                elif 0 < len(times) < experiment.runs:  # short of the chain's minimum
                    row.update(unresolved=True, pairs=len(times),
                               error=f"unresolved: {len(times)} pairs, fewer than the "
                                     f"minimum {experiment.runs}")
                elif times and reference and len(times) == len(reference):
                    speedup, low, high = paired_speedup_ci(reference, times)
                    row.update(speedup=speedup, ci_low=low, ci_high=high, pairs=len(times),
                               failed=row["tree"] is None or c.failed > 0,
                               candidate_median_s=_median(times),
                               reference_median_s=_median(reference))
                    row.update(_gc_and_clock(rundir / c.dir, c.sha256))
                if row["tree"] is None and row["error"] is None:
                    row["error"] = "no decision dumps"
            if row["failed"] and row["error"] is None:
                row["error"] = "no paired measurement"
            rows.append(row)
    return experiment, rows


def extract(rundirs: Iterable[Path], counted: bool = False) -> dict[str, Candidates]:
    """The candidates of every benchmark found in ``rundirs``, by benchmark name
    (``counted``: as ``rundir_rows``)."""
    by_bench: dict[str, list[dict]] = {}
    trees: dict[str, dict[str, Tree]] = {}
    directories: dict[str, str] = {}
    for rundir in rundirs:
        found: dict[str, Tree] = {}
        experiment, rows = rundir_rows(Path(rundir), found, counted)
        bench = experiment.task
        by_bench.setdefault(bench, []).extend(rows)
        trees.setdefault(bench, {}).update(found)
        directories.setdefault(bench, experiment.benchmark)
    out = {}
    for bench, rows in by_bench.items():
        table = pd.DataFrame(rows)
        for column in COLUMNS:
            if column not in table:
                table[column] = math.nan
        extra = sorted(c for c in table.columns if c not in COLUMNS)
        table = table[list(COLUMNS) + extra]
        out[bench] = Candidates(bench, table, trees[bench], directories[bench])
    return out
