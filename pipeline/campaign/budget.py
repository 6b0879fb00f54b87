"""The campaign's worker-hours budget: worker-seconds its experiments have spent running
binaries, read from their journals (as typed records, through ``read_journal``) while they run,
and how much of it each stage may spend."""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dispatcher.core.records import (
    BaselineEvent,
    BatchEntry,
    CanaryEvent,
    ConfirmEvent,
    RemeasureEvent,
    StartEvent,
    StepEvent,
    event_from_json,
)
from dispatcher.core.rundir import JOURNAL, RundirError, read_journal
from dispatcher.core.site_records import (
    LabelEvent,
    MinimalEvent,
    SubsetEvent,
    sites_event_from_json,
)
from pipeline.campaign.plan import SEARCHES, Campaign
from pipeline.campaign.stages import SITES, listed


def _timed(times: Iterable[float]) -> float:
    return sum(t for t in times if math.isfinite(t))


def event_seconds(event: Any, exact: bool = False) -> float:
    """The worker-seconds one journal event records: a search's timed runs (a baseline's, every
    candidate's and its reference's, a remeasure's, a canary's, a confirmation's; a candidate
    the store answered costs nothing) or a labels test's CPU seconds.  ``exact``: the search
    compares in an exact metric, so its candidates', remeasures' and canaries' figures are
    counts, not seconds, and no timed run (the baseline and the confirmation stay in time)."""
    if isinstance(event, BaselineEvent):
        return _timed(event.times)
    if isinstance(event, StepEvent):
        return 0.0 if exact else sum(_timed(c.times) + _timed(c.reference_times)
                                     for c in event.candidates if not c.cached)
    if isinstance(event, (RemeasureEvent, CanaryEvent)) and exact:
        return 0.0
    if isinstance(event, (RemeasureEvent, CanaryEvent, ConfirmEvent)):
        return _timed(event.times) + _timed(event.reference_times)
    if isinstance(event, (SubsetEvent, LabelEvent)):
        return event.outcome.cpu_s
    if isinstance(event, MinimalEvent):
        return event.full.cpu_s + event.kept.cpu_s
    return 0.0


@dataclass
class WorkerClock:
    """Worker-seconds the campaign's experiments have spent, from their journals; a journal is
    read again only when it grew.  One that does not read (a line of another format) counts
    what it counted when it last did, and is read again at the next look."""

    seen: dict[Path, tuple[int, float]] = field(default_factory=dict)

    def seconds(self, experiments: Iterable[tuple[BatchEntry, Path]]) -> float:
        total = 0.0
        for entry, rundir in experiments:
            journal = rundir / JOURNAL
            try:
                size = journal.stat().st_size
            except OSError:
                continue
            known = self.seen.get(journal)
            if known is None or known[0] != size:
                parse = sites_event_from_json if entry.algorithm == SITES else event_from_json
                try:
                    events = read_journal(journal, parse)
                    # a search's first event says what it compares in
                    exact = bool(events) and isinstance(events[0], StartEvent) \
                        and events[0].metric != "time"
                    spent = sum(event_seconds(e, exact) for e in events)
                except (RundirError, OSError):
                    total += known[1] if known else 0.0
                    continue
                known = (size, spent)
                self.seen[journal] = known
            total += known[1]
        return total

    def spent(self, campaign: Campaign) -> float:
        """What the search and the sweeps have spent so far."""
        return self.seconds(listed(campaign.batch_log, (*SEARCHES, SITES)))


def stage_budget_s(campaign: Campaign, stage: str) -> float | None:
    """The worker-seconds the campaign may have spent when ``stage`` must stop (None: the
    budget does not bound it): the search its share, the sweeps the rest; with the flipbacks
    stage on, the labels stop short of its share, which it then has with what they left."""
    if stage == "search":
        return campaign.budget_s * campaign.search_share
    if stage == "labels" and campaign.flipbacks.enabled:
        return campaign.budget_s * (1 - campaign.flipbacks_share)
    if stage in ("labels", "flipbacks"):
        return campaign.budget_s
    return None
