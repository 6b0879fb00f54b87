"""Rundirs: everything needed to inspect or continue one experiment, on disk.

    <rundir>/experiment.json    what was asked (records.Experiment)
    <rundir>/config.yaml        the config used (resolved)
    <rundir>/journal.jsonl      append-only, fsynced, one event per line (records.Event)
    <rundir>/state.json         the search state after the last step (records.SearchState)
    <rundir>/profile.json       where the baseline spent its time (records.HotFunctions), when
                                the search focuses on hot code; written before ``baseline``
    <rundir>/steps/<nnnnn>/c<k>/  per candidate: overrides.sexp (the proposal), the compiler's
                                *.decisions.sexp (what it really did), measurements.json
    <rundir>/plot.png           energy against step (written by analysis.plots)

The journal is the truth: each ``step`` event carries the search state after that step, so
``--resume`` continues from the last complete line and a crash loses only the step in flight.
The records themselves, and their versions, are ``dispatcher.records``; this module is the
directory and its files.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import yaml

from dispatcher.files import append_json_line, write_json_atomic
from dispatcher.records import (
    BaselineEvent,
    BatchEntry,
    Event,
    Experiment,
    FinishEvent,
    HotFunctions,
    RecordError,
    RunResult,
    SearchState,
    StartEvent,
    StepEvent,
    candidate_dir,
    event_from_json,
    read_experiment,
    read_results,
    results_to_json,
)

JOURNAL = "journal.jsonl"
EXPERIMENT = "experiment.json"
MEASUREMENTS = "measurements.json"
PROFILE = "profile.json"


class RundirError(RuntimeError):
    """A rundir or batch log that cannot be used; the message is one line naming the file."""


E = TypeVar("E")


def read_json_lines(path: Path) -> list[dict]:
    """Every complete JSON line of a journal or batch log; a torn last line (a crash
    mid-write) is ignored; a corrupt line before the end is a RundirError."""
    try:
        lines = path.read_bytes().split(b"\n")
    except FileNotFoundError:
        return []
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if all(not rest.strip() for rest in lines[i + 1:]):
                break  # the torn tail of an interrupted write
            raise RundirError(f"{path}:{i + 1}: corrupt journal line") from None
    return out


def read_journal(path: Path) -> list[Event]:
    """The journal's events, typed; RundirError (one line, file:line) for a bad one."""
    events = []
    for i, data in enumerate(read_json_lines(path)):
        try:
            events.append(event_from_json(data, f"{path}: event {i + 1}"))
        except RecordError as exc:
            raise RundirError(str(exc)) from None
    return events


@dataclass
class Rundir:
    path: Path

    @property
    def journal_path(self) -> Path:
        return self.path / JOURNAL

    @property
    def experiment(self) -> Experiment:
        try:
            return read_experiment(self.path / EXPERIMENT)
        except RecordError as exc:
            raise RundirError(str(exc)) from None

    @classmethod
    def create(cls, path: Path, experiment: Experiment, config_raw: dict) -> Rundir:
        if path.exists() and any(path.iterdir()):
            raise RundirError(f"{path}: already exists and is not empty (use --resume)")
        path.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path / EXPERIMENT, experiment.to_json())
        (path / "config.yaml").write_text(yaml.safe_dump(config_raw, sort_keys=True))
        rundir = cls(path)
        rundir.append(StartEvent(**experiment.model_dump()))
        return rundir

    @classmethod
    def open(cls, path: Path) -> Rundir:
        """An existing rundir to continue: its experiment record is checked now."""
        if not (path / EXPERIMENT).is_file():
            raise RundirError(f"{path}: not a rundir (no {EXPERIMENT})")
        rundir = cls(path)
        rundir.experiment  # noqa: B018 (a bad record fails here, before anything starts)
        rundir._drop_torn_tail()
        return rundir

    def _drop_torn_tail(self) -> None:
        """Cut a half-written last line so the next append starts on a fresh line."""
        try:
            data = self.journal_path.read_bytes()
        except FileNotFoundError:
            return
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            with open(self.journal_path, "r+b") as f:
                f.truncate(cut)
                os.fsync(f.fileno())

    def append(self, event) -> None:
        """Journal one event (stamped with the time now unless it has one)."""
        data = event.to_json()
        if data.get("time") is None:
            data["time"] = time.time()
        append_json_line(self.journal_path, data)

    def events(self) -> list[Event]:
        return read_journal(self.journal_path)

    def events_of(self, kind: type[E]) -> Iterator[E]:
        return (e for e in self.events() if isinstance(e, kind))

    def last_step(self) -> StepEvent | None:
        steps = list(self.events_of(StepEvent))
        return steps[-1] if steps else None

    def baseline(self) -> BaselineEvent | None:
        return next(self.events_of(BaselineEvent), None)

    def finished_completed(self) -> bool:
        """Its last event is ``finish`` with reason ``completed``: nothing left to do."""
        events = self.events()
        return bool(events) and isinstance(events[-1], FinishEvent) \
            and events[-1].reason == "completed"

    def write_profile(self, hot: HotFunctions) -> None:
        write_json_atomic(self.path / PROFILE, hot.to_json())

    def profile(self) -> HotFunctions | None:
        """The baseline's profile, or None (a rundir that searched every site alike)."""
        path = self.path / PROFILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise RundirError(f"{path}: unreadable profile ({exc})") from None
        try:
            return HotFunctions.from_json(data, str(path))
        except RecordError as exc:
            raise RundirError(str(exc)) from None

    def write_state(self, state: SearchState) -> None:
        write_json_atomic(self.path / "state.json", state.to_json())

    def fresh_candidate_dir(self, step: int, candidate: int) -> Path:
        """The candidate's directory, empty: one left by a step in flight at a crash is
        redone cleanly."""
        d = self.path / candidate_dir(step, candidate)
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        return d

    @staticmethod
    def write_measurements(directory: Path, results: list[RunResult]) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        return write_json_atomic(directory / MEASUREMENTS, results_to_json(results))

    @staticmethod
    def read_measurements(directory: Path) -> list[RunResult]:
        try:
            return read_results(directory / MEASUREMENTS)
        except RecordError as exc:
            raise RundirError(str(exc)) from None


def append_batch_log(path: Path, entry: BatchEntry) -> None:
    """The batch log lists every experiment started: one JSON line each, fsynced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = entry.to_json()
    if data.get("time") is None:
        data["time"] = time.time()
    append_json_line(path, data)


def read_batch_log(path: Path) -> list[BatchEntry]:
    entries = []
    for i, data in enumerate(read_json_lines(path)):
        try:
            entries.append(BatchEntry.from_json(data, f"{path}: entry {i + 1}"))
        except RecordError as exc:
            raise RundirError(str(exc)) from None
    return entries
