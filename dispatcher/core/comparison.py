"""A candidate measured against its reference in pairs: the record the measurement service
(``dispatcher.running.measurement``) returns and stores, and the analysis reads back.

Pure (no threads, no service), so that ``analysis/`` reads stored comparisons without the
running layer.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from dispatcher.core.files import json_text_with, records_json
from dispatcher.core.lazy import cached
from dispatcher.core.records import RunResult, results_to_json
from dispatcher.core.stats import paired_speedup_ci


@dataclass(frozen=True)
class Comparison:
    """A candidate measured against its reference in pairs on one worker CPU.

    ``stopped`` ``unresolved``: fewer than the policy's ``min_pairs`` undisturbed pairs could
    be collected (the CPU was busy, or the binaries' runs are too short to keep their share
    above the floor): its pairs are kept for the record but it has no speedup."""

    worker: str | None  # the slot of the last pairs
    reference_times: list[float]  # pairs: reference_times[i] with candidate_times[i]
    candidate_times: list[float]
    results: list[RunResult]  # every run of both binaries, in the order they ran
    stopped: str  # target | budget | worse | failed | unresolved
    failed: int = 0  # failed runs of the candidate
    dropped: int = 0  # pairs dropped because their runs were on different slots or disturbed
    min_pairs: int = 0  # the fewest pairs its policy asked for (0: stored before it was kept)
    # "time" (paired wall times), or an exact metric ("instructions", "cycles": one run of
    # each binary under cachegrind; reference_times/candidate_times then hold the one value
    # of each, and the speedup has no sampling interval: docs/measurement.md)
    metric: str = "time"
    # Read back from the store: its runs cost no worker time this time (not saved, not compared).
    reused: bool = field(default=False, compare=False)

    @property
    def pairs(self) -> int:
        return len(self.candidate_times)

    @property
    def resolved(self) -> bool:
        return self.stopped != "unresolved"

    @property
    def interval(self) -> tuple[float | None, float | None, float | None]:
        """(speedup, low, high): reference over candidate; Nones without pairs, and for an
        unresolved comparison (its few pairs are no figure)."""
        if not self.candidate_times or not self.resolved:
            return None, None, None
        if self.metric != "time":  # exact counts: the ratio, a degenerate interval
            if self.stopped == "failed" or not self.candidate_times[0]:
                return None, None, None
            ratio = self.reference_times[0] / self.candidate_times[0]
            return ratio, ratio, ratio
        return paired_speedup_ci(self.reference_times, self.candidate_times)

    @property
    def disturbed(self) -> int:
        """Runs that succeeded but were disturbed (never used)."""
        return sum(r.disturbed for r in self.results)

    @property
    def runs(self) -> int:
        return sum(len(r.records) for r in self.results)

    def unresolved_line(self) -> str:
        """Why there is no speedup, in one line (for an unresolved comparison)."""
        return (f"unresolved: {self.pairs} undisturbed pair{'s' if self.pairs != 1 else ''} "
                f"of the {self.min_pairs} needed; {self.disturbed} of {self.runs} runs "
                f"disturbed (CPU shares {share_range(self.results)})")

    def to_json(self) -> dict:
        return {**self.to_json_head(), "results": results_to_json(self.results)}

    @cached
    def results_text(self) -> str:
        """Its runs as a measurements.json holds them (``records_json``), serialised once:
        the stored comparison holds the same list (``text``)."""
        return records_json(results_to_json(self.results))

    def text(self) -> str:
        """The stored comparison: ``to_json()`` as JSON, its runs (most of it) as
        ``results_text``, not serialised again."""
        return json_text_with(self.to_json_head(), "results", self.results_text)

    def to_json_head(self) -> dict:
        """``to_json()`` but its runs."""
        data = {"worker": self.worker, "reference_times": self.reference_times,
                "candidate_times": self.candidate_times, "stopped": self.stopped,
                "failed": self.failed, "dropped": self.dropped, "min_pairs": self.min_pairs}
        if self.metric != "time":  # absent for time: stored comparisons read as before
            data["metric"] = self.metric
        return data

    @classmethod
    def from_json(cls, data: dict) -> Comparison:
        return cls(worker=data["worker"], reference_times=list(data["reference_times"]),
                   candidate_times=list(data["candidate_times"]), stopped=data["stopped"],
                   failed=data["failed"], dropped=data["dropped"],
                   min_pairs=data.get("min_pairs", 0), metric=data.get("metric", "time"),
                   results=[RunResult.model_validate(r) for r in data["results"]])


def share_range(results: list[RunResult]) -> str:
    """The CPU shares of the runs that succeeded, as "0.28-0.50" (one: "0.42"; none: "?")."""
    shares = [rec.cpu_share for r in results for rec in r.records
              if rec.failure is None and rec.cpu_share is not None]
    if not shares:
        return "?"
    low, high = min(shares), max(shares)
    return f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}"
